// The proposers: the dynamic program against brute force on small random
// instances, greedy and uniform on hand-checked cases.
#include "trainer/planner/proposers.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

namespace deltastream::planner {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

using Items = std::vector<std::vector<DpItem>>;

// The cheapest selection with total bytes < budget, by trying them all;
// infinity when none is feasible.
double BruteForce(const Items& items, int64_t budget) {
  double best = kInfinity;
  std::vector<size_t> choice(items.size(), 0);
  while (true) {
    int64_t bytes = 0;
    double cost = 0;
    for (size_t t = 0; t < items.size(); ++t) {
      bytes += items[t][choice[t]].bytes;
      cost += items[t][choice[t]].cost;
    }
    if (bytes < budget) best = std::min(best, cost);
    size_t t = 0;
    while (t < items.size() && ++choice[t] == items[t].size()) choice[t++] = 0;
    if (t == items.size()) return best;
  }
}

struct Totals {
  int64_t bytes = 0;
  double cost = 0;
};
Totals Sum(const Items& items, const Proposal& selection) {
  Totals totals;
  for (size_t t = 0; t < items.size(); ++t) {
    totals.bytes += items[t][selection[t]].bytes;
    totals.cost += items[t][selection[t]].cost;
  }
  return totals;
}

Items RandomItems(std::mt19937& random) {
  std::uniform_int_distribution<int> tables(1, 6), options(1, 4);
  std::uniform_int_distribution<int64_t> mem(0, 1000);
  std::uniform_real_distribution<double> cost(0, 100);
  Items items(tables(random));
  for (auto& table : items) {
    table.resize(options(random));
    for (DpItem& item : table) {
      item.bytes = mem(random);
      item.cost = cost(random);
    }
  }
  return items;
}

TEST(DynamicProgrammingSelections, MatchesBruteForceWithinBinResolution) {
  std::mt19937 random(17);
  for (int round = 0; round < 300; ++round) {
    const Items items = RandomItems(random);
    const int64_t budget =
        std::uniform_int_distribution<int64_t>(1, 4000)(random);
    const int bins = std::uniform_int_distribution<int>(1, 50)(random);
    const std::vector<Proposal> selections =
        DynamicProgrammingSelections(items, budget, bins);
    double best = kInfinity;
    int64_t previous_bin = bins;
    const double bin_size = static_cast<double>(budget) / bins;
    for (const Proposal& selection : selections) {
      const Totals totals = Sum(items, selection);
      ASSERT_LT(totals.bytes, budget);  // every proposal is feasible
      // From the largest storage down.
      const int64_t bin = static_cast<int64_t>(totals.bytes / bin_size);
      ASSERT_LE(bin, previous_bin);
      previous_bin = bin;
      best = std::min(best, totals.cost);
    }
    const double optimum = BruteForce(items, budget);
    EXPECT_GE(best, optimum - 1e-9);
    // Each table can drift by at most one bin.
    const int64_t tighter =
        budget - static_cast<int64_t>(items.size() * bin_size) - 1;
    const double tighter_optimum = BruteForce(items, tighter);
    if (tighter_optimum < kInfinity) {
      EXPECT_LE(best, tighter_optimum + 1e-9) << "round " << round;
    }
    if (optimum == kInfinity) {
      EXPECT_TRUE(selections.empty());
    }
  }
}

TEST(DynamicProgrammingSelections, ExactWithOneByteBins) {
  std::mt19937 random(3);
  for (int round = 0; round < 100; ++round) {
    const Items items = RandomItems(random);
    const int64_t budget =
        std::uniform_int_distribution<int64_t>(1, 3000)(random);
    const std::vector<Proposal> selections =
        DynamicProgrammingSelections(items, budget, static_cast<int>(budget));
    double best = kInfinity;
    for (const Proposal& selection : selections) {
      best = std::min(best, Sum(items, selection).cost);
    }
    EXPECT_DOUBLE_EQ(best, BruteForce(items, budget)) << "round " << round;
  }
}

TEST(DynamicProgrammingSelections, NothingFeasibleGivesNothing) {
  const Items items = {{{10, 1}}, {{10, 1}}};
  EXPECT_TRUE(DynamicProgrammingSelections(items, 20, 10).empty());
  EXPECT_EQ(DynamicProgrammingSelections(items, 21, 10).size(), 1u);
}

// An option with only what the proposers read.
ShardingOption Option(v1::ShardingType type, double cost, int64_t ddr) {
  ShardingOption option;
  option.type = type;
  option.total_cost = cost;
  option.total_storage = Storage{0, ddr};
  return option;
}

TEST(GreedyProposer, MovesTheLargestTableToItsNextCheapestOption) {
  const OptionsByTable options = {
      {Option(v1::TABLE_WISE, 3, 10), Option(v1::ROW_WISE, 1, 100),
       Option(v1::COLUMN_WISE, 2, 50)},
      {Option(v1::ROW_WISE, 5, 20), Option(v1::TABLE_WISE, 1, 80)}};
  std::unique_ptr<Proposer> greedy = MakeGreedyProposer();
  greedy->Load(options, DefaultTopology(2, false), Storage{0, 1000});
  // By cost: table 0 is 1, 2, 0; table 1 is 1, 0.
  const std::vector<Proposal> expected = {{1, 1}, {2, 1}, {2, 0}, {0, 0}};
  for (const Proposal& proposal : expected) {
    std::optional<Proposal> got = greedy->Propose();
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, proposal);
    greedy->Feedback(false);
  }
  EXPECT_FALSE(greedy->Propose().has_value());
}

