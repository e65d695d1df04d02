#ifndef DELTASTREAM_TRAINER_MODELS_MODEL_H_
#define DELTASTREAM_TRAINER_MODELS_MODEL_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/batch.h"
#include "trainer/modules/embedding_modules.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace deltastream {

// A recommendation model as the trainer drives it: a click logit per example
// from dense features and sparse IDs. Embedding tables live in embedding
// modules whose fused optimizers update them inside backward; every other
// parameter is in dense(), for an ordinary torch::optim optimizer.
class RecModel {
 public:
  virtual ~RecModel() = default;

  // Logits float [B] for a batch already on device(). In training (gradients
  // enabled) the embedding modules call their hooks; errors are the
  // modules' (a missing feature, an input on another device).
  virtual absl::StatusOr<at::Tensor> Forward(const Batch& batch) = 0;

  // The model's embedding modules (owned by the model), their paths the
  // model's attribute paths, e.g. "sparse_arch.embedding_bag_collection".
  virtual std::vector<EmbeddingModule*> embedding_modules() = 0;

  // Every dense parameter, for the dense optimizer and checkpoints.
  virtual torch::nn::Module& dense() = 0;

  virtual c10::Device device() const = 0;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODELS_MODEL_H_
