// The pipelines against the plain loop: exact gradient accumulation (K
// micro-batches of B equal one batch of K x B for every sparse optimizer and
// the dense part, the last partial window flushed, micro-batches of other
// sizes weighed by their examples, switches mid-window, a new K or mixed
// precision mid-window), no batch lost when a look-ahead pull fails, the
// tracker under accumulation (a window's IDs recorded at the step that
// changes them), the overlapping pipelines and switches between pipelines
// giving the plain loop's parameters and deltas, on one process and on two
// ranks (sharded, real Gloo over loopback), and mixed precision refused on the
// CPU.
#include <ATen/core/Tensor.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/testing/tensor_values.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "tests/trainer/pipeline/pipeline_fixtures.h"
#include "tracker_service/tracker.h"
#include "trainer/comm/process_group.h"
#include "trainer/models/dlrm.h"
#include "trainer/models/sequence_model.h"
#include "trainer/optim/dense_optimizer.h"
#include "trainer/pipeline/gradient_scaler.h"
#include "trainer/pipeline/pipeline_factory.h"
#include "trainer/pipeline/sequential_pipeline.h"
#include "trainer/pipeline/train_step.h"
#include "trainer/tracking/module_tracking.h"

namespace deltastream {
namespace {

using testing::Examples;
using testing::ExampleSource;
using testing::MakeExamples;
using testing::MaxDifference;
using testing::Options;
using testing::RankResult;
using testing::Repeat;
using testing::RunRanks;
using testing::Train;
using testing::Trainable;
using testing::TrainAll;

constexpr double kTolerance = 2e-5;

class AccumulationTest : public ::testing::TestWithParam<SparseOptimizerType> {
};

TEST_P(AccumulationTest, FourBatchesOf64EqualOneOf256) {
  const Examples examples = MakeExamples(512, 5);
  std::unique_ptr<Trainable> big =
      Train(GetParam(), Options("sequential", 1), examples, Repeat(256, 2));
  for (const char* pipeline : {"sequential", "base", "sparse_dist"}) {
    std::unique_ptr<Trainable> small =
        Train(GetParam(), Options(pipeline, 4), examples, Repeat(64, 8));
    EXPECT_LT(MaxDifference(*big->model, *small->model), kTolerance)
        << pipeline;
  }
  // Without accumulation the micro-batches do not make the big batch: the
  // comparison can tell.
  std::unique_ptr<Trainable> stepped =
      Train(GetParam(), Options("sequential", 1), examples, Repeat(64, 8));
  EXPECT_GT(MaxDifference(*big->model, *stepped->model), 1e-3);
}

TEST_P(AccumulationTest, TheLastPartialWindowIsFlushedAsItsOwnBatch) {
  const Examples examples = MakeExamples(384, 6);
  // 6 micro-batches with K = 4: a window of 256, then one of 128.
  std::unique_ptr<Trainable> big =
      Train(GetParam(), Options("sequential", 1), examples, {256, 128});
  for (const char* pipeline : {"sequential", "base", "sparse_dist"}) {
    std::unique_ptr<Trainable> small =
        Train(GetParam(), Options(pipeline, 4), examples, Repeat(64, 6));
    EXPECT_LT(MaxDifference(*big->model, *small->model), kTolerance)
        << pipeline;
  }
}

// Micro-batches of different sizes (a source's partial last batch) weigh
// by their examples: a window trains as one batch of all its examples.
TEST_P(AccumulationTest, APartialLastBatchWeighsByItsExamples) {
  const Examples examples = MakeExamples(360, 14);
  struct Case {
    int k;
    std::vector<int64_t> micro;  // with K = k
    std::vector<int64_t> whole;  // the same windows, with K = 1
  };
  for (const Case& c :
       {Case{2, {64, 8}, {72}}, Case{2, {64, 64, 64, 8}, {128, 72}},
        Case{4, {64, 64, 64, 64, 64, 40}, {256, 104}},
        Case{3, {8, 64, 64}, {136}}}) {
    std::unique_ptr<Trainable> big =
        Train(GetParam(), Options("sequential", 1), examples, c.whole);
    for (const char* pipeline : {"sequential", "base", "sparse_dist"}) {
      std::unique_ptr<Trainable> small =
          Train(GetParam(), Options(pipeline, c.k), examples, c.micro);
      EXPECT_LT(MaxDifference(*big->model, *small->model), kTolerance)
          << pipeline << " K=" << c.k << " " << c.micro.size()
          << " micro-batches";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    EverySparseOptimizer, AccumulationTest,
    ::testing::Values(SparseOptimizerType::kSgd, SparseOptimizerType::kAdagrad,
                      SparseOptimizerType::kRowwiseAdagrad,
                      SparseOptimizerType::kAdam),
    [](const ::testing::TestParamInfo<SparseOptimizerType>& info) {
      return std::string(SparseOptimizerName(info.param));
    });

TEST(PipelineSwitchTest, SwitchingMidWindowChangesNothing) {
  const Examples examples = MakeExamples(640, 7);
  std::unique_ptr<Trainable> reference =
      Train(SparseOptimizerType::kAdam, Options("sequential", 4), examples,
            Repeat(64, 10));
  Trainable switched(SparseOptimizerType::kAdam);
  ExampleSource source(examples, Repeat(64, 10));
  PipelineHandover handover;
  // 3 micro-batches each, so every switch but the first is mid-window.
  for (const char* name : {"sequential", "base", "sparse_dist", "base"}) {
    absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline = MakeTrainPipeline(
        Options(name, 4), switched.Parts(), std::move(handover));
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<std::optional<TrainedStep>> step =
          (*pipeline)->Progress(source);
      ASSERT_TRUE(step.ok()) << step.status();
      if (!step->has_value()) break;
    }
    absl::StatusOr<PipelineHandover> released = (*pipeline)->Release();
    ASSERT_TRUE(released.ok()) << released.status();
    handover = *std::move(released);
  }
  EXPECT_LT(MaxDifference(*reference->model, *switched.model), kTolerance);
}

// A one-rank Gloo group: the model is sharded, so sparse_dist distributes
// its input (and converts feature dicts) on its background thread.
std::unique_ptr<ProcessGroup> OneRankGroup() {
  ProcessGroupOptions options;
  options.timeout = absl::Seconds(60);
  options.rendezvous_timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      ProcessGroup::Create(options);
  EXPECT_TRUE(group.ok()) << group.status();
  return group.ok() ? *std::move(group) : nullptr;
}

TEST(ShardedAccumulationTest, APartialLastBatchWeighsByItsExamples) {
  std::unique_ptr<ProcessGroup> group = OneRankGroup();
  ASSERT_NE(group, nullptr);
  const Examples examples = MakeExamples(72, 17);
  auto train = [&](const std::string& name, int k, std::vector<int64_t> sizes) {
    std::unique_ptr<Trainable> trainable =
        Train(SparseOptimizerType::kAdam, Options(name, k), examples,
              std::move(sizes), c10::Device(c10::kCPU), "adam", group.get());
    EXPECT_FALSE(trainable->model->sharded_modules().empty());
    return trainable;
  };
  std::unique_ptr<Trainable> big = train("sequential", 1, {72});
  for (const char* name : {"sequential", "base", "sparse_dist"}) {
    std::unique_ptr<Trainable> small = train(name, 2, {64, 8});
    EXPECT_LT(MaxDifference(*big->model, *small->model), kTolerance) << name;
  }
}

// A switch mid-window carries the window's weights: micro-batches of
// different sizes still train as one batch of all their examples.
TEST(PipelineSwitchTest, SwitchingMidWindowKeepsTheWindowsWeights) {
  const Examples examples = MakeExamples(200, 18);
  for (const char* first : {"sequential", "base", "sparse_dist"}) {
    for (const char* second : {"sequential", "base", "sparse_dist"}) {
      SCOPED_TRACE(absl::StrCat(first, " then ", second));
      std::unique_ptr<Trainable> reference =
          Train(SparseOptimizerType::kAdagrad, Options("sequential", 1),
                examples, {72, 104});
      Trainable switched(SparseOptimizerType::kAdagrad);
      ExampleSource source(examples, {64, 8, 40, 64});
      absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
          MakeTrainPipeline(Options(first, 2), switched.Parts());
      ASSERT_TRUE(pipeline.ok()) << pipeline.status();
      ASSERT_TRUE((*pipeline)->Progress(source).ok());
      absl::StatusOr<PipelineHandover> handover = (*pipeline)->Release();
      ASSERT_TRUE(handover.ok()) << handover.status();
      EXPECT_EQ(handover->window_position, 1);
      pipeline = MakeTrainPipeline(Options(second, 2), switched.Parts(),
                                   *std::move(handover));
      ASSERT_TRUE(pipeline.ok()) << pipeline.status();
      absl::StatusOr<int> trained = TrainAll(**pipeline, source);
      ASSERT_TRUE(trained.ok()) << trained.status();
      EXPECT_EQ(*trained, 3);
      EXPECT_LT(MaxDifference(*reference->model, *switched.model), kTolerance);
    }
  }
}

// A new accumulation_steps mid-window continues the open window up to the
// new K micro-batches, trained as one batch of all their examples.
TEST(PipelineSwitchTest, ANewKMidWindowEndsTheWindowAtTheNewK) {
  const Examples examples = MakeExamples(320, 19);
  // One micro-batch under K = 2, then K = 3: windows of 3 x 64, then the
  // data's last 2 x 64.
  std::unique_ptr<Trainable> reference =
      Train(SparseOptimizerType::kAdam, Options("sequential", 1), examples,
            {192, 128});
  for (const char* name : {"sequential", "base", "sparse_dist"}) {
    SCOPED_TRACE(name);
    Trainable switched(SparseOptimizerType::kAdam);
    ExampleSource source(examples, Repeat(64, 5));
    absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
        MakeTrainPipeline(Options(name, 2), switched.Parts());
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    ASSERT_TRUE((*pipeline)->Progress(source).ok());
    absl::StatusOr<PipelineHandover> handover = (*pipeline)->Release();
    ASSERT_TRUE(handover.ok()) << handover.status();
    pipeline = MakeTrainPipeline(Options(name, 3), switched.Parts(),
                                 *std::move(handover));
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    EXPECT_EQ((*pipeline)->stats().window_position, 1);
    absl::StatusOr<int> trained = TrainAll(**pipeline, source);
    ASSERT_TRUE(trained.ok()) << trained.status();
    EXPECT_EQ(*trained, 4);
    EXPECT_LT(MaxDifference(*reference->model, *switched.model), kTolerance);
  }
  // A window that already holds the new K micro-batches is refused.
  Trainable trainable(SparseOptimizerType::kAdam);
  ExampleSource source(examples, Repeat(64, 5));
  absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
      MakeTrainPipeline(Options("base", 4), trainable.Parts());
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  ASSERT_TRUE((*pipeline)->Progress(source).ok());
  ASSERT_TRUE((*pipeline)->Progress(source).ok());
  absl::StatusOr<PipelineHandover> handover = (*pipeline)->Release();
  ASSERT_TRUE(handover.ok()) << handover.status();
  const absl::Status refused =
      MakeTrainPipeline(Options("base", 2), trainable.Parts(),
                        *std::move(handover))
          .status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()),
              ::testing::HasSubstr("window boundary"));
}

// Micro-batches trained with mixed precision's loss scale cannot be
// unscaled by a pipeline without it (nor the reverse): a switch that turns
// mixed_precision on or off mid-window is refused; at a window boundary it
// is not.
TEST(PipelineSwitchTest, ChangingMixedPrecisionMidWindowIsRefused) {
  const Examples examples = MakeExamples(256, 20);
  for (int trained : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(trained, " micro-batches trained"));
    Trainable trainable(SparseOptimizerType::kSgd);
    PipelineHandover scaled;
    scaled.scaler = std::make_shared<GradientScaler>();
    SequentialTrainPipeline pipeline(trainable.Parts(), 2, std::move(scaled));
    ExampleSource source(examples, Repeat(64, 4));
    for (int i = 0; i < trained; ++i) {
      ASSERT_TRUE(pipeline.Progress(source).ok());
    }
    absl::StatusOr<PipelineHandover> handover = pipeline.Release();
    ASSERT_TRUE(handover.ok()) << handover.status();
    ASSERT_NE(handover->scaler, nullptr);
    absl::StatusOr<std::unique_ptr<TrainPipeline>> next = MakeTrainPipeline(
        Options("base", 2), trainable.Parts(), *std::move(handover));
    if (trained == 1) {
      EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition)
          << next.status();
      EXPECT_THAT(std::string(next.status().message()),
                  ::testing::HasSubstr("mixed_precision"));
    } else {
      ASSERT_TRUE(next.ok()) << next.status();
      EXPECT_EQ((*next)->gradient_scaler(), nullptr);
    }
  }
}

