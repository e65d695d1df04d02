#include "trainer/planner/enumerator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "trainer/planner/cost_estimator.h"
#include "trainer/planner/storage_estimator.h"

namespace deltastream::planner {
namespace {

bool Applies(const TableSpec& table, v1::ShardingType type,
             const Topology& topology) {
  const int64_t min_partition =
      table.min_partition > 0 ? table.min_partition : kDefaultMinPartition;
  switch (type) {
    case v1::DATA_PARALLEL:
    case v1::TABLE_WISE:
      return true;
    case v1::ROW_WISE:  // on one rank the same as TABLE_WISE, but allowed
      return true;
    case v1::COLUMN_WISE:
      return table.dim >= 2 * min_partition;
    case v1::TABLE_ROW_WISE:
      return table.pooled && topology.hosts() > 1;
    default:
      return false;
  }
}

bool Allowed(const TableSpec& table, v1::ShardingType type) {
  return table.sharding_types.empty() ||
         std::find(table.sharding_types.begin(), table.sharding_types.end(),
                   type) != table.sharding_types.end();
}

std::vector<v1::ComputeKernel> Kernels(const TableSpec& table,
                                       v1::ShardingType type,
                                       const Topology& topology) {
  if (type == v1::DATA_PARALLEL) {
    if (table.placement == Placement::kHost) return {};
    return {v1::DENSE};
  }
  if (!topology.gpu) {
    if (table.placement == Placement::kHost) return {};
    return {v1::FUSED};
  }
  switch (table.placement) {
    case Placement::kDevice:
      return {v1::FUSED};
    case Placement::kHost:
      return {v1::FUSED_UVM_CACHING};
    default:
      return {v1::FUSED, v1::FUSED_UVM_CACHING};
  }
}

// The shards' rectangles (and fixed ranks) of `type`.
std::vector<ShardEstimate> Rectangles(const TableSpec& table,
                                      v1::ShardingType type,
                                      const Topology& topology) {
  std::vector<ShardEstimate> shards;
  auto add = [&](int64_t row_offset, int64_t rows, int64_t col_offset,
                 int64_t cols, int rank) {
    ShardEstimate shard;
    shard.row_offset = row_offset;
    shard.rows = rows;
    shard.col_offset = col_offset;
    shard.cols = cols;
    shard.rank = rank;
    shards.push_back(shard);
  };
  switch (type) {
    case v1::DATA_PARALLEL:
      for (int rank = 0; rank < topology.world_size; ++rank) {
        add(0, table.rows, 0, table.dim, rank);
      }
      break;
    case v1::TABLE_WISE:
      add(0, table.rows, 0, table.dim, -1);
      break;
    case v1::ROW_WISE:
    case v1::TABLE_ROW_WISE: {
      const int blocks = type == v1::ROW_WISE ? topology.world_size
                                              : topology.ranks_per_host();
      const int64_t block = (table.rows + blocks - 1) / blocks;
      for (int i = 0; i < blocks; ++i) {
        const int64_t begin = std::min(table.rows, block * i);
        const int64_t end = std::min(table.rows, block * (i + 1));
        add(begin, end - begin, 0, table.dim,
            type == v1::ROW_WISE ? i : -1 - i);
      }
      break;
    }
    case v1::COLUMN_WISE: {
      const int64_t width =
          table.min_partition > 0 ? table.min_partition : kDefaultMinPartition;
      const int64_t count = table.dim / width;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t cols = i + 1 == count ? table.dim - width * i : width;
        add(0, table.rows, width * i, cols, -1);
      }
      break;
    }
    default:
      break;
  }
  return shards;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<ShardingOption>>> EnumerateOptions(
    absl::Span<const TableSpec> tables, OptimizerKind optimizer,
    const Topology& topology) {
  std::vector<std::vector<ShardingOption>> options(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    const TableSpec& table = tables[t];
    if (table.rows <= 0 || table.dim <= 0 || table.element_bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table.name,
                       "': rows, dim and element size must be "
                       "positive, got ",
                       table.rows, " x ", table.dim));
    }
    for (v1::ShardingType type : kShardingTypes) {
      if (!Applies(table, type, topology) || !Allowed(table, type)) continue;
      for (v1::ComputeKernel kernel : Kernels(table, type, topology)) {
        ShardingOption option;
        option.table = static_cast<int>(t);
        option.type = type;
        option.kernel = kernel;
        option.shards = Rectangles(table, type, topology);
        for (ShardEstimate& shard : option.shards) {
          const ShardIo io =
              EstimateShardIo(table, type, shard.rows, shard.cols, topology);
          shard.input_bytes = io.input_bytes;
          shard.output_bytes = io.output_bytes;
          shard.storage = EstimateShardStorage(
              ShardTensorBytes(shard.rows, shard.cols, table.element_bytes,
                               optimizer),
              io, kernel, topology);
          shard.cost = EstimateShardCost(table, type, kernel, shard.rows,
                                         shard.cols, topology);
        }
        option.Total();
        options[t].push_back(std::move(option));
      }
    }
    if (options[t].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table.name,
          "': its constraints (sharding types, placement) allow no sharding "
          "option on this topology"));
    }
  }
  return options;
}

}  // namespace deltastream::planner
