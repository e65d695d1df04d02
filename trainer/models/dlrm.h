#ifndef DELTASTREAM_TRAINER_MODELS_DLRM_H_
#define DELTASTREAM_TRAINER_MODELS_DLRM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/models/embedding_arch.h"
#include "trainer/models/model.h"
#include "trainer/modules/embedding_config.h"
#include "trainer/modules/embedding_modules.h"
#include "trainer/optim/sparse_optimizer.h"
#include "trainer/sharding/sharded_embedding_modules.h"

namespace deltastream {

// The fields are the same for every model (trainer/models/model.h).
using DlrmConfig = RecModelConfig;

// DLRM (Naumov et al., 2019): a bottom MLP turns the dense features into one
// D-vector; an EmbeddingBagCollection ("sparse_arch.embedding_bag_collection")
// pools one D-vector per sparse feature; the interaction takes the pairwise
// dot products of those F + 1 vectors (i < j) next to the dense vector; a top
// MLP maps them to a logit. Dense parameters: "dense_arch.*" and
// "over_arch.*" (torch::nn::Sequential of Linear and ReLU).
class Dlrm : public RecModel {
 public:
  // InvalidArgument: bad tables or optimizer, tables of another dim than
  // dense_arch's last width, empty or non-positive widths, over_arch not
  // ending in 1, num_dense < 1.
  static absl::StatusOr<std::unique_ptr<Dlrm>> Create(DlrmConfig config);
  ~Dlrm() override;

  absl::StatusOr<at::Tensor> Forward(const Batch& batch) override;
  absl::StatusOr<at::Tensor> ForwardDistributed(
      const Batch& batch,
      absl::Span<const DistributedBatch> distributed) override;
  std::vector<EmbeddingModule*> embedding_modules() override;
  std::vector<ShardedEmbeddingModule*> sharded_modules() override;
  torch::nn::Module& dense() override;
  c10::Device device() const override { return config_.device; }

 private:
  struct Dense;
  // Forward with the input distribution done (`distributed`, sharded) or
  // done inside (null).
  absl::StatusOr<at::Tensor> ForwardFrom(
      const Batch& batch,
      const absl::Span<const DistributedBatch>* distributed);
  explicit Dlrm(DlrmConfig config);

  DlrmConfig config_;
  using Embeddings =
      EmbeddingArch<EmbeddingBagCollection, ShardedEmbeddingBagCollection>;
  Embeddings ebc_;
  std::shared_ptr<Dense> dense_;
  int64_t num_features_ = 0;      // F, the EBC's features
  at::Tensor interaction_index_;  // flat (i, j), i < j, of [F+1, F+1]
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODELS_DLRM_H_
