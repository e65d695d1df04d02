#include "trainer/planner/sharding_option.h"

namespace deltastream::planner {

void ShardingOption::Total() {
  total_storage = Storage();
  total_cost = 0;
  for (const ShardEstimate& shard : shards) {
    total_storage += shard.storage;
    total_cost += shard.cost.total();
  }
}

absl::string_view ShardingTypeName(v1::ShardingType type) {
  switch (type) {
    case v1::DATA_PARALLEL:
      return "DATA_PARALLEL";
    case v1::TABLE_WISE:
      return "TABLE_WISE";
    case v1::ROW_WISE:
      return "ROW_WISE";
    case v1::COLUMN_WISE:
      return "COLUMN_WISE";
    case v1::TABLE_ROW_WISE:
      return "TABLE_ROW_WISE";
    default:
      return "UNSPECIFIED";
  }
}

absl::string_view ShardingTypeShortName(v1::ShardingType type) {
  switch (type) {
    case v1::DATA_PARALLEL:
      return "DP";
    case v1::TABLE_WISE:
      return "TW";
    case v1::ROW_WISE:
      return "RW";
    case v1::COLUMN_WISE:
      return "CW";
    case v1::TABLE_ROW_WISE:
      return "TWRW";
    default:
      return "?";
  }
}

absl::string_view ComputeKernelName(v1::ComputeKernel kernel) {
  switch (kernel) {
    case v1::COMPUTE_KERNEL_UNSPECIFIED:
    case v1::FUSED:
      return "FUSED";
    default:
      return v1::ComputeKernel_Name(kernel);
  }
}

}  // namespace deltastream::planner
