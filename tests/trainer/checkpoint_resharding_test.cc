// Sharded checkpoints on real processes (Gloo on loopback): a model saved by
// 2 ranks under a mixed plan (row-wise, column-wise, data-parallel and
// table-wise tables) is restored by 4 ranks, by 2 ranks under another plan
// and by one unsharded process, for Adagrad, row-wise Adagrad and Adam, and
// every restored table and optimizer state equals the saved global one
// (tests/trainer/checkpoint_fixtures.h says what that is; equality is exact:
// resharding only copies, the row-wise Adagrad mean is exact in double).
// An error on one rank, or a dead rank, fails the save on every rank and
// leaves no complete checkpoint.
//
// The binary also writes such a checkpoint for the Python tests:
//   checkpoint_resharding_test --write_checkpoint=DIR
// (DIR/<optimizer>/checkpoint-000000000007, saved by 2 ranks).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/test_dirs.h"
#include "tests/trainer/checkpoint_fixtures.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "trainer/checkpoint.h"
#include "trainer/comm/process_group.h"
#include "trainer/sharding/sharding_plan.h"

namespace deltastream {
namespace {

namespace fs = std::filesystem;
using ::deltastream::testing::CheckKnownStates;
using ::deltastream::testing::CheckpointTables;
using ::deltastream::testing::GlobalWeight;
using ::deltastream::testing::MakeCheckpointModel;
using ::deltastream::testing::RankResult;
using ::deltastream::testing::RunRanks;
using ::deltastream::testing::SetKnownStates;

constexpr int64_t kStep = 7;

const std::vector<std::pair<std::string, SparseOptimizerType>>& Optimizers() {
  static const auto* optimizers =
      new std::vector<std::pair<std::string, SparseOptimizerType>>{
          {"adagrad", SparseOptimizerType::kAdagrad},
          {"rowwise_adagrad", SparseOptimizerType::kRowwiseAdagrad},
          {"adam", SparseOptimizerType::kAdam}};
  return *optimizers;
}

// "saved" (2 ranks), "four" (4 ranks) and "other" (2 ranks).
v1::ShardingPlan Plan(const std::string& name, int world) {
  const std::vector<EmbeddingTableConfig> t = CheckpointTables();
  v1::ShardingPlan plan;
  plan.set_world_size(world);
  if (name == "saved") {
    *plan.add_tables() = RowWisePlan(t[0], world);
    *plan.add_tables() = ColumnWisePlan(t[1], {1, 0});
    *plan.add_tables() = DataParallelPlan(t[2], world);
    *plan.add_tables() = TableWisePlan(t[3], 1);
  } else if (name == "four") {
    *plan.add_tables() = ColumnWisePlan(t[0], {0, 1, 2, 3});
    *plan.add_tables() = RowWisePlan(t[1], world);
    *plan.add_tables() = TableWisePlan(t[2], 3);
    *plan.add_tables() = DataParallelPlan(t[3], world);
  } else {
    *plan.add_tables() = TableWisePlan(t[0], 0);
    *plan.add_tables() = TableRowWisePlan(t[1], {0, 1});
    *plan.add_tables() = RowWisePlan(t[2], world);
    *plan.add_tables() = ColumnWisePlan(t[3], {0, 1});
  }
  return plan;
}

#define RANK_OK(expr)                                              \
  do {                                                             \
    absl::Status _s = (expr);                                      \
    if (!_s.ok()) {                                                \
      std::fprintf(stderr, "FAILED: %s\n", _s.ToString().c_str()); \
      return 3;                                                    \
    }                                                              \
  } while (0)

int RunScenario(const std::string& scenario) {
  absl::Duration timeout = absl::Seconds(30);
  if (const char* t = std::getenv("TEST_COLLECTIVE_TIMEOUT_S")) {
    timeout = absl::Seconds(std::atoi(t));
  }
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      ProcessGroup::FromEnvironment(c10::Device(c10::kCPU), timeout);
  RANK_OK(group.status());
  const int world = (*group)->world_size();
  const std::string dir = std::getenv("CHECKPOINT_DIR");
  const std::string plan_name =
      std::getenv("PLAN") != nullptr ? std::getenv("PLAN") : "saved";
  for (const auto& [name, optimizer] : Optimizers()) {
    absl::StatusOr<std::unique_ptr<Dlrm>> model = MakeCheckpointModel(
        optimizer, 1, group->get(), Plan(plan_name, world));
    RANK_OK(model.status());
    torch::optim::SGD dense_optimizer((*model)->dense().parameters(),
                                      torch::optim::SGDOptions(0.1));
    const std::string sub = absl::StrCat(dir, "/", name);
    if (scenario == "load") {
      std::optional<std::string> latest = LatestCheckpoint(sub);
      if (!latest.has_value()) RANK_OK(absl::NotFoundError(sub));
      absl::StatusOr<CheckpointInfo> info =
          LoadCheckpoint(*latest, **model, dense_optimizer, group->get());
      RANK_OK(info.status());
      if (info->step != kStep || info->examples != 10 * kStep) {
        RANK_OK(absl::InternalError("wrong step or examples"));
      }
      RANK_OK(CheckKnownStates(**model, Plan("saved", 2)));
      std::printf("rank %d loaded %s under plan %s\n", (*group)->rank(),
                  name.c_str(), plan_name.c_str());
      continue;
    }
    RANK_OK(SetKnownStates(**model));
    if (scenario == "dead" && (*group)->rank() == 1) kill(getpid(), SIGKILL);
    RANK_OK(SaveCheckpoint(sub, kStep, 10 * kStep, **model, dense_optimizer,
                           1, group->get())
                .status());
  }
  return 0;
}

void ExpectAllPassed(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n"
                                       << results[r].output;
  }
}

std::set<std::string> Keys(const std::string& file) {
  std::set<std::string> keys;
  absl::StatusOr<std::map<std::string, at::Tensor>> tensors =
      ReadCheckpointTensors(file);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  if (tensors.ok()) {
    for (const auto& [key, tensor] : *tensors) keys.insert(key);
  }
  return keys;
}

TEST(CheckpointReshardingTest, SavedByTwoRanksRestoresUnderAnyLayout) {
  const std::string dir = FreshDir("resharding");
  ExpectAllPassed(RunRanks("save", 2, absl::Seconds(120),
                           {{"CHECKPOINT_DIR", dir}}));
  const std::string checkpoint =
      absl::StrCat(dir, "/adagrad/checkpoint-000000000007");
  ASSERT_EQ(LatestCheckpoint(dir + "/adagrad"), checkpoint);

  // Rank 0's file: its shards, the data-parallel table, the dense part;
  // rank 1's: its shards only.
  const std::string fqn = "sparse_arch.embedding_bag_collection.embedding_bags";
  std::set<std::string> rank0 = Keys(checkpoint + "/rank-00000-of-00002.pt");
  std::set<std::string> rank1 = Keys(checkpoint + "/rank-00001-of-00002.pt");
  for (const char* table : {"t0", "t1", "t2"}) {
    EXPECT_EQ(rank0.count(absl::StrCat(fqn, ".", table, ".weight")), 1u)
        << table;
  }
  EXPECT_EQ(rank0.count(fqn + ".t3.weight"), 0u);
  EXPECT_EQ(rank0.count("dense_optimizer"), 1u);
  EXPECT_EQ(rank1.count(fqn + ".t2.weight"), 0u);  // data-parallel: once
  EXPECT_EQ(rank1.count(fqn + ".t3.weight"), 1u);
  EXPECT_EQ(rank1.count("dense_optimizer"), 0u);

  ExpectAllPassed(RunRanks("load", 4, absl::Seconds(120),
                           {{"CHECKPOINT_DIR", dir}, {"PLAN", "four"}}));
  ExpectAllPassed(RunRanks("load", 2, absl::Seconds(120),
                           {{"CHECKPOINT_DIR", dir}, {"PLAN", "other"}}));

  // One unsharded process.
  for (const auto& [name, optimizer] : Optimizers()) {
    SCOPED_TRACE(name);
    absl::StatusOr<std::unique_ptr<Dlrm>> model =
        MakeCheckpointModel(optimizer, 2);
    ASSERT_TRUE(model.ok()) << model.status();
    torch::optim::SGD dense_optimizer((*model)->dense().parameters(),
                                      torch::optim::SGDOptions(0.1));
    const std::string path =
        absl::StrCat(dir, "/", name, "/checkpoint-000000000007");
    absl::StatusOr<CheckpointInfo> info =
        LoadCheckpoint(path, **model, dense_optimizer);
    ASSERT_TRUE(info.ok()) << info.status();
    absl::Status same = CheckKnownStates(**model, Plan("saved", 2));
    EXPECT_TRUE(same.ok()) << same;

    // ReadCheckpointModel assembles the whole tables.
    absl::StatusOr<deltastream::CheckpointModel> read =
        ReadCheckpointModel(path);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->step, kStep);
    const std::vector<EmbeddingTableConfig> tables = CheckpointTables();
    ASSERT_EQ(read->tables.size(), tables.size());
    for (size_t t = 0; t < tables.size(); ++t) {
      const std::string table = absl::StrCat(fqn, ".", tables[t].name);
      ASSERT_EQ(read->tables.count(table), 1u) << table;
      EXPECT_TRUE(at::equal(read->tables[table],
                            GlobalWeight(static_cast<int64_t>(t), tables[t])))
          << table;
    }
    EXPECT_EQ(read->dense.size(),
              (*model)->dense().named_parameters().size());
  }
}

