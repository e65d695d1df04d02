#ifndef DELTASTREAM_TRAINER_MODELS_SEQUENCE_MODEL_H_
#define DELTASTREAM_TRAINER_MODELS_SEQUENCE_MODEL_H_

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
using SequenceModelConfig = RecModelConfig;

// A sequence model over an EmbeddingCollection
// ("sequence_arch.embedding_collection"): one row per ID; each feature's rows
// of an example are attention-pooled against the dense vector (DIN-style:
// softmax over the example's rows of <row, dense>, then the weighted sum; an
// example without IDs pools to zeros); the dense vector and the pooled ones
// go through a top MLP to a logit (see AttentionPool in
// trainer/models/attention_pooling.h). All on the device,
// no host loops. Dense parameters: "dense_arch.*" and "over_arch.*".
class SequenceModel : public RecModel {
 public:
  // InvalidArgument as Dlrm::Create.
  static absl::StatusOr<std::unique_ptr<SequenceModel>> Create(
      SequenceModelConfig config);
  ~SequenceModel() override;

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
  explicit SequenceModel(SequenceModelConfig config);

  SequenceModelConfig config_;
  using Embeddings =
      EmbeddingArch<EmbeddingCollection, ShardedEmbeddingCollection>;
  Embeddings ec_;
  std::shared_ptr<Dense> dense_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODELS_SEQUENCE_MODEL_H_
