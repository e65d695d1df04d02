#ifndef DELTASTREAM_TRAINER_SHARDING_SHARDED_EMBEDDING_MODULES_H_
#define DELTASTREAM_TRAINER_SHARDING_SHARDED_EMBEDDING_MODULES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/plan.pb.h"
#include "trainer/comm/process_group.h"
#include "trainer/modules/embedding_modules.h"
#include "trainer/sparse/feature_dict.h"
#include "trainer/sparse/keyed_jagged_tensor.h"
#include "trainer/sparse/keyed_tensor.h"

namespace deltastream {

struct ShardedModuleOptions {
  // The unsharded module's options (path, tables, optimizer, device, seed,
  // is_weighted): the sharded module computes what that module computes on
  // the global batch.
  EmbeddingModuleOptions module;
  // Where each table lives; no tables: DefaultShardingPlan (table-wise,
  // round robin). Validated by ValidateShardingPlan.
  v1::ShardingPlan plan;
  // TorchRec's gradient division: the reverse of the output distribution
  // divides gradients by the world size, so that N ranks whose losses are
  // means over their B examples train as one process whose loss is the
  // mean over N x B. Data-parallel tables are always averaged.
  bool gradient_division = true;
};

// One rectangular piece of a table held by one rank.
struct EmbeddingShard {
  int64_t table_index = 0;  // in tables() order
  std::string table;
  v1::ShardingType sharding_type = v1::SHARDING_TYPE_UNSPECIFIED;
  int rank = 0;
  // Global offsets of the shard: local row i of the shard is global row
  // row_offset + i, local column j global column col_offset + j.
  int64_t row_offset = 0;
  int64_t rows = 0;
  int64_t col_offset = 0;
  int64_t cols = 0;
};

// What the input distribution produced for one batch: enough for the
// compute and output distribution that follow (TorchRec's
// input_dist / compute_and_output_dist split, which pipelines overlap).
struct DistributedBatch {
  // This rank's features in the module's feature order, stride B.
  KeyedJaggedTensor input;
  // What this rank's shards look up: its local features, each holding
  // every rank's examples in rank order (stride world_size x B), with local
  // (shard) row IDs.
  KeyedJaggedTensor local;
  int64_t batch = 0;
  // received[q][k]: IDs rank q sent for local feature k.
  std::vector<std::vector<int64_t>> received;
  // sent[p][k]: IDs this rank sent to rank p for p's local feature k, and
  // where they sit in the feature's values (undefined: all of them, in
  // order).
  std::vector<std::vector<int64_t>> sent;
  std::vector<std::vector<at::Tensor>> sent_positions;
};

// The part both sharded collections share (TorchRec's
// ShardedEmbeddingBagCollection / ShardedEmbeddingCollection): the plan, the
// shards this rank holds as a local unsharded module, and the input
// distribution.
//
// Every rank builds the module with the same options (same plan, tables,
// seed) and calls every forward and backward in the same order: the
// collectives inside pair up across ranks. Forward and backward block on
// them; a failed collective fails the forward with its Status (naming the
// missing rank), or, in backward, throws c10::Error with that message (the
// only way out of autograd). Shards start as the same slices of the tables
// an unsharded module with the same seed starts from.
//
// Training. The local module's fused optimizers update only the rows of this
// rank's shards, in backward. Gradients reach a shard through the reverse of
// the output distribution, divided by the world size (gradient_division);
// data-parallel tables average every rank's gradients and apply the same
// update on every rank.
//
// Limitations (as TorchRec's): one shard per table per rank; all tables of a
// module share one dtype; every rank's batch has the same size. Row-wise
// Adagrad on a column-wise table keeps a row state per column block. Adam's
// step counts the updates of a shard, so a row-wise shard that receives no
// ID in a step does not count it.
//
// Not thread-safe: call from the training thread.
class ShardedEmbeddingModule {
 public:
  virtual ~ShardedEmbeddingModule();
  ShardedEmbeddingModule(const ShardedEmbeddingModule&) = delete;
  ShardedEmbeddingModule& operator=(const ShardedEmbeddingModule&) = delete;

  const std::string& path() const { return options_.module.path; }
  virtual bool pooled() const = 0;
  const std::vector<EmbeddingTableConfig>& tables() const {
    return options_.module.tables;
  }
  const std::vector<std::string>& feature_names() const {
    return feature_names_;
  }
  const v1::ShardingPlan& plan() const { return options_.plan; }
  ProcessGroup& group() const { return *group_; }

