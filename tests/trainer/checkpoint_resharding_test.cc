// Sharded checkpoints on real processes (Gloo on loopback): a model saved by
// 2 ranks under a mixed plan (row-wise, column-wise, data-parallel and
// table-wise tables) is restored by 4 ranks, by 2 ranks under another plan
// and by one unsharded process, for Adagrad, row-wise Adagrad and Adam, and
// every restored table and optimizer state equals the saved global one
// (tests/trainer/checkpoint_fixtures.h says what that is; equality is exact:
// resharding only copies, the row-wise Adagrad mean is exact in double).
// A model trained 2 steps under 2 ranks, checkpointed and trained 2 more
// under 4 ranks with another plan ends where one process training 4 steps
// without a break ends. An error on one rank, or a dead rank, fails the save
// on every rank and leaves no complete checkpoint. A gradient scaler's state
// saved with it (rank 0's file) is returned to every rank of every layout.
//
// The binary also writes such a checkpoint for the Python tests:
//   checkpoint_resharding_test --write_checkpoint=DIR
// (DIR/<optimizer>/checkpoint-000000000007, saved by 2 ranks).
#include <gtest/gtest.h>
#include <signal.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/test_dirs.h"
#include "tests/trainer/checkpoint_fixtures.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "trainer/checkpoint.h"
#include "trainer/comm/gradient_averaging.h"
#include "trainer/comm/process_group.h"
#include "trainer/data/batch.h"
#include "trainer/pipeline/gradient_scaler.h"
#include "trainer/sharding/sharding_plan.h"

