#include "trainer/sharding/sharded_embedding_modules.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/torch_status.h"
#include "trainer/sharding/collective_autograd.h"
#include "trainer/sharding/sharding_plan.h"

namespace deltastream {
namespace {

// Throws out of a backward (see CollectiveGradients).
void ThrowIfError(const absl::Status& status) {
  TORCH_CHECK(status.ok(), status.ToString());
}

at::Tensor Int64(std::vector<int64_t> values) {
  return at::tensor(values, at::TensorOptions().dtype(at::kLong));
}

int64_t Sum(const std::vector<int64_t>& values) {
  int64_t sum = 0;
  for (int64_t v : values) sum += v;
  return sum;
}

at::Tensor CatOrEmpty(const std::vector<at::Tensor>& parts,
                      const at::TensorOptions& options) {
  if (parts.empty()) return at::empty({0}, options);
  return at::cat(parts);
}

// One all-to-all whose output the caller allocates from `output_splits`.
absl::StatusOr<at::Tensor> Exchange(ProcessGroup& group,
                                    const at::Tensor& input,
                                    const std::vector<int64_t>& input_splits,
                                    const std::vector<int64_t>& output_splits,
                                    absl::string_view label) {
  at::Tensor output = at::empty({Sum(output_splits)}, input.options());
  absl::Status status = group.AllToAll(input.contiguous(), input_splits, output,
                                       output_splits, label);
  if (!status.ok()) return status;
  return output;
}

}  // namespace

ShardedEmbeddingModule::ShardedEmbeddingModule(ShardedModuleOptions options,
                                               ProcessGroup* group)
    : options_(std::move(options)), group_(group) {}

ShardedEmbeddingModule::~ShardedEmbeddingModule() = default;

absl::Status ShardedEmbeddingModule::Init() {
  const EmbeddingModuleOptions& module = options_.module;
  const int world = group_->world_size();
  const int me = group_->rank();
  // The unsharded module's checks, on the global options and on every rank:
  // the local modules see altered tables (row blocks pool sums) and a rank
  // without shards builds none, so their own checks would refuse the options
  // on some ranks only, or on none.
  if (absl::Status s = EmbeddingModule::Validate(module, pooled()); !s.ok()) {
    return s;
  }
  for (const EmbeddingTableConfig& table : module.tables) {
    if (table.dtype != module.tables[0].dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "module '", module.path, "': a sharded module needs one dtype for ",
          "every table ('", table.name, "' differs from '",
          module.tables[0].name, "')"));
    }
  }
  if (module.device != group_->device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("module '", module.path, "' is on ", module.device.str(),
                     " but its process group is on ", group_->device().str()));
  }
  if (options_.plan.tables().empty()) {
    options_.plan = DefaultShardingPlan(module.tables, world);
  }
  if (absl::Status s =
          ValidateShardingPlan(options_.plan, module.tables, world, pooled());
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module '", module.path, "': bad sharding plan: ", s.message()));
  }
  std::map<std::string, const v1::TablePlan*> plans;
  for (const v1::TablePlan& p : options_.plan.tables()) plans[p.table()] = &p;

  slots_.assign(world, {});
  row_split_.assign(module.tables.size(), false);
  std::vector<int64_t> first_feature;
  for (size_t t = 0; t < module.tables.size(); ++t) {
    first_feature.push_back(static_cast<int64_t>(feature_names_.size()));
    for (const std::string& f : module.tables[t].feature_names) {
      feature_names_.push_back(f);
      feature_table_.push_back(static_cast<int64_t>(t));
    }
  }
  EmbeddingModuleOptions local_options = module;
  local_options.tables.clear();
  std::vector<at::Tensor> local_rows;
  for (size_t t = 0; t < module.tables.size(); ++t) {
    const EmbeddingTableConfig& table = module.tables[t];
    const v1::TablePlan& plan = *plans[table.name];
    // Shards in rank order, so every rank lists them alike.
    std::vector<EmbeddingShard> table_shards;
    for (const v1::Shard& s : plan.shards()) {
      if (s.rows() == 0 || s.cols() == 0) continue;
      EmbeddingShard shard;
      shard.table_index = static_cast<int64_t>(t);
      shard.table = table.name;
      shard.sharding_type = plan.sharding_type();
      shard.rank = s.rank();
      shard.row_offset = s.row_offset();
      shard.rows = s.rows();
      shard.col_offset = s.col_offset();
      shard.cols = s.cols();
      table_shards.push_back(shard);
      if (shard.rows != table.num_embeddings) row_split_[t] = true;
    }
    std::sort(table_shards.begin(), table_shards.end(),
              [](const EmbeddingShard& a, const EmbeddingShard& b) {
                return a.rank < b.rank;
              });
    at::Tensor initial;
    for (const EmbeddingShard& shard : table_shards) {
      const int64_t index = static_cast<int64_t>(shards_.size());
      shards_.push_back(shard);
      for (int64_t f = 0; f < static_cast<int64_t>(table.feature_names.size());
           ++f) {
        slots_[shard.rank].push_back({first_feature[t] + f, index});
      }
      if (shard.rank != me) continue;
      local_shards_.push_back(shard);
      EmbeddingTableConfig local = table;
      local.num_embeddings = shard.rows;
      local.embedding_dim = shard.cols;
      // Row blocks pool partial sums: a mean is taken where they meet.
      if (row_split_[t] || shard.rows != table.num_embeddings) {
        local.pooling = Pooling::kSum;
      }
      local.init_min = local.init_max = 0.0;
      local_options.tables.push_back(local);
      if (!initial.defined()) {
        initial = InitialTableRows(table, module.seed, static_cast<int64_t>(t));
      }
      local_rows.push_back(initial.narrow(0, shard.row_offset, shard.rows)
                               .narrow(1, shard.col_offset, shard.cols));
    }
  }
  if (local_options.tables.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<EmbeddingModule>> local =
      CreateLocal(std::move(local_options));
  if (!local.ok()) return local.status();
  local_ = *std::move(local);
  return CatchTorchErrors([&]() -> absl::Status {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < local_rows.size(); ++i) {
      // The live table (StateTensors hands out the tensors themselves).
      for (auto& [name, tensor] : local_->StateTensors()) {
        if (name == absl::StrCat(local_shards_[i].table, ".weight")) {
          tensor.copy_(local_rows[i]);
        }
      }
    }
    return absl::OkStatus();
  });
}

