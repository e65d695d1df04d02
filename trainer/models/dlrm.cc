#include "trainer/models/dlrm.h"

#include "absl/strings/str_cat.h"
#include "trainer/models/architecture.h"

namespace deltastream {

struct Dlrm::Dense : torch::nn::Module {
  Dense(const DlrmConfig& config, int64_t num_features) {
    const int64_t dim = config.dense_arch.back();
    const int64_t vectors = num_features + 1;
    dense_arch = register_module(
        "dense_arch", MakeMlp(config.num_dense, config.dense_arch, true));
    over_arch = register_module(
        "over_arch",
        MakeMlp(dim + vectors * (vectors - 1) / 2, config.over_arch, false));
  }
  torch::nn::Sequential dense_arch{nullptr};
  torch::nn::Sequential over_arch{nullptr};
};

Dlrm::Dlrm(DlrmConfig config) : config_(std::move(config)) {}
Dlrm::~Dlrm() = default;

absl::StatusOr<std::unique_ptr<Dlrm>> Dlrm::Create(DlrmConfig config) {
  if (absl::Status status = ValidateArchitecture(config); !status.ok()) {
    return status;
  }
  absl::StatusOr<Embeddings> arch =
      Embeddings::Create("sparse_arch.embedding_bag_collection", config);
  if (!arch.ok()) return arch.status();
  std::unique_ptr<Dlrm> model(new Dlrm(std::move(config)));
  model->ebc_ = *std::move(arch);
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    const int64_t features =
        static_cast<int64_t>(model->ebc_.feature_names().size());
    model->num_features_ = features;
    model->dense_ = std::make_shared<Dense>(model->config_, features);
    // From a local generator (the global one is not reseeded), on the CPU,
    // so every device starts from the same parameters.
    InitializeLinearLayers(*model->dense_,
                           DenseParameterSeed(model->config_.seed));
    model->dense_->to(model->config_.device);
    at::Tensor pairs = at::triu_indices(features + 1, features + 1, 1);
    model->interaction_index_ =
        (pairs[0] * (features + 1) + pairs[1]).to(model->config_.device);
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return model;
}

absl::StatusOr<at::Tensor> Dlrm::Forward(const Batch& batch) {
  return ForwardFrom(batch, nullptr);
}

absl::StatusOr<at::Tensor> Dlrm::ForwardDistributed(
    const Batch& batch, absl::Span<const DistributedBatch> distributed) {
  return ForwardFrom(batch, &distributed);
}

absl::StatusOr<at::Tensor> Dlrm::ForwardFrom(
    const Batch& batch, const absl::Span<const DistributedBatch>* distributed) {
  if (absl::Status status =
          ValidateBatch(batch, config_.num_dense, config_.device);
      !status.ok()) {
    return status;
  }
  absl::StatusOr<KeyedTensor> pooled = ebc_.Forward(batch.sparse, distributed);
  if (!pooled.ok()) return pooled.status();
  return CatchTorchErrors([&]() -> absl::StatusOr<at::Tensor> {
    const int64_t b = batch.dense.size(0);
    const int64_t dim = config_.dense_arch.back();
    // [B, D]
    const at::Tensor dense = dense_->dense_arch->forward(batch.dense);
    // [B, F, D]: the KeyedTensor's blocks side by side, in feature order.
    const at::Tensor sparse = pooled->values()
                                  .to(dense.scalar_type())
                                  .reshape({b, num_features_, dim});
    // [B, F + 1, D] -> the dot products of the pairs i < j.
    const at::Tensor vectors = at::cat({dense.unsqueeze(1), sparse}, 1);
    const at::Tensor dots = at::bmm(vectors, vectors.transpose(1, 2));
    const at::Tensor interactions =
        dots.flatten(1).index_select(1, interaction_index_);
    return dense_->over_arch->forward(at::cat({dense, interactions}, 1))
        .squeeze(1);
  });
}

std::vector<EmbeddingModule*> Dlrm::embedding_modules() {
  return ebc_.modules();
}

std::vector<ShardedEmbeddingModule*> Dlrm::sharded_modules() {
  return ebc_.sharded_modules();
}

torch::nn::Module& Dlrm::dense() { return *dense_; }

}  // namespace deltastream
