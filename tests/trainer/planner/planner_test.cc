// The planner: estimators on hand-checked figures, the enumerator's
// options, the partitioners, valid plans on random models and topologies,
// the message when nothing fits, and the config reader.
#include "trainer/planner/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/trainer/planner/planner_test_fixtures.h"
#include "trainer/planner/cost_estimator.h"
#include "trainer/planner/enumerator.h"
#include "trainer/planner/model_spec.h"
#include "trainer/planner/partitioners.h"
#include "trainer/planner/plan_report.h"
#include "trainer/planner/proposers.h"
#include "trainer/planner/storage_estimator.h"

namespace deltastream::planner {
namespace {

using ::testing::HasSubstr;

Topology Cpu(int world_size, int64_t ddr = 8 * kGib) {
  Topology topology = DefaultTopology(world_size, false);
  topology.ddr_bytes = ddr;
  return topology;
}

TEST(StorageEstimator, OptimizerStatesByOptimizer) {
  EXPECT_EQ(OptimizerStateBytes(100, 16, 4, OptimizerKind::kSgd), 0);
  EXPECT_EQ(OptimizerStateBytes(100, 16, 4, OptimizerKind::kAdagrad), 6400);
  EXPECT_EQ(OptimizerStateBytes(100, 16, 4, OptimizerKind::kRowwiseAdagrad),
            400);
  EXPECT_EQ(OptimizerStateBytes(100, 16, 8, OptimizerKind::kAdam), 25600);
  EXPECT_EQ(ShardTensorBytes(100, 16, 4, OptimizerKind::kRowwiseAdagrad), 6800);
}

TEST(StorageEstimator, IoBuffersFromBatchWorldAndPoolingFactor) {
  TableSpec table = Table("t", 1000, 16);
  table.pooling_factor = 2;
  Topology topology = Cpu(4);
  topology.batch_size = 100;
  // Table-wise: every rank's 200 IDs (8 bytes), 100 pooled rows each.
  ShardIo io = EstimateShardIo(table, v1::TABLE_WISE, 1000, 16, topology);
  EXPECT_EQ(io.input_bytes, 4 * 200 * 8);
  EXPECT_EQ(io.output_bytes, 4 * 100 * 16 * 4);
  // Row-wise: a quarter of the IDs, partial sums for every example.
  io = EstimateShardIo(table, v1::ROW_WISE, 250, 16, topology);
  EXPECT_EQ(io.input_bytes, 200 * 8);
  EXPECT_EQ(io.output_bytes, 4 * 100 * 16 * 4);
  // Data-parallel as trainer/sharding replicates: every rank's IDs and
  // outputs on every rank.
  io = EstimateShardIo(table, v1::DATA_PARALLEL, 1000, 16, topology);
  EXPECT_EQ(io.input_bytes, 4 * 200 * 8);
  EXPECT_EQ(io.output_bytes, 4 * 100 * 16 * 4);
  // Sequence: a row per ID.
  table.pooled = false;
  io = EstimateShardIo(table, v1::TABLE_WISE, 1000, 8, topology);
  EXPECT_EQ(io.output_bytes, 4 * 200 * 8 * 4);
  EXPECT_EQ(EstimateShardIo(table, v1::ROW_WISE, 0, 16, topology).input_bytes,
            0);
}

TEST(StorageEstimator, AllOnTheRanksDevice) {
  Topology gpu = DefaultTopology(2, true);
  gpu.hbm_bytes = 16 * kGib;
  gpu.ddr_bytes = 64 * kGib;
  const ShardIo io{100, 200};
  const Storage on_gpu = EstimateShardStorage(1000, io, gpu);
  EXPECT_EQ(on_gpu.hbm, 1300);
  EXPECT_EQ(on_gpu.ddr, 0);
  const Storage cpu = EstimateShardStorage(1000, io, Cpu(2));
  EXPECT_EQ(cpu.hbm, 0);
  EXPECT_EQ(cpu.ddr, 1300);
}

TEST(StorageEstimator, ReservationPercentDenseAndKjt) {
  Topology topology = Cpu(2, 1000 * 1000);
  topology.batch_size = 10;
  std::vector<TableSpec> tables = {Table("a", 10, 4), Table("b", 10, 4)};
  const StorageReservation reservation =
      ReserveStorage(topology, tables, 1000, 3);
  EXPECT_EQ(reservation.percent.ddr, 150000);
  EXPECT_EQ(reservation.dense, 3000);
  EXPECT_EQ(reservation.kjt, 20 * 10 * 2 * 8);
  EXPECT_EQ(reservation.total.ddr, 150000 + 3000 + 3200);
  EXPECT_EQ(UsableStorage(topology, reservation).ddr, 1000 * 1000 - 156200);
}

TEST(CostEstimator, NoCommsOnOneRankAndDataParallelAsTheShardedModulesDoIt) {
  const TableSpec table = Table("t", 100000, 64);
  const Cost alone =
      EstimateShardCost(table, v1::TABLE_WISE, 100000, 64, Cpu(1));
  EXPECT_GT(alone.fwd_compute, 0);
  EXPECT_DOUBLE_EQ(alone.bwd_compute,
                   Cpu(1).bwd_compute_multiplier * alone.fwd_compute);
  EXPECT_EQ(alone.fwd_comms, 0);
  EXPECT_EQ(alone.bwd_comms, 0);

  // Table-wise on 4 ranks, batch 512, one ID per example, by hand: 2048
  // IDs looked up, 2048 rows of 256 bytes written; 3/4 of the IDs come
  // from other ranks and 3/4 of the rows go back.
  Topology cpu4 = Cpu(4);
  cpu4.batch_size = 512;
  const Cost tw = EstimateShardCost(table, v1::TABLE_WISE, 100000, 64, cpu4);
  const double forward =
      (2048.0 * 8 + 2048.0 * 256 + 2048.0 * 256) / cpu4.ddr_bw +
      2048 * cpu4.lookup_seconds_per_id;
  EXPECT_NEAR(tw.fwd_compute, forward * 1e3, 1e-9);
  EXPECT_NEAR(tw.bwd_compute, forward * cpu4.bwd_compute_multiplier * 1e3,
              1e-9);
  const double ids_in = 2048.0 * 8 * 0.75 / cpu4.intra_host_bw * 1e3;
  const double rows_out = 2048.0 * 256 * 0.75 / cpu4.intra_host_bw * 1e3;
  EXPECT_NEAR(tw.fwd_comms, ids_in + rows_out, 1e-9);
  EXPECT_NEAR(tw.bwd_comms, rows_out, 1e-9);

  // Data-parallel as trainer/sharding replicates a table: every rank looks
  // up every rank's IDs (the same compute as the table-wise shard) and
  // receives them (the same input all-to-all), keeps its own rows (no
  // forward output comms) and all-gathers the output gradients backward.
  const Cost dp = EstimateShardCost(table, v1::DATA_PARALLEL, 100000, 64, cpu4);
  EXPECT_NEAR(dp.fwd_compute, tw.fwd_compute, 1e-9);
  EXPECT_NEAR(dp.bwd_compute, tw.bwd_compute, 1e-9);
  EXPECT_NEAR(dp.fwd_comms, ids_in, 1e-9);
  EXPECT_NEAR(dp.bwd_comms, rows_out, 1e-9);
  EXPECT_EQ(EstimateShardCost(table, v1::ROW_WISE, 0, 64, Cpu(4)).total(), 0);
}

TEST(CostEstimator, RankCostsOfAnyPlan) {
  const std::vector<TableSpec> tables = {Table("a", 1000, 16),
                                         Table("b", 500, 32)};
  Topology topology = Cpu(2);
  v1::ShardingPlan plan;
  plan.set_world_size(2);
  for (const TableSpec& table : tables) {
    v1::TablePlan* t = plan.add_tables();
    t->set_table(table.name);
    t->set_sharding_type(v1::TABLE_WISE);
    t->set_num_embeddings(table.rows);
    t->set_embedding_dim(table.dim);
    v1::Shard* shard = t->add_shards();
    shard->set_rank(table.name == "a" ? 0 : 1);
    shard->set_rows(table.rows);
    shard->set_cols(table.dim);
  }
  absl::StatusOr<std::vector<Cost>> costs =
      EstimateRankCosts(plan, tables, topology);
  ASSERT_TRUE(costs.ok()) << costs.status();
  ASSERT_EQ(costs->size(), 2u);
  EXPECT_DOUBLE_EQ(
      (*costs)[0].total(),
      EstimateShardCost(tables[0], v1::TABLE_WISE, 1000, 16, topology).total());
  EXPECT_DOUBLE_EQ(
      (*costs)[1].total(),
      EstimateShardCost(tables[1], v1::TABLE_WISE, 500, 32, topology).total());
  // Refused: another world size, or a plan that misses a table.
  EXPECT_FALSE(EstimateRankCosts(plan, tables, Cpu(4)).ok());
  plan.mutable_tables()->RemoveLast();
  EXPECT_THAT(EstimateRankCosts(plan, tables, topology).status().message(),
              HasSubstr("'b' is not planned"));
}

TEST(Topology, EnvironmentOverridesInTorchRecsUnits) {
  Topology topology = Cpu(2);
  setenv("INTRA_NODE_BANDWIDTH", "2000000", 1);  // bytes per ms: 2 GB/s
  setenv("LOOKUP_NS_PER_ID", "50", 1);
  setenv("BWD_COMPUTE_MULTIPLIER", "3", 1);
  ASSERT_TRUE(ApplyTopologyEnvironment(&topology).ok());
  EXPECT_DOUBLE_EQ(topology.intra_host_bw, 2e9);
  EXPECT_DOUBLE_EQ(topology.lookup_seconds_per_id, 50e-9);
  EXPECT_DOUBLE_EQ(topology.bwd_compute_multiplier, 3);
  setenv("DDR_MEM_BW", "fast", 1);
  EXPECT_THAT(ApplyTopologyEnvironment(&topology).message(),
              HasSubstr("DDR_MEM_BW='fast' is not a number"));
  for (const char* name : {"INTRA_NODE_BANDWIDTH", "LOOKUP_NS_PER_ID",
                           "BWD_COMPUTE_MULTIPLIER", "DDR_MEM_BW"}) {
    unsetenv(name);
  }
}

TEST(Enumerator, TypesKernelsAndShards) {
  TableSpec wide = Table("wide", 1001, 128);
  TableSpec narrow = Table("narrow", 10, 16);
  Topology topology = Cpu(4);
  topology.local_world_size = 2;
  absl::StatusOr<OptionsByTable> options =
      EnumerateOptions({wide, narrow}, OptimizerKind::kAdam, topology);
  ASSERT_TRUE(options.ok()) << options.status();
  std::vector<v1::ShardingType> types;
  for (const ShardingOption& option : (*options)[0]) {
    types.push_back(option.type);
    EXPECT_EQ(option.kernel,
              option.type == v1::DATA_PARALLEL ? v1::DENSE : v1::FUSED);
  }
  EXPECT_EQ(types, std::vector<v1::ShardingType>(std::begin(kShardingTypes),
                                                 std::end(kShardingTypes)));
  // Narrow: no column-wise (16 < 2 x 32).
  EXPECT_EQ((*options)[1].size(), 4u);
  for (const ShardingOption& option : (*options)[0]) {
    if (option.type == v1::ROW_WISE) {
      ASSERT_EQ(option.shards.size(), 4u);
      EXPECT_EQ(option.shards[0].rows, 251);
      EXPECT_EQ(option.shards[3].rows, 248);
      EXPECT_EQ(option.shards[3].row_offset, 753);
      EXPECT_EQ(option.shards[2].rank, 2);
    }
    if (option.type == v1::COLUMN_WISE) {
      ASSERT_EQ(option.shards.size(), 4u);
      EXPECT_EQ(option.shards[3].col_offset, 96);
      EXPECT_EQ(option.shards[3].rank, -1);
    }
    if (option.type == v1::TABLE_ROW_WISE) {
      EXPECT_EQ(option.shards.size(), 2u);
    }
  }
  // Constraints: only row-wise; column-wise in blocks of 50 (the last
  // takes the rest).
  wide.sharding_types = {v1::ROW_WISE};
  options = EnumerateOptions({wide}, OptimizerKind::kSgd, topology);
  ASSERT_TRUE(options.ok());
  ASSERT_EQ((*options)[0].size(), 1u);
  wide.min_partition = 50;
  wide.sharding_types = {v1::COLUMN_WISE};
  options = EnumerateOptions({wide}, OptimizerKind::kSgd, topology);
  ASSERT_TRUE(options.ok());
  ASSERT_EQ((*options)[0][0].shards.size(), 2u);
  EXPECT_EQ((*options)[0][0].shards[1].cols, 78);
  // A constraint that leaves nothing.
  wide.min_partition = 65;
  EXPECT_THAT(EnumerateOptions({wide}, OptimizerKind::kSgd, topology)
                  .status()
                  .message(),
              HasSubstr("'wide'"));
}

// The trainer builds every shard on the rank's device: on GPUs every
// option is FUSED (DENSE data-parallel) and all of it in HBM.
TEST(Enumerator, GpuOptionsKeepEverythingOnTheDevice) {
  Topology gpu = DefaultTopology(4, true);
  gpu.local_world_size = 2;
  gpu.hbm_bytes = kGib;
  gpu.ddr_bytes = 64 * kGib;
  absl::StatusOr<OptionsByTable> options =
      EnumerateOptions({Table("wide", 100000, 128), Table("narrow", 10, 16)},
                       OptimizerKind::kAdam, gpu);
  ASSERT_TRUE(options.ok()) << options.status();
  for (const std::vector<ShardingOption>& table : *options) {
    for (const ShardingOption& option : table) {
      EXPECT_EQ(option.kernel,
                option.type == v1::DATA_PARALLEL ? v1::DENSE : v1::FUSED)
          << ShardingTypeName(option.type);
      for (const ShardEstimate& shard : option.shards) {
        EXPECT_EQ(shard.storage.ddr, 0) << ShardingTypeName(option.type);
      }
    }
  }
}

// Column-wise shards: blocks of min_partition columns, but never more than
// one per rank (the trainer refuses two shards of a table on one rank).
TEST(Enumerator, ColumnWiseAtMostOneShardPerRank) {
  TableSpec table = Table("t", 1000, 128);
  table.sharding_types = {v1::COLUMN_WISE};
  auto widths = [&](int world) {
    std::vector<int64_t> cols;
    absl::StatusOr<OptionsByTable> options =
        EnumerateOptions({table}, OptimizerKind::kSgd, Cpu(world));
    EXPECT_TRUE(options.ok()) << options.status();
    if (!options.ok()) return cols;
    int64_t offset = 0;
    for (const ShardEstimate& shard : (*options)[0][0].shards) {
      EXPECT_EQ(shard.col_offset, offset);
      offset += shard.cols;
      cols.push_back(shard.cols);
    }
    EXPECT_EQ(offset, table.dim);
    return cols;
  };
  EXPECT_EQ(widths(8), std::vector<int64_t>({32, 32, 32, 32}));
  EXPECT_EQ(widths(4), std::vector<int64_t>({32, 32, 32, 32}));
  EXPECT_EQ(widths(3), std::vector<int64_t>({42, 42, 44}));
  EXPECT_EQ(widths(2), std::vector<int64_t>({64, 64}));
  EXPECT_EQ(widths(1), std::vector<int64_t>({128}));
  table.dim = 100;
  EXPECT_EQ(widths(8), std::vector<int64_t>({32, 32, 36}));
  EXPECT_EQ(widths(2), std::vector<int64_t>({50, 50}));
}

// Numbers out of range are refused, never turned into odd shards or
// undefined conversions.
TEST(Enumerator, RefusesBadNumbers) {
  // A min_partition whose double overflows: no column-wise option (not
  // one of zero shards).
  TableSpec table = Table("t", 1000, 128);
  table.min_partition = std::numeric_limits<int64_t>::max();
  absl::StatusOr<OptionsByTable> options =
      EnumerateOptions({table}, OptimizerKind::kSgd, Cpu(2));
  ASSERT_TRUE(options.ok()) << options.status();
  for (const ShardingOption& option : (*options)[0]) {
    EXPECT_NE(option.type, v1::COLUMN_WISE);
    EXPECT_FALSE(option.shards.empty()) << ShardingTypeName(option.type);
  }
  table.sharding_types = {v1::COLUMN_WISE};
  EXPECT_EQ(
      EnumerateOptions({table}, OptimizerKind::kSgd, Cpu(2)).status().code(),
      absl::StatusCode::kInvalidArgument);
  // Pooling factors that are not finite numbers >= 0.
  for (double pooling : {std::numeric_limits<double>::quiet_NaN(),
                         std::numeric_limits<double>::infinity(), -1.0}) {
    TableSpec busy = Table("busy", 1000, 16);
    busy.pooling_factor = pooling;
    const absl::Status status =
        EnumerateOptions({busy}, OptimizerKind::kSgd, Cpu(2)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << pooling;
    EXPECT_THAT(status.message(), HasSubstr("'busy'")) << pooling;
    EXPECT_THAT(status.message(), HasSubstr("pooling_factor")) << pooling;
  }
}

// Table-wise options with the given costs and storage, one shard each.
std::vector<ShardingOption> TableWise(const std::vector<double>& costs,
                                      const std::vector<int64_t>& storage) {
  std::vector<ShardingOption> options;
  for (size_t i = 0; i < costs.size(); ++i) {
    ShardingOption option;
    option.table = static_cast<int>(i);
    option.shards.resize(1);
    option.shards[0].storage = Storage{0, storage[i]};
    option.shards[0].cost.fwd_compute = costs[i];
    option.Total();
    options.push_back(option);
  }
  return options;
}

std::vector<const ShardingOption*> Pointers(
    const std::vector<ShardingOption>& options) {
  std::vector<const ShardingOption*> pointers;
  for (const ShardingOption& option : options) pointers.push_back(&option);
  return pointers;
}

TEST(Partitioner, GreedyPutsTheMostExpensiveFirstOnTheLeastLoaded) {
  const std::vector<ShardingOption> options =
      TableWise({2, 3, 2, 1}, {10, 10, 10, 10});
  const Partition partition =
      PartitionShards(Pointers(options), Cpu(2), Storage{0, 100},
                      PartitionStrategy::kGreedyCost);
  ASSERT_TRUE(partition.ok());
  // 3 -> 0, 2 -> 1, 2 -> 1 (2 < 3), 1 -> 0.
  EXPECT_EQ(partition.ranks[1][0], 0);
  EXPECT_EQ(partition.ranks[0][0], 1);
  EXPECT_EQ(partition.ranks[2][0], 1);
  EXPECT_EQ(partition.ranks[3][0], 0);
  EXPECT_DOUBLE_EQ(partition.max_cost, 4);
  EXPECT_EQ(partition.used[0].ddr, 20);
}

TEST(Partitioner, GreedySkipsRanksWithoutRoom) {
  const std::vector<ShardingOption> options =
      TableWise({5, 1, 1}, {60, 50, 30});
  const Partition partition =
      PartitionShards(Pointers(options), Cpu(2), Storage{0, 100},
                      PartitionStrategy::kGreedyCost);
  ASSERT_TRUE(partition.ok());
  // 5 -> 0 (60), 1 -> 1 (50), 1 -> 1 (least cost, 80 <= 100).
  EXPECT_EQ(partition.ranks[2][0], 1);
  // By cost the two small ones go to different ranks; the large one then
  // finds 70 of its 80 bytes on either.
  const std::vector<ShardingOption> tight = TableWise({5, 4, 1}, {30, 30, 80});
  const Partition fails = PartitionShards(
      Pointers(tight), Cpu(2), Storage{0, 100}, PartitionStrategy::kGreedyCost);
  ASSERT_EQ(fails.unplaced.size(), 1u);
  EXPECT_EQ(fails.unplaced[0].table, 2);
  EXPECT_EQ(fails.unplaced[0].missing.ddr, 10);
  EXPECT_EQ(fails.unplaced[0].rank, 0);
  // Memory-balanced places the largest first and fits all three.
  const Partition balanced =
      PartitionShards(Pointers(tight), Cpu(2), Storage{0, 100},
                      PartitionStrategy::kMemoryBalanced);
  EXPECT_TRUE(balanced.ok());
}

// Shards of one table go to different ranks, whatever the costs say: the
// trainer holds at most one shard of a table per rank.
TEST(Partitioner, NeverPutsTwoShardsOfATableOnOneRank) {
  // An expensive table-wise table, then two cheap column-wise shards: by
  // cost alone both would go to the idle rank.
  std::vector<ShardingOption> options = TableWise({10}, {10});
  ShardingOption columns;
  columns.table = 1;
  columns.type = v1::COLUMN_WISE;
  columns.shards.resize(2);
  for (ShardEstimate& shard : columns.shards) {
    shard.storage = Storage{0, 10};
    shard.cost.fwd_compute = 1;
  }
  columns.Total();
  options.push_back(columns);
  for (PartitionStrategy strategy :
       {PartitionStrategy::kGreedyCost, PartitionStrategy::kMemoryBalanced}) {
    const Partition partition =
        PartitionShards(Pointers(options), Cpu(2), Storage{0, 100}, strategy);
    ASSERT_TRUE(partition.ok()) << PartitionStrategyName(strategy);
    EXPECT_NE(partition.ranks[1][0], partition.ranks[1][1])
        << PartitionStrategyName(strategy);
  }
  // Three shards of one table on two ranks: one finds no rank.
  options[1].shards.resize(3, options[1].shards[0]);
  options[1].Total();
  const Partition three =
      PartitionShards(Pointers(options), Cpu(2), Storage{0, 100},
                      PartitionStrategy::kGreedyCost);
  ASSERT_EQ(three.unplaced.size(), 1u);
  EXPECT_EQ(three.unplaced[0].table, 1);
}

// Random models: pooled or not, float or double, some constraints.
std::vector<TableSpec> RandomTables(std::mt19937& random, int count) {
  std::uniform_int_distribution<int64_t> rows(1, 2000000);
  std::uniform_int_distribution<int> dims(0, 4), kind(0, 9);
  const int64_t dim_choices[] = {4, 16, 32, 64, 128};
  std::vector<TableSpec> tables;
  for (int t = 0; t < count; ++t) {
    TableSpec table =
        Table(absl::StrCat("t", t), rows(random), dim_choices[dims(random)]);
    table.element_bytes = kind(random) == 0 ? 8 : 4;
    table.pooling_factor = 1 + kind(random);
    if (kind(random) == 0) table.sharding_types = {v1::ROW_WISE};
    if (kind(random) == 1)
      table.sharding_types = {v1::TABLE_WISE, v1::COLUMN_WISE};
    tables.push_back(table);
  }
  return tables;
}

TEST(Planner, PlansAreValidOnRandomModelsAndTopologies) {
  std::mt19937 random(5);
  struct Case {
    int world, local;
    bool gpu;
  };
  const Case cases[] = {{1, 0, false}, {2, 0, false}, {4, 2, false},
                        {8, 4, false}, {2, 0, true},  {8, 2, true}};
  for (const Case& c : cases) {
    for (int round = 0; round < 4; ++round) {
      const std::vector<TableSpec> tables = RandomTables(random, 1 + round * 7);
      Topology topology = DefaultTopology(c.world, c.gpu);
      topology.local_world_size = c.local;
      topology.hbm_bytes = 2 * kGib;
      topology.ddr_bytes = 8 * kGib;
      topology.batch_size = 256;
      const StorageReservation reservation =
          ReserveStorage(topology, tables, 1 << 20, 3);
      for (const char* proposer : {"dp", "greedy", "uniform"}) {
        PlannerOptions options;
        options.proposers = {proposer};
        absl::StatusOr<Plan> plan = MakePlan(tables, OptimizerKind::kAdagrad,
                                             topology, reservation, options);
        if (!plan.ok()) {
          // Only a plan that does not fit may be refused.
          ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted)
              << plan.status();
          continue;
        }
        const v1::ShardingPlan proto = ToProto(*plan, tables, topology);
        EXPECT_TRUE(ValidatePlan(proto, tables, &plan->usable).ok())
            << ValidatePlan(proto, tables, &plan->usable);
        for (const RankStats& rank : plan->ranks) {
          EXPECT_TRUE(rank.used.FitsIn(plan->usable));
        }
        EXPECT_GE(plan->imbalance(), 1 - 1e-9);
        EXPECT_TRUE(plan->proposer == proposer || plan->proposer == "smallest")
            << plan->proposer;
      }
    }
  }
}

TEST(Planner, AllProposersDoAtLeastAsWellAsEach) {
  std::mt19937 random(11);
  const std::vector<TableSpec> tables = RandomTables(random, 40);
  Topology topology = Cpu(8, 2 * kGib);
  const StorageReservation reservation = ReserveStorage(topology, tables, 0, 3);
  absl::StatusOr<Plan> all =
      MakePlan(tables, OptimizerKind::kRowwiseAdagrad, topology, reservation);
  ASSERT_TRUE(all.ok()) << all.status();
  for (const char* proposer : {"dp", "greedy", "uniform"}) {
    PlannerOptions options;
    options.proposers = {proposer};
    absl::StatusOr<Plan> one = MakePlan(tables, OptimizerKind::kRowwiseAdagrad,
                                        topology, reservation, options);
    if (one.ok()) {
      EXPECT_LE(all->max_cost, one->max_cost + 1e-12) << proposer;
    }
  }
}

// Branch and bound finds the plan that partitioning every proposal finds.
TEST(Planner, BoundedSearchFindsTheBestOfAllProposals) {
  std::mt19937 random(23);
  for (int round = 0; round < 6; ++round) {
    const std::vector<TableSpec> tables = RandomTables(random, 12);
    Topology topology = Cpu(4, 512 << 20);
    topology.local_world_size = 2;
    const StorageReservation reservation =
        ReserveStorage(topology, tables, 0, 2);
    const Storage usable = UsableStorage(topology, reservation);
    absl::StatusOr<OptionsByTable> options =
        EnumerateOptions(tables, OptimizerKind::kSgd, topology);
    ASSERT_TRUE(options.ok());
    std::unique_ptr<Proposer> dp = MakeDynamicProgrammingProposer();
    dp->Load(*options, topology, usable);
    double best = std::numeric_limits<double>::infinity();
    while (std::optional<Proposal> proposal = dp->Propose()) {
      std::vector<const ShardingOption*> chosen;
      for (size_t t = 0; t < proposal->size(); ++t) {
        chosen.push_back(&(*options)[t][(*proposal)[t]]);
      }
      for (PartitionStrategy strategy : {PartitionStrategy::kGreedyCost,
                                         PartitionStrategy::kMemoryBalanced}) {
        const Partition partition =
            PartitionShards(chosen, topology, usable, strategy);
        if (partition.ok()) {
          // MakePlan tries memory-balanced only when greedy fails.
          best = std::min(best, partition.max_cost);
          break;
        }
      }
      dp->Feedback(true);
    }
    PlannerOptions planner_options;
    planner_options.proposers = {"dp"};
    planner_options.max_proposals = 1 << 20;
    absl::StatusOr<Plan> plan = MakePlan(tables, OptimizerKind::kSgd, topology,
                                         reservation, planner_options);
    if (best == std::numeric_limits<double>::infinity()) {
      EXPECT_FALSE(plan.ok() && plan->proposer == "dp");
      continue;
    }
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_DOUBLE_EQ(plan->max_cost, best) << "round " << round;
  }
}

// The world and the DP's bins drive the planner's work and memory: past
// their maximum (kMaxWorldSize, kMaxDpBinsPerDevice) MakePlan refuses them
// before enumerating anything; at it, it plans.
TEST(Planner, RefusesWorldsAndBinsPastTheirMaximum) {
  const std::vector<TableSpec> tables = {Table("t", 1000, 16)};
  auto plan = [&](int world_size, int bins) {
    const Topology topology = Cpu(world_size);
    PlannerOptions options;
    options.dp_bins_per_device = bins;
    return MakePlan(tables, OptimizerKind::kSgd, topology,
                    ReserveStorage(topology, tables, 0, 2), options)
        .status();
  };
  EXPECT_TRUE(plan(kMaxWorldSize, kMaxDpBinsPerDevice).ok());
  for (int world_size : {kMaxWorldSize + 1, 100000000}) {
    const absl::Status status = plan(world_size, 100);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("world_size must be in [1, 4096]"));
    EXPECT_EQ(ValidateTopology(Cpu(world_size)).code(),
              absl::StatusCode::kInvalidArgument);
  }
  for (int bins : {0, kMaxDpBinsPerDevice + 1}) {
    const absl::Status status = plan(2, bins);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bins;
    EXPECT_THAT(status.message(),
                HasSubstr("dp_bins_per_device must be in [1, 1000]"));
  }
}

// The bounds' one check each, which callers use before they plan (the CLI
// names its flags): the range and the value, after `what`.
TEST(Planner, BoundChecksNameWhatTheyCheck) {
  for (int world_size : {1, kMaxWorldSize}) {
    EXPECT_TRUE(ValidateWorldSize("--world_size", world_size).ok());
  }
  for (int world_size : {0, -1, kMaxWorldSize + 1}) {
    const absl::Status status = ValidateWorldSize("--world_size", world_size);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(
        status.message(),
        absl::StrCat("--world_size must be in [1, 4096], got ", world_size));
  }
  for (int bins : {1, kMaxDpBinsPerDevice}) {
    EXPECT_TRUE(ValidateDpBinsPerDevice("--dp_bins_per_device", bins).ok());
  }
  for (int bins : {0, kMaxDpBinsPerDevice + 1}) {
    const absl::Status status =
        ValidateDpBinsPerDevice("--dp_bins_per_device", bins);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(
        status.message(),
        absl::StrCat("--dp_bins_per_device must be in [1, 1000], got ", bins));
  }
}

TEST(ValidatePlan, CatchesBrokenPlans) {
  const std::vector<TableSpec> tables = {Table("a", 100, 64)};
  const Topology topology = Cpu(2);
  absl::StatusOr<Plan> plan = MakePlan(tables, OptimizerKind::kSgd, topology,
                                       ReserveStorage(topology, tables, 0, 2));
  ASSERT_TRUE(plan.ok());
  v1::ShardingPlan proto = ToProto(*plan, tables, topology);
  ASSERT_TRUE(ValidatePlan(proto, tables).ok());
  v1::ShardingPlan broken = proto;
  broken.mutable_tables(0)->set_sharding_type(v1::COLUMN_WISE);
  broken.mutable_tables(0)->clear_shards();
  auto* shard = broken.mutable_tables(0)->add_shards();
  shard->set_rows(100);
  shard->set_cols(40);
  EXPECT_THAT(ValidatePlan(broken, tables).message(), HasSubstr("cover"));
  auto* overlap = broken.mutable_tables(0)->add_shards();
  overlap->set_rank(1);
  overlap->set_rows(100);
  overlap->set_col_offset(30);
  overlap->set_cols(34);
  EXPECT_THAT(ValidatePlan(broken, tables).message(), HasSubstr("overlap"));
  broken = proto;
  broken.add_tables()->CopyFrom(proto.tables(0));
  EXPECT_THAT(ValidatePlan(broken, tables).message(), HasSubstr("twice"));
  broken = proto;
  broken.mutable_tables(0)->mutable_shards(0)->set_rank(2);
  EXPECT_THAT(ValidatePlan(broken, tables).message(), HasSubstr("rank 2"));
  broken = proto;
  broken.clear_tables();
  EXPECT_THAT(ValidatePlan(broken, tables).message(), HasSubstr("not planned"));
  const Storage tiny{0, 10};
  EXPECT_THAT(ValidatePlan(proto, tables, &tiny).message(), HasSubstr("over"));
}

TEST(ValidatePlan, OneShardOfATablePerRankAndKernelsTheTrainerRuns) {
  std::vector<TableSpec> tables = {Table("wide", 1000, 128)};
  tables[0].sharding_types = {v1::COLUMN_WISE};
  const Topology topology = Cpu(2);
  absl::StatusOr<Plan> plan = MakePlan(tables, OptimizerKind::kSgd, topology,
                                       ReserveStorage(topology, tables, 0, 2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const v1::ShardingPlan proto = ToProto(*plan, tables, topology);
  ASSERT_TRUE(ValidatePlan(proto, tables).ok()) << ValidatePlan(proto, tables);
  ASSERT_EQ(proto.tables(0).shards_size(), 2);
  v1::ShardingPlan broken = proto;
  broken.mutable_tables(0)->mutable_shards(1)->set_rank(
      proto.tables(0).shards(0).rank());
  EXPECT_THAT(ValidatePlan(broken, tables).message(), HasSubstr("two shards"));
  broken = proto;
  broken.mutable_tables(0)->set_compute_kernel(v1::FUSED_UVM_CACHING);
  EXPECT_THAT(ValidatePlan(broken, tables).message(),
              HasSubstr("FUSED_UVM_CACHING"));
}

TEST(Planner, SmallTablesOnManyRanksSpreadTableWise) {
  std::vector<TableSpec> tables;
  for (int t = 0; t < 8; ++t)
    tables.push_back(Table(absl::StrCat("t", t), 100000, 16));
  const Topology topology = Cpu(4);
  absl::StatusOr<Plan> plan =
      MakePlan(tables, OptimizerKind::kRowwiseAdagrad, topology,
               ReserveStorage(topology, tables, 0, 3));
  ASSERT_TRUE(plan.ok());
  for (const RankStats& rank : plan->ranks) {
    EXPECT_EQ(rank.shards.at(v1::TABLE_WISE), 2);
  }
  EXPECT_NEAR(plan->imbalance(), 1, 1e-9);
  const std::string report = FormatPlanReport(*plan, tables, topology);
  EXPECT_THAT(report, HasSubstr("imbalance (max / mean) 1.000"));
  EXPECT_THAT(FormatPlanJson(*plan, tables, topology),
              HasSubstr("\"sharding_type\":\"TABLE_WISE\""));
}

TEST(Planner, NothingFitsSaysWhichTablesRanksAndWhatWouldHelp) {
  std::vector<TableSpec> tables = {Table("huge", 50000000, 128),
                                   Table("small", 1000, 16)};
  Topology topology = Cpu(2, 4 * kGib);
  absl::StatusOr<Plan> plan = MakePlan(tables, OptimizerKind::kAdam, topology,
                                       ReserveStorage(topology, tables, 0, 3));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string message(plan.status().message());
  EXPECT_THAT(message, HasSubstr("table 'huge'"));
  EXPECT_THAT(message, HasSubstr("missing (its shards need"));
  EXPECT_THAT(message, HasSubstr("more ranks"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("a smaller batch")));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("'small'")));
  // I/O buffers that do not fit: a smaller batch would help (no
  // reservation here).
  TableSpec busy = Table("busy", 1000, 16);
  busy.pooling_factor = 300000;
  plan =
      MakePlan({busy}, OptimizerKind::kSgd, Cpu(2, kGib), StorageReservation());
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("a smaller batch"));
  // Constrained to table-wise, a table that fits row-wise.
  tables = {Table("wide", 8000000, 128)};
  tables[0].sharding_types = {v1::TABLE_WISE};
  topology = Cpu(4, 4 * kGib);
  plan = MakePlan(tables, OptimizerKind::kSgd, topology,
                  ReserveStorage(topology, tables, 0, 2));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("fewer constraints"));
  EXPECT_THAT(plan.status().message(), HasSubstr("more memory per rank"));
  tables[0].sharding_types.clear();
  EXPECT_TRUE(MakePlan(tables, OptimizerKind::kSgd, topology,
                       ReserveStorage(topology, tables, 0, 2))
                  .ok());
  // A reservation that takes everything.
  const StorageReservation greedy_reservation =
      ReserveStorage(topology, tables, 8 * kGib, 2);
  plan = MakePlan(tables, OptimizerKind::kSgd, topology, greedy_reservation);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("a smaller reservation"));
}

