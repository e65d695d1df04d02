#ifndef DELTASTREAM_TRAINER_MODULES_EMBEDDING_MODULES_H_
#define DELTASTREAM_TRAINER_MODULES_EMBEDDING_MODULES_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/modules/embedding_config.h"
#include "trainer/optim/sparse_optimizer.h"
#include "trainer/sparse/feature_dict.h"
#include "trainer/sparse/keyed_jagged_tensor.h"
#include "trainer/sparse/keyed_tensor.h"

namespace deltastream {

class EmbeddingModule;

// What one forward pass of a module looked up, for the post-lookup hooks.
struct ModuleLookup {
  // The module's features (its tables' features, in table order).
  const KeyedJaggedTensor& features;
  // Per table, in tables() order: the IDs its features looked up
  // (concatenated in feature order, int64 [n_t]) and the rows they read,
  // [n_t, dim_t], as they were before this step's update. Views of live
  // tensors on the module's device: a hook that keeps them must not modify
  // them.
  std::vector<at::Tensor> ids;
  std::vector<at::Tensor> rows;
};

// Called after every training lookup (a forward with gradients enabled),
// before pooling; an error fails the forward with it. Evaluation forwards
// (under c10::NoGradGuard) change no row and call no hook.
using PostLookupHook =
    std::function<absl::Status(const EmbeddingModule&, const ModuleLookup&)>;
// Called once a training forward's output exists (TorchRec's
// post-output-dist point, where the tracker compacts).
using PostOutputHook = std::function<void(const EmbeddingModule&)>;

struct EmbeddingModuleOptions {
  // The module's path in the model, e.g. "sparse.ebc"; table FQNs are
  // "<path>.embedding_bags.<table>" (pooled) or "<path>.embeddings.<table>".
  std::string path;
  std::vector<EmbeddingTableConfig> tables;
  SparseOptimizerConfig optimizer;
  c10::Device device = c10::Device(c10::kCPU);
  // Initial rows are drawn from this seed on the CPU, so every device starts
  // from the same values.
  uint64_t seed = 0;
  // Pooled only: every ID carries a weight (the KJT's weights) that scales
  // its row before sum pooling. Needs sum pooling in every table.
  bool is_weighted = false;
};

// The common part of the two embedding collections: tables, their fused
// sparse optimizer, hooks, and access to live rows.
//
// Training. The forward pass reads rows for the IDs of every table; when
// gradients are enabled (c10::GradMode), backward applies the table's
// optimizer to the rows those IDs name, and only to them, as part of
// loss.backward(): there is no separate optimizer step and no dense gradient
// of a table. A forward under c10::NoGradGuard (evaluation) updates nothing.
//
// Threads. Forward and backward run on the training thread (backward on
// autograd's threads). Rows change during backward: a reader on another
// thread (ReadRows, ReadOptimizerStates) must not overlap a backward; the
// trainer's ModuleRowsReader (trainer/tracking) serialises them with a lock
// that the training loop holds across backward.
class EmbeddingModule {
 public:
  virtual ~EmbeddingModule() = default;
  EmbeddingModule(const EmbeddingModule&) = delete;
  EmbeddingModule& operator=(const EmbeddingModule&) = delete;

  const std::string& path() const { return options_.path; }
  // True for EmbeddingBagCollection (pooled), false for EmbeddingCollection.
  virtual bool pooled() const = 0;
  const std::vector<EmbeddingTableConfig>& tables() const {
    return options_.tables;
  }
  const SparseOptimizerConfig& optimizer_config() const {
    return options_.optimizer;
  }
  c10::Device device() const { return options_.device; }
  // Every feature of every table, in table order.
  const std::vector<std::string>& feature_names() const {
    return feature_names_;
  }

  // Position of table `name`; NotFound when absent.
  absl::StatusOr<int64_t> TableIndex(absl::string_view name) const;
  // The FQN of table `index`: "<path>.embedding_bags.<name>" or
  // "<path>.embeddings.<name>".
  std::string TableFqn(int64_t index) const;
  // The live table `index`, [rows, dim] (do not modify it outside backward).
  const at::Tensor& weight(int64_t index) const { return weights_[index]; }

