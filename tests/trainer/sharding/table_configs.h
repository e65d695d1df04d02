#ifndef DELTASTREAM_TESTS_TRAINER_SHARDING_TABLE_CONFIGS_H_
#define DELTASTREAM_TESTS_TRAINER_SHARDING_TABLE_CONFIGS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "proto/plan.pb.h"
#include "trainer/modules/embedding_config.h"
#include "trainer/sharding/sharding_plan.h"

namespace deltastream {
namespace testing {

// Tables and sharding plans of the sharding tests.

// A table config with every field set (-Wmissing-field-initializers).
inline EmbeddingTableConfig Table(const std::string& name, int64_t rows,
                                  int64_t dim,
                                  std::vector<std::string> features,
                                  Pooling pooling = Pooling::kSum) {
  EmbeddingTableConfig table;
  table.name = name;
  table.num_embeddings = rows;
  table.embedding_dim = dim;
  table.feature_names = std::move(features);
  table.pooling = pooling;
  return table;
}

// Every table of `tables` in one layout over `world` ranks, by name:
// "table_wise" (table t on rank (t + 1) % world), "all_on_last_rank",
// "row_wise", "column_wise", "table_row_wise", "data_parallel", or "mixed"
// (table 0 row-wise, 1 column-wise on ranks {world - 1, 0}, 2
// data-parallel, the others table-wise on the last rank).
inline v1::ShardingPlan PlanOfKind(
    const std::string& name, const std::vector<EmbeddingTableConfig>& tables,
    int world) {
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  v1::ShardingPlan plan;
  plan.set_world_size(world);
  for (size_t t = 0; t < tables.size(); ++t) {
    const EmbeddingTableConfig& table = tables[t];
    v1::TablePlan* p = plan.add_tables();
    if (name == "table_wise") {
      *p = TableWisePlan(table, static_cast<int>((t + 1) % world));
    } else if (name == "all_on_last_rank") {
      *p = TableWisePlan(table, world - 1);  // the other ranks hold nothing
    } else if (name == "row_wise") {
      *p = RowWisePlan(table, world);
    } else if (name == "column_wise") {
      *p = ColumnWisePlan(table, all);
    } else if (name == "table_row_wise") {
      *p = TableRowWisePlan(table, all);
    } else if (name == "data_parallel") {
      *p = DataParallelPlan(table, world);
    } else {  // mixed
      switch (t) {
        case 0:
          *p = RowWisePlan(table, world);
          break;
        case 1:
          *p = world > 1 ? ColumnWisePlan(table, {world - 1, 0})
                         : ColumnWisePlan(table, {0});
          break;
        case 2:
          *p = DataParallelPlan(table, world);
          break;
        default:
          *p = TableWisePlan(table, world - 1);
          break;
      }
    }
  }
  return plan;
}

}  // namespace testing
}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_TRAINER_SHARDING_TABLE_CONFIGS_H_
