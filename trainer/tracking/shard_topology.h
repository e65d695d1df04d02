#ifndef DELTASTREAM_TRAINER_TRACKING_SHARD_TOPOLOGY_H_
#define DELTASTREAM_TRAINER_TRACKING_SHARD_TOPOLOGY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tracker_service/service_topology.h"
#include "trainer/comm/process_group.h"
#include "trainer/modules/embedding_modules.h"
#include "trainer/sharding/sharded_embedding_modules.h"
#include "trainer/tracking/module_tracking.h"

namespace deltastream {

// How a sharded trainer's tracking sees its shards (issue 16): every rank
// tracks its local modules (ShardedEmbeddingModule::local_module()) and
// records and serves GLOBAL row IDs.
//   - Row-wise and table-row-wise shards: local row i is global row
//     row_offset + i (ShardRowOffsets, for AttachTracker and
//     ModuleRowsReader); an all_rows read streams the shard's rows
//     [row_offset, row_offset + rows).
//   - Column-wise shards: IDs are global already; the values hold the
//     shard's columns and the chunks say which (DeltaChunk.col_offset,
//     table_cols), so a client joins the ranks' rows by ID.
//   - Table-wise: the whole table on one rank, offset 0.
//   - Data-parallel: the whole table on every rank. Every rank records its
//     own examples' lookups (each rank looks up only those); the rows are
//     equal on every rank after each step (gradients are all-reduced), so a
//     client reading several ranks keeps one row per ID. The topology marks
//     such tables DATA_PARALLEL.

// The cleaned FQN of table `table` of `module` (as the local module names
// it: "<path>.embedding_bags.<table>" or "<path>.embeddings.<table>").
std::string ShardedTableFqn(const ShardedEmbeddingModule& module,
                            absl::string_view table);

// The row offsets of this rank's shards that split rows (ROW_WISE,
// TABLE_ROW_WISE) by cleaned FQN; other shards start at 0 and are left out.
RowOffsets ShardRowOffsets(absl::Span<ShardedEmbeddingModule* const> modules);

// The topology of a trainer whose rank is `rank` of `world_size`, without
// endpoints: with sharded modules, every shard of every table not skipped
// by `fqns_to_skip` (TrackerOptions::fqns_to_skip; every rank lists every
// shard, also of tables it holds none of) and the plans in text (one
// module's plan, or each module's after a "# <path>" line); without, the
// tables of `modules` whole on rank 0, TABLE_WISE.
ServiceTopology DescribeTopology(
    int rank, int world_size, absl::Span<ShardedEmbeddingModule* const> sharded,
    absl::Span<EmbeddingModule* const> modules,
    const std::vector<std::string>& fqns_to_skip);

// `address` ("HOST:PORT") as another host can reach it: a wildcard host
// (0.0.0.0, [::], ::, empty) becomes this machine's full name
// (FullHostName, base/host_port.h).
std::string ReachableAddress(absl::string_view address);

// Publishes this rank's `address` in the group's store under
// "tracker/endpoint/<rank>", waits until every rank has (a barrier, so a
// key an earlier trainer left on the same store is never read) and reads
// every rank's: the endpoints by rank. With a null group: {address}. A
// collective: every rank calls it. The barrier's error (naming the missing
// rank) when a rank does not arrive within the group's timeout.
absl::StatusOr<std::vector<std::string>> ExchangeEndpoints(
    ProcessGroup* group, const std::string& address);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_TRACKING_SHARD_TOPOLOGY_H_