  // Current rows of `ids` (int64, any device) of table `index`, [n, dim], on
  // the module's device. InvalidArgument for an ID outside [0, rows).
  absl::StatusOr<at::Tensor> ReadRows(int64_t index,
                                      const at::Tensor& ids) const;
  // The optimizer's row state of `ids` ([n, dim] or [n, 1]).
  // FailedPrecondition for SGD (no row state); InvalidArgument as ReadRows.
  absl::StatusOr<at::Tensor> ReadOptimizerStates(int64_t index,
                                                 const at::Tensor& ids) const;

  void AddPostLookupHook(PostLookupHook hook);
  void AddPostOutputHook(PostOutputHook hook);

  // Exact gradient accumulation (a window of K micro-batches trained as one
  // batch of K x B). While accumulating, a training forward neither calls the
  // post-lookup hooks nor attaches the fused update: backward adds each
  // table's row gradients (IDs and per-occurrence gradients) to a buffer,
  // and the lookups (features, IDs, rows) are kept for the hooks. Rows and
  // optimizer states do not change until ApplyAccumulated, which first calls
  // the post-lookup hooks for every kept lookup, in lookup order (so the
  // tracker records the window's IDs in the batch whose step changes their
  // rows, and EMBEDDING rows as they were before that step: unchanged during
  // the window), then applies each table's optimizer ONCE to the summed
  // gradients of every row touched in any micro-batch of the window: SGD,
  // Adagrad, row-wise Adagrad and Adam then match one batch of K x B (Adam's
  // step counts windows). The caller scales each micro-batch's loss (TrainStep:
  // by its share of the window, 1/K for K equal micro-batches).
  //
  // Turning accumulation off with gradients buffered is the caller's error:
  // apply them first. Training-thread only, like forward.
  void SetAccumulating(bool accumulating) { accumulating_ = accumulating; }
  bool accumulating() const { return accumulating_; }
  // Whether a forward or backward of the open window left something to
  // apply.
  bool has_accumulated() const;
  // Calls the kept lookups' hooks, then applies the buffered gradients times
  // `gradient_scale` (TrainStep's window rescale: K / m for a last window of
  // m < K equal micro-batches whose loss was scaled by 1/K) and empties the
  // buffers. A hook's error is
  // returned before any row changes (the buffers are then dropped). Call
  // after the window's last backward, where the training loop holds the
  // rows reader's update guard.
  absl::Status ApplyAccumulated(double gradient_scale = 1.0);
  // Whether every buffered row gradient is finite (mixed precision's
  // overflow check; synchronises with the device).
  bool AccumulatedGradientsFinite() const;
  // Drops the buffered gradients and kept lookups: a skipped step changes
  // no row and records nothing.
  void DiscardAccumulated();

  // Every tensor of the module for checkpoints, by name:
  // "<table>.weight", "<table>.momentum1", "<table>.momentum2", "<table>.step"
  // (the optimizer's, where it has them). Live tensors, no copy.
  std::vector<std::pair<std::string, at::Tensor>> StateTensors() const;
  // Loads them (from any device; copied into the live tensors).
  // InvalidArgument when a name is missing or unknown, or a shape or dtype
  // differs; nothing changes then.
  absl::Status LoadStateTensors(
      const std::vector<std::pair<std::string, at::Tensor>>& states);

  // The checks Create runs on a module's options: a path, tables
  // (ValidateTables), the optimizer (ValidateOptimizer), per-ID weights only
  // in a pooled collection (`pooled`) with sum pooling in every table, a CUDA
  // device only where one is present. InvalidArgument (FailedPrecondition for
  // a missing device) naming the module. The sharded modules run it on their
  // global options, on every rank, before they build their shards.
  static absl::Status Validate(const EmbeddingModuleOptions& options,
                               bool pooled);

 protected:
  // Allocates the tables (options validated by Validate); `pooled` picks the
  // FQN infix.
  EmbeddingModule(EmbeddingModuleOptions options, bool pooled);

