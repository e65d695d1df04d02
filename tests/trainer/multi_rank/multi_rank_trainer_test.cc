// The trainer on several ranks (real processes, Gloo on loopback) against
// one process: N ranks of batch B train, for 20 steps, what one trainer of
// batch N x B trains on the same data and seed. Every rank also runs the
// one-process trainer and compares: the progress figures (global loss and
// held-out AUC), every dense parameter, and its shards' weights and optimizer
// states against the same slices of the one-process tables.
//
// Tolerance: 1e-4 absolute. The sharded forward sums partial pools (row- and
// column-wise shards) and the dense gradients are averaged by an all-reduce
// of per-rank means instead of one mean: float32 sums in another order,
// about 1e-7 relative per step; 20 steps of Adagrad/Adam (which divide by
// small accumulated squares early on) amplify that to ~1e-5 at worst, a
// margin of ten below the tolerance. Table-wise tables' rows are updated by
// the same sums in the same order but their gradients come through the
// dense part, so no plan is bit for bit over 20 steps (observed: 2e-7 to
// 5e-7 on every plan). Row-wise Adagrad is not run on column-wise tables:
// there a shard keeps one accumulator per row of its column block (as
// TorchRec does), which is not the unsharded optimizer.
#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_io.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "tests/trainer/multi_rank/small_trainer.h"
#include "tests/trainer/sharding/shard_states.h"
#include "tests/trainer/sharding/table_configs.h"
#include "trainer/comm/process_group.h"
#include "trainer/config.h"
#include "trainer/sharding/sharded_embedding_modules.h"
#include "trainer/sharding/sharding_plan.h"
#include "trainer/trainer.h"