// TrainStep's after_forward (where sparse_dist issues the next batch's
// input distribution on CUDA) runs after the forward, before backward; its
// error fails the step before anything changed.
TEST(TrainStepTest, AfterForwardRunsBeforeBackwardAndItsErrorFailsTheStep) {
  const Examples examples = MakeExamples(64, 13);
  Trainable trainable(SparseOptimizerType::kSgd);
  TrainStep step(trainable.Parts(), 1);
  const Batch batch = testing::MakeBatch(examples, 0, 64);
  bool forward_ran = false;
  bool after_ran = false;
  absl::StatusOr<TrainedStep> trained = step.Train(
      batch,
      [&]() -> absl::StatusOr<at::Tensor> {
        forward_ran = true;
        return trainable.model->Forward(batch);
      },
      /*ends_window=*/false,
      [&]() -> absl::Status {
        after_ran = true;
        EXPECT_TRUE(forward_ran);
        for (const at::Tensor& parameter :
             trainable.model->dense().parameters()) {
          EXPECT_TRUE(!parameter.grad().defined() ||
                      parameter.grad().abs().sum().item<double>() == 0);
        }
        return absl::UnavailableError("distribution failed");
      });
  EXPECT_TRUE(after_ran);
  EXPECT_EQ(trained.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(step.window_position(), 0);
  std::unique_ptr<Trainable> untouched =
      Train(SparseOptimizerType::kSgd, Options("sequential", 1), examples, {});
  EXPECT_EQ(MaxDifference(*untouched->model, *trainable.model), 0);
}

TEST(PipelineOptionsTest, RefusesBadOptionsAndMixedPrecisionOnTheCpu) {
  Trainable trainable(SparseOptimizerType::kSgd);
  TrainPipelineOptions options = Options("sparse_dist", 2);
  options.mixed_precision = true;
  absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
      MakeTrainPipeline(options, trainable.Parts());
  EXPECT_EQ(pipeline.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pipeline.status().message().find("CUDA"), std::string::npos)
      << pipeline.status();
  EXPECT_EQ(
      MakeTrainPipeline(Options("fast", 1), trainable.Parts()).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      MakeTrainPipeline(Options("base", 0), trainable.Parts()).status().code(),
      absl::StatusCode::kInvalidArgument);
  PipelineHandover mid_window;
  mid_window.window_position = 2;
  EXPECT_EQ(MakeTrainPipeline(Options("base", 2), trainable.Parts(),
                              std::move(mid_window))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A model with a real tracker attached (ID_ONLY, two consumers).
struct Tracked {
  explicit Tracked(SparseOptimizerType sparse,
                   TrackingMode mode = TrackingMode::kIdOnly)
      : trainable(sparse, nullptr, mode == TrackingMode::kEmbedding) {
    modules = trainable.model->embedding_modules();
    reader = std::make_unique<ModuleRowsReader>(modules);
    TrackerOptions options;
    options.mode = mode;
    options.consumers = {"between", "end"};
    options.auto_compact = true;
    options.modules = DescribeModules(modules);
    absl::StatusOr<std::unique_ptr<Tracker>> made =
        Tracker::Create(options, reader.get());
    if (!made.ok() || !AttachTracker(**made, modules).ok()) std::abort();
    tracker = *std::move(made);
  }
  TrainPipelineParts Parts() {
    TrainPipelineParts parts = trainable.Parts();
    parts.rows_reader = reader.get();
    parts.tracker = tracker.get();
    return parts;
  }
  // A read of closed batches (what a concurrent consumer sees).
  Delta Read(const std::string& consumer) {
    DeltaRequest request;
    request.consumer = consumer;
    request.through_current_batch = false;
    absl::StatusOr<Delta> delta = tracker->GetDelta(request);
    EXPECT_TRUE(delta.ok()) << delta.status();
    return delta.ok() ? *std::move(delta) : Delta();
  }

  Trainable trainable;
  std::vector<EmbeddingModule*> modules;
  std::unique_ptr<ModuleRowsReader> reader;
  std::unique_ptr<Tracker> tracker;
};

std::vector<at::Tensor> Tables(EmbeddingModule& module) {
  std::vector<at::Tensor> tables;
  for (size_t t = 0; t < module.tables().size(); ++t) {
    tables.push_back(module.weight(t).clone());
  }
  return tables;
}

TEST(TrackingUnderAccumulationTest, WindowIdsAreRecordedAtTheStepThatChanges) {
  const Examples examples = MakeExamples(256, 8);
  for (const char* name : {"sequential", "base", "sparse_dist"}) {
    Tracked tracked(SparseOptimizerType::kAdagrad);
    EmbeddingModule& module = *tracked.modules.at(0);
    absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
        MakeTrainPipeline(Options(name, 2), tracked.Parts());
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    ExampleSource source(examples, Repeat(64, 4));
    std::vector<at::Tensor> window_start = Tables(module);
    for (int64_t step = 1; step <= 4; ++step) {
      absl::StatusOr<std::optional<TrainedStep>> trained =
          (*pipeline)->Progress(source);
      ASSERT_TRUE(trained.ok()) << trained.status();
      ASSERT_TRUE(trained->has_value());
      EXPECT_EQ(tracked.tracker->current_batch(), step) << name;
      const Delta between = tracked.Read("between");
      std::vector<at::Tensor> now = Tables(module);
      for (size_t t = 0; t < now.size(); ++t) {
        const at::Tensor changed =
            (window_start[t] != now[t]).any(1).nonzero().reshape({-1});
        auto it = between.tables.find(module.TableFqn(t));
        const std::vector<int64_t> read = it == between.tables.end()
                                              ? std::vector<int64_t>()
                                              : Longs(it->second.ids);
        // Mid-window: nothing changed and nothing is read; at the window's
        // end: exactly the rows its step changed.
        EXPECT_EQ(read, Longs(changed)) << name << " step " << step;
        if (step % 2 == 1) {
          EXPECT_TRUE(read.empty()) << name << " step " << step;
        } else {
          EXPECT_FALSE(read.empty()) << name << " step " << step;
        }
      }
      window_start = std::move(now);
    }
  }
}

TEST(TrackingUnderAccumulationTest, EmbeddingStatesAreTheRowsBeforeTheWindow) {
  const Examples examples = MakeExamples(256, 12);
  for (const char* name : {"sequential", "sparse_dist"}) {
    Tracked tracked(SparseOptimizerType::kSgd, TrackingMode::kEmbedding);
    EmbeddingModule& module = *tracked.modules.at(0);
    absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
        MakeTrainPipeline(Options(name, 2), tracked.Parts());
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    ExampleSource source(examples, Repeat(64, 4));
    for (int window = 0; window < 2; ++window) {
      const std::vector<at::Tensor> before = Tables(module);
      ASSERT_TRUE((*pipeline)->Progress(source).ok());
      ASSERT_TRUE((*pipeline)->Progress(source).ok());
      const Delta delta = tracked.Read("between");
      ASSERT_FALSE(delta.tables.empty()) << name;
      for (size_t t = 0; t < before.size(); ++t) {
        auto it = delta.tables.find(module.TableFqn(t));
        ASSERT_NE(it, delta.tables.end()) << name;
        const at::Tensor& ids = it->second.ids;
        // States: the rows as the window looked them up (before its
        // update); values: the rows after it.
        EXPECT_TRUE(it->second.states.equal(before[t].index_select(0, ids)))
            << name << " window " << window;
        EXPECT_TRUE(
            it->second.values.equal(module.weight(t).index_select(0, ids)))
            << name << " window " << window;
        EXPECT_FALSE(it->second.values.equal(it->second.states)) << name;
      }
    }
  }
}

// Optimizer-state modes record a window's lookups when it is applied, under
// the training thread's update guard (their pins deadlocked on it).
TEST(TrackingUnderAccumulationTest, OptimizerStateModesRecordAtTheWindowsEnd) {
  const Examples examples = MakeExamples(256, 13);
  for (const char* name : {"sequential", "sparse_dist"}) {
    for (TrackingMode mode :
         {TrackingMode::kRowwiseAdagrad, TrackingMode::kMomentumLast}) {
      Tracked tracked(SparseOptimizerType::kRowwiseAdagrad, mode);
      EmbeddingModule& module = *tracked.modules.at(0);
      absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
          MakeTrainPipeline(Options(name, 2), tracked.Parts());
      ASSERT_TRUE(pipeline.ok()) << pipeline.status();
      ExampleSource source(examples, Repeat(64, 4));
      for (int window = 0; window < 2; ++window) {
        ASSERT_TRUE((*pipeline)->Progress(source).ok()) << name;
        ASSERT_TRUE((*pipeline)->Progress(source).ok()) << name;
        const Delta delta = tracked.Read("between");
        auto it = delta.tables.find(module.TableFqn(0));
        ASSERT_NE(it, delta.tables.end()) << name;
        EXPECT_GT(it->second.ids.numel(), 0) << name << " window " << window;
        EXPECT_TRUE(it->second.values.equal(
            module.weight(0).index_select(0, it->second.ids)))
            << name << " window " << window;
        // Row-wise Adagrad: latest - first, grown by the window; momentum
        // last: the state as recorded, before the window (zero at first).
        if (mode == TrackingMode::kRowwiseAdagrad || window > 0) {
          EXPECT_GT(it->second.states.abs().sum().item<double>(), 0) << name;
        }
      }
    }
  }
}

TEST(PipelineTrackingTest, EveryPipelineGivesThePlainLoopsParametersAndDeltas) {
  const Examples examples = MakeExamples(384, 9);
  struct Reads {
    std::vector<std::vector<int64_t>> ids;
    std::vector<at::Tensor> values;
  };
  auto run = [&](const std::string& name, int k, Tracked& tracked) {
    Reads reads;
    absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
        MakeTrainPipeline(Options(name, k), tracked.Parts());
    EXPECT_TRUE(pipeline.ok()) << pipeline.status();
    ExampleSource source(examples, Repeat(64, 6));
    for (int step = 1; step <= 6; ++step) {
      EXPECT_TRUE((*pipeline)->Progress(source).ok());
      if (step % 2 == 0) {
        Delta delta = tracked.Read("end");
        for (auto& [fqn, table] : delta.tables) {
          reads.ids.push_back(Longs(table.ids));
          reads.values.push_back(table.values);
        }
      }
    }
    return reads;
  };
  for (int k : {1, 2}) {
    Tracked plain(SparseOptimizerType::kRowwiseAdagrad);
    const Reads expected = run("sequential", k, plain);
    for (const char* name : {"base", "sparse_dist"}) {
      Tracked tracked(SparseOptimizerType::kRowwiseAdagrad);
      const Reads reads = run(name, k, tracked);
      EXPECT_EQ(reads.ids, expected.ids) << name << " K=" << k;
      ASSERT_EQ(reads.values.size(), expected.values.size());
      for (size_t i = 0; i < reads.values.size(); ++i) {
        EXPECT_TRUE(reads.values[i].equal(expected.values[i]))
            << name << " K=" << k;
      }
      EXPECT_EQ(MaxDifference(*plain.trainable.model, *tracked.trainable.model),
                0)
          << name << " K=" << k;
    }
  }
}

// Mixed precision's scaling and skipping are device-independent: exercised
// on the CPU by handing a pipeline a scaler (the factory refuses mixed
// precision on the CPU, where autocast does not apply).
TEST(GradientScalingTest, ScaledStepsEqualUnscaledOnes) {
  const Examples examples = MakeExamples(256, 10);
  std::unique_ptr<Trainable> plain =
      Train(SparseOptimizerType::kAdam, Options("sequential", 2), examples,
            Repeat(64, 4));
  Trainable scaled(SparseOptimizerType::kAdam);
  PipelineHandover handover;
  handover.scaler = std::make_shared<GradientScaler>();
  SequentialTrainPipeline pipeline(scaled.Parts(), 2, std::move(handover));
  ExampleSource source(examples, Repeat(64, 4));
  ASSERT_TRUE(TrainAll(pipeline, source).ok());
  EXPECT_LT(MaxDifference(*plain->model, *scaled.model), kTolerance);
  EXPECT_EQ(pipeline.gradient_scaler()->skipped_steps(), 0);
}

TEST(GradientScalingTest, ANonFiniteStepIsSkippedForDenseAndSparseAlike) {
  Examples examples = MakeExamples(128, 11);
  // The second batch's dense features overflow: its gradients are NaN.
  examples.dense.narrow(0, 64, 64).fill_(NAN);
  std::unique_ptr<Trainable> first_only =
      Train(SparseOptimizerType::kRowwiseAdagrad, Options("sequential", 1),
            examples, {64});
  Tracked tracked(SparseOptimizerType::kRowwiseAdagrad);
  PipelineHandover handover;
  handover.scaler = std::make_shared<GradientScaler>();
  SequentialTrainPipeline pipeline(tracked.Parts(), 1, std::move(handover));
  ExampleSource source(examples, {64, 64});
  ASSERT_TRUE(pipeline.Progress(source).ok());
  tracked.Read("between");
  ASSERT_TRUE(pipeline.Progress(source).ok());
  // Nothing changed, nothing recorded, the scale backed off.
  EXPECT_LT(MaxDifference(*first_only->model, *tracked.trainable.model), 1e-7);
  for (const auto& [fqn, table] : tracked.Read("between").tables) {
    EXPECT_EQ(table.ids.numel(), 0) << fqn;
  }
  EXPECT_EQ(pipeline.gradient_scaler()->skipped_steps(), 1);
  EXPECT_EQ(pipeline.gradient_scaler()->scale(), 65536.0 / 2);
  // Its state round-trips for checkpoints.
  GradientScaler restored;
  ASSERT_TRUE(
      restored.LoadStateTensors(pipeline.gradient_scaler()->StateTensors())
          .ok());
  EXPECT_EQ(restored.scale(), 65536.0 / 2);
}

// Feature-dict batches (Batch::sparse_dict) train exactly as the same
// batches as KeyedJaggedTensors, under every pipeline.
TEST(FeatureDictInputTest, EveryPipelineTrainsThemAsKjtBatches) {
  const Examples examples = MakeExamples(128, 31);
  for (const char* name : {"sequential", "base", "sparse_dist"}) {
    for (int k : {1, 2}) {
      SCOPED_TRACE(absl::StrCat(name, " K=", k));
      Trainable kjt(SparseOptimizerType::kAdagrad);
      Trainable dict(SparseOptimizerType::kAdagrad);
      for (auto [trainable, dicts] :
           {std::pair{&kjt, false}, std::pair{&dict, true}}) {
        absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
            MakeTrainPipeline(Options(name, k), trainable->Parts());
        ASSERT_TRUE(pipeline.ok()) << pipeline.status();
        ExampleSource source(examples, Repeat(32, 4), dicts);
        absl::StatusOr<int> trained = TrainAll(**pipeline, source);
        ASSERT_TRUE(trained.ok()) << trained.status();
        EXPECT_EQ(*trained, 4);
      }
      EXPECT_EQ(MaxDifference(*kjt.model, *dict.model), 0.0);
    }
  }
}

// `batch` (a feature-dict batch) with a dict that is no valid
// KeyedJaggedTensor (float IDs).
Batch WithInvalidDict(Batch batch) {
  FeatureDict bad;
  for (int64_t k = 0; k < batch.sparse_dict->size(); ++k) {
    const JaggedTensor& feature = batch.sparse_dict->At(k);
    EXPECT_TRUE(bad.Add(batch.sparse_dict->keys()[k],
                        *JaggedTensor::FromLengths(
                            feature.values().to(at::kFloat), feature.lengths()))
                    .ok());
  }
  batch.sparse_dict = std::move(bad);
  return batch;
}

// A batch whose feature dict is no valid KeyedJaggedTensor.
class BadDictSource : public BatchSource {
 public:
  absl::StatusOr<std::optional<Batch>> Next() override {
    return WithInvalidDict(
        testing::AsFeatureDict(testing::MakeBatch(examples_, 0, 8)));
  }

 private:
  const Examples examples_ = MakeExamples(8, 5);
};

// Feature-dict batches of `sizes`; the one at `bad` either holds an invalid
// dict or, with `source_error`, fails the source's Next once (DataLoss; the
// next call returns it).
class FailingAtSource : public BatchSource {
 public:
  FailingAtSource(const Examples& examples, std::vector<int64_t> sizes,
                  size_t bad, bool source_error)
      : source_(examples, std::move(sizes), /*feature_dicts=*/true),
        bad_(bad),
        source_error_(source_error) {}
  absl::StatusOr<std::optional<Batch>> Next() override {
    if (next_ == bad_ && source_error_ && !failed_) {
      failed_ = true;
      return absl::DataLossError("the source failed");
    }
    absl::StatusOr<std::optional<Batch>> batch = source_.Next();
    if (batch.ok() && batch->has_value() && next_++ == bad_ && !source_error_) {
      return WithInvalidDict(**std::move(batch));
    }
    return batch;
  }

 private:
  ExampleSource source_;
  size_t bad_;
  bool source_error_;
  bool failed_ = false;
  size_t next_ = 0;
};

// When pulling a batch ahead fails (an invalid dict, a source's error), no
// batch already pulled is lost: Release hands over every batch pulled and
// not trained, in order, and the source has the rest.
TEST(LookAheadErrorTest, ReleaseHandsOverEveryBatchPulledAndNotTrained) {
  std::unique_ptr<ProcessGroup> group = OneRankGroup();
  ASSERT_NE(group, nullptr);
  const Examples examples = MakeExamples(80, 21);
  const std::vector<int64_t> sizes = {8, 12, 16, 20, 24};
  for (bool sharded : {false, true}) {
    for (const char* name : {"sequential", "base", "sparse_dist"}) {
      for (int k : {1, 2}) {
        for (size_t bad : {1, 2}) {
          for (bool source_error : {false, true}) {
            SCOPED_TRACE(absl::StrCat(
                name, sharded ? " sharded" : "", " K=", k, " batch ", bad, " ",
                source_error ? "source error" : "invalid dict"));
            ProcessGroup* pg = sharded ? group.get() : nullptr;
            Trainable trainable(SparseOptimizerType::kSgd, pg);
            absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
                MakeTrainPipeline(Options(name, k), trainable.Parts(pg));
            ASSERT_TRUE(pipeline.ok()) << pipeline.status();
            FailingAtSource source(examples, sizes, bad, source_error);
            size_t trained = 0;
            absl::Status failed;
            while (trained <= sizes.size()) {
              absl::StatusOr<std::optional<TrainedStep>> step =
                  (*pipeline)->Progress(source);
              if (!step.ok()) {
                failed = step.status();
                break;
              }
              ASSERT_TRUE(step->has_value());
              EXPECT_EQ((*step)->examples, sizes[trained]);
              ++trained;
            }
            EXPECT_EQ(failed.code(), source_error
                                         ? absl::StatusCode::kDataLoss
                                         : absl::StatusCode::kInvalidArgument)
                << failed;
            ASSERT_LE(trained, bad);
            if (!sharded && k == 1 && bad == 1 &&
                name != std::string("sequential")) {
              // The look-ahead pull of batch 1 fails in the first Progress.
              EXPECT_EQ(trained, 0u);
            }
            absl::StatusOr<PipelineHandover> handover = (*pipeline)->Release();
            ASSERT_TRUE(handover.ok()) << handover.status();
            // The batches handed over, then the source's rest: every batch
            // not trained, in order.
            std::vector<int64_t> untrained;
            for (const Batch& batch : handover->batches) {
              untrained.push_back(batch.size());
            }
            const size_t handed_over = untrained.size();
            EXPECT_GE(handed_over,
                      source_error ? bad - trained : bad - trained + 1);
            while (true) {
              absl::StatusOr<std::optional<Batch>> rest = source.Next();
              ASSERT_TRUE(rest.ok()) << rest.status();
              if (!rest->has_value()) break;
              untrained.push_back((*rest)->size());
            }
            EXPECT_EQ(untrained, std::vector<int64_t>(sizes.begin() + trained,
                                                      sizes.end()));
            if (!source_error && handed_over > bad - trained) {
              // The invalid batch keeps its dict: the next pipeline fails
              // at it again.
              EXPECT_TRUE(
                  handover->batches[bad - trained].sparse_dict.has_value());
            }
            if (source_error) {
              // Progress again after the source's error (which it does not
              // repeat): every batch trains once, in order.
              Trainable retried(SparseOptimizerType::kSgd, pg);
              pipeline = MakeTrainPipeline(Options(name, k), retried.Parts(pg));
              ASSERT_TRUE(pipeline.ok()) << pipeline.status();
              FailingAtSource again(examples, sizes, bad, true);
              std::vector<int64_t> steps;
              int errors = 0;
              while (steps.size() <= sizes.size() && errors <= 1) {
                absl::StatusOr<std::optional<TrainedStep>> step =
                    (*pipeline)->Progress(again);
                if (!step.ok()) {
                  ++errors;
                  continue;
                }
                if (!step->has_value()) break;
                steps.push_back((*step)->examples);
              }
              EXPECT_EQ(errors, 1);
              EXPECT_EQ(steps, sizes);
            }
          }
        }
      }
    }
  }
}

// On a sharded model on the CPU sparse_dist converts a batch's dict on its
// distribution thread: a switch right after the batch before an invalid
// one hands the invalid one over, and it fails the next pipeline's step.
TEST(LookAheadErrorTest, AnInvalidDictInFlightIsHandedOver) {
  std::unique_ptr<ProcessGroup> group = OneRankGroup();
  ASSERT_NE(group, nullptr);
  const Examples examples = MakeExamples(80, 22);
  Trainable trainable(SparseOptimizerType::kSgd, group.get());
  absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline = MakeTrainPipeline(
      Options("sparse_dist", 1), trainable.Parts(group.get()));
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  FailingAtSource source(examples, {8, 12, 16, 20, 24}, 1, false);
  absl::StatusOr<std::optional<TrainedStep>> step =
      (*pipeline)->Progress(source);
  ASSERT_TRUE(step.ok()) << step.status();
  absl::StatusOr<PipelineHandover> handover = (*pipeline)->Release();
  ASSERT_TRUE(handover.ok()) << handover.status();
  ASSERT_EQ(handover->batches.size(), 2u);
  EXPECT_EQ(handover->batches[0].size(), 12);
  EXPECT_TRUE(handover->batches[0].sparse_dict.has_value());
  EXPECT_EQ(handover->batches[1].size(), 16);
  absl::StatusOr<std::unique_ptr<TrainPipeline>> next = MakeTrainPipeline(
      Options("base", 1), trainable.Parts(group.get()), *std::move(handover));
  ASSERT_TRUE(next.ok()) << next.status();
  step = (*next)->Progress(source);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(step.status().message()),
              ::testing::HasSubstr("sparse_dict"));
}

TEST(FeatureDictInputTest, AnInvalidDictFailsTheStepWithItsReason) {
  for (const char* name : {"sequential", "base", "sparse_dist"}) {
    SCOPED_TRACE(name);
    Trainable trainable(SparseOptimizerType::kSgd);
    absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
        MakeTrainPipeline(Options(name, 1), trainable.Parts());
    ASSERT_TRUE(pipeline.ok()) << pipeline.status();
    BadDictSource source;
    absl::StatusOr<std::optional<TrainedStep>> step =
        (*pipeline)->Progress(source);
    EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(step.status().message()),
                ::testing::HasSubstr("sparse_dict"));
  }
}

// Two ranks, a sharded model: every pipeline, with and without
// accumulation, and with feature-dict input, ends with the plain loop's
// parameters on every rank; an invalid dict fails sparse_dist's step on its
// distribution thread with its reason.

int RunScenario(const std::string& /*scenario*/) {
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      testing::RankGroupFromEnv();
  RANK_OK(group.status());
  ProcessGroup& pg = **group;
  // Each rank its own examples; 4 steps of 32 per rank.
  const Examples examples = MakeExamples(128, 20 + pg.rank());
  bool sequence = false;
  auto train = [&](const std::string& name, int k, int64_t micro, int count,
                   std::unique_ptr<Trainable>& out,
                   bool dicts = false) -> absl::Status {
    out =
        std::make_unique<Trainable>(SparseOptimizerType::kAdam, &pg, sequence);
    absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
        MakeTrainPipeline(Options(name, k), out->Parts(&pg));
    if (!pipeline.ok()) return pipeline.status();
    ExampleSource source(examples, Repeat(micro, count), dicts);
    absl::StatusOr<int> trained = TrainAll(**pipeline, source);
    if (!trained.ok()) return trained.status();
    if (*trained != count) return absl::InternalError("batches lost");
    const PipelineStats stats = (*pipeline)->stats();
    std::printf("rank %d %s %s K=%d: %lld batches, input dist exposed %s\n",
                pg.rank(), sequence ? "sequence" : "dlrm", name.c_str(), k,
                static_cast<long long>(stats.batches),
                absl::FormatDuration(stats.exposed_input_dist).c_str());
    return absl::OkStatus();
  };
  for (bool sequence_model : {false, true}) {
    sequence = sequence_model;
    std::unique_ptr<Trainable> reference;
    RANK_OK(train("sequential", 1, 32, 4, reference));
    struct Run {
      std::string name;
      int k;
      int64_t micro;
      int count;
      bool dicts = false;
    };
    for (const Run& run :
         {Run{"base", 1, 32, 4}, Run{"sparse_dist", 1, 32, 4},
          Run{"sequential", 2, 16, 8}, Run{"sparse_dist", 2, 16, 8},
          Run{"base", 4, 8, 16}, Run{"base", 1, 32, 4, true},
          Run{"sparse_dist", 2, 16, 8, true}}) {
      std::unique_ptr<Trainable> trained;
      RANK_OK(train(run.name, run.k, run.micro, run.count, trained, run.dicts));
      const double difference =
          MaxDifference(*reference->model, *trained->model);
      if (!(difference < kTolerance)) {
        std::fprintf(stderr, "FAILED: rank %d %s K=%d differs by %g\n",
                     pg.rank(), run.name.c_str(), run.k, difference);
        return 4;
      }
    }
  }
  // Both ranks' first batch holds an invalid dict: each rank's distribution
  // thread refuses it before any collective.
  Trainable trainable(SparseOptimizerType::kSgd, &pg);
  absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
      MakeTrainPipeline(Options("sparse_dist", 1), trainable.Parts(&pg));
  RANK_OK(pipeline.status());
  BadDictSource bad;
  absl::StatusOr<std::optional<TrainedStep>> step = (*pipeline)->Progress(bad);
  RANK_EXPECT(step.status().code() == absl::StatusCode::kInvalidArgument &&
                  absl::StrContains(step.status().message(), "sparse_dict"),
              "got ", step.status().ToString());
  // No collective ran on the pipeline's group: without this, a rank that got
  // here first would end, closing its side of that group while the other
  // rank was still connecting it.
  RANK_OK(pg.Barrier("test.end"));
  return 0;
}

TEST(PipelinesOnTwoRanksTest, EveryPipelineEqualsThePlainLoop) {
  std::vector<RankResult> results = RunRanks("ranks", 2, absl::Seconds(120));
  ExpectRanksPassed(results);
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  return deltastream::testing::RankTestMain(argc, argv,
                                            deltastream::RunScenario);
}