  // The part of a forward both collections share: selects the module's
  // features from `input` (NotFound for a missing one; other keys are
  // ignored), moves nothing between devices (InvalidArgument when the input
  // is on another device), reads every table's rows (attaching the fused
  // update when gradients are enabled) and calls the post-lookup hooks.
  struct Lookup {
    KeyedJaggedTensor features;
    std::vector<at::Tensor> rows;  // per table [n_t, dim_t]
  };
  absl::StatusOr<Lookup> LookUp(const KeyedJaggedTensor& input);
  void CallPostOutputHooks() const;

  const EmbeddingModuleOptions& options() const { return options_; }
  // Table `index`'s features: the first one's position in feature_names(),
  // and how many.
  std::pair<int64_t, int64_t> feature_range(size_t index) const {
    return feature_range_[index];
  }

 private:
  EmbeddingModuleOptions options_;
  std::string fqn_infix_;
  std::vector<std::string> feature_names_;
  // Per table: the first feature's position in feature_names_, and count.
  std::vector<std::pair<int64_t, int64_t>> feature_range_;
  std::vector<at::Tensor> weights_;
  // One per table; shared with the backward hooks of past forwards.
  std::vector<std::shared_ptr<SparseTableOptimizer>> optimizers_;
  std::vector<PostLookupHook> post_lookup_hooks_;
  std::vector<PostOutputHook> post_output_hooks_;

  // Accumulation (see SetAccumulating).
  struct GradientBuffer;
  struct KeptLookup {
    KeyedJaggedTensor features;
    std::vector<at::Tensor> ids;
    std::vector<at::Tensor> rows;
  };
  bool accumulating_ = false;
  // One per table; shared with the backward hooks of past forwards.
  std::vector<std::shared_ptr<GradientBuffer>> gradient_buffers_;
  std::vector<KeptLookup> kept_lookups_;
};

// The rows table `index` of a module built with `seed` starts from (on the
// CPU): what a sharded module slices its shards from, so that every shard
// starts where the unsharded table does.
at::Tensor InitialTableRows(const EmbeddingTableConfig& table, uint64_t seed,
                            int64_t index);

// Pooled embeddings (TorchRec's EmbeddingBagCollection): for every feature
// and example, the sum (or mean) of the rows of its IDs (scaled by their
// weights when is_weighted). An example without IDs pools to zeros.
class EmbeddingBagCollection : public EmbeddingModule {
 public:
  // InvalidArgument for bad tables or optimizer settings, or is_weighted with
  // mean pooling.
  static absl::StatusOr<std::unique_ptr<EmbeddingBagCollection>> Create(
      EmbeddingModuleOptions options);

  bool pooled() const override { return true; }

  // A KeyedTensor of [batch, dim] blocks keyed by feature, in table order.
  // Errors: see LookUp; InvalidArgument when is_weighted and the input has
  // no weights.
  absl::StatusOr<KeyedTensor> Forward(const KeyedJaggedTensor& input);
  // The same from per-feature jagged tensors (converted with
  // FeatureDict::ToKeyedJaggedTensor; same output).
  absl::StatusOr<KeyedTensor> Forward(const FeatureDict& input);

 private:
  using EmbeddingModule::EmbeddingModule;
};

// Sequence embeddings (TorchRec's EmbeddingCollection): one row per ID,
// returned per feature as a jagged tensor ([n_f, dim] values, the input's
// lengths).
class EmbeddingCollection : public EmbeddingModule {
 public:
  // InvalidArgument for bad tables or optimizer settings, or is_weighted.
  static absl::StatusOr<std::unique_ptr<EmbeddingCollection>> Create(
      EmbeddingModuleOptions options);

  bool pooled() const override { return false; }

  // The module's features in table order; each value [n_f, dim].
  absl::StatusOr<FeatureDict> Forward(const KeyedJaggedTensor& input);
  absl::StatusOr<FeatureDict> Forward(const FeatureDict& input);

 private:
  using EmbeddingModule::EmbeddingModule;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODULES_EMBEDDING_MODULES_H_