TEST(GreedyProposer, StopsAtTheFirstPlanThatFits) {
  const OptionsByTable options = {
      {Option(v1::TABLE_WISE, 1, 10), Option(v1::ROW_WISE, 2, 5)}};
  std::unique_ptr<Proposer> greedy = MakeGreedyProposer();
  greedy->Load(options, DefaultTopology(2, false), Storage{0, 1000});
  ASSERT_EQ(greedy->Propose(), Proposal({0}));
  greedy->Feedback(true);
  EXPECT_FALSE(greedy->Propose().has_value());
}

TEST(UniformProposer, OneProposalPerTypeEveryTableAllows) {
  const OptionsByTable options = {
      {Option(v1::TABLE_WISE, 2, 10), Option(v1::TABLE_WISE, 1, 30),
       Option(v1::ROW_WISE, 3, 10), Option(v1::DATA_PARALLEL, 9, 10)},
      {Option(v1::TABLE_WISE, 5, 10), Option(v1::DATA_PARALLEL, 1, 10),
       Option(v1::ROW_WISE, 4, 10)}};
  std::unique_ptr<Proposer> uniform = MakeUniformProposer();
  uniform->Load(options, DefaultTopology(2, false), Storage{0, 1000});
  // In kShardingTypes order: DATA_PARALLEL, TABLE_WISE (the cheaper TW of
  // table 0), ROW_WISE; no COLUMN_WISE or TABLE_ROW_WISE.
  const std::vector<Proposal> expected = {{3, 1}, {1, 0}, {2, 2}};
  for (const Proposal& proposal : expected) {
    ASSERT_EQ(uniform->Propose(), proposal);
    uniform->Feedback(true);
  }
  EXPECT_FALSE(uniform->Propose().has_value());
}

TEST(DynamicProgrammingProposer, LargestBudgetFirstOrCheapestFirst) {
  // Two tables, each with a big cheap and a small expensive option.
  const OptionsByTable options = {
      {Option(v1::TABLE_WISE, 1, 600), Option(v1::ROW_WISE, 4, 100)},
      {Option(v1::TABLE_WISE, 2, 500), Option(v1::ROW_WISE, 3, 200)}};
  const Topology topology = DefaultTopology(2, false);
  auto storage = [&](const Proposal& p) {
    return options[0][p[0]].total_storage.ddr +
           options[1][p[1]].total_storage.ddr;
  };
  auto cost = [&](const Proposal& p) {
    return options[0][p[0]].total_cost + options[1][p[1]].total_cost;
  };
  std::unique_ptr<Proposer> dp = MakeDynamicProgrammingProposer(50);
  dp->Load(options, topology, Storage{0, 1000});
  std::vector<Proposal> proposals;
  while (std::optional<Proposal> proposal = dp->Propose()) {
    proposals.push_back(*proposal);
    dp->Feedback(false);
  }
  // Every combination fits in 2000 bytes: four, by storage descending.
  ASSERT_EQ(proposals.size(), 4u);
  for (size_t i = 1; i < proposals.size(); ++i) {
    EXPECT_GT(storage(proposals[i - 1]), storage(proposals[i]));
  }
  EXPECT_EQ(proposals.front(), Proposal({0, 0}));  // 1100 bytes, cost 3
  dp->Load(options, topology, Storage{0, 1000});
  dp->OrderByTotalCost();
  double previous = 0;
  int count = 0;
  while (std::optional<Proposal> proposal = dp->Propose()) {
    EXPECT_GE(cost(*proposal), previous);
    previous = cost(*proposal);
    ++count;
    dp->Feedback(true);
  }
  EXPECT_EQ(count, 4);
}

// The DP budgets the memory the tables live in (HBM on GPUs, DDR on
// CPUs), however large: a budget past int64 is no limit, not a negative one.
TEST(DynamicProgrammingProposer, BudgetsTheDeviceMemoryWithoutOverflow) {
  const OptionsByTable cpu_options = {{Option(v1::TABLE_WISE, 1, 600)},
                                      {Option(v1::ROW_WISE, 2, 500)}};
  std::unique_ptr<Proposer> dp = MakeDynamicProgrammingProposer();
  dp->Load(cpu_options, DefaultTopology(4, false),
           Storage{0, std::numeric_limits<int64_t>::max() / 2});
  EXPECT_EQ(dp->Propose(), Proposal({0, 0}));
  dp->Load(cpu_options, DefaultTopology(2, false), Storage{0, 500});
  EXPECT_FALSE(dp->Propose().has_value());  // 1100 bytes > 2 x 500
  OptionsByTable gpu_options = cpu_options;
  for (auto& table : gpu_options) {
    for (ShardingOption& option : table) {
      option.total_storage = Storage{option.total_storage.ddr, 0};
    }
  }
  dp->Load(gpu_options, DefaultTopology(2, true), Storage{600, 0});
  EXPECT_EQ(dp->Propose(), Proposal({0, 0}));
  dp->Load(gpu_options, DefaultTopology(2, true), Storage{500, 1 << 20});
  EXPECT_FALSE(dp->Propose().has_value());
}

TEST(MakeProposer, KnowsTheThreeNames) {
  for (const char* name : {"dp", "greedy", "uniform"}) {
    absl::StatusOr<std::unique_ptr<Proposer>> proposer = MakeProposer(name);
    ASSERT_TRUE(proposer.ok());
    EXPECT_EQ((*proposer)->name(), name);
  }
  EXPECT_EQ(MakeProposer("best").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deltastream::planner