void ShardedEmbeddingModule::AddPostLookupHook(PostLookupHook hook) {
  if (local_) local_->AddPostLookupHook(std::move(hook));
}

void ShardedEmbeddingModule::AddPostOutputHook(PostOutputHook hook) {
  if (local_) local_->AddPostOutputHook(std::move(hook));
}

std::vector<std::pair<std::string, at::Tensor>>
ShardedEmbeddingModule::LocalStateTensors() const {
  if (!local_) return {};
  return local_->StateTensors();
}

absl::Status ShardedEmbeddingModule::LoadLocalStateTensors(
    const std::vector<std::pair<std::string, at::Tensor>>& states) {
  if (!local_) {
    return states.empty() ? absl::OkStatus()
                          : absl::InvalidArgumentError(absl::StrCat(
                                "module '", path(), "' holds no shard on rank ",
                                group_->rank()));
  }
  return local_->LoadStateTensors(states);
}

absl::StatusOr<DistributedBatch> ShardedEmbeddingModule::DistributeInput(
    const KeyedJaggedTensor& raw_input) {
  return DistributeInput(raw_input, *group_);
}

absl::StatusOr<DistributedBatch> ShardedEmbeddingModule::DistributeInput(
    const KeyedJaggedTensor& raw_input, ProcessGroup& group) const {
  DistributedBatch batch;
  InputFault fault;
  if (raw_input.keys() == feature_names_) {
    batch.input = raw_input;
  } else {
    const std::vector<std::vector<std::string>> groups = {feature_names_};
    absl::StatusOr<std::vector<KeyedJaggedTensor>> parts =
        raw_input.SplitByKeys(groups);
    if (parts.ok()) {
      batch.input = std::move((*parts)[0]);
    } else {
      fault = {InputFault::kOther, -1, parts.status().code(),
               std::string(parts.status().message())};
      for (size_t f = 0; f < feature_names_.size(); ++f) {
        if (!raw_input.KeyIndex(feature_names_[f]).ok()) {
          fault = {InputFault::kMissingFeature, static_cast<int64_t>(f),
                   absl::StatusCode::kNotFound,
                   DescribeFault(InputFault::kMissingFeature,
                                 static_cast<int64_t>(f))};
          break;
        }
      }
    }
  }
  return Distribute(std::move(batch), group, std::move(fault));
}

absl::StatusOr<DistributedBatch> ShardedEmbeddingModule::DistributeInput(
    const FeatureDict& raw_input) {
  // The module's features, in its order, as views of the dict's.
  DistributedBatch batch;
  InputFault fault;
  FeatureDict features;
  for (size_t f = 0; f < feature_names_.size(); ++f) {
    const std::string& name = feature_names_[f];
    absl::StatusOr<JaggedTensor> feature = raw_input.Get(name);
    if (!feature.ok()) {
      fault = {
          InputFault::kMissingFeature, static_cast<int64_t>(f),
          absl::StatusCode::kNotFound,
          DescribeFault(InputFault::kMissingFeature, static_cast<int64_t>(f))};
      break;
    }
    if (absl::Status added = features.Add(name, *std::move(feature));
        !added.ok()) {
      fault = {InputFault::kOther, static_cast<int64_t>(f), added.code(),
               std::string(added.message())};
      break;
    }
  }
  if (fault.kind == InputFault::kNone) {
    absl::StatusOr<KeyedJaggedTensor> input = features.ToKeyedJaggedTensor();
    if (input.ok()) {
      batch.input = *std::move(input);
    } else {
      fault = {InputFault::kOther, -1, input.status().code(),
               std::string(input.status().message())};
    }
  }
  return Distribute(std::move(batch), *group_, std::move(fault));
}

std::string ShardedEmbeddingModule::DescribeFault(int64_t kind,
                                                  int64_t feature) const {
  const bool named =
      feature >= 0 && feature < static_cast<int64_t>(feature_names_.size());
  switch (kind) {
    case InputFault::kMissingFeature:
      if (named)
        return absl::StrCat("no feature '", feature_names_[feature], "'");
      break;
    case InputFault::kIdOutsideTable:
      if (named) {
        return absl::StrCat(
            "feature '", feature_names_[feature], "' has an ID outside [0, ",
            tables()[feature_table_[feature]].num_embeddings, ")");
      }
      break;
    case InputFault::kWrongDevice:
      return absl::StrCat("not on the module's device, ",
                          options_.module.device.str());
    case InputFault::kNoWeights:
      return "no per-ID weights, but the module is weighted";
    default:
      break;
  }
  return "refused by that rank (its own error says why)";
}

