// The models: shapes, determinism, validation, learning on synthetic data
// (loss falls, held-out AUC rises), only looked-up rows change, and the
// metrics against hand-computed values.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "trainer/data/synthetic.h"
#include "trainer/models/dlrm.h"
#include "trainer/models/metrics.h"
#include "trainer/models/sequence_model.h"

namespace deltastream {
namespace {

using ::testing::HasSubstr;

std::vector<EmbeddingTableConfig> Tables(int64_t rows, int64_t dim) {
  return {{"t0", rows, dim, {"cat_0"}}, {"t1", rows, dim, {"cat_1", "cat_2"}}};
}

std::unique_ptr<RecModel> MakeModel(bool sequence, uint64_t seed = 7,
                                    int64_t rows = 1000) {
  if (sequence) {
    SequenceModelConfig config;
    config.num_dense = 4;
    config.dense_arch = {16, 8};
    config.over_arch = {16, 1};
    config.tables = Tables(rows, 8);
    config.sparse_optimizer.learning_rate = 0.1;
    config.seed = seed;
    return *SequenceModel::Create(config);
  }
  DlrmConfig config;
  config.num_dense = 4;
  config.dense_arch = {16, 8};
  config.over_arch = {16, 1};
  config.tables = Tables(rows, 8);
  config.sparse_optimizer.learning_rate = 0.1;
  config.seed = seed;
  return *Dlrm::Create(config);
}

std::unique_ptr<SyntheticSource> Data(bool sequence, uint64_t stream,
                                      int64_t rows = 1000) {
  SyntheticOptions options;
  options.batch_size = 128;
  options.num_dense = 4;
  for (const char* name : {"cat_0", "cat_1", "cat_2"}) {
    options.features.push_back(
        {name, rows, sequence ? 0 : 1, sequence ? 5 : 1});
  }
  options.seed = 3;
  options.stream = stream;
  return *SyntheticSource::Create(options);
}

TEST(ModelsTest, ShapesAndDeterminism) {
  for (bool sequence : {false, true}) {
    auto a = MakeModel(sequence), b = MakeModel(sequence),
         c = MakeModel(sequence, /*seed=*/8);
    Batch batch = **Data(sequence, 0)->Next();
    torch::NoGradGuard no_grad;
    at::Tensor la = *a->Forward(batch), lb = *b->Forward(batch),
               lc = *c->Forward(batch);
    EXPECT_EQ(la.sizes(), (std::vector<int64_t>{128})) << sequence;
    EXPECT_TRUE(at::equal(la, lb)) << sequence;
    EXPECT_FALSE(at::equal(la, lc)) << sequence;
    EXPECT_EQ(a->embedding_modules().size(), 1u);
    EXPECT_EQ(a->embedding_modules()[0]->path(),
              sequence ? "sequence_arch.embedding_collection"
                       : "sparse_arch.embedding_bag_collection");
  }
}

TEST(ModelsTest, ValidationErrors) {
  DlrmConfig config;
  config.tables = Tables(10, 8);
  config.dense_arch = {16, 4};
  EXPECT_THAT(Dlrm::Create(config).status().message(),
              HasSubstr("dense_arch ends in 4"));
  config.dense_arch = {16, 8};
  config.over_arch = {16, 2};
  EXPECT_THAT(Dlrm::Create(config).status().message(),
              HasSubstr("must end in 1"));
  SequenceModelConfig sequence;
  sequence.tables = {};
  EXPECT_THAT(SequenceModel::Create(sequence).status().message(),
              HasSubstr("no tables"));
}

void CheckLearns(bool sequence) {
  auto model = MakeModel(sequence);
  torch::optim::Adagrad optimizer(model->dense().parameters(),
                                  torch::optim::AdagradOptions(0.05));
  auto train = Data(sequence, 0);
  std::vector<Batch> held_out;
  auto eval_source = Data(sequence, 1);
  for (int i = 0; i < 8; ++i) held_out.push_back(**eval_source->Next());
  auto auc = [&] {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> scores, labels;
    for (const Batch& b : held_out) {
      scores.push_back(*model->Forward(b));
      labels.push_back(b.labels);
    }
    return Auc(at::cat(scores), at::cat(labels));
  };
  const double auc_before = auc();
  const at::Tensor before = model->embedding_modules()[0]->weight(0).clone();
  double first_losses = 0, last_losses = 0;
  std::vector<int64_t> looked_up;
  for (int step = 0; step < 200; ++step) {
    Batch batch = **train->Next();
    if (step == 0) {
      at::Tensor ids = batch.sparse.ValuesOf(0);
      looked_up.assign(ids.data_ptr<int64_t>(),
                       ids.data_ptr<int64_t>() + ids.numel());
    }
    at::Tensor loss =
        BinaryCrossEntropyWithLogits(*model->Forward(batch), batch.labels);
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    if (step == 0) {
      // Only the rows of table t0 that step 0 looked up changed.
      at::Tensor now = model->embedding_modules()[0]->weight(0);
      at::Tensor changed = (now != before).any(1).nonzero().reshape({-1});
      at::Tensor expected = std::get<0>(
          at::_unique(at::tensor(looked_up, at::kLong), /*sorted=*/true));
      EXPECT_TRUE(at::equal(changed, expected)) << sequence;
    }
    if (step < 20) first_losses += loss.item<double>();
    if (step >= 180) last_losses += loss.item<double>();
  }
  const double auc_after = auc();
  std::printf("%s: loss %.4f -> %.4f, held-out AUC %.3f -> %.3f\n",
              sequence ? "sequence" : "dlrm", first_losses / 20,
              last_losses / 20, auc_before, auc_after);
  EXPECT_LT(last_losses, first_losses * 0.95) << sequence;
  EXPECT_GT(auc_after, 0.7) << sequence;
}

TEST(ModelsTest, DlrmLearns) { CheckLearns(false); }
TEST(ModelsTest, SequenceModelLearns) { CheckLearns(true); }

TEST(MetricsTest, AucAndBinaryCrossEntropy) {
  // Positives at 0.9 and 0.4, negatives at 0.4 and 0.1: pairs (0.9 > 0.4),
  // (0.9 > 0.1), (0.4 = 0.4: a half), (0.4 > 0.1) -> 3.5 / 4.
  EXPECT_DOUBLE_EQ(
      Auc(at::tensor({0.9, 0.4, 0.4, 0.1}), at::tensor({1.0, 1.0, 0.0, 0.0})),
      3.5 / 4);
  EXPECT_DOUBLE_EQ(Auc(at::tensor({0.2, 0.3}), at::tensor({1.0, 1.0})), 0.5);
  EXPECT_DOUBLE_EQ(
      Auc(at::tensor({0.1, 0.2, 0.3}), at::tensor({0.0, 0.0, 1.0})), 1.0);
  at::Tensor logits = at::tensor({0.0, 2.0});
  at::Tensor labels = at::tensor({1.0, 0.0});
  const double expected = (std::log(2.0) + std::log(1 + std::exp(2.0))) / 2;
  EXPECT_NEAR(BinaryCrossEntropyWithLogits(logits, labels).item<double>(),
              expected, 1e-6);
}

TEST(ModelsTest, CudaForwardMatchesCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  DlrmConfig config;
  config.num_dense = 4;
  config.dense_arch = {16, 8};
  config.over_arch = {16, 1};
  config.tables = Tables(1000, 8);
  config.seed = 7;
  auto cpu = *Dlrm::Create(config);
  config.device = c10::Device(c10::kCUDA, 0);
  auto gpu = *Dlrm::Create(config);
  Batch batch = **Data(false, 0)->Next();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(at::allclose(*cpu->Forward(batch),
                           gpu->Forward(batch.To(gpu->device()))->cpu(), 1e-4,
                           1e-4));
}

}  // namespace
}  // namespace deltastream