  // Every shard of every table (rows > 0 and cols > 0), and this rank's.
  const std::vector<EmbeddingShard>& shards() const { return shards_; }
  const std::vector<EmbeddingShard>& local_shards() const {
    return local_shards_;
  }
  // This rank's shards as an unsharded module (tables named as the global
  // ones, so FQNs match: "<path>.embedding_bags.<table>"), local table i
  // holding local_shards()[i]; nullptr when this rank holds no shard. Its
  // post-lookup hooks see local IDs (add row_offset for global ones).
  EmbeddingModule* local_module() const { return local_.get(); }

  // Hooks on the local module (no-ops on a rank without shards).
  void AddPostLookupHook(PostLookupHook hook);
  void AddPostOutputHook(PostOutputHook hook);

  // This rank's shard states for checkpoints: "<table>.weight" and the
  // optimizer's states (as EmbeddingModule::StateTensors), live tensors.
  std::vector<std::pair<std::string, at::Tensor>> LocalStateTensors() const;
  absl::Status LoadLocalStateTensors(
      const std::vector<std::pair<std::string, at::Tensor>>& states);

  // The input distribution alone: selects the module's features, bucketizes
  // IDs by shard and runs the KJT all-to-all (split sizes, then lengths,
  // values and weights; weights only for a weighted module). Refused: a
  // missing feature (NotFound), an ID outside its table, an input on another
  // device, a weighted module's input without weights (InvalidArgument), and
  // ranks whose batch sizes differ. Every rank checks its own input before
  // the first collective and sends the verdict with the split sizes: when
  // any rank's input is refused, every rank returns at once with that code,
  // naming the rank (and the feature), and the group stays in step for the
  // next batch.
  absl::StatusOr<DistributedBatch> DistributeInput(
      const KeyedJaggedTensor& input);
  // The same from a feature dict: its features are converted, in the
  // module's feature order, straight into the batch's input (one
  // concatenation, no permute after it); features the module does not use
  // are ignored. NotFound for a missing feature.
  absl::StatusOr<DistributedBatch> DistributeInput(const FeatureDict& input);
  // The same over `group`, a group of the same ranks other than group()
  // (ProcessGroup::CreateSibling): what lets a pipeline distribute the next
  // batch on another thread while this one trains (TrainPipelineSparseDist).
  // Reads only the module's layout: may run on another thread concurrently
  // with forward and backward on the training thread.
  absl::StatusOr<DistributedBatch> DistributeInput(
      const KeyedJaggedTensor& input, ProcessGroup& group) const;

 protected:
  ShardedEmbeddingModule(ShardedModuleOptions options, ProcessGroup* group);
  // Validates (the unsharded module's checks, EmbeddingModule::Validate, on
  // the global options, then those of sharding), builds the shard layout and
  // the local module. Every check but the local module's allocation runs
  // alike on every rank, so options are refused by every rank or by none.
  absl::Status Init();
  virtual absl::StatusOr<std::unique_ptr<EmbeddingModule>> CreateLocal(
      EmbeddingModuleOptions options) = 0;
  // Why this rank's input cannot be distributed (kNone: it can). It travels
  // in the split sizes' all-to-all, the input distribution's first
  // collective, so that every rank refuses a batch any rank refuses.
  struct InputFault {
    enum Kind : int64_t {
      kNone = 0,
      kMissingFeature,  // NotFound
      kIdOutsideTable,  // InvalidArgument
      kWrongDevice,     // InvalidArgument
      kNoWeights,       // InvalidArgument: a weighted module's input
      kOther,           // this rank's own error (its code)
    };
    Kind kind = kNone;
    int64_t feature = -1;  // in feature_names(), where one is at fault
    absl::StatusCode code = absl::StatusCode::kOk;
    std::string detail;  // what is wrong, as this rank knows it
  };
  // The input distribution of `batch.input` (the module's features, in its
  // order): checks (unless `fault` already says what is wrong), bucketizes
  // and exchanges; a fault of any rank fails every rank.
  absl::StatusOr<DistributedBatch> Distribute(DistributedBatch batch,
                                              ProcessGroup& group,
                                              InputFault fault) const;
  // The checks of this rank's input (device, weights, IDs).
  InputFault CheckInput(const KeyedJaggedTensor& input) const;
  // What another rank's fault of `kind` at `feature` says (the `detail` it
  // would give, as far as this rank can tell).
  std::string DescribeFault(int64_t kind, int64_t feature) const;

  // Local feature k of `rank`: the global feature index and the shard.
  struct Slot {
    int64_t feature = 0;
    int64_t shard = 0;  // index into shards()
  };
  const std::vector<Slot>& slots(int rank) const { return slots_[rank]; }
  const EmbeddingShard& shard(const Slot& slot) const {
    return shards_[slot.shard];
  }
  // Whether a table's shards split its rows (some shard is not full height).
  bool row_split(int64_t table) const { return row_split_[table]; }
  int64_t feature_table(int64_t feature) const {
    return feature_table_[feature];
  }
  float grad_scale() const {
    return options_.gradient_division ? 1.0f / group_->world_size() : 1.0f;
  }