ShardedEmbeddingModule::InputFault ShardedEmbeddingModule::CheckInput(
    const KeyedJaggedTensor& input) const {
  if (input.device() != options_.module.device) {
    return {
        InputFault::kWrongDevice, -1, absl::StatusCode::kInvalidArgument,
        absl::StrCat("on ", input.device().str(), ", but the module lives on ",
                     options_.module.device.str())};
  }
  if (options_.module.is_weighted && !input.has_weights()) {
    return {InputFault::kNoWeights, -1, absl::StatusCode::kInvalidArgument,
            DescribeFault(InputFault::kNoWeights, -1)};
  }
  // One pass over every ID against the smallest table; a feature by feature
  // pass (naming the feature) only when that fails.
  int64_t outside = -1;
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    if (input.offset_per_key().empty()) return absl::OkStatus();
    const int64_t total = input.offset_per_key().back();
    if (total == 0) return absl::OkStatus();
    int64_t smallest = tables()[0].num_embeddings;
    for (const EmbeddingTableConfig& table : tables()) {
      smallest = std::min(smallest, table.num_embeddings);
    }
    auto within = [](const at::Tensor& ids, int64_t rows) {
      auto [low, high] = at::aminmax(ids);
      return low.item<int64_t>() >= 0 && high.item<int64_t>() < rows;
    };
    if (within(input.values().narrow(0, 0, total), smallest)) {
      return absl::OkStatus();
    }
    for (size_t f = 0; f < feature_names_.size(); ++f) {
      const int64_t rows = tables()[feature_table_[f]].num_embeddings;
      at::Tensor ids = input.ValuesOf(static_cast<int64_t>(f));
      if (ids.numel() > 0 && !within(ids, rows)) {
        outside = static_cast<int64_t>(f);
        break;
      }
    }
    return absl::OkStatus();
  });
  if (!status.ok()) {
    return {InputFault::kOther, -1, status.code(),
            std::string(status.message())};
  }
  if (outside >= 0) {
    return {InputFault::kIdOutsideTable, outside,
            absl::StatusCode::kInvalidArgument,
            DescribeFault(InputFault::kIdOutsideTable, outside)};
  }
  return {};
}

