#ifndef DELTASTREAM_TRAINER_MODELS_EMBEDDING_ARCH_H_
#define DELTASTREAM_TRAINER_MODELS_EMBEDDING_ARCH_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "trainer/models/model.h"
#include "trainer/modules/embedding_modules.h"
#include "trainer/sharding/sharded_embedding_modules.h"
#include "trainer/sparse/keyed_jagged_tensor.h"

namespace deltastream {

// The embedding part of a model (RecModel): one collection, unsharded
// (`Collection`: EmbeddingBagCollection or EmbeddingCollection), or sharded
// over RecModelConfig::group by its plan (`Sharded`: the matching sharded
// collection). One rule for both models: which of the two a config builds,
// what a forward runs, and what the model reports as its modules.
template <typename Collection, typename Sharded>
class EmbeddingArch {
 public:
  // What Forward returns: KeyedTensor (pooled) or FeatureDict (sequence).
  using Output = typename decltype(std::declval<Collection&>().Forward(
      std::declval<const KeyedJaggedTensor&>()))::value_type;

  // The collection at `path` over config's tables, optimizer, device and
  // seed; the collection's Create errors.
  static absl::StatusOr<EmbeddingArch> Create(std::string path,
                                              const RecModelConfig& config) {
    EmbeddingModuleOptions options;
    options.path = std::move(path);
    options.tables = config.tables;
    options.optimizer = config.sparse_optimizer;
    options.device = config.device;
    options.seed = config.seed;
    EmbeddingArch arch;
    if (config.group == nullptr) {
      absl::StatusOr<std::unique_ptr<Collection>> made =
          Collection::Create(std::move(options));
      if (!made.ok()) return made.status();
      arch.unsharded_ = *std::move(made);
    } else {
      ShardedModuleOptions sharded_options;
      sharded_options.module = std::move(options);
      sharded_options.plan = config.plan;
      absl::StatusOr<std::unique_ptr<Sharded>> made =
          Sharded::Create(std::move(sharded_options), config.group);
      if (!made.ok()) return made.status();
      arch.sharded_ = *std::move(made);
    }
    return arch;
  }

  // The lookup of `input` (`distributed` null), or, sharded, the compute
  // and output distribution of an input distributed ahead
  // (RecModel::ForwardDistributed: FailedPrecondition for an unsharded
  // model or not exactly one distributed batch).
  absl::StatusOr<Output> Forward(
      const KeyedJaggedTensor& input,
      const absl::Span<const DistributedBatch>* distributed) {
    if (distributed == nullptr) {
      return sharded_ != nullptr ? sharded_->Forward(input)
                                 : unsharded_->Forward(input);
    }
    if (sharded_ == nullptr || distributed->size() != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ForwardDistributed needs a sharded model and one distributed "
          "input per sharded module (1), got ",
          sharded_ == nullptr ? "an unsharded model" : "another count: ",
          sharded_ == nullptr ? 0 : distributed->size()));
    }
    return sharded_->ComputeAndDistribute((*distributed)[0]);
  }

  // RecModel::embedding_modules() and sharded_modules().
  std::vector<EmbeddingModule*> modules() const {
    if (unsharded_ != nullptr) return {unsharded_.get()};
    if (sharded_->local_module() == nullptr) return {};
    return {sharded_->local_module()};
  }
  std::vector<ShardedEmbeddingModule*> sharded_modules() const {
    if (sharded_ == nullptr) return {};
    return {sharded_.get()};
  }
  const std::vector<std::string>& feature_names() const {
    return unsharded_ != nullptr ? unsharded_->feature_names()
                                 : sharded_->feature_names();
  }

 private:
  // Exactly one of the two.
  std::unique_ptr<Collection> unsharded_;
  std::unique_ptr<Sharded> sharded_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODELS_EMBEDDING_ARCH_H_
