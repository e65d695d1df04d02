#include "trainer/planner/enumerator.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "trainer/planner/cost_estimator.h"
#include "trainer/planner/storage_estimator.h"

namespace deltastream::planner {
namespace {

int64_t MinPartition(const TableSpec& table) {
  return table.min_partition > 0 ? table.min_partition : kDefaultMinPartition;
}

bool Applies(const TableSpec& table, v1::ShardingType type,
             const Topology& topology) {
  switch (type) {
    case v1::DATA_PARALLEL:
    case v1::TABLE_WISE:
      return true;
    case v1::ROW_WISE:  // on one rank the same as TABLE_WISE, but allowed
      return true;
    case v1::COLUMN_WISE:  // dim >= 2 x min_partition, without overflow
      return table.dim / 2 >= MinPartition(table);
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

// The kernels the trainer runs: every shard on the rank's device.
v1::ComputeKernel Kernel(v1::ShardingType type) {
  return type == v1::DATA_PARALLEL ? v1::DENSE : v1::FUSED;
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
      // Blocks of min_partition columns, or of dim / N when that is wider:
      // at most one shard per rank (the trainer holds one shard of a table
      // per rank). The last block takes the rest.
      const int64_t width =
          std::max(MinPartition(table), table.dim / topology.world_size);
      const int64_t count =
          std::min<int64_t>(table.dim / width, topology.world_size);
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

// A table's shape and numbers as the estimators need them.
absl::Status CheckNumbers(const TableSpec& table) {
  auto invalid = [&](absl::string_view message) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", table.name, "': ", message));
  };
  if (table.rows <= 0 || table.dim <= 0 || table.element_bytes <= 0) {
    return invalid(absl::StrCat(
        "rows, dim and element size must be positive, got ", table.rows, " x ",
        table.dim, " of ", table.element_bytes, " bytes"));
  }
  // Weights and up to two optimizer states (Adam) must stay far inside
  // int64: 2^53 bytes (8 PiB) is more than any rank holds.
  if (3.0 * static_cast<double>(table.rows) * static_cast<double>(table.dim) *
          static_cast<double>(table.element_bytes) >
      9007199254740992.0) {
    return invalid(absl::StrCat(table.rows, " x ", table.dim,
                                " is too large (over 8 PiB with its "
                                "optimizer states)"));
  }
  if (!(table.pooling_factor >= 0) || !std::isfinite(table.pooling_factor)) {
    return invalid(
        absl::StrCat("pooling_factor must be a finite number >= 0, got ",
                     table.pooling_factor));
  }
  if (table.min_partition < 0) {
    return invalid(
        absl::StrCat("min_partition must be >= 0, got ", table.min_partition));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::vector<ShardingOption>>> EnumerateOptions(
    absl::Span<const TableSpec> tables, OptimizerKind optimizer,
    const Topology& topology) {
  std::vector<std::vector<ShardingOption>> options(tables.size());
  for (size_t t = 0; t < tables.size(); ++t) {
    const TableSpec& table = tables[t];
    if (absl::Status status = CheckNumbers(table); !status.ok()) {
      return status;
    }
    for (v1::ShardingType type : kShardingTypes) {
      if (!Applies(table, type, topology) || !Allowed(table, type)) continue;
      ShardingOption option;
      option.table = static_cast<int>(t);
      option.type = type;
      option.kernel = Kernel(type);
      option.shards = Rectangles(table, type, topology);
      for (ShardEstimate& shard : option.shards) {
        const ShardIo io =
            EstimateShardIo(table, type, shard.rows, shard.cols, topology);
        shard.input_bytes = io.input_bytes;
        shard.output_bytes = io.output_bytes;
        shard.storage = EstimateShardStorage(
            ShardTensorBytes(shard.rows, shard.cols, table.element_bytes,
                             optimizer),
            io, topology);
        shard.cost =
            EstimateShardCost(table, type, shard.rows, shard.cols, topology);
      }
      option.Total();
      options[t].push_back(std::move(option));
    }
    if (options[t].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table.name,
          "': its constraints (sharding types, min_partition) allow no "
          "sharding option on this topology"));
    }
  }
  return options;
}

}  // namespace deltastream::planner