namespace deltastream {
namespace {

using ::deltastream::testing::ExpectRanksPassed;
using ::deltastream::testing::MakeTrainer;
using ::deltastream::testing::MaxDiff;
using ::deltastream::testing::PlanOfKind;
using ::deltastream::testing::RunRanks;
using ::deltastream::testing::ShardStateDiff;
using ::deltastream::testing::ShardStateDiffs;
using ::deltastream::testing::SmallModel;
using ::deltastream::testing::SmallModelConfig;

constexpr int64_t kBatch = 8;  // per rank
constexpr int64_t kSteps = 20;
constexpr double kTolerance = 1e-4;

// (`criteo_path` empty: synthetic data.)
std::string Config(const std::string& kind, const std::string& optimizer,
                   int64_t batch, const std::string& criteo_path = "") {
  SmallModel model;
  model.kind = kind;
  model.sparse_optimizer = optimizer;
  model.batch = batch;
  model.eval_batches = 2;
  model.log_every_steps = 10;
  model.criteo_path = criteo_path;
  return SmallModelConfig(model);
}

// The plan of PlanOfKind(`name`) over `world` ranks.
testing::PlanOfTables PlanNamed(const std::string& name, int world) {
  return [name, world](const std::vector<EmbeddingTableConfig>& tables) {
    return PlanOfKind(name, tables, world);
  };
}

// One case: "<model kind>/<plan>/<sparse optimizer>[/criteo]" (criteo: the
// data is the Criteo file $CRITEO_PATH).
int RunCase(ProcessGroup& group, const std::string& name) {
  const std::vector<std::string> parts = absl::StrSplit(name, '/');
  RANK_EXPECT(parts.size() == 3 || parts.size() == 4, name);
  const std::string &kind = parts[0], &plan_name = parts[1],
                    &optimizer = parts[2];
  const char* criteo_env = std::getenv("CRITEO_PATH");
  RANK_EXPECT(parts.size() == 3 || criteo_env != nullptr, name);
  const std::string criteo_path = parts.size() == 4 ? criteo_env : "";
  const int world = group.world_size(), me = group.rank();
  const std::atomic<bool> stop{false};

  absl::StatusOr<std::unique_ptr<Trainer>> reference =
      MakeTrainer(Config(kind, optimizer, world * kBatch, criteo_path));
  RANK_OK(reference.status());
  absl::StatusOr<TrainerProgress> expected = (*reference)->Run(stop, kSteps);
  RANK_OK(expected.status());

  absl::StatusOr<std::unique_ptr<Trainer>> sharded =
      MakeTrainer(Config(kind, optimizer, kBatch, criteo_path), &group,
                  PlanNamed(plan_name, world));
  RANK_OK(sharded.status());
  absl::StatusOr<TrainerProgress> got = (*sharded)->Run(stop, kSteps);
  RANK_OK(got.status());

  double worst = 0;
  auto check = [&](double diff, const std::string& what) {
    worst = std::max(worst, diff);
    return diff <= kTolerance;
  };
  RANK_EXPECT(got->step == kSteps &&
                  got->examples_this_run == expected->examples_this_run,
              name, " trained ", got->step, " steps of ",
              got->examples_this_run, " examples");
  RANK_EXPECT(check(std::abs(got->loss - expected->loss), "loss"), name,
              " loss ", got->loss, " vs ", expected->loss);
  RANK_EXPECT(check(std::abs(*got->eval_auc - *expected->eval_auc), "auc"),
              name, " auc ", *got->eval_auc, " vs ", *expected->eval_auc);

  std::map<std::string, at::Tensor> dense;
  for (const auto& item : (*reference)->model().dense().named_parameters()) {
    dense[item.key()] = item.value();
  }
  for (const auto& item : (*sharded)->model().dense().named_parameters()) {
    RANK_EXPECT(check(MaxDiff(item.value(), dense[item.key()]), item.key()),
                name, " dense ", item.key(), " differs by ",
                MaxDiff(item.value(), dense[item.key()]));
  }
  // Adam's step counts a shard's own updates (a documented limitation):
  // compare the moments and weights only.
  ShardedEmbeddingModule& module = *(*sharded)->model().sharded_modules().at(0);
  absl::StatusOr<std::vector<ShardStateDiff>> states =
      ShardStateDiffs(*(*reference)->model().embedding_modules()[0], module,
                      /*with_step=*/false);
  RANK_OK(states);
  for (const ShardStateDiff& state : *states) {
    RANK_EXPECT(check(state.diff, state.state), name, " ", state.state,
                " differs by ", state.diff, " after ", kSteps, " steps");
  }
  RANK_EXPECT(module.local_shards().empty() || !states->empty(), name,
              " compared no state");
  std::printf("rank %d %s: loss %.6f auc %.6f, max difference %g\n", me,
              name.c_str(), got->loss, *got->eval_auc, worst);
  return 0;
}

// Resharding: the global batch is kReshardBatch whatever the world size;
// "reshard:<plan>:<steps>" trains `steps` more steps from the latest
// checkpoint of $RESHARD_DIR (none: from the start) and checkpoints.
constexpr int64_t kReshardBatch = 32;

std::string ReshardConfig(int world) {
  return Config("dlrm", "adagrad", kReshardBatch / world);
}

int RunReshard(ProcessGroup& group, const std::string& plan_name,
               int64_t steps) {
  const std::string dir = std::getenv("RESHARD_DIR");
  const int world = group.world_size();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = MakeTrainer(
      ReshardConfig(world), &group, PlanNamed(plan_name, world), dir);
  RANK_OK(trainer.status());
  const std::atomic<bool> stop{false};
  RANK_OK((*trainer)->Run(stop, steps).status());
  return 0;
}

// A case of RunCase, or "reshard:<plan>:<steps>" (RunReshard).
int RunCaseOrReshard(ProcessGroup& group, const std::string& name) {
  if (!absl::StartsWith(name, "reshard:")) return RunCase(group, name);
  const std::vector<std::string> parts = absl::StrSplit(name, ':');
  int64_t steps = 0;
  RANK_EXPECT(parts.size() == 3 && absl::SimpleAtoi(parts[2], &steps), name);
  return RunReshard(group, parts[1], steps);
}

constexpr char kPooledCases[] =
    "dlrm/table_wise/adam,dlrm/row_wise/rowwise_adagrad,"
    "dlrm/column_wise/adagrad,dlrm/table_row_wise/sgd,"
    "dlrm/data_parallel/adagrad,dlrm/mixed/adagrad";
constexpr char kSequenceCases[] =
    "sequence/row_wise/adagrad,sequence/mixed/adam";

// A one-process trainer's tables (weights and optimizer states) and dense
// parameters, by name.
std::map<std::string, at::Tensor> ModelStates(Trainer& trainer) {
  std::map<std::string, at::Tensor> all;
  for (const auto& [name, tensor] :
       trainer.model().embedding_modules()[0]->StateTensors()) {
    all[name] = tensor;
  }
  for (const auto& item : trainer.model().dense().named_parameters()) {
    all["dense." + item.key()] = item.value();
  }
  return all;
}

// Expects every ModelStates tensor of `got` within `tolerance` of `want`'s
// (`context` begins each message); returns the largest difference.
double ExpectSameStates(Trainer& got, Trainer& want, double tolerance,
                        const std::string& context) {
  const std::map<std::string, at::Tensor> want_states = ModelStates(want);
  const std::map<std::string, at::Tensor> got_states = ModelStates(got);
  EXPECT_EQ(got_states.size(), want_states.size()) << context;
  double worst = 0;
  for (const auto& [name, tensor] : want_states) {
    const auto it = got_states.find(name);
    if (it == got_states.end()) {
      ADD_FAILURE() << context << ": no " << name;
      continue;
    }
    const double diff = MaxDiff(it->second, tensor);
    worst = std::max(worst, diff);
    EXPECT_LE(diff, tolerance) << context << ": " << name;
  }
  return worst;
}

// A run whose step budget ends inside an accumulation window ends the
// window at its last step (a short window, its gradients rescaled by K / m),
// so that its final checkpoint holds every step it counts: one step of
// K = 2 trains as one step of K = 1, run after run (before, the step's
// gradients stayed buffered, in no checkpoint).
TEST(TrainerWindowTest, ARunEndingInsideAWindowAppliesIt) {
  for (const std::string pipeline : {"sequential", "base"}) {
    const std::string config = absl::StrCat(SmallModelConfig(SmallModel()),
                                            "pipeline: \"", pipeline, "\"\n");
    absl::StatusOr<std::unique_ptr<Trainer>> windowed =
        MakeTrainer(config + "accumulation_steps: 2\n");
    ASSERT_TRUE(windowed.ok()) << windowed.status();
    absl::StatusOr<std::unique_ptr<Trainer>> plain = MakeTrainer(config);
    ASSERT_TRUE(plain.ok()) << plain.status();
    const std::atomic<bool> stop{false};
    for (int run = 1; run <= 2; ++run) {
      ASSERT_TRUE((*windowed)->Run(stop, 1).ok());
      ASSERT_TRUE((*plain)->Run(stop, 1).ok());
      ExpectSameStates(**windowed, **plain, 1e-6,
                       absl::StrCat(pipeline, " run ", run));
    }
  }
}

// A stop request inside a window trains one more micro-batch, which ends
// the window: the run stops at a window's end, as one that was not stopped.
TEST(TrainerWindowTest, AStopInsideAWindowEndsTheWindowFirst) {
  SmallModel model;
  model.log_every_steps = 1;
  const std::string config =
      SmallModelConfig(model) + "accumulation_steps: 3\n";
  std::atomic<bool> stop{false};
  // The progress line of step 1 (inside the first window) asks to stop.
  absl::StatusOr<std::unique_ptr<Trainer>> stopped = MakeTrainer(
      config, nullptr, nullptr, "", [&stop](const std::string& line) {
        if (absl::StrContains(line, "step 1 ")) stop = true;
      });
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  absl::StatusOr<TrainerProgress> progress = (*stopped)->Run(stop, 10);
  ASSERT_TRUE(progress.ok()) << progress.status();
  ASSERT_TRUE(stop.load()) << "no progress line named step 1";
  EXPECT_EQ(progress->step, 2);

  absl::StatusOr<std::unique_ptr<Trainer>> straight = MakeTrainer(config);
  ASSERT_TRUE(straight.ok()) << straight.status();
  const std::atomic<bool> never{false};
  ASSERT_TRUE((*straight)->Run(never, 2).ok());
  ExpectSameStates(**stopped, **straight, 0, "stopped");
}

TEST(MultiRankTrainerTest, TwoRanksTrainAsOneProcess) {
  ExpectRanksPassed(RunRanks(absl::StrCat(kPooledCases, ",", kSequenceCases), 2,
                             absl::Seconds(240)));
}

TEST(MultiRankTrainerTest, FourRanksTrainAsOneProcess) {
  ExpectRanksPassed(RunRanks(absl::StrCat(kPooledCases, ",", kSequenceCases), 4,
                             absl::Seconds(240)));
}

// Criteo data: the held-out batches are the first batches of the file, of
// which each rank evaluates its share (before, a rank took its share of its
// share, and no multi-rank run on Criteo data with eval_batches started).
TEST(MultiRankTrainerTest, TwoRanksTrainOnCriteoDataAsOneProcess) {
  const std::string path =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/criteo.tsv");
  std::string lines;
  // Two held-out global batches, kSteps to train and a partial one.
  for (int64_t i = 0; i < (kSteps + 2) * 2 * kBatch + 5; ++i) {
    absl::StrAppend(&lines, (i * 2654435761 >> 13) % 3 == 0 ? 1 : 0);
    for (int f = 0; f < 13; ++f) absl::StrAppend(&lines, "\t", (i + f) % 9);
    for (int f = 0; f < 26; ++f) {
      absl::StrAppend(&lines, "\t", absl::Hex(i * 131 + f * 17));
    }
    absl::StrAppend(&lines, "\n");
  }
  ASSERT_TRUE(WriteFileDurably(path, lines).ok());
  ExpectRanksPassed(RunRanks("dlrm/mixed/adagrad/criteo", 2, absl::Seconds(120),
                             {{"CRITEO_PATH", path}}));
}

// A model checkpointed under 2 ranks (a mixed plan), continued under 4 (all
// row-wise) and then by one process continues exactly as the uninterrupted
// one-process run: every table, optimizer state and dense parameter within
// the tolerance at the end.
TEST(MultiRankTrainerTest, CheckpointsReshardAcrossWorldSizes) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/reshard");
  ExpectRanksPassed(RunRanks("reshard:mixed:8", 2, absl::Seconds(120),
                             {{"RESHARD_DIR", dir}}));
  ExpectRanksPassed(RunRanks("reshard:row_wise:6", 4, absl::Seconds(120),
                             {{"RESHARD_DIR", dir}}));
  const std::atomic<bool> stop{false};
  absl::StatusOr<std::unique_ptr<Trainer>> resumed =
      MakeTrainer(ReshardConfig(1), nullptr, nullptr, dir);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ((*resumed)->step(), 14);
  ASSERT_TRUE((*resumed)->Run(stop, 6).ok());

  absl::StatusOr<std::unique_ptr<Trainer>> uninterrupted =
      MakeTrainer(ReshardConfig(1));
  ASSERT_TRUE(uninterrupted.ok()) << uninterrupted.status();
  ASSERT_TRUE((*uninterrupted)->Run(stop, 20).ok());

  const double worst =
      ExpectSameStates(**resumed, **uninterrupted, kTolerance, "resumed");
  std::printf("2 -> 4 -> 1 ranks: max difference %g after 20 steps\n", worst);
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  return deltastream::testing::RankTestMain(argc, argv,
                                            deltastream::RunCaseOrReshard);
}
