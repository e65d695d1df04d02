#include "trainer/sharding/sharding_plan.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/file_io.h"
#include "base/text_proto.h"

namespace deltastream {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

v1::TablePlan Plan(const EmbeddingTableConfig& table, v1::ShardingType type) {
  v1::TablePlan plan;
  plan.set_table(table.name);
  plan.set_sharding_type(type);
  plan.set_compute_kernel(type == v1::DATA_PARALLEL ? v1::DENSE : v1::FUSED);
  plan.set_num_embeddings(table.num_embeddings);
  plan.set_embedding_dim(table.embedding_dim);
  return plan;
}

void AddShard(v1::TablePlan& plan, int rank, int64_t row_offset, int64_t rows,
              int64_t col_offset, int64_t cols) {
  v1::Shard* shard = plan.add_shards();
  shard->set_rank(rank);
  shard->set_row_offset(row_offset);
  shard->set_rows(rows);
  shard->set_col_offset(col_offset);
  shard->set_cols(cols);
}

v1::TablePlan RowBlocks(const EmbeddingTableConfig& table,
                        v1::ShardingType type, absl::Span<const int> ranks) {
  v1::TablePlan plan = Plan(table, type);
  const int64_t block =
      CeilDiv(table.num_embeddings, static_cast<int64_t>(ranks.size()));
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int64_t begin = std::min<int64_t>(i * block, table.num_embeddings);
    const int64_t end = std::min<int64_t>(begin + block, table.num_embeddings);
    AddShard(plan, ranks[i], begin, end - begin, 0, table.embedding_dim);
  }
  return plan;
}

std::string ShardName(const v1::TablePlan& plan, int index) {
  return absl::StrCat("table '", plan.table(), "' shard ", index);
}

// The shards' rectangles are inside the table, disjoint, and cover it.
absl::Status CheckTiling(const v1::TablePlan& plan, int64_t rows, int64_t dim) {
  std::vector<TensorBlock> blocks;
  for (const v1::Shard& s : plan.shards()) {
    blocks.push_back({s.row_offset(), s.rows(), s.col_offset(), s.cols()});
  }
  const std::string problem =
      BlocksProblem(blocks, rows, dim, /*cover=*/true,
                    absl::StrCat("table '", plan.table(), "'"), "shard");
  if (problem.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(problem);
}

absl::Status CheckTablePlan(const v1::TablePlan& plan,
                            const EmbeddingTableConfig& table, int world_size,
                            int local_world_size, bool pooled) {
  const std::string name = absl::StrCat("table '", table.name, "'");
  if ((plan.num_embeddings() != 0 &&
       plan.num_embeddings() != table.num_embeddings) ||
      (plan.embedding_dim() != 0 &&
       plan.embedding_dim() != table.embedding_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": planned as ", plan.num_embeddings(), " x ",
                     plan.embedding_dim(), " but the model has ",
                     table.num_embeddings, " x ", table.embedding_dim));
  }
  if (plan.shards().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, " has no shards"));
  }
  std::set<int> ranks;
  for (int i = 0; i < plan.shards_size(); ++i) {
    const int rank = plan.shards(i).rank();
    if (rank < 0 || rank >= world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(ShardName(plan, i), ": rank ", rank, " outside [0, ",
                       world_size, ")"));
    }
    if (!ranks.insert(rank).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": rank ", rank, " holds two shards (one per rank at most)"));
    }
  }
  const int64_t rows = table.num_embeddings;
  const int64_t dim = table.embedding_dim;
  auto all_shards = [&](auto&& ok, absl::string_view rule) -> absl::Status {
    for (int i = 0; i < plan.shards_size(); ++i) {
      if (!ok(plan.shards(i))) {
        return absl::InvalidArgumentError(absl::StrCat(
            ShardName(plan, i), " breaks ",
            v1::ShardingType_Name(plan.sharding_type()), "'s rule: ", rule));
      }
    }
    return absl::OkStatus();
  };
  auto whole = [&](const v1::Shard& s) {
    return s.row_offset() == 0 && s.rows() == rows && s.col_offset() == 0 &&
           s.cols() == dim;
  };
  auto full_width = [&](const v1::Shard& s) {
    return s.col_offset() == 0 && s.cols() == dim;
  };
  auto full_height = [&](const v1::Shard& s) {
    return s.row_offset() == 0 && s.rows() == rows;
  };
  switch (plan.sharding_type()) {
    case v1::DATA_PARALLEL:
      if (plan.shards_size() != world_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": DATA_PARALLEL needs one shard per rank (",
                         world_size, "), got ", plan.shards_size()));
      }
      return all_shards(whole, "every shard is the whole table");
    case v1::TABLE_WISE:
      if (plan.shards_size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": TABLE_WISE needs exactly one shard"));
      }
      return all_shards(whole, "the shard is the whole table");
    case v1::TABLE_ROW_WISE: {
      if (!pooled) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": TABLE_ROW_WISE applies to pooled collections only"));
      }
      const int host = plan.shards(0).rank() / local_world_size;
      if (absl::Status s = all_shards(
              [&](const v1::Shard& shard) {
                return shard.rank() / local_world_size == host;
              },
              "every shard on one host");
          !s.ok()) {
        return s;
      }
      [[fallthrough]];
    }
    case v1::ROW_WISE:
      if (absl::Status s = all_shards(full_width, "shards of full width");
          !s.ok()) {
        return s;
      }
      return CheckTiling(plan, rows, dim);
    case v1::COLUMN_WISE:
      if (absl::Status s = all_shards(full_height, "shards of full height");
          !s.ok()) {
        return s;
      }
      return CheckTiling(plan, rows, dim);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": no sharding type"));
  }
}

}  // namespace