TEST(CheckpointReshardingTest, AnErrorOnOneRankFailsEveryRank) {
  const std::string dir = FreshDir("one_fails");
  // Rank 1's file cannot be renamed into place: a directory is there.
  for (const auto& [name, optimizer] : Optimizers()) {
    fs::create_directories(absl::StrCat(
        dir, "/", name, "/checkpoint-000000000007/rank-00001-of-00002.pt/x"));
  }
  std::vector<RankResult> results =
      RunRanks("save", 2, absl::Seconds(60), {{"CHECKPOINT_DIR", dir}});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << results[r].output;
    EXPECT_EQ(results[r].exit_code, 3) << "rank " << r << results[r].output;
  }
  EXPECT_TRUE(absl::StrContains(results[0].output, "rank 1"))
      << results[0].output;
  EXPECT_EQ(LatestCheckpoint(dir + "/adagrad"), std::nullopt);
}

TEST(CheckpointReshardingTest, ADeadRankFailsTheSaveNamingIt) {
  const std::string dir = FreshDir("dead");
  std::vector<RankResult> results =
      RunRanks("dead", 2, absl::Seconds(30),
               {{"CHECKPOINT_DIR", dir}, {"TEST_COLLECTIVE_TIMEOUT_S", "2"}});
  EXPECT_FALSE(results[0].timed_out);
  EXPECT_EQ(results[0].exit_code, 3) << results[0].output;
  EXPECT_TRUE(absl::StrContains(results[0].output, "rank 1 did not report"))
      << results[0].output;
  EXPECT_EQ(LatestCheckpoint(dir + "/adagrad"), std::nullopt);
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  if (std::optional<std::string> scenario =
          deltastream::testing::ScenarioFromEnv()) {
    return deltastream::RunScenario(*scenario);
  }
  constexpr absl::string_view kWrite = "--write_checkpoint=";
  if (argc == 2 && absl::StartsWith(argv[1], kWrite)) {
    const std::string dir = std::string(argv[1]).substr(kWrite.size());
    int failed = 0;
    for (const deltastream::testing::RankResult& result :
         deltastream::testing::RunRanks("save", 2, absl::Seconds(120),
                                        {{"CHECKPOINT_DIR", dir}})) {
      if (result.exit_code != 0) {
        std::fprintf(stderr, "%s", result.output.c_str());
        failed = 1;
      }
    }
    return failed;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