absl::StatusOr<DistributedBatch> ShardedEmbeddingModule::Distribute(
    DistributedBatch batch, ProcessGroup& group, InputFault fault) const {
  const int world = group.world_size();
  const int me = group.rank();
  const KeyedJaggedTensor& input = batch.input;
  if (fault.kind == InputFault::kNone) fault = CheckInput(input);
  const bool faulty = fault.kind != InputFault::kNone;
  if (world == 1) {
    if (faulty) {
      return absl::Status(fault.code, absl::StrCat("module '", path(),
                                                   "': input: ", fault.detail));
    }
    // Rank 0 holds every table whole, in the module's feature order: its
    // lookup is the input itself, and nothing moves.
    batch.batch = input.stride();
    batch.local = input;
    batch.received = {input.length_per_key()};
    batch.sent = batch.received;
    batch.sent_positions = {std::vector<at::Tensor>(feature_names_.size())};
    return batch;
  }
  const int64_t b = faulty ? 0 : input.stride();
  batch.batch = b;
  // Weights travel for a weighted module only (every rank's input has them);
  // an unweighted module's lookups ignore them.
  const bool weighted = options_.module.is_weighted;
  const at::TensorOptions long_options =
      at::TensorOptions().dtype(at::kLong).device(options_.module.device);

  // Bucketize: per destination rank and its local feature, the IDs (local),
  // lengths and weights this rank sends. Its own part (own_*, per local
  // feature) stays out of the all-to-alls: a rank does not copy to itself.
  std::vector<at::Tensor> lengths_parts, values_parts, weights_parts;
  std::vector<at::Tensor> own_lengths, own_values, own_weights;
  std::vector<int64_t> length_splits(world), value_splits(world);
  batch.sent.assign(world, {});
  batch.sent_positions.assign(world, {});
  std::vector<at::Tensor> example_of_id(feature_names_.size());
  if (!faulty) {
    absl::Status status = CatchTorchErrors([&]() -> absl::Status {
      for (int p = 0; p < world; ++p) {
        for (const Slot& slot : slots_[p]) {
          const EmbeddingShard& s = shards_[slot.shard];
          const int64_t f = slot.feature;
          at::Tensor ids = input.ValuesOf(f);
          at::Tensor lengths = input.LengthsOf(f).to(at::kLong);
          std::optional<at::Tensor> weights;
          if (weighted) weights = input.WeightsOf(f);
          at::Tensor positions;
          if (s.rows != tables()[s.table_index].num_embeddings) {
            if (!example_of_id[f].defined()) {
              // The example of each ID: i repeated lengths[i] times.
              example_of_id[f] = at::repeat_interleave(lengths);
            }
            positions = ((ids >= s.row_offset) & (ids < s.row_offset + s.rows))
                            .nonzero()
                            .squeeze(1);
            ids = ids.index_select(0, positions) - s.row_offset;
            lengths = at::bincount(example_of_id[f].index_select(0, positions),
                                   {}, b);
            if (weights) weights = weights->index_select(0, positions);
          }
          batch.sent[p].push_back(ids.numel());
          batch.sent_positions[p].push_back(positions);
          if (p == me) {
            own_lengths.push_back(lengths);
            own_values.push_back(ids);
            if (weighted) own_weights.push_back(*weights);
            continue;
          }
          lengths_parts.push_back(lengths);
          values_parts.push_back(ids);
          if (weighted) weights_parts.push_back(*weights);
          length_splits[p] += b;
          value_splits[p] += ids.numel();
        }
      }
      return absl::OkStatus();
    });
    if (!status.ok()) {
      fault = {InputFault::kOther, -1, status.code(),
               std::string(status.message())};
    }
  }

  // Split sizes first: every rank's batch size, how many IDs it sends, and
  // whether its input is refused (code, kind, feature): a rank that refuses
  // its input still takes part, so that every rank refuses the batch at once
  // instead of waiting out the timeout in the next collective.
  constexpr int64_t kHeader = 5;
  std::vector<int64_t> header;
  for (int p = 0; p < world; ++p) {
    const bool ok = fault.kind == InputFault::kNone;
    header.push_back(b);
    header.push_back(ok ? value_splits[p] : 0);
    header.push_back(
        ok ? 0
           : static_cast<int64_t>(fault.code == absl::StatusCode::kOk
                                      ? absl::StatusCode::kInvalidArgument
                                      : fault.code));
    header.push_back(static_cast<int64_t>(fault.kind));
    header.push_back(fault.feature);
  }
  std::vector<int64_t> splits(world, kHeader);
  absl::StatusOr<at::Tensor> received_header =
      Exchange(group, Int64(header).to(options_.module.device), splits, splits,
               "input_dist.splits");
  if (!received_header.ok()) return received_header.status();
  const at::Tensor header_host = received_header->cpu();
  const int64_t* h = header_host.data_ptr<int64_t>();
  // A refused input: this rank's own fault first, else the lowest rank's.
  std::vector<int> refusing;
  for (int q = 0; q < world; ++q) {
    if (h[kHeader * q + 2] != 0) refusing.push_back(q);
  }
  if (!refusing.empty()) {
    const bool mine = fault.kind != InputFault::kNone;
    const int q = mine ? me : refusing[0];
    const int64_t* theirs = h + kHeader * q;
    std::string others;
    for (int r : refusing) {
      if (r != q) absl::StrAppend(&others, others.empty() ? "" : ", ", r);
    }
    return absl::Status(
        static_cast<absl::StatusCode>(theirs[2]),
        absl::StrCat(
            "module '", path(), "': rank ", q, "'s input: ",
            mine ? fault.detail : DescribeFault(theirs[3], theirs[4]),
            others.empty() ? "" : absl::StrCat(" (rank(s) ", others, " too)"),
            "; every rank refuses this batch"));
  }
  std::vector<int64_t> received_values(world);
  for (int q = 0; q < world; ++q) {
    const int64_t their_batch = h[kHeader * q];
    received_values[q] = h[kHeader * q + 1];
    if (their_batch != b) {
      return absl::InvalidArgumentError(
          absl::StrCat("module '", path(), "': rank ", q, " has a batch of ",
                       their_batch, " examples and rank ", me, " of ", b,
                       "; every rank needs the same batch size"));
    }
  }
  const int64_t local_keys = static_cast<int64_t>(slots_[me].size());
  std::vector<int64_t> received_lengths(world, local_keys * b);
  received_lengths[me] = 0;  // kept in own_*
  received_values[me] = 0;
  absl::StatusOr<at::Tensor> lengths =
      Exchange(group, CatOrEmpty(lengths_parts, long_options), length_splits,
               received_lengths, "input_dist.lengths");
  if (!lengths.ok()) return lengths.status();
  absl::StatusOr<at::Tensor> values =
      Exchange(group, CatOrEmpty(values_parts, long_options), value_splits,
               received_values, "input_dist.values");
  if (!values.ok()) return values.status();
  at::Tensor weights;
  if (weighted) {
    absl::StatusOr<at::Tensor> received_weights =
        Exchange(group, CatOrEmpty(weights_parts, input.weights()->options()),
                 value_splits, received_values, "input_dist.weights");
    if (!received_weights.ok()) return received_weights.status();
    weights = *std::move(received_weights);
  }

  // From [rank][feature][example] to [feature][rank][example], this rank's
  // own part taken from where it was bucketized.
  return CatchTorchErrors([&]() -> absl::StatusOr<DistributedBatch> {
    std::vector<at::Tensor> per_rank;  // [local_keys, b] each
    for (int q = 0; q < world; ++q) {
      if (q == me) {
        per_rank.push_back(local_keys == 0 ? at::empty({0, b}, long_options)
                                           : at::stack(own_lengths));
        continue;
      }
      const int64_t before = q < me ? q : q - 1;
      per_rank.push_back(
          lengths->narrow(0, before * local_keys * b, local_keys * b)
              .view({local_keys, b}));
    }
    at::Tensor local_lengths = at::stack(per_rank, 1);  // [keys, world, b]
    at::Tensor counts = local_lengths.sum(2).cpu();
    batch.received.assign(world, std::vector<int64_t>(local_keys));
    std::vector<std::vector<int64_t>> starts(world,
                                             std::vector<int64_t>(local_keys));
    int64_t offset = 0;
    for (int q = 0; q < world; ++q) {
      for (int64_t k = 0; k < local_keys; ++k) {
        batch.received[q][k] = counts[k][q].item<int64_t>();
        if (q == me) continue;
        starts[q][k] = offset;
        offset += batch.received[q][k];
      }
    }
    std::vector<at::Tensor> value_parts, weight_parts;
    for (int64_t k = 0; k < local_keys; ++k) {
      for (int q = 0; q < world; ++q) {
        if (q == me) {
          value_parts.push_back(own_values[k]);
          if (weighted) weight_parts.push_back(own_weights[k]);
          continue;
        }
        value_parts.push_back(
            values->narrow(0, starts[q][k], batch.received[q][k]));
        if (weighted) {
          weight_parts.push_back(
              weights.narrow(0, starts[q][k], batch.received[q][k]));
        }
      }
    }
    std::vector<std::string> keys;
    for (const Slot& slot : slots_[me])
      keys.push_back(feature_names_[slot.feature]);
    std::optional<at::Tensor> local_weights;
    if (weighted) local_weights = CatOrEmpty(weight_parts, weights.options());
    absl::StatusOr<KeyedJaggedTensor> local = KeyedJaggedTensor::FromLengths(
        std::move(keys), CatOrEmpty(value_parts, long_options),
        local_lengths.reshape({-1}), local_weights, world * b);
    if (!local.ok()) return local.status();
    batch.local = *std::move(local);
    return std::move(batch);
  });
}