namespace deltastream {
namespace {

namespace fs = std::filesystem;
using ::deltastream::testing::CheckKnownStates;
using ::deltastream::testing::CheckpointTables;
using ::deltastream::testing::ExpectRanksPassed;
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

// Training across a checkpoint: the global batch of step s (kGlobalBatch
// examples) is the same whatever the world size; rank r of N trains on
// examples [r B, (r + 1) B), B = kGlobalBatch / N.
constexpr int64_t kGlobalBatch = 8;

Batch ExamplesOf(int step, int64_t begin, int64_t end) {
  std::mt19937 rng(99 + step);
  at::Tensor dense = at::empty({kGlobalBatch, 3}, at::kFloat);
  at::Tensor labels = at::empty({kGlobalBatch}, at::kFloat);
  const std::vector<EmbeddingTableConfig> tables = CheckpointTables();
  std::vector<std::string> keys;
  std::vector<std::vector<std::vector<int64_t>>> ids(tables.size());
  for (int64_t e = 0; e < kGlobalBatch; ++e) {
    for (int64_t d = 0; d < 3; ++d) {
      dense[e][d] = static_cast<float>(rng() % 1000) / 1000.0f;
    }
    labels[e] = static_cast<float>(rng() % 2);
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    keys.push_back(tables[t].feature_names[0]);
    ids[t].resize(kGlobalBatch);
    for (int64_t e = 0; e < kGlobalBatch; ++e) {
      for (int n = static_cast<int>(rng() % 3); n > 0; --n) {
        ids[t][e].push_back(
            static_cast<int64_t>(rng() % tables[t].num_embeddings));
      }
    }
  }
  std::vector<int64_t> values, lengths;
  for (size_t t = 0; t < tables.size(); ++t) {
    for (int64_t e = begin; e < end; ++e) {
      lengths.push_back(static_cast<int64_t>(ids[t][e].size()));
      values.insert(values.end(), ids[t][e].begin(), ids[t][e].end());
    }
  }
  Batch batch;
  batch.dense = dense.narrow(0, begin, end - begin).clone();
  batch.labels = labels.narrow(0, begin, end - begin).clone();
  batch.sparse = *KeyedJaggedTensor::FromLengths(
      keys, at::tensor(values, at::kLong), at::tensor(lengths, at::kLong));
  return batch;
}

// Steps [first, last) of this rank's share (the whole batch without a
// group); dense gradients averaged over the group, as the trainer does.
absl::Status TrainSteps(RecModel& model, torch::optim::Optimizer& optimizer,
                        ProcessGroup* group, int first, int last) {
  const int world = group != nullptr ? group->world_size() : 1;
  const int rank = group != nullptr ? group->rank() : 0;
  const int64_t b = kGlobalBatch / world;
  for (int step = first; step < last; ++step) {
    Batch batch = ExamplesOf(step, rank * b, (rank + 1) * b);
    optimizer.zero_grad();
    absl::StatusOr<at::Tensor> logits = model.Forward(batch);
    if (!logits.ok()) return logits.status();
    at::binary_cross_entropy_with_logits(*logits, batch.labels).backward();
    if (group != nullptr) {
      if (absl::Status s = AverageGradients(*group, model.dense().parameters());
          !s.ok()) {
        return s;
      }
    }
    optimizer.step();
  }
  return absl::OkStatus();
}

// The scaler state the "save" scenario saves: scale 32768 (halved once),
// growth tracker 1.
GradientScalerState SavedScalerState() {
  GradientScaler scaler;
  scaler.Update(/*found_non_finite=*/true);
  scaler.Update(false);
  return scaler.StateTensors();
}

// OK when `loaded` loads into a scaler as SavedScalerState's.
absl::Status CheckScalerState(const GradientScalerState& loaded) {
  GradientScaler scaler;
  if (absl::Status s = scaler.LoadStateTensors(loaded); !s.ok()) return s;
  for (const auto& [name, tensor] : scaler.StateTensors()) {
    if ((name == "scale" && tensor.item<double>() != 32768.0) ||
        (name == "growth_tracker" && tensor.item<int64_t>() != 1)) {
      return absl::InternalError(absl::StrCat("gradient scaler state '", name,
                                              "' is ", tensor.item<double>()));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<torch::optim::Optimizer> DenseAdam(RecModel& model) {
  return std::make_unique<torch::optim::Adam>(model.dense().parameters(),
                                              torch::optim::AdamOptions(0.01));
}

int RunScenario(const std::string& scenario) {
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      testing::RankGroupFromEnv();
  RANK_OK(group.status());
  const int world = (*group)->world_size();
  const std::string dir = std::getenv("CHECKPOINT_DIR");
  const std::string plan_name =
      std::getenv("PLAN") != nullptr ? std::getenv("PLAN") : "saved";
  if (scenario == "train" || scenario == "resume") {
    // Steps 0-1 under 2 ranks, a checkpoint, steps 2-3 under 4 ranks.
    const bool resume = scenario == "resume";
    absl::StatusOr<std::unique_ptr<Dlrm>> model =
        MakeCheckpointModel(SparseOptimizerType::kAdagrad, resume ? 5 : 1,
                            group->get(), Plan(plan_name, world));
    RANK_OK(model.status());
    std::unique_ptr<torch::optim::Optimizer> optimizer = DenseAdam(**model);
    if (resume) {
      absl::StatusOr<CheckpointInfo> info =
          LoadCheckpoint(*LatestCheckpoint(dir + "/train").value(), **model,
                         *optimizer, group->get());
      RANK_OK(info.status());
    }
    const int first = resume ? 2 : 0;
    RANK_OK(TrainSteps(**model, *optimizer, group->get(), first, first + 2));
    RANK_OK(SaveCheckpoint(dir + (resume ? "/resumed" : "/train"), first + 2,
                           (first + 2) * kGlobalBatch, **model, *optimizer, 1,
                           group->get())
                .status());
    return 0;
  }
  for (const auto& [name, optimizer] : Optimizers()) {
    absl::StatusOr<std::unique_ptr<Dlrm>> model =
        MakeCheckpointModel(optimizer, 1, group->get(), Plan(plan_name, world));
    RANK_OK(model.status());
    torch::optim::SGD dense_optimizer((*model)->dense().parameters(),
                                      torch::optim::SGDOptions(0.1));
    const std::string sub = absl::StrCat(dir, "/", name);
    if (scenario == "load") {
      std::optional<std::string> latest = LatestCheckpoint(sub).value();
      if (!latest.has_value()) RANK_OK(absl::NotFoundError(sub));
      absl::StatusOr<CheckpointInfo> info =
          LoadCheckpoint(*latest, **model, dense_optimizer, group->get());
      RANK_OK(info.status());
      if (info->step != kStep || info->examples != 10 * kStep) {
        RANK_OK(absl::InternalError("wrong step or examples"));
      }
      RANK_OK(CheckKnownStates(**model, Plan("saved", 2)));
      RANK_OK(CheckScalerState(info->gradient_scaler_state));
      std::printf("rank %d loaded %s under plan %s\n", (*group)->rank(),
                  name.c_str(), plan_name.c_str());
      continue;
    }
    RANK_OK(SetKnownStates(**model));
    if (scenario == "dead" && (*group)->rank() == 1) kill(getpid(), SIGKILL);
    RANK_OK(SaveCheckpoint(sub, kStep, 10 * kStep, **model, dense_optimizer, 1,
                           group->get(), SavedScalerState())
                .status());
  }
  return 0;
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
  ExpectRanksPassed(
      RunRanks("save", 2, absl::Seconds(120), {{"CHECKPOINT_DIR", dir}}));
  const std::string checkpoint =
      absl::StrCat(dir, "/adagrad/checkpoint-000000000007");
  ASSERT_EQ(LatestCheckpoint(dir + "/adagrad").value(), checkpoint);

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
  EXPECT_EQ(rank0.count("grad_scaler.scale"), 1u);
  EXPECT_EQ(rank1.count("grad_scaler.scale"), 0u);
  EXPECT_EQ(rank1.count(fqn + ".t2.weight"), 0u);  // data-parallel: once
  EXPECT_EQ(rank1.count(fqn + ".t3.weight"), 1u);
  EXPECT_EQ(rank1.count("dense_optimizer"), 0u);

  ExpectRanksPassed(RunRanks("load", 4, absl::Seconds(120),
                             {{"CHECKPOINT_DIR", dir}, {"PLAN", "four"}}));
  ExpectRanksPassed(RunRanks("load", 2, absl::Seconds(120),
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
    absl::Status scaler = CheckScalerState(info->gradient_scaler_state);
    EXPECT_TRUE(scaler.ok()) << scaler;

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
    EXPECT_EQ(read->dense.size(), (*model)->dense().named_parameters().size());
  }
}

TEST(CheckpointReshardingTest, TrainingContinuesUnderFourRanksAsUninterrupted) {
  const std::string dir = FreshDir("continue");
  ExpectRanksPassed(
      RunRanks("train", 2, absl::Seconds(120), {{"CHECKPOINT_DIR", dir}}));
  ExpectRanksPassed(RunRanks("resume", 4, absl::Seconds(120),
                             {{"CHECKPOINT_DIR", dir}, {"PLAN", "four"}}));
  // One process, four steps without a break.
  absl::StatusOr<std::unique_ptr<Dlrm>> reference =
      MakeCheckpointModel(SparseOptimizerType::kAdagrad, 1);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::unique_ptr<torch::optim::Optimizer> optimizer = DenseAdam(**reference);
  ASSERT_TRUE(TrainSteps(**reference, *optimizer, nullptr, 0, 4).ok());
  // The resumed ranks' final checkpoint, read into one process.
  absl::StatusOr<std::unique_ptr<Dlrm>> resumed =
      MakeCheckpointModel(SparseOptimizerType::kAdagrad, 9);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  std::unique_ptr<torch::optim::Optimizer> resumed_optimizer =
      DenseAdam(**resumed);
  std::optional<std::string> latest =
      LatestCheckpoint(dir + "/resumed").value();
  ASSERT_TRUE(latest.has_value());
  absl::StatusOr<CheckpointInfo> info =
      LoadCheckpoint(*latest, **resumed, *resumed_optimizer);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->step, 4);
  // Row- and column-split shards sum partial pools and gradients in another
  // order than one process (float32 values of order 1, a few steps).
  constexpr double kTolerance = 1e-5;
  std::map<std::string, at::Tensor> expected;
  for (const auto& [name, t] :
       (*reference)->embedding_modules()[0]->StateTensors()) {
    expected[name] = t;
  }
  double worst = 0;
  int compared = 0;
  for (const auto& [name, t] :
       (*resumed)->embedding_modules()[0]->StateTensors()) {
    ASSERT_EQ(expected.count(name), 1u) << name;
    const double diff = (t.to(at::kDouble) - expected[name].to(at::kDouble))
                            .abs()
                            .max()
                            .item<double>();
    worst = std::max(worst, diff);
    EXPECT_LE(diff, kTolerance) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 8);  // 4 tables: weight and momentum1
  std::vector<at::Tensor> a = (*reference)->dense().parameters();
  std::vector<at::Tensor> b = (*resumed)->dense().parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = (a[i].to(at::kDouble) - b[i].to(at::kDouble))
                            .abs()
                            .max()
                            .item<double>();
    worst = std::max(worst, diff);
    EXPECT_LE(diff, kTolerance) << "dense parameter " << i;
  }
  // The tables did train: they left the initial values.
  absl::StatusOr<std::unique_ptr<Dlrm>> initial =
      MakeCheckpointModel(SparseOptimizerType::kAdagrad, 1);
  ASSERT_TRUE(initial.ok());
  EXPECT_FALSE(at::equal((*initial)->embedding_modules()[0]->weight(0),
                         (*resumed)->embedding_modules()[0]->weight(0)));
  std::printf(
      "2 ranks, checkpoint, 4 ranks vs one process: max difference "
      "%g\n",
      worst);
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
  EXPECT_EQ(LatestCheckpoint(dir + "/adagrad").value(), std::nullopt);
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
  EXPECT_EQ(LatestCheckpoint(dir + "/adagrad").value(), std::nullopt);
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
