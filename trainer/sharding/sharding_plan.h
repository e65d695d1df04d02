#ifndef DELTASTREAM_TRAINER_SHARDING_SHARDING_PLAN_H_
#define DELTASTREAM_TRAINER_SHARDING_SHARDING_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/plan.pb.h"
#include "trainer/modules/embedding_config.h"

namespace deltastream {

// Plans for one table, laid out as TorchRec lays them out (the planner,
// trainer/planner, writes the same shapes with estimates filled in).
//
// The whole table on `rank`.
v1::TablePlan TableWisePlan(const EmbeddingTableConfig& table, int rank);
// Blocks of ceil(rows / world_size) rows on ranks 0..world_size-1 in order;
// the last blocks smaller or empty (empty blocks are listed with rows 0).
v1::TablePlan RowWisePlan(const EmbeddingTableConfig& table, int world_size);
// Column blocks of ceil(dim / ranks.size()) columns (the last smaller), the
// j-th on ranks[j]; a rank may appear once.
v1::TablePlan ColumnWisePlan(const EmbeddingTableConfig& table,
                             absl::Span<const int> ranks);
// Row blocks of ceil(rows / ranks.size()) over `ranks` (the ranks of one
// host), in that order.
v1::TablePlan TableRowWisePlan(const EmbeddingTableConfig& table,
                               absl::Span<const int> ranks);
// The whole table on every rank.
v1::TablePlan DataParallelPlan(const EmbeddingTableConfig& table,
                               int world_size);

// Table-wise, round robin: table i on rank i % world_size.
v1::ShardingPlan DefaultShardingPlan(
    const std::vector<EmbeddingTableConfig>& tables, int world_size);

// InvalidArgument, naming the table (and shard) at fault, unless: the plan's
// world_size equals `world_size`; every table of `tables` has exactly one
// TablePlan and the plan names no other; a plan's num_embeddings and
// embedding_dim, where set (non-zero), equal the table's; each shard's rank
// is in [0, world_size) and no rank holds two shards of one table; and per
// sharding type:
//   DATA_PARALLEL: one shard per rank, each the whole table.
//   TABLE_WISE: one shard, the whole table.
//   ROW_WISE, TABLE_ROW_WISE: shards of full width whose rows tile the
//     table (shards of zero rows allowed); TABLE_ROW_WISE only in a pooled
//     collection (`pooled`), its ranks on one host (rank / local_world_size
//     equal, local_world_size 0 meaning world_size).
//   COLUMN_WISE: shards of full height whose columns tile the table.
// SHARDING_TYPE_UNSPECIFIED is refused, and so is a compute_kernel other
// than COMPUTE_KERNEL_UNSPECIFIED, FUSED or DENSE (FUSED_UVM_CACHING
// included: every shard is built on the module's device).
absl::Status ValidateShardingPlan(
    const v1::ShardingPlan& plan,
    const std::vector<EmbeddingTableConfig>& tables, int world_size,
    bool pooled);

// A block of a [rows, cols] tensor: rows [row_offset, row_offset + rows),
// columns [col_offset, col_offset + cols).
struct TensorBlock {
  int64_t row_offset = 0;
  int64_t rows = 0;
  int64_t col_offset = 0;
  int64_t cols = 0;
};

// The first problem of `blocks` as blocks of a `rows` x `cols` tensor, ""
// when there is none: each lies inside it (no negative number, no sum that
// overflows: the numbers may come from anyone's file), no two overlap, and,
// with `cover`, together they cover it. The problem names the tensor
// (`what`, "table 't0'") and block i ("<what> <kind> <i>", kind "shard" or
// "block"). The one rule for a plan's shards and a checkpoint manifest's
// blocks.
std::string BlocksProblem(const std::vector<TensorBlock>& blocks, int64_t rows,
                          int64_t cols, bool cover, absl::string_view what,
                          absl::string_view kind);

// Reads a plan in protobuf text format (as the planner writes it).
// NotFound when the file cannot be read (with the system's reason);
// InvalidArgument with the parser's line and column for a malformed file,
// or for a plan of no tables (an empty file). Not validated against a
// model: see
// ValidateShardingPlan.
absl::StatusOr<v1::ShardingPlan> ReadShardingPlan(const std::string& path);
// Writes `plan` in text format (atomically: a temporary file, then rename).
absl::Status WriteShardingPlan(const v1::ShardingPlan& plan,
                               const std::string& path);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_SHARDING_SHARDING_PLAN_H_
