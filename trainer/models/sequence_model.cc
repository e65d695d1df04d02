#include "trainer/models/sequence_model.h"

#include "absl/strings/str_cat.h"
#include "trainer/models/architecture.h"
#include "trainer/models/attention_pooling.h"

namespace deltastream {

struct SequenceModel::Dense : torch::nn::Module {
  Dense(const SequenceModelConfig& config, int64_t num_features) {
    const int64_t dim = config.dense_arch.back();
    dense_arch = register_module(
        "dense_arch", MakeMlp(config.num_dense, config.dense_arch, true));
    over_arch = register_module("over_arch", MakeMlp(dim * (num_features + 1),
                                                     config.over_arch, false));
  }
  torch::nn::Sequential dense_arch{nullptr};
  torch::nn::Sequential over_arch{nullptr};
};

SequenceModel::SequenceModel(SequenceModelConfig config)
    : config_(std::move(config)) {}
SequenceModel::~SequenceModel() = default;

absl::StatusOr<std::unique_ptr<SequenceModel>> SequenceModel::Create(
    SequenceModelConfig config) {
  if (absl::Status status = ValidateArchitecture(config); !status.ok()) {
    return status;
  }
  absl::StatusOr<Embeddings> arch =
      Embeddings::Create("sequence_arch.embedding_collection", config);
  if (!arch.ok()) return arch.status();
  std::unique_ptr<SequenceModel> model(new SequenceModel(std::move(config)));
  model->ec_ = *std::move(arch);
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    model->dense_ = std::make_shared<Dense>(
        model->config_,
        static_cast<int64_t>(model->ec_.feature_names().size()));
    // From a local generator (the global one is not reseeded), on the CPU,
    // so every device starts from the same parameters.
    InitializeLinearLayers(*model->dense_,
                           DenseParameterSeed(model->config_.seed));
    model->dense_->to(model->config_.device);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return model;
}

absl::StatusOr<at::Tensor> SequenceModel::Forward(const Batch& batch) {
  return ForwardFrom(batch, nullptr);
}

absl::StatusOr<at::Tensor> SequenceModel::ForwardDistributed(
    const Batch& batch, absl::Span<const DistributedBatch> distributed) {
  return ForwardFrom(batch, &distributed);
}

absl::StatusOr<at::Tensor> SequenceModel::ForwardFrom(
    const Batch& batch, const absl::Span<const DistributedBatch>* distributed) {
  if (absl::Status status =
          ValidateBatch(batch, config_.num_dense, config_.device);
      !status.ok()) {
    return status;
  }
  absl::StatusOr<FeatureDict> sequences =
      ec_.Forward(batch.sparse, distributed);
  if (!sequences.ok()) return sequences.status();
  return CatchTorchErrors([&]() -> absl::StatusOr<at::Tensor> {
    // [B, D]: the dense vector, also every feature's attention query.
    const at::Tensor query = dense_->dense_arch->forward(batch.dense);
    std::vector<at::Tensor> parts = {query};
    for (int64_t f = 0; f < sequences->size(); ++f) {
      const JaggedTensor& sequence = sequences->At(f);
      absl::StatusOr<at::Tensor> pooled =
          AttentionPool(sequence.values(), sequence.lengths(), query);
      if (!pooled.ok()) return pooled.status();
      parts.push_back(*std::move(pooled));
    }
    // [B, (F + 1) D] -> [B]
    return dense_->over_arch->forward(at::cat(parts, 1)).squeeze(1);
  });
}

std::vector<EmbeddingModule*> SequenceModel::embedding_modules() {
  return ec_.modules();
}

std::vector<ShardedEmbeddingModule*> SequenceModel::sharded_modules() {
  return ec_.sharded_modules();
}

torch::nn::Module& SequenceModel::dense() { return *dense_; }

}  // namespace deltastream