v1::TablePlan TableWisePlan(const EmbeddingTableConfig& table, int rank) {
  v1::TablePlan plan = Plan(table, v1::TABLE_WISE);
  AddShard(plan, rank, 0, table.num_embeddings, 0, table.embedding_dim);
  return plan;
}

v1::TablePlan RowWisePlan(const EmbeddingTableConfig& table, int world_size) {
  std::vector<int> ranks(world_size);
  for (int r = 0; r < world_size; ++r) ranks[r] = r;
  return RowBlocks(table, v1::ROW_WISE, ranks);
}

v1::TablePlan ColumnWisePlan(const EmbeddingTableConfig& table,
                             absl::Span<const int> ranks) {
  v1::TablePlan plan = Plan(table, v1::COLUMN_WISE);
  const int64_t block =
      CeilDiv(table.embedding_dim, static_cast<int64_t>(ranks.size()));
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int64_t begin = std::min<int64_t>(i * block, table.embedding_dim);
    const int64_t end = std::min<int64_t>(begin + block, table.embedding_dim);
    AddShard(plan, ranks[i], 0, table.num_embeddings, begin, end - begin);
  }
  return plan;
}

v1::TablePlan TableRowWisePlan(const EmbeddingTableConfig& table,
                               absl::Span<const int> ranks) {
  return RowBlocks(table, v1::TABLE_ROW_WISE, ranks);
}

v1::TablePlan DataParallelPlan(const EmbeddingTableConfig& table,
                               int world_size) {
  v1::TablePlan plan = Plan(table, v1::DATA_PARALLEL);
  for (int r = 0; r < world_size; ++r) {
    AddShard(plan, r, 0, table.num_embeddings, 0, table.embedding_dim);
  }
  return plan;
}

v1::ShardingPlan DefaultShardingPlan(
    const std::vector<EmbeddingTableConfig>& tables, int world_size) {
  v1::ShardingPlan plan;
  plan.set_world_size(world_size);
  plan.set_proposer("table_wise_round_robin");
  for (size_t t = 0; t < tables.size(); ++t) {
    *plan.add_tables() =
        TableWisePlan(tables[t], static_cast<int>(t % world_size));
  }
  return plan;
}