// A GPU rank keeps every table in its HBM: a table larger than the HBM
// does not fit, however much host memory there is, and the message speaks
// of HBM.
TEST(Planner, NothingFitsOnGpusSpeaksOfHbm) {
  const std::vector<TableSpec> tables = {Table("big", 20000000, 64),
                                         Table("small", 1000, 16)};
  Topology gpu = DefaultTopology(2, true);
  gpu.hbm_bytes = kGib;
  gpu.ddr_bytes = 256 * kGib;
  absl::StatusOr<Plan> plan = MakePlan(tables, OptimizerKind::kSgd, gpu,
                                       ReserveStorage(gpu, tables, 0, 2));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted)
      << (plan.ok() ? ToProto(*plan, tables, gpu).DebugString()
                    : plan.status().ToString());
  const std::string message(plan.status().message());
  EXPECT_THAT(message, HasSubstr("1.00 GiB HBM per rank"));
  EXPECT_THAT(message, HasSubstr("table 'big'"));
  EXPECT_THAT(message, HasSubstr("of HBM in all"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("DDR")));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("'small'")));
}

TEST(ModelSpec, DefaultsMatchTheTrainer) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfig(v1::TrainerConfig());
  ASSERT_TRUE(spec.ok());
  ASSERT_EQ(spec->tables.size(), 8u);
  EXPECT_EQ(spec->tables[7].name, "t7");
  EXPECT_EQ(spec->tables[0].rows, 100000);
  EXPECT_EQ(spec->tables[0].dim, 16);
  EXPECT_EQ(spec->batch_size, 512);
  EXPECT_EQ(spec->optimizer, OptimizerKind::kRowwiseAdagrad);
  EXPECT_FALSE(spec->gpu);
  absl::StatusOr<v1::TrainerConfig> config = ParseConfigText(R"(
    model { kind: "sequence" dense_arch: [8] tables { name: "s"
            num_embeddings: 10 embedding_dim: 8 feature_names: ["a", "b"]
            dtype: "double" }
            sparse_optimizer { type: "adam" } }
    data { batch_size: 64 synthetic { min_length: 2 max_length: 6 } }
    device: "cuda")");
  ASSERT_TRUE(config.ok());
  spec = ModelSpecFromConfig(*config);
  ASSERT_TRUE(spec.ok());
  EXPECT_FALSE(spec->tables[0].pooled);
  EXPECT_EQ(spec->tables[0].element_bytes, 8);
  EXPECT_DOUBLE_EQ(spec->tables[0].pooling_factor, 8);  // 2 features x 4
  EXPECT_EQ(spec->optimizer, OptimizerKind::kAdam);
  EXPECT_EQ(spec->batch_size, 64);
  EXPECT_TRUE(spec->gpu);
  EXPECT_THAT(ParseConfigText("model { tables { nam: 1 } }").status().message(),
              HasSubstr("line 1"));
  config->mutable_model()->mutable_sparse_optimizer()->set_type("lion");
  EXPECT_THAT(ModelSpecFromConfig(*config).status().message(),
              HasSubstr("lion"));
}

