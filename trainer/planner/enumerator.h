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
// at least two minimum partitions wide, in blocks of min_partition columns
// or of dim / world_size when that is wider (at most one shard per rank; the
// last block takes the rest); TABLE_ROW_WISE for pooled tables when the
// world spans hosts. A table's `sharding_types` narrows these. Kernels: the
// ones the trainer runs, every shard on the rank's device: DENSE for
// data-parallel tables, FUSED for the others.
//
// Data-parallel and row-wise shards come with their ranks (rank order);
// the others have rank -1 (table-row-wise shards: their position on the
// host, rank -1 - local_rank) for a partitioner to place. No option has two
// shards for one rank.
//
// Returns, per table in input order, its options (at least one).
// InvalidArgument naming the table when its constraints leave no option,
// its shape is not positive or too large (over 8 PiB with the optimizer's
// states), its pooling factor is not a finite number >= 0 or its
// min_partition is negative.
absl::StatusOr<std::vector<std::vector<ShardingOption>>> EnumerateOptions(
    absl::Span<const TableSpec> tables, OptimizerKind optimizer,
    const Topology& topology);

}  // namespace deltastream::planner

#endif  // DELTASTREAM_TRAINER_PLANNER_ENUMERATOR_H_