// ---------------------------------------------------------------------------
// The scaffold of both collections.

template <typename Collection, typename Local, typename Output>
absl::StatusOr<std::unique_ptr<Collection>>
ShardedCollection<Collection, Local, Output>::Create(
    ShardedModuleOptions options, ProcessGroup* group) {
  std::unique_ptr<Collection> module(new Collection(std::move(options), group));
  if (absl::Status s = module->Init(); !s.ok()) return s;
  return module;
}

template <typename Collection, typename Local, typename Output>
absl::StatusOr<std::unique_ptr<EmbeddingModule>>
ShardedCollection<Collection, Local, Output>::CreateLocal(
    EmbeddingModuleOptions options) {
  absl::StatusOr<std::unique_ptr<Local>> local =
      Local::Create(std::move(options));
  if (!local.ok()) return local.status();
  return std::unique_ptr<EmbeddingModule>(std::move(*local));
}

template <typename Collection, typename Local, typename Output>
template <typename Input>
absl::StatusOr<Output> ShardedCollection<Collection, Local, Output>::Run(
    const Input& input) {
  absl::StatusOr<DistributedBatch> batch = DistributeInput(input);
  if (!batch.ok()) return batch.status();
  return ComputeAndDistribute(*batch);
}

template <typename Collection, typename Local, typename Output>
absl::StatusOr<Output> ShardedCollection<Collection, Local, Output>::Forward(
    const KeyedJaggedTensor& input) {
  return Run(input);
}

template <typename Collection, typename Local, typename Output>
absl::StatusOr<Output> ShardedCollection<Collection, Local, Output>::Forward(
    const FeatureDict& input) {
  return Run(input);
}

template <typename Collection, typename Local, typename Output>
absl::StatusOr<Output>
ShardedCollection<Collection, Local, Output>::ComputeAndDistribute(
    const DistributedBatch& batch) {
  if (!local_) return DistributeOutput(batch, nullptr);
  absl::StatusOr<Output> local_output =
      static_cast<Local*>(local_.get())->Forward(batch.local);
  if (!local_output.ok()) {
    // The inputs were checked on every rank: what fails here is this rank's
    // own (a post-lookup hook, such as the tracker's, or memory), and the
    // other ranks are on their way into the output distribution, which this
    // rank will not join. It leaves the group, so that they name it and its
    // reason, at once, instead of a rank that did not report (dead or hung)
    // after their collective timeout.
    if (group_->world_size() > 1) {
      group_->Leave(
          absl::Status(local_output.status().code(),
                       absl::StrCat("module '", path(),
                                    "': the lookup of its shards failed: ",
                                    local_output.status().message())));
    }
    return local_output.status();
  }
  // One rank holds every table whole: its output is the module's.
  if (group_->world_size() == 1) return local_output;
  return DistributeOutput(batch, &*local_output);
}

// ---------------------------------------------------------------------------
// Pooled.

