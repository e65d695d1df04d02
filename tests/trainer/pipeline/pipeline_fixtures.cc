#include "tests/trainer/pipeline/pipeline_fixtures.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <tuple>
#include <utility>

#include "tests/testing/tensor_values.h"
#include "trainer/models/dlrm.h"
#include "trainer/models/sequence_model.h"
#include "trainer/optim/dense_optimizer.h"

namespace deltastream {
namespace testing {

Examples MakeExamples(int64_t n, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  Examples examples;
  examples.dense = at::randn({n, kNumDense}, generator);
  examples.labels = at::randint(0, 2, {n}, generator).to(at::kFloat);
  const std::vector<int64_t> rows = {100, 50};
  const at::Tensor draws = at::randint(0, 1 << 20, {2, n, 4}, generator);
  examples.ids.resize(rows.size());
  for (size_t f = 0; f < rows.size(); ++f) {
    for (int64_t e = 0; e < n; ++e) {
      // cat_0: one ID; cat_1: one to three.
      const int64_t count = f == 0 ? 1 : 1 + draws[f][e][3].item<int64_t>() % 3;
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < count; ++i) {
        // Few hot rows, so that micro-batches share rows.
        ids.push_back(draws[f][e][i].item<int64_t>() % (rows[f] / 4));
      }
      examples.ids[f].push_back(std::move(ids));
    }
  }
  return examples;
}

Batch MakeBatch(const Examples& examples, int64_t begin, int64_t end) {
  std::vector<int64_t> values, lengths;
  for (const auto& feature : examples.ids) {
    for (int64_t e = begin; e < end; ++e) {
      values.insert(values.end(), feature[e].begin(), feature[e].end());
      lengths.push_back(static_cast<int64_t>(feature[e].size()));
    }
  }
  Batch batch;
  batch.dense = examples.dense.narrow(0, begin, end - begin).clone();
  batch.labels = examples.labels.narrow(0, begin, end - begin).clone();
  batch.sparse = *KeyedJaggedTensor::FromLengths({"cat_0", "cat_1"},
                                                 Ids(values), Ids(lengths));
  return batch;
}

Batch AsFeatureDict(Batch batch) {
  FeatureDict features;
  for (int64_t k = 0; k < batch.sparse.num_keys(); ++k) {
    const JaggedTensor feature = batch.sparse.At(k);
    absl::StatusOr<JaggedTensor> own = JaggedTensor::FromLengths(
        feature.values().clone(), feature.lengths().clone());
    EXPECT_TRUE(own.ok()) << own.status();
    EXPECT_TRUE(features.Add(batch.sparse.keys()[k], *std::move(own)).ok());
  }
  batch.sparse = KeyedJaggedTensor();
  batch.sparse_dict = std::move(features);
  return batch;
}

absl::StatusOr<std::optional<Batch>> ExampleSource::Next() {
  if (next_ == sizes_.size()) return std::nullopt;
  const int64_t begin = begin_;
  begin_ += sizes_[next_++];
  Batch batch = MakeBatch(examples_, begin, begin_);
  if (feature_dicts_) return AsFeatureDict(std::move(batch));
  return batch;
}

std::vector<int64_t> Repeat(int64_t size, int count) {
  return std::vector<int64_t>(count, size);
}

Trainable::Trainable(SparseOptimizerType sparse, ProcessGroup* group,
                     bool sequence, c10::Device device,
                     const std::string& dense_optimizer) {
  DlrmConfig config;
  config.num_dense = kNumDense;
  config.dense_arch = {16, kDim};
  config.over_arch = {16, 1};
  for (const auto& [name, rows, feature] :
       {std::tuple<const char*, int64_t, const char*>{"t0", 100, "cat_0"},
        {"t1", 50, "cat_1"}}) {
    EmbeddingTableConfig table;
    table.name = name;
    table.num_embeddings = rows;
    table.embedding_dim = kDim;
    table.feature_names = {feature};
    config.tables.push_back(table);
  }
  config.sparse_optimizer.type = sparse;
  config.sparse_optimizer.learning_rate = 0.05;
  config.sparse_optimizer.weight_decay = 0.01;
  config.seed = 3;
  config.group = group;
  config.device = device;
  if (sequence) {
    absl::StatusOr<std::unique_ptr<SequenceModel>> made =
        SequenceModel::Create(config);
    if (!made.ok()) std::abort();
    model = *std::move(made);
  } else {
    absl::StatusOr<std::unique_ptr<Dlrm>> made = Dlrm::Create(config);
    if (!made.ok()) std::abort();
    model = *std::move(made);
  }
  dense =
      *MakeDenseOptimizer(dense_optimizer, 0.01, model->dense().parameters());
}

TrainPipelineParts Trainable::Parts(ProcessGroup* group) const {
  TrainPipelineParts parts;
  parts.model = model.get();
  parts.dense_optimizer = dense.get();
  parts.group = group;
  return parts;
}

TrainPipelineOptions Options(const std::string& pipeline, int k) {
  TrainPipelineOptions options;
  options.pipeline = pipeline;
  options.accumulation_steps = k;
  return options;
}

absl::StatusOr<int> TrainAll(TrainPipeline& pipeline, BatchSource& source) {
  int batches = 0;
  while (true) {
    absl::StatusOr<std::optional<TrainedStep>> step = pipeline.Progress(source);
    if (!step.ok()) return step.status();
    if (!step->has_value()) return batches;
    ++batches;
  }
}

double MaxDifference(RecModel& a, RecModel& b) {
  double worst = 0;
  auto compare = [&](const at::Tensor& x, const at::Tensor& y) {
    if (x.sizes() != y.sizes()) {
      worst = INFINITY;
      return;
    }
    if (x.numel() == 0) return;
    const double d = (x.cpu().to(at::kDouble) - y.cpu().to(at::kDouble))
                         .abs()
                         .max()
                         .item<double>();
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  };
  std::vector<at::Tensor> pa = a.dense().parameters();
  std::vector<at::Tensor> pb = b.dense().parameters();
  if (pa.size() != pb.size()) return INFINITY;
  for (size_t i = 0; i < pa.size(); ++i) compare(pa[i], pb[i]);
  std::vector<EmbeddingModule*> ma = a.embedding_modules();
  std::vector<EmbeddingModule*> mb = b.embedding_modules();
  if (ma.size() != mb.size()) return INFINITY;
  for (size_t m = 0; m < ma.size(); ++m) {
    auto sa = ma[m]->StateTensors();
    auto sb = mb[m]->StateTensors();
    if (sa.size() != sb.size()) return INFINITY;
    for (size_t i = 0; i < sa.size(); ++i) compare(sa[i].second, sb[i].second);
  }
  return worst;
}

std::unique_ptr<Trainable> Train(SparseOptimizerType sparse,
                                 const TrainPipelineOptions& options,
                                 const Examples& examples,
                                 std::vector<int64_t> sizes, c10::Device device,
                                 const std::string& dense_optimizer,
                                 ProcessGroup* group) {
  auto trainable = std::make_unique<Trainable>(sparse, group, false, device,
                                               dense_optimizer);
  absl::StatusOr<std::unique_ptr<TrainPipeline>> pipeline =
      MakeTrainPipeline(options, trainable->Parts(group));
  EXPECT_TRUE(pipeline.ok()) << pipeline.status();
  if (!pipeline.ok()) return trainable;
  ExampleSource source(examples, std::move(sizes));
  absl::StatusOr<int> trained = TrainAll(**pipeline, source);
  EXPECT_TRUE(trained.ok()) << trained.status();
  return trainable;
}

}  // namespace testing
}  // namespace deltastream
