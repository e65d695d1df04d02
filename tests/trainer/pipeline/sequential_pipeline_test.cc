// The plain step loop: one step per batch, equal to a hand-written step; the
// end of the data and a source's error; the tracker stepped once per batch,
// its deltas holding exactly the rows the steps changed.
#include "trainer/pipeline/sequential_pipeline.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/tensor_values.h"
#include "tests/testing/test_dirs.h"
#include "tracker_service/tracker.h"
#include "trainer/data/criteo_tsv.h"
#include "trainer/data/synthetic.h"
#include "trainer/models/dlrm.h"
#include "trainer/models/metrics.h"
#include "trainer/optim/dense_optimizer.h"
#include "trainer/tracking/module_tracking.h"

namespace deltastream {
namespace {

constexpr int64_t kBatch = 32;
constexpr int64_t kNumDense = 13;
constexpr int64_t kDim = 8;

std::unique_ptr<Dlrm> MakeDlrm(uint64_t seed = 3) {
  DlrmConfig config;
  config.num_dense = kNumDense;
  config.dense_arch = {16, kDim};
  config.over_arch = {16, 1};
  config.tables = {{"t0", 100, kDim, {"cat_0"}}, {"t1", 50, kDim, {"cat_1"}}};
  config.sparse_optimizer.type = SparseOptimizerType::kAdagrad;
  config.sparse_optimizer.learning_rate = 0.1;
  config.seed = seed;
  absl::StatusOr<std::unique_ptr<Dlrm>> model = Dlrm::Create(config);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

std::unique_ptr<BatchSource> MakeSynthetic() {
  SyntheticOptions options;
  options.batch_size = kBatch;
  options.num_dense = kNumDense;
  options.features = {{"cat_0", 100, 1, 1}, {"cat_1", 50, 1, 3}};
  options.seed = 11;
  absl::StatusOr<std::unique_ptr<SyntheticSource>> source =
      SyntheticSource::Create(options);
  EXPECT_TRUE(source.ok()) << source.status();
  return *std::move(source);
}

// A Criteo file of `lines` examples; line `malformed` (0-based, if any) has
// a field that is not a number.
std::unique_ptr<BatchSource> MakeCriteo(const std::string& name, int64_t lines,
                                        int64_t malformed = -1) {
  const std::string path = FreshDir(name) + ".tsv";
  std::ofstream out(path);
  for (int64_t i = 0; i < lines; ++i) {
    out << (i % 3 == 0 ? 1 : 0);
    for (int f = 0; f < 13; ++f)
      out << '\t' << (i == malformed ? "x" : "") << i % 7;
    for (int f = 0; f < 26; ++f)
      out << '\t' << absl::StrCat(absl::Hex(i * 31 + f));
    out << '\n';
  }
  out.close();
  CriteoOptions options;
  options.paths = {path};
  options.batch_size = kBatch;
  options.num_rows = {50};  // every feature: t1 has 50 rows
  options.max_malformed_fraction = 0;
  options.malformed_grace_lines = 0;
  absl::StatusOr<std::unique_ptr<CriteoTsvSource>> source =
      CriteoTsvSource::Create(options);
  EXPECT_TRUE(source.ok()) << source.status();
  return *std::move(source);
}

// Every parameter of `model`: dense ones, then the tables.
std::vector<at::Tensor> AllParameters(RecModel& model) {
  std::vector<at::Tensor> parameters = model.dense().parameters();
  for (EmbeddingModule* module : model.embedding_modules()) {
    for (size_t t = 0; t < module->tables().size(); ++t) {
      parameters.push_back(module->weight(t));
    }
  }
  return parameters;
}

// A model with its dense optimizer: what an untracked pipeline trains.
struct Trainable {
  Trainable()
      : model(MakeDlrm()),
        dense(*MakeDenseOptimizer("adagrad", 0.05,
                                  model->dense().parameters())) {}

  TrainPipelineParts Parts() const {
    TrainPipelineParts parts;
    parts.model = model.get();
    parts.dense_optimizer = dense.get();
    return parts;
  }

  std::unique_ptr<Dlrm> model;
  std::unique_ptr<torch::optim::Optimizer> dense;
};

TEST(SequentialTrainPipelineTest, EachProgressIsOneHandWrittenStep) {
  Trainable piped, by_hand;
  SequentialTrainPipeline pipeline(piped.Parts());
  std::unique_ptr<BatchSource> piped_source = MakeSynthetic();
  std::unique_ptr<BatchSource> hand_source = MakeSynthetic();
  for (int step = 0; step < 4; ++step) {
    absl::StatusOr<std::optional<TrainedStep>> trained =
        pipeline.Progress(*piped_source);
    ASSERT_TRUE(trained.ok()) << trained.status();
    ASSERT_TRUE(trained->has_value());
    EXPECT_EQ((*trained)->examples, kBatch);

    const Batch batch = *hand_source->Next().value();
    at::Tensor loss = BinaryCrossEntropyWithLogits(
        *by_hand.model->Forward(batch), batch.labels);
    by_hand.dense->zero_grad();
    loss.backward();
    by_hand.dense->step();

    EXPECT_EQ((*trained)->loss.dim(), 0);
    EXPECT_FALSE((*trained)->loss.requires_grad());
    EXPECT_EQ((*trained)->loss.item<float>(), loss.item<float>());
  }
  const std::vector<at::Tensor> a = AllParameters(*piped.model);
  const std::vector<at::Tensor> b = AllParameters(*by_hand.model);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::equal(a[i], b[i])) << "parameter " << i;
  }
}

TEST(SequentialTrainPipelineTest, TrainsEveryBatchThenReportsTheEnd) {
  Trainable trainable;
  SequentialTrainPipeline pipeline(trainable.Parts());
  // Two full batches and a partial one.
  std::unique_ptr<BatchSource> source =
      MakeCriteo("pipeline_end", 2 * kBatch + 5);
  std::vector<int64_t> examples;
  for (;;) {
    absl::StatusOr<std::optional<TrainedStep>> trained =
        pipeline.Progress(*source);
    ASSERT_TRUE(trained.ok()) << trained.status();
    if (!trained->has_value()) break;
    EXPECT_TRUE(std::isfinite((*trained)->loss.item<double>()));
    examples.push_back((*trained)->examples);
    ASSERT_LE(examples.size(), 3u);
  }
  EXPECT_THAT(examples, ::testing::ElementsAre(kBatch, kBatch, 5));
  // The end stays the end, and changes nothing.
  const std::vector<at::Tensor> before = AllParameters(*trainable.model);
  std::vector<at::Tensor> copies;
  for (const at::Tensor& p : before) copies.push_back(p.clone());
  absl::StatusOr<std::optional<TrainedStep>> again = pipeline.Progress(*source);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->has_value());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(at::equal(before[i], copies[i]));
  }
}