  ShardedModuleOptions options_;
  ProcessGroup* group_;
  std::unique_ptr<EmbeddingModule> local_;

 private:
  std::vector<std::string> feature_names_;
  std::vector<int64_t> feature_table_;
  std::vector<EmbeddingShard> shards_;
  std::vector<EmbeddingShard> local_shards_;
  std::vector<std::vector<Slot>> slots_;  // per rank
  std::vector<bool> row_split_;           // per table
};

// The scaffold both collections share: Create, and Forward as the input
// distribution followed by ComputeAndDistribute (the local lookup with the
// unsharded module type `Local`, whose forward returns `Output`, then the
// collection's output distribution). At world size 1 nothing moves: the
// input goes to the local module as it is and its output is the result.
template <typename Collection, typename Local, typename Output>
class ShardedCollection : public ShardedEmbeddingModule {
 public:
  // InvalidArgument for bad options (every check of the unsharded module's
  // Create, on every rank, whether or not it holds shards) or a plan that
  // does not fit them (ValidateShardingPlan); `group` must outlive the
  // module.
  static absl::StatusOr<std::unique_ptr<Collection>> Create(
      ShardedModuleOptions options, ProcessGroup* group);

  absl::StatusOr<Output> Forward(const KeyedJaggedTensor& input);
  absl::StatusOr<Output> Forward(const FeatureDict& input);
  // The local lookup and the output distribution of a distributed batch.
  // When the local lookup fails on this rank alone (a post-lookup hook's
  // error: the inputs were checked on every rank), the other ranks are
  // already bound for the output distribution: at world sizes above 1 this
  // rank then leaves the group (ProcessGroup::Leave) with the error, so that
  // their collective names it and why, at once; the group is unusable
  // afterwards.
  absl::StatusOr<Output> ComputeAndDistribute(const DistributedBatch& batch);

 protected:
  using ShardedEmbeddingModule::ShardedEmbeddingModule;
  // The output distribution of the local module's output (nullptr on a
  // rank without shards); called at world sizes above 1.
  virtual absl::StatusOr<Output> DistributeOutput(
      const DistributedBatch& batch, const Output* local_output) = 0;

 private:
  absl::StatusOr<std::unique_ptr<EmbeddingModule>> CreateLocal(
      EmbeddingModuleOptions options) final;
  // DistributeInput, then ComputeAndDistribute.
  template <typename Input>
  absl::StatusOr<Output> Run(const Input& input);
};

// Pooled (TorchRec's ShardedEmbeddingBagCollection): the same output as
// EmbeddingBagCollection::Forward on this rank's examples. Output
// distribution: an all-to-all of pooled blocks for table-wise, column-wise
// and table-row-wise shards (partial sums of row blocks added where they
// arrive), a reduce-scatter for row-wise tables, and this rank's slice of
// the data-parallel tables' output (computed on every rank's examples).
class ShardedEmbeddingBagCollection
    : public ShardedCollection<ShardedEmbeddingBagCollection,
                               EmbeddingBagCollection, KeyedTensor> {
 public:
  bool pooled() const override { return true; }

 private:
  friend class ShardedCollection;
  using ShardedCollection::ShardedCollection;
  absl::StatusOr<KeyedTensor> DistributeOutput(
      const DistributedBatch& batch, const KeyedTensor* local_output) override;
};

// Sequence (TorchRec's ShardedEmbeddingCollection): the same output as
// EmbeddingCollection::Forward on this rank's examples; the rows of every
// ID come back by an all-to-all and are put back in input order. Per-ID
// weights are refused (InvalidArgument), as by EmbeddingCollection.
class ShardedEmbeddingCollection
    : public ShardedCollection<ShardedEmbeddingCollection, EmbeddingCollection,
                               FeatureDict> {
 public:
  bool pooled() const override { return false; }

 private:
  friend class ShardedCollection;
  using ShardedCollection::ShardedCollection;
  absl::StatusOr<FeatureDict> DistributeOutput(
      const DistributedBatch& batch, const FeatureDict* local_output) override;
};

// Defined in sharded_embedding_modules.cc for these two collections.
extern template class ShardedCollection<ShardedEmbeddingBagCollection,
                                        EmbeddingBagCollection, KeyedTensor>;
extern template class ShardedCollection<ShardedEmbeddingCollection,
                                        EmbeddingCollection, FeatureDict>;

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_SHARDING_SHARDED_EMBEDDING_MODULES_H_
