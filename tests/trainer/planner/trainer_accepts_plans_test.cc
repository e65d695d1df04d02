// The planner's plans as the trainer reads them: every plan the planner
// makes passes the trainer's own check (ValidateShardingPlan,
// trainer/sharding), on CPUs and GPUs, whatever the constraints; in
// particular one shard of a table per rank and only the kernels the trainer
// runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/trainer/planner/planner_test_fixtures.h"
#include "trainer/planner/planner.h"
#include "trainer/planner/storage_estimator.h"
#include "trainer/sharding/sharding_plan.h"

namespace deltastream::planner {
namespace {

// The trainer's configs of the planner's tables (the shapes are what the
// check reads).
std::vector<EmbeddingTableConfig> TrainerTables(
    const std::vector<TableSpec>& tables) {
  std::vector<EmbeddingTableConfig> configs;
  for (const TableSpec& table : tables) {
    EmbeddingTableConfig config;
    config.name = table.name;
    config.num_embeddings = table.rows;
    config.embedding_dim = table.dim;
    config.feature_names = {absl::StrCat("f_", table.name)};
    config.dtype = table.element_bytes == 8 ? c10::kDouble : c10::kFloat;
    configs.push_back(config);
  }
  return configs;
}

// Every proposer's plan (when one fits) passes the trainer's check and
// holds at most one shard of a table per rank. Adds the plans checked to
// `*checked`.
void ExpectTheTrainerAcceptsEveryPlan(const std::vector<TableSpec>& tables,
                                      const Topology& topology,
                                      bool require_a_plan, int* checked) {
  const StorageReservation reservation =
      ReserveStorage(topology, tables, 1 << 20, 3);
  for (const char* proposer : {"dp", "greedy", "uniform"}) {
    PlannerOptions options;
    options.proposers = {proposer};
    absl::StatusOr<Plan> plan = MakePlan(tables, OptimizerKind::kAdagrad,
                                         topology, reservation, options);
    if (!plan.ok()) {
      ASSERT_FALSE(require_a_plan) << proposer << ": " << plan.status();
      ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted)
          << plan.status();
      continue;
    }
    ++*checked;
    const v1::ShardingPlan proto = ToProto(*plan, tables, topology);
    for (const v1::TablePlan& table : proto.tables()) {
      std::set<int> ranks;
      for (const v1::Shard& shard : table.shards()) {
        EXPECT_TRUE(ranks.insert(shard.rank()).second)
            << proposer << ": table '" << table.table() << "' has two shards "
            << "on rank " << shard.rank();
      }
    }
    const absl::Status accepted = ValidateShardingPlan(
        proto, TrainerTables(tables), topology.world_size, /*pooled=*/true);
    EXPECT_TRUE(accepted.ok()) << proposer << ": " << accepted;
  }
}

// A table of dim 128 constrained to column-wise on 2 ranks: 4 blocks of the
// default 32 columns would put two on each rank, which the trainer refuses.
TEST(TrainerAcceptsPlans, ColumnWiseOnlyOnTwoRanks) {
  for (bool gpu : {false, true}) {
    std::vector<TableSpec> tables = {Table("wide", 10000, 128),
                                     Table("other", 5000, 128)};
    tables[0].sharding_types = {v1::COLUMN_WISE};
    Topology topology = DefaultTopology(2, gpu);
    topology.hbm_bytes = 4 * kGib;
    topology.ddr_bytes = 8 * kGib;
    int checked = 0;
    ExpectTheTrainerAcceptsEveryPlan(tables, topology, /*require_a_plan=*/true,
                                     &checked);
  }
}

// Random models on CPU and GPU worlds of one and two hosts, some tables
// constrained (row-wise only; table- or column-wise only), GPUs with less
// HBM than DDR (where host-cached tables used to be proposed).
TEST(TrainerAcceptsPlans, RandomModelsAndTopologies) {
  std::mt19937 random(7);
  std::uniform_int_distribution<int64_t> rows(1, 2000000);
  std::uniform_int_distribution<int> dims(0, 4), kind(0, 9);
  const int64_t dim_choices[] = {4, 16, 32, 64, 128};
  struct Case {
    int world, local;
    bool gpu;
  };
  const Case cases[] = {{1, 0, false}, {2, 0, false}, {4, 2, false},
                        {2, 0, true},  {4, 2, true},  {8, 4, true}};
  int checked[2] = {0, 0};  // plans checked on CPUs, GPUs
  for (const Case& c : cases) {
    for (int round = 0; round < 3; ++round) {
      std::vector<TableSpec> tables;
      for (int t = 0; t < 2 + round * 6; ++t) {
        TableSpec table = Table(absl::StrCat("t", t), rows(random),
                                dim_choices[dims(random)]);
        table.pooling_factor = 1 + kind(random);
        if (kind(random) < 2) table.sharding_types = {v1::ROW_WISE};
        if (kind(random) < 4) {
          table.sharding_types = {v1::TABLE_WISE, v1::COLUMN_WISE};
        }
        if (kind(random) == 0) table.min_partition = 4;
        tables.push_back(table);
      }
      Topology topology = DefaultTopology(c.world, c.gpu);
      topology.local_world_size = c.local;
      topology.hbm_bytes = 2 * kGib;
      topology.ddr_bytes = 16 * kGib;
      topology.batch_size = 256;
      ExpectTheTrainerAcceptsEveryPlan(tables, topology,
                                       /*require_a_plan=*/false,
                                       &checked[c.gpu ? 1 : 0]);
    }
  }
  // Most models fit: the check is not vacuous.
  EXPECT_GE(checked[0], 20);
  EXPECT_GE(checked[1], 20);
}

}  // namespace
}  // namespace deltastream::planner