absl::StatusOr<KeyedTensor> ShardedEmbeddingBagCollection::DistributeOutput(
    const DistributedBatch& batch, const KeyedTensor* local_output) {
  const int world = group_->world_size();
  const int me = group_->rank();
  const int64_t b = batch.batch;
  const at::TensorOptions options = at::TensorOptions()
                                        .dtype(tables()[0].dtype)
                                        .device(options_.module.device);
  // This rank's pooled blocks, [world * b, cols] per local feature.
  std::vector<at::Tensor> blocks;
  if (local_output != nullptr) {
    for (int64_t k = 0; k < local_output->num_keys(); ++k) {
      blocks.push_back(local_output->At(k));
    }
  }
  auto kind = [&](const Slot& slot) { return shard(slot).sharding_type; };
  auto is_a2a = [&](const Slot& slot) {
    return kind(slot) != v1::DATA_PARALLEL && kind(slot) != v1::ROW_WISE;
  };
  // Row-wise features, in feature order: the reduce-scatter's columns.
  std::vector<int64_t> rs_features;
  std::vector<int64_t> rs_column(feature_names().size(), -1);
  int64_t rs_width = 0;
  for (size_t f = 0; f < feature_names().size(); ++f) {
    const EmbeddingTableConfig& table = tables()[feature_table(f)];
    for (const v1::TablePlan& p : plan().tables()) {
      if (p.table() == table.name && p.sharding_type() == v1::ROW_WISE) {
        rs_features.push_back(static_cast<int64_t>(f));
        rs_column[f] = rs_width;
        rs_width += table.embedding_dim;
      }
    }
  }
  auto width = [&](int rank, auto&& pick) {
    int64_t w = 0;
    for (const Slot& slot : slots(rank)) {
      if (pick(slot)) w += shard(slot).cols;
    }
    return w;
  };
  const float scale = grad_scale();

  return CatchTorchErrors([&]() -> absl::StatusOr<KeyedTensor> {
    std::vector<at::Tensor> a2a_blocks, dp_blocks;
    std::vector<at::Tensor> rs_blocks(rs_features.size());
    const std::vector<Slot>& mine = slots(me);
    for (size_t k = 0; k < mine.size(); ++k) {
      if (is_a2a(mine[k])) a2a_blocks.push_back(blocks[k]);
      if (kind(mine[k]) == v1::DATA_PARALLEL) dp_blocks.push_back(blocks[k]);
      if (kind(mine[k]) == v1::ROW_WISE) {
        for (size_t i = 0; i < rs_features.size(); ++i) {
          if (rs_features[i] == mine[k].feature) rs_blocks[i] = blocks[k];
        }
      }
    }
    for (size_t i = 0; i < rs_features.size(); ++i) {
      if (!rs_blocks[i].defined()) {
        rs_blocks[i] = at::zeros(
            {world * b, tables()[feature_table(rs_features[i])].embedding_dim},
            options);
      }
    }
    CollectiveGradients gradients(absl::StrCat(path(), ".output_dist"));
    // Table-, column- and table-row-wise: an all-to-all of pooled blocks,
    // rank q receiving rows [q b, (q + 1) b).
    const int64_t my_a2a = width(me, is_a2a);
    at::Tensor a2a_in = a2a_blocks.empty()
                            ? at::zeros({world * b * my_a2a}, options)
                            : at::cat(a2a_blocks, 1).reshape({-1});
    std::vector<int64_t> a2a_send(world, b * my_a2a), a2a_recv(world);
    for (int p = 0; p < world; ++p) a2a_recv[p] = b * width(p, is_a2a);
    at::Tensor a2a_out;
    {
      c10::NoGradGuard no_grad;
      absl::StatusOr<at::Tensor> out =
          Exchange(*group_, a2a_in, a2a_send, a2a_recv, "output_dist.pooled");
      if (!out.ok()) return out.status();
      a2a_out = *std::move(out);
    }
    gradients.Add(
        a2a_in, &a2a_out,
        [group = group_, a2a_send, a2a_recv, scale](const at::Tensor& grad) {
          absl::StatusOr<at::Tensor> back = Exchange(
              *group, grad, a2a_recv, a2a_send, "output_dist.pooled.backward");
          ThrowIfError(back.status());
          return back->mul_(scale);
        });
    // Row-wise: a reduce-scatter of partial sums over all examples.
    at::Tensor rs_in, rs_out;
    if (!rs_features.empty()) {
      rs_in = at::cat(rs_blocks, 1);
      c10::NoGradGuard no_grad;
      rs_out = at::empty({b, rs_width}, options);
      if (absl::Status s = group_->ReduceScatterSum(rs_in.contiguous(), rs_out,
                                                    "output_dist.row_wise");
          !s.ok()) {
        return s;
      }
    }
    if (rs_in.defined()) {
      gradients.Add(rs_in, &rs_out,
                    [group = group_, world, scale](const at::Tensor& grad) {
                      at::Tensor all = at::empty(
                          {world * grad.size(0), grad.size(1)}, grad.options());
                      ThrowIfError(group->AllGather(
                          grad, all, "output_dist.row_wise.backward"));
                      return all.mul_(scale);
                    });
    }
    // Data-parallel: this rank's rows; every rank's gradients averaged.
    at::Tensor dp_in, dp_out;
    if (!dp_blocks.empty()) {
      dp_in = at::cat(dp_blocks, 1);
      c10::NoGradGuard no_grad;
      dp_out = dp_in.narrow(0, me * b, b).clone();
    }
    if (dp_in.defined()) {
      gradients.Add(
          dp_in, &dp_out, [group = group_, world](const at::Tensor& grad) {
            at::Tensor all =
                at::empty({world * grad.size(0), grad.size(1)}, grad.options());
            ThrowIfError(group->AllGather(
                grad, all, "output_dist.data_parallel.backward"));
            return all.div_(world);
          });
    }
    gradients.Attach();

    // Assemble each feature: partial sums of row blocks added, column blocks
    // side by side.
    std::vector<std::map<int64_t, at::Tensor>> by_column(
        feature_names().size());
    auto add = [&](int64_t f, int64_t col, const at::Tensor& part) {
      at::Tensor& slot = by_column[f][col];
      slot = slot.defined() ? slot + part : part;
    };
    int64_t offset = 0;
    for (int p = 0; p < world; ++p) {
      at::Tensor from_p =
          a2a_out.narrow(0, offset, a2a_recv[p]).view({b, width(p, is_a2a)});
      offset += a2a_recv[p];
      int64_t col = 0;
      for (const Slot& slot : slots(p)) {
        if (!is_a2a(slot)) continue;
        add(slot.feature, shard(slot).col_offset,
            from_p.narrow(1, col, shard(slot).cols));
        col += shard(slot).cols;
      }
    }
    for (int64_t f : rs_features) {
      add(f, 0,
          rs_out.narrow(1, rs_column[f],
                        tables()[feature_table(f)].embedding_dim));
    }
    int64_t dp_col = 0;
    for (const Slot& slot : mine) {
      if (kind(slot) != v1::DATA_PARALLEL) continue;
      add(slot.feature, 0, dp_out.narrow(1, dp_col, shard(slot).cols));
      dp_col += shard(slot).cols;
    }
    std::vector<at::Tensor> columns;
    std::vector<int64_t> dims;
    for (size_t f = 0; f < feature_names().size(); ++f) {
      const EmbeddingTableConfig& table = tables()[feature_table(f)];
      std::vector<at::Tensor> parts;
      for (auto& [col, part] : by_column[f]) parts.push_back(part);
      at::Tensor pooled = parts.size() == 1 ? parts[0] : at::cat(parts, 1);
      if (table.pooling == Pooling::kMean && row_split(feature_table(f))) {
        pooled = pooled / batch.input.LengthsOf(static_cast<int64_t>(f))
                              .clamp_min(1)
                              .to(pooled.scalar_type())
                              .unsqueeze(1);
      }
      columns.push_back(pooled);
      dims.push_back(table.embedding_dim);
    }
    return KeyedTensor::Create(feature_names(), std::move(dims),
                               at::cat(columns, 1));
  });
}