TEST(SequentialTrainPipelineTest, ReturnsTheSourcesError) {
  Trainable trainable;
  SequentialTrainPipeline pipeline(trainable.Parts());
  // The second batch holds a malformed line, and none is tolerated.
  std::unique_ptr<BatchSource> source =
      MakeCriteo("pipeline_error", 2 * kBatch, kBatch + 1);
  absl::StatusOr<std::optional<TrainedStep>> first = pipeline.Progress(*source);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_value());
  absl::StatusOr<std::optional<TrainedStep>> second =
      pipeline.Progress(*source);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kDataLoss)
      << second.status();
  EXPECT_THAT(second.status().message(), ::testing::HasSubstr("malformed"));
}

TEST(SequentialTrainPipelineTest, StepsTheTrackerOncePerBatchWithItsRows) {
  Trainable trainable;
  std::vector<EmbeddingModule*> modules = trainable.model->embedding_modules();
  ModuleRowsReader reader(modules);
  TrackerOptions options;
  options.consumers = {"predictor"};
  options.modules = DescribeModules(modules);
  absl::StatusOr<std::unique_ptr<Tracker>> tracker =
      Tracker::Create(options, &reader);
  ASSERT_TRUE(tracker.ok()) << tracker.status();
  ASSERT_TRUE(AttachTracker(**tracker, modules).ok());
  TrainPipelineParts parts = trainable.Parts();
  parts.rows_reader = &reader;
  parts.tracker = tracker->get();
  SequentialTrainPipeline pipeline(parts);

  EmbeddingModule& sparse = *modules.at(0);
  std::vector<at::Tensor> before;
  for (size_t t = 0; t < sparse.tables().size(); ++t) {
    before.push_back(sparse.weight(t).clone());
  }
  std::unique_ptr<BatchSource> source = MakeSynthetic();
  for (int64_t step = 1; step <= 3; ++step) {
    absl::StatusOr<std::optional<TrainedStep>> trained =
        pipeline.Progress(*source);
    ASSERT_TRUE(trained.ok()) << trained.status();
    ASSERT_TRUE(trained->has_value());
    EXPECT_EQ((*tracker)->current_batch(), step);
  }
  DeltaRequest request;
  request.consumer = "predictor";
  request.through_current_batch = false;
  absl::StatusOr<Delta> delta = (*tracker)->GetDelta(request);
  ASSERT_TRUE(delta.ok()) << delta.status();
  ASSERT_EQ(delta->tables.size(), sparse.tables().size());
  for (size_t t = 0; t < sparse.tables().size(); ++t) {
    const at::Tensor changed =
        (before[t] != sparse.weight(t)).any(1).nonzero().reshape({-1});
    EXPECT_EQ(Longs(delta->tables.at(sparse.TableFqn(t)).ids), Longs(changed))
        << sparse.TableFqn(t);
  }
}

}  // namespace
}  // namespace deltastream