TEST(ModelSpec, Constraints) {
  std::vector<TableSpec> tables = {Table("a", 10, 64), Table("b", 10, 8)};
  absl::StatusOr<v1::PlannerConstraints> constraints = ParseConstraintsText(R"(
    tables { table: "a" sharding_types: [ROW_WISE, COLUMN_WISE]
             min_partition: 16 pooling_factor: 3 placement: PLACEMENT_DEVICE })");
  ASSERT_TRUE(constraints.ok()) << constraints.status();
  ASSERT_TRUE(ApplyConstraints(*constraints, &tables).ok());
  EXPECT_EQ(tables[0].sharding_types.size(), 2u);
  EXPECT_EQ(tables[0].min_partition, 16);
  EXPECT_DOUBLE_EQ(tables[0].pooling_factor, 3);
  constraints->mutable_tables(0)->set_table("c");
  EXPECT_THAT(ApplyConstraints(*constraints, &tables).message(),
              HasSubstr("'c'"));
}

TEST(ModelSpec, ConstraintsRefuseRepeatsBadNumbersAndHostPlacement) {
  const std::vector<TableSpec> model = {Table("a", 10, 64), Table("b", 10, 8)};
  auto apply = [&](const std::string& text) {
    absl::StatusOr<v1::PlannerConstraints> constraints =
        ParseConstraintsText(text);
    EXPECT_TRUE(constraints.ok()) << constraints.status();
    std::vector<TableSpec> tables = model;
    return ApplyConstraints(*constraints, &tables);
  };
  // The second entry would silently replace the first.
  absl::Status status = apply(R"(
    tables { table: "a" sharding_types: [ROW_WISE] }
    tables { table: "b" }
    tables { table: "a" pooling_factor: 3 })");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("table 'a' is constrained twice"));
  for (const char* pooling : {"nan", "inf", "-inf", "-1"}) {
    status = apply(
        absl::StrCat("tables { table: \"a\" pooling_factor: ", pooling, " }"));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << pooling;
    EXPECT_THAT(status.message(), HasSubstr("pooling_factor")) << pooling;
  }
  // Wider than the table (and 2 x it would overflow).
  status = apply("tables { table: \"a\" min_partition: 9223372036854775807 }");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("min_partition"));
  EXPECT_TRUE(apply("tables { table: \"a\" min_partition: 64 }").ok());
  // Host memory with a device cache: the trainer cannot run it (it used to
  // be refused on CPUs only).
  status = apply("tables { table: \"a\" placement: PLACEMENT_HOST }");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("PLACEMENT_HOST"));
  EXPECT_TRUE(
      apply("tables { table: \"a\" placement: PLACEMENT_DEVICE }").ok());
}

}  // namespace
}  // namespace deltastream::planner