std::string BlocksProblem(const std::vector<TensorBlock>& blocks, int64_t rows,
                          int64_t cols, bool cover, absl::string_view what,
                          absl::string_view kind) {
  int64_t area = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const TensorBlock& b = blocks[i];
    if (b.row_offset < 0 || b.rows < 0 || b.col_offset < 0 || b.cols < 0 ||
        b.row_offset > rows || b.rows > rows - b.row_offset ||
        b.col_offset > cols || b.cols > cols - b.col_offset) {
      return absl::StrCat(what, " ", kind, " ", i, " (rows ", b.row_offset, "+",
                          b.rows, ", cols ", b.col_offset, "+", b.cols,
                          ") lies outside its ", rows, " x ", cols);
    }
    for (size_t j = 0; j < i; ++j) {
      const TensorBlock& o = blocks[j];
      const bool rows_overlap = b.row_offset < o.row_offset + o.rows &&
                                o.row_offset < b.row_offset + b.rows;
      const bool cols_overlap = b.col_offset < o.col_offset + o.cols &&
                                o.col_offset < b.col_offset + b.cols;
      if (rows_overlap && cols_overlap) {
        return absl::StrCat(what, " ", kind, " ", i, " overlaps ", kind, " ",
                            j);
      }
    }
    // Inside and disjoint: the areas add up to at most rows x cols.
    area += b.rows * b.cols;
  }
  if (cover && area != rows * cols) {
    return absl::StrCat(what, ": ", kind, "s cover ", area, " of ", rows * cols,
                        " entries");
  }
  return "";
}

absl::Status ValidateShardingPlan(
    const v1::ShardingPlan& plan,
    const std::vector<EmbeddingTableConfig>& tables, int world_size,
    bool pooled) {
  if (plan.world_size() != world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan is for world size ", plan.world_size(),
                     ", the job has ", world_size, " ranks"));
  }
  const int local_world_size =
      plan.local_world_size() > 0 ? plan.local_world_size() : world_size;
  std::map<std::string, const v1::TablePlan*> by_name;
  for (const v1::TablePlan& table_plan : plan.tables()) {
    if (!by_name.emplace(table_plan.table(), &table_plan).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the plan names table '", table_plan.table(), "' twice"));
    }
  }
  for (const EmbeddingTableConfig& table : tables) {
    auto it = by_name.find(table.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the plan has no entry for table '", table.name, "'"));
    }
    // Every shard is built on the module's device: a table the plan puts in
    // host memory (FUSED_UVM_CACHING) would be allocated whole there.
    const v1::ComputeKernel kernel = it->second->compute_kernel();
    if (kernel != v1::COMPUTE_KERNEL_UNSPECIFIED && kernel != v1::FUSED &&
        kernel != v1::DENSE) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table.name, "': compute kernel ",
          v1::ComputeKernel_IsValid(kernel) ? v1::ComputeKernel_Name(kernel)
                                            : absl::StrCat(kernel),
          " is not supported (the trainer keeps every shard on the rank's "
          "device: FUSED, DENSE or unset)"));
    }
    if (absl::Status s = CheckTablePlan(*it->second, table, world_size,
                                        local_world_size, pooled);
        !s.ok()) {
      return s;
    }
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the plan names table '", by_name.begin()->first,
                     "', which the module does not have"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ShardingPlan> ReadShardingPlan(const std::string& path) {
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat("sharding plan: ", text.status().message()));
  }
  v1::ShardingPlan plan;
  if (absl::Status parsed = ParseTextProto(*text, &plan); !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sharding plan '", path,
        "' is not a ShardingPlan in text format: ", parsed.message()));
  }
  if (plan.tables().empty()) {
    // An empty file parses: it would stand for the default plan unseen.
    return absl::InvalidArgumentError(
        absl::StrCat("sharding plan '", path, "' plans no tables"));
  }
  return plan;
}

absl::Status WriteShardingPlan(const v1::ShardingPlan& plan,
                               const std::string& path) {
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(plan, &text)) {
    return absl::InternalError("cannot print the sharding plan");
  }
  return WriteFileDurably(path, text);
}

}  // namespace deltastream
