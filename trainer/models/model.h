#ifndef DELTASTREAM_TRAINER_MODELS_MODEL_H_
#define DELTASTREAM_TRAINER_MODELS_MODEL_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/plan.pb.h"
#include "trainer/data/batch.h"
#include "trainer/modules/embedding_config.h"
#include "trainer/modules/embedding_modules.h"
#include "trainer/optim/sparse_optimizer.h"

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace deltastream {

class ProcessGroup;
class ShardedEmbeddingModule;
struct DistributedBatch;

// What every model is built from (Dlrm, SequenceModel).
struct RecModelConfig {
  int64_t num_dense = 13;
  // Bottom MLP over the dense features; its last width D is the embedding dim
  // every table must share (DLRM's interaction, the sequence model's query).
  std::vector<int64_t> dense_arch = {64, 16};
  // Top MLP; ends in 1 (the logit).
  std::vector<int64_t> over_arch = {64, 32, 1};
  // Pooled tables for DLRM, sequence features for the sequence model.
  std::vector<EmbeddingTableConfig> tables;
  SparseOptimizerConfig sparse_optimizer;
  c10::Device device = c10::Device(c10::kCPU);
  // Tables and dense parameters start from this seed: the same config and
  // seed give bit-identical models, on any device, whatever the global
  // generator's state (which Create does not reseed).
  uint64_t seed = 0;
  // Sharding (trainer/sharding): with a group, the model's embedding module
  // is sharded over its ranks by `plan` (no tables: DefaultShardingPlan,
  // table-wise round robin), and every rank computes the logits of its own
  // examples; the dense part is replicated (its gradients are averaged by
  // the caller: AverageGradients). Null: one process, unsharded. The group
  // outlives the model.
  ProcessGroup* group = nullptr;
  v1::ShardingPlan plan;
};

// The shape rule (trainer/models/architecture_rule.h) of `config`: what
// every model's Create checks before it builds anything, for a config's
// resolution to check first (ResolveTrainerConfig).
absl::Status ValidateArchitecture(const RecModelConfig& config);

// A recommendation model as the trainer drives it: a click logit per example
// from dense features and sparse IDs. Embedding tables live in embedding
// modules whose fused optimizers update them inside backward; every other
// parameter is in dense(), for an ordinary torch::optim optimizer.
class RecModel {
 public:
  virtual ~RecModel() = default;

  // Logits [B] (float for float dense features) for a batch already on
  // device(). The batch's sparse features may carry keys the model does not
  // read; they are ignored. Nothing is copied to the host and nothing
  // synchronises with the device beyond the KJT's own host metadata.
  //
  // With gradients enabled (training), loss.backward() on a loss of these
  // logits also applies the embedding modules' fused sparse optimizers to
  // the rows this batch looked up, and the modules call their hooks; under
  // c10::NoGradGuard (evaluation) no row changes. (The model's own backward
  // does not synchronise either; the modules' fused update deduplicates IDs
  // with at::_unique2, which does.)
  //
  // Errors: InvalidArgument when batch.dense is not a floating
  // [B, num_dense] tensor on device() or the sparse stride is not B; the
  // embedding modules' errors (NotFound for a missing feature,
  // InvalidArgument for sparse features on another device); Internal for a
  // LibTorch error.
  virtual absl::StatusOr<at::Tensor> Forward(const Batch& batch) = 0;

  // Forward of a sharded model whose sparse input is already distributed:
  // `distributed[i]` is sharded_modules()[i]->DistributeInput(batch.sparse)
  // (over any group of the same ranks). The same logits, gradients and
  // hook calls as Forward(batch), without the input distribution's
  // collectives (TrainPipelineSparseDist runs them ahead, on another
  // thread). FailedPrecondition for an unsharded model or a count that is
  // not sharded_modules().size(); otherwise Forward's errors.
  virtual absl::StatusOr<at::Tensor> ForwardDistributed(
      const Batch& batch, absl::Span<const DistributedBatch> distributed) = 0;

  // The model's embedding modules (owned by the model), their paths the
  // model's attribute paths, e.g. "sparse_arch.embedding_bag_collection".
  // Sharded: the local modules holding this rank's shards (tables named as
  // the global ones, local row IDs; a rank without shards has none).
  virtual std::vector<EmbeddingModule*> embedding_modules() = 0;

  // Sharded: the sharded modules (owned by the model), whose local modules
  // are embedding_modules(). Unsharded: empty.
  virtual std::vector<ShardedEmbeddingModule*> sharded_modules() = 0;

  // A module holding every dense parameter (everything but the embedding
  // tables), on device(), for the dense optimizer (parameters()) and
  // checkpoints (named_parameters(), e.g. "dense_arch.0.weight").
  virtual torch::nn::Module& dense() = 0;

  // Where the parameters, the tables and the batches live.
  virtual c10::Device device() const = 0;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODELS_MODEL_H_
