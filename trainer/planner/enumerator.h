#ifndef DELTASTREAM_TRAINER_PLANNER_ENUMERATOR_H_
#define DELTASTREAM_TRAINER_PLANNER_ENUMERATOR_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trainer/planner/sharding_option.h"
#include "trainer/planner/topology.h"

namespace deltastream::planner {

// Every allowed way to shard each table (TorchRec's EmbeddingEnumerator),
// each shard with its storage and cost estimates.
//
// Sharding types: DATA_PARALLEL, TABLE_WISE and ROW_WISE always (on one
// rank ROW_WISE is one shard, like TABLE_WISE); COLUMN_WISE when the table is
// at least two minimum partitions wide; TABLE_ROW_WISE for pooled tables when
// the world spans hosts. A table's `sharding_types` narrows these. Kernels: on
// CPUs FUSED; on GPUs FUSED and FUSED_UVM_CACHING as the table's placement
// allows; DENSE for data-parallel tables (device placement only).
//
// Data-parallel and row-wise shards come with their ranks (rank order);
// the others have rank -1 (table-row-wise shards: their position on the
// host, rank -1 - local_rank) for a partitioner to place.
//
// Returns, per table in input order, its options (at least one).
// InvalidArgument naming the table when its constraints leave no option,
// or its shape is not positive.
absl::StatusOr<std::vector<std::vector<ShardingOption>>> EnumerateOptions(
    absl::Span<const TableSpec> tables, OptimizerKind optimizer,
    const Topology& topology);

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TRAINER_PLANNER_ENUMERATOR_H_
