// The models: shapes, determinism, validation, batch errors, extra features,
// attention pooling against a hand computation, learning on a synthetic task
// (loss falls, held-out AUC rises), only looked-up rows change, evaluation
// changes nothing, the metrics against hand-computed values, and CUDA
// against the CPU (skipped without a GPU).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_unique.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isin.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/optim/adagrad.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/data/batch.h"
#include "trainer/models/attention_pooling.h"
#include "trainer/models/dlrm.h"
#include "trainer/models/metrics.h"
#include "trainer/models/model.h"
#include "trainer/models/sequence_model.h"
#include "trainer/sparse/keyed_jagged_tensor.h"

namespace deltastream {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kNumDense = 4;
constexpr int64_t kDim = 8;
constexpr int64_t kSignalRows = 100;  // table t0: feature "cat_0"
constexpr int64_t kNoiseRows = 1000;  // table t1: "cat_1" and "cat_2"
constexpr int64_t kBatchSize = 128;

std::vector<EmbeddingTableConfig> Tables(int64_t dim = kDim) {
  return {{"t0", kSignalRows, dim, {"cat_0"}},
          {"t1", kNoiseRows, dim, {"cat_1", "cat_2"}}};
}

absl::StatusOr<std::unique_ptr<RecModel>> MakeModel(
    bool sequence, uint64_t seed = 7,
    c10::Device device = c10::Device(c10::kCPU)) {
  RecModelConfig config;  // DlrmConfig and SequenceModelConfig alike
  config.num_dense = kNumDense;
  config.dense_arch = {16, kDim};
  config.over_arch = {16, 1};
  config.tables = Tables();
  config.sparse_optimizer.learning_rate = 0.1;
  config.device = device;
  config.seed = seed;
  if (sequence) {
    absl::StatusOr<std::unique_ptr<SequenceModel>> model =
        SequenceModel::Create(config);
    if (!model.ok()) return model.status();
    return std::unique_ptr<RecModel>(*std::move(model));
  }
  absl::StatusOr<std::unique_ptr<Dlrm>> model = Dlrm::Create(config);
  if (!model.ok()) return model.status();
  return std::unique_ptr<RecModel>(*std::move(model));
}

// A synthetic task whose label is a simple function of one sparse feature
// and one dense feature: label = 1 when sign(cat_0) + dense[:, 0] > 0, where
// sign is +1 for even IDs and -1 for odd ones. DLRM examples have one ID per
// feature; sequence examples have 0..5 IDs of cat_0, all of one parity (an
// empty list has sign 0), and 0..3 of the others. cat_1 and cat_2 are noise.
// With `extra_key`, a feature no model reads ("unused") with IDs far outside
// every table.
Batch ToyBatch(bool sequence, at::Generator& generator,
               bool extra_key = false) {
  const int64_t b = kBatchSize;
  const auto int64 = at::TensorOptions().dtype(at::kLong);
  Batch batch;
  batch.dense = at::randn({b, kNumDense}, generator, at::kFloat);
  std::vector<std::string> keys = {"cat_0", "cat_1", "cat_2"};
  std::vector<at::Tensor> values, lengths;

  const at::Tensor signal_lengths =
      sequence ? at::randint(0, 6, {b}, generator, int64)
               : at::ones({b}, int64);
  const at::Tensor parity = at::randint(0, 2, {b}, generator, int64);
  const int64_t n = signal_lengths.sum().item<int64_t>();
  values.push_back(2 * at::randint(0, kSignalRows / 2, {n}, generator, int64) +
                   parity.repeat_interleave(signal_lengths));
  lengths.push_back(signal_lengths);
  const at::Tensor sign =
      (1 - 2 * parity).to(at::kFloat) * (signal_lengths > 0).to(at::kFloat);
  batch.labels = ((sign + batch.dense.select(1, 0)) > 0).to(at::kFloat);

  for (int noise = 0; noise < 2; ++noise) {
    const at::Tensor noise_lengths =
        sequence ? at::randint(0, 4, {b}, generator, int64)
                 : at::ones({b}, int64);
    const int64_t count = noise_lengths.sum().item<int64_t>();
    values.push_back(at::randint(0, kNoiseRows, {count}, generator, int64));
    lengths.push_back(noise_lengths);
  }
  if (extra_key) {
    keys.push_back("unused");
    values.push_back(at::full({b}, int64_t{1} << 40, int64));
    lengths.push_back(at::ones({b}, int64));
  }
  absl::StatusOr<KeyedJaggedTensor> sparse =
      KeyedJaggedTensor::FromLengths(keys, at::cat(values), at::cat(lengths));
  EXPECT_TRUE(sparse.ok()) << sparse.status();
  batch.sparse = *std::move(sparse);
  return batch;
}

// The same batch without its "unused" feature.
Batch WithoutExtraKey(const Batch& batch) {
  Batch copy = batch;
  const std::vector<std::vector<std::string>> groups = {
      {"cat_0", "cat_1", "cat_2"}};
  copy.sparse = (*batch.sparse.SplitByKeys(groups))[0];
  return copy;
}

const char* Name(bool sequence) { return sequence ? "sequence" : "dlrm"; }

TEST(ModelsTest, ShapesPathsAndDeterminism) {
  for (bool sequence : {false, true}) {
    SCOPED_TRACE(Name(sequence));
    // The global generator's state must not matter.
    at::manual_seed(1);
    auto a = *MakeModel(sequence);
    at::manual_seed(2);
    auto b = *MakeModel(sequence);
    auto c = *MakeModel(sequence, /*seed=*/8);
    at::Generator generator = at::detail::createCPUGenerator(5);
    Batch batch = ToyBatch(sequence, generator);
    at::NoGradGuard no_grad;
    at::Tensor la = *a->Forward(batch), lb = *b->Forward(batch),
               lc = *c->Forward(batch);
    EXPECT_EQ(la.sizes(), (std::vector<int64_t>{kBatchSize}));
    EXPECT_EQ(la.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(la, lb));
    EXPECT_FALSE(at::equal(la, lc));

    auto pa = a->dense().named_parameters(), pb = b->dense().named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    EXPECT_GT(pa.size(), 0u);
    for (const auto& item : pa) {
      EXPECT_TRUE(at::equal(item.value(), pb[item.key()])) << item.key();
    }
    EXPECT_TRUE(pa.contains("dense_arch.0.weight"));
    EXPECT_TRUE(pa.contains("over_arch.0.weight"));

    ASSERT_EQ(a->embedding_modules().size(), 1u);
    EmbeddingModule* module = a->embedding_modules()[0];
    EXPECT_EQ(module->path(), sequence
                                  ? "sequence_arch.embedding_collection"
                                  : "sparse_arch.embedding_bag_collection");
    EXPECT_EQ(module->pooled(), !sequence);
    EXPECT_TRUE(
        at::equal(module->weight(0), b->embedding_modules()[0]->weight(0)));
    EXPECT_EQ(a->device(), c10::Device(c10::kCPU));
  }
}

TEST(ModelsTest, IgnoresFeaturesItDoesNotRead) {
  for (bool sequence : {false, true}) {
    SCOPED_TRACE(Name(sequence));
    auto model = *MakeModel(sequence);
    at::Generator generator = at::detail::createCPUGenerator(5);
    Batch with_extra = ToyBatch(sequence, generator, /*extra_key=*/true);
    at::NoGradGuard no_grad;
    absl::StatusOr<at::Tensor> logits = model->Forward(with_extra);
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_TRUE(
        at::equal(*logits, *model->Forward(WithoutExtraKey(with_extra))));
  }
}

TEST(ModelsTest, ForwardErrors) {
  for (bool sequence : {false, true}) {
    SCOPED_TRACE(Name(sequence));
    auto model = *MakeModel(sequence);
    at::Generator generator = at::detail::createCPUGenerator(5);
    const Batch batch = ToyBatch(sequence, generator);

    Batch missing = batch;
    const std::vector<std::vector<std::string>> groups = {{"cat_0", "cat_1"}};
    missing.sparse = (*batch.sparse.SplitByKeys(groups))[0];
    EXPECT_EQ(model->Forward(missing).status().code(),
              absl::StatusCode::kNotFound);

    Batch narrow = batch;
    narrow.dense = batch.dense.narrow(1, 0, kNumDense - 1);
    absl::Status status = model->Forward(narrow).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("batch.dense must be [batch, 4]"));

    Batch short_dense = batch;
    short_dense.dense = batch.dense.narrow(0, 0, kBatchSize - 1);
    EXPECT_THAT(model->Forward(short_dense).status().message(),
                HasSubstr("stride 128"));

    Batch integer = batch;
    integer.dense = batch.dense.to(at::kLong);
    EXPECT_EQ(model->Forward(integer).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(ModelsTest, ValidationErrors) {
  DlrmConfig config;
  config.num_dense = kNumDense;
  config.tables = Tables(/*dim=*/8);
  config.dense_arch = {16, 4};
  absl::Status status = Dlrm::Create(config).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("dense_arch ends in 4"));
  config.dense_arch = {16, 8};
  config.over_arch = {16, 2};
  EXPECT_THAT(Dlrm::Create(config).status().message(),
              HasSubstr("must end in 1"));
  config.over_arch = {};
  EXPECT_THAT(Dlrm::Create(config).status().message(),
              HasSubstr("over_arch needs positive widths"));
  config.over_arch = {0, 1};
  EXPECT_THAT(Dlrm::Create(config).status().message(),
              HasSubstr("over_arch needs positive widths"));
  config.over_arch = {16, 1};
  config.num_dense = 0;
  EXPECT_THAT(Dlrm::Create(config).status().message(),
              HasSubstr("num_dense must be >= 1"));
  config.num_dense = kNumDense;
  config.tables[1].feature_names = {"cat_0"};  // read by two tables
  EXPECT_EQ(Dlrm::Create(config).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.tables = Tables();
  EXPECT_TRUE(Dlrm::Create(config).ok());

  SequenceModelConfig sequence;
  sequence.num_dense = kNumDense;
  sequence.dense_arch = {16, 8};
  sequence.tables = {};
  EXPECT_THAT(SequenceModel::Create(sequence).status().message(),
              HasSubstr("no tables"));
  sequence.tables = Tables(/*dim=*/16);
  EXPECT_THAT(SequenceModel::Create(sequence).status().message(),
              HasSubstr("dense_arch ends in 8"));
  sequence.tables = Tables(/*dim=*/8);
  sequence.over_arch = {4};
  EXPECT_THAT(SequenceModel::Create(sequence).status().message(),
              HasSubstr("must end in 1"));
  sequence.over_arch = {4, 1};
  EXPECT_TRUE(SequenceModel::Create(sequence).ok());
}

TEST(AttentionPoolTest, MatchesHandComputation) {
  // Example 0: rows (1, 0) and (0, 1) against (1, 0): scores 1 and 0.
  // Example 1: no rows -> zeros. Example 2: one row -> that row.
  at::Tensor rows =
      at::tensor({1.0f, 0.0f, 0.0f, 1.0f, 2.0f, 2.0f}).view({3, 2});
  rows.set_requires_grad(true);
  const at::Tensor queries =
      at::tensor({1.0f, 0.0f, 5.0f, 5.0f, 0.0f, 1.0f}).view({3, 2});
  for (at::ScalarType length_type : {at::kLong, at::kInt}) {
    const at::Tensor lengths = at::tensor({2, 0, 1}, length_type);
    absl::StatusOr<at::Tensor> pooled = AttentionPool(rows, lengths, queries);
    ASSERT_TRUE(pooled.ok()) << pooled.status();
    const double e = std::exp(1.0);
    const at::Tensor expected =
        at::tensor({static_cast<float>(e / (e + 1)),
                    static_cast<float>(1 / (e + 1)), 0.0f, 0.0f, 2.0f, 2.0f})
            .view({3, 2});
    EXPECT_TRUE(at::allclose(*pooled, expected, 1e-6, 1e-6)) << *pooled;
    if (length_type == at::kLong) {
      pooled->sum().backward();
      ASSERT_TRUE(rows.grad().defined());
      // The single row of example 2 has weight 1 and gradient 1 per entry.
      EXPECT_TRUE(at::allclose(rows.grad()[2], at::ones({2})));
    }
  }
}

TEST(AttentionPoolTest, ExamplesOfVeryDifferentScoresStayFinite) {
  // Scores +1000 and -1000 in two examples: a softmax shifted by the global
  // maximum would underflow example 1 to 0 / 0.
  const at::Tensor rows =
      at::tensor({100.0f, 0.0f, -100.0f, 0.0f}).view({2, 2});
  const at::Tensor queries =
      at::tensor({10.0f, 0.0f, 10.0f, 0.0f}).view({2, 2});
  absl::StatusOr<at::Tensor> pooled =
      AttentionPool(rows, at::tensor({1, 1}, at::kLong), queries);
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  EXPECT_TRUE(at::equal(*pooled, rows)) << *pooled;
}

TEST(AttentionPoolTest, NoRowsAndBadShapes) {
  absl::StatusOr<at::Tensor> pooled = AttentionPool(
      at::zeros({0, 3}), at::zeros({2}, at::kLong), at::ones({2, 3}));
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  EXPECT_TRUE(at::equal(*pooled, at::zeros({2, 3})));
  EXPECT_EQ(AttentionPool(at::zeros({2, 3}), at::ones({2}, at::kLong),
                          at::ones({2, 4}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AttentionPool(at::zeros({2, 3}), at::ones({2}, at::kFloat),
                          at::ones({2, 3}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AttentionPool(at::zeros({2, 3}), at::ones({3}, at::kLong),
                          at::ones({2, 3}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The IDs each table of the model looks up in `batch`, unique and sorted.
std::vector<at::Tensor> LookedUpRows(const EmbeddingModule& module,
                                     const Batch& batch) {
  std::vector<at::Tensor> rows;
  for (const EmbeddingTableConfig& table : module.tables()) {
    std::vector<at::Tensor> ids;
    for (const std::string& feature : table.feature_names) {
      ids.push_back(batch.sparse.Get(feature)->values());
    }
    rows.push_back(std::get<0>(at::_unique(at::cat(ids), /*sorted=*/true)));
  }
  return rows;
}

void CheckLearns(bool sequence) {
  SCOPED_TRACE(Name(sequence));
  auto model = *MakeModel(sequence);
  EmbeddingModule& module = *model->embedding_modules()[0];
  torch::optim::Adagrad optimizer(model->dense().parameters(),
                                  torch::optim::AdagradOptions(0.05));
  at::Generator train_generator = at::detail::createCPUGenerator(11);
  at::Generator eval_generator = at::detail::createCPUGenerator(12);
  std::vector<Batch> held_out;
  for (int i = 0; i < 8; ++i)
    held_out.push_back(ToyBatch(sequence, eval_generator));
  auto held_out_auc = [&] {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> scores, labels;
    for (const Batch& b : held_out) {
      scores.push_back(*model->Forward(b));
      labels.push_back(b.labels);
    }
    return Auc(at::cat(scores), at::cat(labels));
  };

  // Evaluation (no gradients) changes no row.
  const at::Tensor initial = module.weight(0).clone();
  const double auc_before = held_out_auc();
  EXPECT_TRUE(at::equal(module.weight(0), initial));

  double first_losses = 0, last_losses = 0;
  constexpr int kSteps = 200, kWindow = 20;
  for (int step = 0; step < kSteps; ++step) {
    const Batch batch = ToyBatch(sequence, train_generator);
    std::vector<at::Tensor> before;
    for (size_t t = 0; t < module.tables().size(); ++t) {
      before.push_back(module.weight(t).clone());
    }
    absl::StatusOr<at::Tensor> logits = model->Forward(batch);
    ASSERT_TRUE(logits.ok()) << logits.status();
    at::Tensor loss = BinaryCrossEntropyWithLogits(*logits, batch.labels);
    optimizer.zero_grad();
    loss.backward();  // also updates the looked-up rows (fused)
    optimizer.step();
    if (step == 0 || step == kSteps - 1) {
      // Only rows this step looked up changed, in every table. At the start
      // every one of them does; late in training a row read only by
      // examples the model already gets right can see a gradient that
      // rounds to zero (sigmoid saturates in float), and stay.
      const std::vector<at::Tensor> looked_up = LookedUpRows(module, batch);
      for (size_t t = 0; t < module.tables().size(); ++t) {
        const at::Tensor changed =
            (module.weight(t) != before[t]).any(1).nonzero().reshape({-1});
        SCOPED_TRACE(testing::Message()
                     << "step " << step << " table " << t << ": "
                     << changed.numel() << " rows changed, "
                     << looked_up[t].numel() << " looked up");
        EXPECT_TRUE(at::isin(changed, looked_up[t]).all().item<bool>());
        if (step == 0) {
          EXPECT_TRUE(at::equal(changed, looked_up[t]));
        }
        EXPECT_GT(changed.numel(), looked_up[t].numel() / 2);
      }
    }
    if (step < kWindow) first_losses += loss.item<double>() / kWindow;
    if (step >= kSteps - kWindow) last_losses += loss.item<double>() / kWindow;
  }
  const double auc_after = held_out_auc();
  std::printf(
      "%s: mean loss of steps 1-20 %.4f -> of steps 181-200 %.4f, "
      "held-out AUC %.3f -> %.3f\n",
      Name(sequence), first_losses, last_losses, auc_before, auc_after);
  EXPECT_LT(last_losses, first_losses * 0.8);
  // Either signal alone ranks the held-out examples at an AUC of about 0.77
  // (dense) or 0.84 (sparse); above 0.95 the model has learned both.
  EXPECT_GT(auc_after, 0.95);
}

TEST(ModelsTest, DlrmLearns) { CheckLearns(false); }
TEST(ModelsTest, SequenceModelLearns) { CheckLearns(true); }

TEST(MetricsTest, Auc) {
  // Positives at 0.9 and 0.4, negatives at 0.4 and 0.1: pairs (0.9 > 0.4),
  // (0.9 > 0.1), (0.4 = 0.4: a half), (0.4 > 0.1) -> 3.5 / 4.
  EXPECT_DOUBLE_EQ(
      Auc(at::tensor({0.9, 0.4, 0.4, 0.1}), at::tensor({1.0, 1.0, 0.0, 0.0})),
      3.5 / 4);
  // Float scores, shuffled; positives 0.8, 0.3, 0.3; negatives 0.3, 0.1:
  // 0.8 beats both (2), each 0.3 beats 0.1 and ties 0.3 (1.5 each) -> 5 / 6.
  EXPECT_DOUBLE_EQ(Auc(at::tensor({0.3f, 0.1f, 0.8f, 0.3f, 0.3f}),
                       at::tensor({1.0f, 0.0f, 1.0f, 0.0f, 1.0f})),
                   5.0 / 6);
  // All tied: every pair counts a half.
  EXPECT_DOUBLE_EQ(Auc(at::zeros({4}), at::tensor({1.0, 0.0, 1.0, 0.0})), 0.5);
  // Perfect and inverted rankings.
  EXPECT_DOUBLE_EQ(
      Auc(at::tensor({0.1, 0.2, 0.3}), at::tensor({0.0, 0.0, 1.0})), 1.0);
  EXPECT_DOUBLE_EQ(
      Auc(at::tensor({0.1, 0.2, 0.3}), at::tensor({1.0, 1.0, 0.0})), 0.0);
  // One class absent, or nothing at all.
  EXPECT_DOUBLE_EQ(Auc(at::tensor({0.2, 0.3}), at::tensor({1.0, 1.0})), 0.5);
  EXPECT_DOUBLE_EQ(Auc(at::tensor({0.2, 0.3}), at::tensor({0.0, 0.0})), 0.5);
  EXPECT_DOUBLE_EQ(Auc(at::zeros({0}), at::zeros({0})), 0.5);
  // Outside the contract.
  EXPECT_TRUE(std::isnan(Auc(at::tensor({0.2, NAN}), at::tensor({1.0, 0.0}))));
  EXPECT_TRUE(std::isnan(Auc(at::tensor({0.2, 0.3}), at::tensor({1.0}))));
}

TEST(MetricsTest, BinaryCrossEntropyWithLogits) {
  // -log(sigmoid(0)) = log 2; -log(1 - sigmoid(2)) = log(1 + e^2);
  // -log(sigmoid(-30)) = 30 + log(1 + e^-30) (stable for large logits).
  const at::Tensor logits = at::tensor({0.0f, 2.0f, -30.0f});
  const at::Tensor labels = at::tensor({1.0f, 0.0f, 1.0f});
  const double expected = (std::log(2.0) + std::log(1 + std::exp(2.0)) + 30 +
                           std::log1p(std::exp(-30.0))) /
                          3;
  EXPECT_NEAR(BinaryCrossEntropyWithLogits(logits, labels).item<double>(),
              expected, 1e-5);
  // Integer labels are converted.
  EXPECT_NEAR(
      BinaryCrossEntropyWithLogits(at::tensor({0.0f}), at::tensor({int64_t{0}}))
          .item<double>(),
      std::log(2.0), 1e-6);
  // Gradient: (sigmoid(x) - y) / B.
  at::Tensor x = at::tensor({0.0f, 2.0f});
  x.set_requires_grad(true);
  BinaryCrossEntropyWithLogits(x, at::tensor({1.0f, 0.0f})).backward();
  const double s2 = 1 / (1 + std::exp(-2.0));
  EXPECT_TRUE(at::allclose(
      x.grad(), at::tensor({(0.5f - 1) / 2, static_cast<float>(s2 / 2)})));
}

// CUDA and CPU models of one seed start equal, compute the same logits, and
// stay together through a training step (dense and fused sparse updates).
TEST(ModelsTest, CudaMatchesCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const c10::Device cuda(c10::kCUDA, 0);
  for (bool sequence : {false, true}) {
    SCOPED_TRACE(Name(sequence));
    auto cpu = *MakeModel(sequence);
    auto gpu = *MakeModel(sequence, /*seed=*/7, cuda);
    EXPECT_EQ(gpu->device(), cuda);
    for (const auto& item : gpu->dense().named_parameters()) {
      EXPECT_EQ(item.value().device(), cuda) << item.key();
      EXPECT_TRUE(at::equal(item.value().cpu(),
                            cpu->dense().named_parameters()[item.key()]));
    }
    at::Generator generator = at::detail::createCPUGenerator(5);
    const Batch batch = ToyBatch(sequence, generator, /*extra_key=*/true);
    const Batch gpu_batch = batch.To(cuda);
    torch::optim::Adagrad cpu_optimizer(cpu->dense().parameters(),
                                        torch::optim::AdagradOptions(0.05));
    torch::optim::Adagrad gpu_optimizer(gpu->dense().parameters(),
                                        torch::optim::AdagradOptions(0.05));
    for (int step = 0; step < 3; ++step) {
      at::Tensor cpu_logits = *cpu->Forward(batch);
      absl::StatusOr<at::Tensor> gpu_logits = gpu->Forward(gpu_batch);
      ASSERT_TRUE(gpu_logits.ok()) << gpu_logits.status();
      EXPECT_EQ(gpu_logits->device(), cuda);
      EXPECT_TRUE(at::allclose(cpu_logits, gpu_logits->cpu(), 1e-4, 1e-4))
          << "step " << step;
      at::Tensor cpu_loss =
          BinaryCrossEntropyWithLogits(cpu_logits, batch.labels);
      at::Tensor gpu_loss =
          BinaryCrossEntropyWithLogits(*gpu_logits, gpu_batch.labels);
      cpu_optimizer.zero_grad();
      gpu_optimizer.zero_grad();
      cpu_loss.backward();
      gpu_loss.backward();
      cpu_optimizer.step();
      gpu_optimizer.step();
    }
    for (size_t t = 0; t < Tables().size(); ++t) {
      EXPECT_TRUE(at::allclose(cpu->embedding_modules()[0]->weight(t),
                               gpu->embedding_modules()[0]->weight(t).cpu(),
                               1e-4, 1e-5))
          << "table " << t;
    }
    // A CPU batch is refused, not copied.
    EXPECT_EQ(gpu->Forward(batch).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace deltastream