// ---------------------------------------------------------------------------
// Sequence.

absl::StatusOr<FeatureDict> ShardedEmbeddingCollection::DistributeOutput(
    const DistributedBatch& batch, const FeatureDict* local_output) {
  const int world = group_->world_size();
  const int me = group_->rank();
  const at::TensorOptions options = at::TensorOptions()
                                        .dtype(tables()[0].dtype)
                                        .device(options_.module.device);
  // Per local feature, the rows of every rank's IDs, [n_k, cols].
  std::vector<at::Tensor> rows;
  if (local_output != nullptr) {
    for (int64_t k = 0; k < local_output->size(); ++k) {
      rows.push_back(local_output->At(k).values());
    }
  }
  const std::vector<Slot>& mine = slots(me);
  auto is_dp = [&](const Slot& slot) {
    return shard(slot).sharding_type == v1::DATA_PARALLEL;
  };
  const float scale = grad_scale();

  return CatchTorchErrors([&]() -> absl::StatusOr<FeatureDict> {
    // Where rank q's rows of local feature k start.
    std::vector<std::vector<int64_t>> start(world,
                                            std::vector<int64_t>(mine.size()));
    for (size_t k = 0; k < mine.size(); ++k) {
      int64_t offset = 0;
      for (int q = 0; q < world; ++q) {
        start[q][k] = offset;
        offset += batch.received[q][k];
      }
    }
    // All-to-all of per-ID rows: rank q gets the rows of the IDs it sent.
    // This rank's own rows stay out of it (used below where they are) when
    // other ranks' rows arrive through it: the output then depends on the
    // all-to-all, so backward reaches its reverse on every rank.
    bool bypass_own = false;
    for (int p = 0; p < world; ++p) {
      for (const Slot& slot : slots(p)) bypass_own |= p != me && !is_dp(slot);
    }
    std::vector<at::Tensor> send_parts, dp_parts, dp_own;
    std::vector<int64_t> send(world), recv(world);
    for (int q = 0; q < world; ++q) {
      for (size_t k = 0; k < mine.size(); ++k) {
        if (is_dp(mine[k]) || (q == me && bypass_own)) continue;
        send_parts.push_back(
            rows[k].narrow(0, start[q][k], batch.received[q][k]).reshape({-1}));
        send[q] += batch.received[q][k] * shard(mine[k]).cols;
      }
    }
    for (int p = 0; p < world; ++p) {
      const std::vector<Slot>& theirs = slots(p);
      for (size_t k = 0; k < theirs.size() && !(p == me && bypass_own); ++k) {
        if (!is_dp(theirs[k]))
          recv[p] += batch.sent[p][k] * shard(theirs[k]).cols;
      }
    }
    // Data-parallel: this rank's rows of every DP feature, flattened
    // feature-major; dp_sizes[q] what rank q's rows occupy.
    std::vector<int64_t> dp_sizes(world);
    for (size_t k = 0; k < mine.size(); ++k) {
      if (!is_dp(mine[k])) continue;
      dp_parts.push_back(rows[k].reshape({-1}));
      for (int q = 0; q < world; ++q) {
        dp_sizes[q] += batch.received[q][k] * shard(mine[k]).cols;
      }
    }
    CollectiveGradients gradients(absl::StrCat(path(), ".output_dist"));
    at::Tensor a2a_in = CatOrEmpty(send_parts, options);
    at::Tensor a2a_out;
    {
      c10::NoGradGuard no_grad;
      absl::StatusOr<at::Tensor> out =
          Exchange(*group_, a2a_in, send, recv, "output_dist.sequence");
      if (!out.ok()) return out.status();
      a2a_out = *std::move(out);
    }
    gradients.Add(a2a_in, &a2a_out,
                  [group = group_, send, recv, scale](const at::Tensor& grad) {
                    absl::StatusOr<at::Tensor> back =
                        Exchange(*group, grad, recv, send,
                                 "output_dist.sequence.backward");
                    ThrowIfError(back.status());
                    return back->mul_(scale);
                  });
    at::Tensor dp_in, dp_out;
    // Feature-major layout of dp_in: feature k's rows of rank q start at
    // dp_start[k][q] (in elements).
    std::vector<std::pair<int64_t, int64_t>> dp_segments;  // (k, cols)
    if (!dp_parts.empty()) {
      dp_in = at::cat(dp_parts);
      c10::NoGradGuard no_grad;
      std::vector<at::Tensor> own;
      int64_t offset = 0;
      for (size_t k = 0; k < mine.size(); ++k) {
        if (!is_dp(mine[k])) continue;
        const int64_t cols = shard(mine[k]).cols;
        own.push_back(dp_in.narrow(0, offset + start[me][k] * cols,
                                   batch.received[me][k] * cols));
        offset += rows[k].size(0) * cols;
        dp_segments.emplace_back(static_cast<int64_t>(k), cols);
      }
      dp_out = CatOrEmpty(own, options).clone();
    }
    if (dp_in.defined()) {
      std::vector<std::vector<int64_t>> received = batch.received;
      gradients.Add(dp_in, &dp_out,
                    [group = group_, world, me, dp_sizes, dp_segments,
                     received](const at::Tensor& grad) {
                      // Every rank sends its rows' gradients to every rank ...
                      std::vector<int64_t> send_sizes(world, dp_sizes[me]);
                      absl::StatusOr<at::Tensor> all = Exchange(
                          *group, grad.repeat({world}), send_sizes, dp_sizes,
                          "output_dist.data_parallel.backward");
                      ThrowIfError(all.status());
                      // ... arriving rank-major; dp_in is feature-major.
                      std::vector<at::Tensor> parts;
                      for (const auto& [k, cols] : dp_segments) {
                        int64_t offset = 0;
                        for (int q = 0; q < world; ++q) {
                          int64_t within = 0;
                          for (const auto& [k2, cols2] : dp_segments) {
                            if (k2 == k) break;
                            within += received[q][k2] * cols2;
                          }
                          parts.push_back(all->narrow(0, offset + within,
                                                      received[q][k] * cols));
                          offset += dp_sizes[q];
                        }
                      }
                      return at::cat(parts).div_(world);
                    });
    }
    gradients.Attach();

    // Each feature's rows, back in input order.
    const KeyedJaggedTensor& input = batch.input;
    std::vector<std::map<int64_t, at::Tensor>> by_column(
        feature_names().size());
    auto add = [&](int64_t f, int64_t col, const at::Tensor& part) {
      at::Tensor& slot = by_column[f][col];
      slot = slot.defined() ? slot + part : part;
    };
    int64_t offset = 0;
    for (int p = 0; p < world; ++p) {
      const std::vector<Slot>& theirs = slots(p);
      for (size_t k = 0; k < theirs.size(); ++k) {
        if (is_dp(theirs[k])) continue;
        const int64_t cols = shard(theirs[k]).cols;
        const int64_t n = batch.sent[p][k];
        at::Tensor part;
        if (p == me && bypass_own) {
          part = rows[k].narrow(0, start[me][k], n);
          if (part.requires_grad() && scale != 1.0f) {
            // What the reverse all-to-all does to the others' rows.
            part.register_hook(
                [scale](const at::Tensor& grad) { return grad * scale; });
          }
        } else {
          part = a2a_out.narrow(0, offset, n * cols).view({n, cols});
          offset += n * cols;
        }
        const at::Tensor& positions = batch.sent_positions[p][k];
        if (positions.defined()) {
          part = at::zeros({input.length_per_key()[theirs[k].feature], cols},
                           options)
                     .index_copy(0, positions, part);
        }
        add(theirs[k].feature, shard(theirs[k]).col_offset, part);
      }
    }
    int64_t dp_offset = 0;
    for (const auto& [k, cols] : dp_segments) {
      const int64_t n = batch.received[me][k];
      add(mine[k].feature, 0,
          dp_out.narrow(0, dp_offset, n * cols).view({n, cols}));
      dp_offset += n * cols;
    }
    FeatureDict output;
    for (size_t f = 0; f < feature_names().size(); ++f) {
      std::vector<at::Tensor> parts;
      for (auto& [col, part] : by_column[f]) parts.push_back(part);
      at::Tensor values = parts.size() == 1 ? parts[0] : at::cat(parts, 1);
      absl::StatusOr<JaggedTensor> jagged =
          input.At(static_cast<int64_t>(f)).WithValues(values);
      if (!jagged.ok()) return jagged.status();
      if (absl::Status s = output.Add(feature_names()[f], *std::move(jagged));
          !s.ok()) {
        return s;
      }
    }
    return output;
  });
}

template class ShardedCollection<ShardedEmbeddingBagCollection,
                                 EmbeddingBagCollection, KeyedTensor>;
template class ShardedCollection<ShardedEmbeddingCollection,
                                 EmbeddingCollection, FeatureDict>;

}  // namespace deltastream
