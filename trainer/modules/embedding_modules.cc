#include "trainer/modules/embedding_modules.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding_bag.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <exception>
#include <map>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/torch_status.h"

namespace deltastream {

// A table's row gradients of the open accumulation window, as backward
// produced them (one entry per occurrence). Backward may run on autograd's
// threads, hence the lock.
struct EmbeddingModule::GradientBuffer {
  absl::Mutex mu;
  std::vector<at::Tensor> ids ABSL_GUARDED_BY(mu);
  std::vector<at::Tensor> grads ABSL_GUARDED_BY(mu);
};

namespace {

at::Tensor InitialRows(const EmbeddingTableConfig& table, uint64_t seed) {
  const double bound =
      std::sqrt(1.0 / static_cast<double>(table.num_embeddings));
  const double low = table.init_min.value_or(-bound);
  const double high = table.init_max.value_or(bound);
  at::Generator generator = at::detail::createCPUGenerator(seed);
  at::Tensor rows;
  try {
    rows = at::empty({table.num_embeddings, table.embedding_dim},
                     at::TensorOptions().dtype(table.dtype));
  } catch (const std::exception&) {
    // LibTorch's own words name neither the table nor its size.
    TORCH_CHECK(false, "table '", table.name, "' (", table.num_embeddings,
                " x ", table.embedding_dim, ", ",
                static_cast<double>(table.num_embeddings) *
                    static_cast<double>(table.embedding_dim) *
                    static_cast<double>(c10::elementSize(table.dtype)) / 1e9,
                " GB): out of memory");
  }
  if (low == high) return rows.fill_(low);
  return rows.uniform_(low, high, generator);
}

// The fused update a forward attaches to the rows it read: sums each ID's
// gradient over its occurrences and applies the table's optimizer to those
// rows. Every tensor keeps a size known on the host (the number of
// occurrences n, not of distinct IDs), so nothing synchronises with a GPU:
// the IDs are sorted, each run of equal IDs sums its gradients into one slot,
// and every occurrence then carries its run's sum, so the optimizer computes
// (and writes) the same new row once per occurrence.
void ApplySparseGradient(SparseTableOptimizer& optimizer, at::Tensor weight,
                         const at::Tensor& ids, const at::Tensor& grad) {
  c10::NoGradGuard no_grad;
  const int64_t n = ids.numel();
  if (n == 0) return;
  auto [sorted_ids, order] = ids.sort();
  at::Tensor run_starts = at::ones({n}, ids.options().dtype(at::kLong));
  if (n > 1) {
    run_starts.narrow(0, 1, n - 1)
        .copy_(sorted_ids.narrow(0, 1, n - 1) !=
               sorted_ids.narrow(0, 0, n - 1));
  }
  at::Tensor run = run_starts.cumsum(0).sub_(1);
  at::Tensor run_sums = at::zeros({n, grad.size(1)}, grad.options())
                            .index_add_(0, run, grad.index_select(0, order));
  optimizer.Update(weight, sorted_ids, run_sums.index_select(0, run));
}

}  // namespace

at::Tensor InitialTableRows(const EmbeddingTableConfig& table, uint64_t seed,
                            int64_t index) {
  return InitialRows(table, seed * 1000003 + static_cast<uint64_t>(index));
}

absl::Status EmbeddingModule::Validate(const EmbeddingModuleOptions& options,
                                       bool pooled) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("an embedding module needs a path");
  }
  if (options.tables.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("module '", options.path, "' has no tables"));
  }
  if (absl::Status status = ValidateTables(options.tables); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("module '", options.path, "': ", status.message()));
  }
  if (absl::Status status = ValidateOptimizer(options.optimizer);
      !status.ok()) {
    return status;
  }
  if (options.is_weighted) {
    if (!pooled) {
      return absl::InvalidArgumentError(
          absl::StrCat("module '", options.path,
                       "': per-ID weights need a pooled collection "
                       "(EmbeddingBagCollection)"));
    }
    for (const EmbeddingTableConfig& table : options.tables) {
      if (table.pooling != Pooling::kSum) {
        return absl::InvalidArgumentError(absl::StrCat(
            "module '", options.path, "': table '", table.name,
            "' uses mean pooling; per-ID weights need sum pooling"));
      }
    }
  }
  if (options.device.is_cuda() && !at::hasCUDA()) {
    return absl::FailedPreconditionError(
        absl::StrCat("module '", options.path, "' is configured for ",
                     options.device.str(), " but no CUDA device is present"));
  }
  return absl::OkStatus();
}

EmbeddingModule::EmbeddingModule(EmbeddingModuleOptions options, bool pooled)
    : options_(std::move(options)),
      fqn_infix_(pooled ? ".embedding_bags." : ".embeddings.") {
  for (size_t t = 0; t < options_.tables.size(); ++t) {
    const EmbeddingTableConfig& table = options_.tables[t];
    feature_range_.emplace_back(
        static_cast<int64_t>(feature_names_.size()),
        static_cast<int64_t>(table.feature_names.size()));
    feature_names_.insert(feature_names_.end(), table.feature_names.begin(),
                          table.feature_names.end());
    weights_.push_back(
        InitialTableRows(table, options_.seed, static_cast<int64_t>(t))
            .to(options_.device));
    // The live tensor, never part of an autograd graph.
    weights_.back().set_requires_grad(false);
    optimizers_.push_back(std::make_shared<SparseTableOptimizer>(
        options_.optimizer, weights_.back()));
    gradient_buffers_.push_back(std::make_shared<GradientBuffer>());
  }
  // Pin the device index (e.g. "cuda" -> "cuda:0") for input checks.
  options_.device = weights_.front().device();
}

absl::StatusOr<int64_t> EmbeddingModule::TableIndex(
    absl::string_view name) const {
  for (size_t t = 0; t < options_.tables.size(); ++t) {
    if (options_.tables[t].name == name) return static_cast<int64_t>(t);
  }
  return absl::NotFoundError(
      absl::StrCat("module '", options_.path, "' has no table '", name, "'"));
}

std::string EmbeddingModule::TableFqn(int64_t index) const {
  return absl::StrCat(options_.path, fqn_infix_, options_.tables[index].name);
}

absl::StatusOr<at::Tensor> EmbeddingModule::ReadRows(
    int64_t index, const at::Tensor& ids) const {
  return CatchTorchErrors([&]() -> absl::StatusOr<at::Tensor> {
    c10::NoGradGuard no_grad;
    return weights_[index].index_select(0, ids.to(weights_[index].device()));
  });
}

absl::StatusOr<at::Tensor> EmbeddingModule::ReadOptimizerStates(
    int64_t index, const at::Tensor& ids) const {
  return CatchTorchErrors([&]() -> absl::StatusOr<at::Tensor> {
    c10::NoGradGuard no_grad;
    return optimizers_[index]->RowStates(ids.to(weights_[index].device()));
  });
}

void EmbeddingModule::AddPostLookupHook(PostLookupHook hook) {
  post_lookup_hooks_.push_back(std::move(hook));
}

void EmbeddingModule::AddPostOutputHook(PostOutputHook hook) {
  post_output_hooks_.push_back(std::move(hook));
}

std::vector<std::pair<std::string, at::Tensor>> EmbeddingModule::StateTensors()
    const {
  std::vector<std::pair<std::string, at::Tensor>> states;
  for (size_t t = 0; t < weights_.size(); ++t) {
    const std::string& table = options_.tables[t].name;
    states.emplace_back(absl::StrCat(table, ".weight"), weights_[t]);
    for (auto& [name, tensor] : optimizers_[t]->StateTensors()) {
      states.emplace_back(absl::StrCat(table, ".", name), tensor);
    }
  }
  return states;
}

absl::Status EmbeddingModule::LoadStateTensors(
    const std::vector<std::pair<std::string, at::Tensor>>& states) {
  return CatchTorchErrors([&]() -> absl::Status {
    std::map<std::string, at::Tensor> given(states.begin(), states.end());
    std::vector<std::pair<std::string, at::Tensor>> expected = StateTensors();
    if (given.size() != states.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("module '", options_.path, "': a state name repeats"));
    }
    for (const auto& [name, live] : expected) {
      auto it = given.find(name);
      if (it == given.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "module '", options_.path, "': state '", name, "' missing"));
      }
      const at::Tensor& t = it->second;
      if (!t.defined() || t.sizes() != live.sizes() ||
          t.scalar_type() != live.scalar_type()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "module '", options_.path, "': state '", name, "' must be ",
            c10::toString(live.scalar_type()), c10::str(live.sizes()), ", got ",
            t.defined() ? absl::StrCat(c10::toString(t.scalar_type()),
                                       c10::str(t.sizes()))
                        : "undefined"));
      }
    }
    if (given.size() != expected.size()) {
      for (const auto& [name, tensor] : given) {
        bool known = false;
        for (const auto& e : expected) known = known || e.first == name;
        if (!known) {
          return absl::InvalidArgumentError(absl::StrCat(
              "module '", options_.path, "': unknown state '", name, "'"));
        }
      }
    }
    c10::NoGradGuard no_grad;
    for (size_t t = 0; t < weights_.size(); ++t) {
      const std::string prefix = absl::StrCat(options_.tables[t].name, ".");
      weights_[t].copy_(given[prefix + "weight"]);
      std::vector<std::pair<std::string, at::Tensor>> optimizer_states;
      for (auto& [name, tensor] : optimizers_[t]->StateTensors()) {
        optimizer_states.emplace_back(name, given[prefix + name]);
      }
      if (absl::Status status =
              optimizers_[t]->LoadStateTensors(optimizer_states);
          !status.ok()) {
        return status;
      }
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<EmbeddingModule::Lookup> EmbeddingModule::LookUp(
    const KeyedJaggedTensor& input) {
  if (input.device() != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module '", options_.path, "' lives on ", options_.device.str(),
        " but its input is on ", input.device().str()));
  }
  Lookup lookup;
  if (input.keys() == feature_names_) {
    lookup.features = input;
  } else {
    const std::vector<std::vector<std::string>> groups = {feature_names_};
    absl::StatusOr<std::vector<KeyedJaggedTensor>> parts =
        input.SplitByKeys(groups);
    if (!parts.ok()) {
      return absl::Status(parts.status().code(),
                          absl::StrCat("module '", options_.path,
                                       "': ", parts.status().message()));
    }
    lookup.features = std::move((*parts)[0]);
  }
  const KeyedJaggedTensor& features = lookup.features;
  const bool train = c10::GradMode::is_enabled();
  ModuleLookup hook_view{features, {}, {}};
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    for (size_t t = 0; t < weights_.size(); ++t) {
      const auto [first, count] = feature_range_[t];
      const int64_t begin = features.offset_per_key()[first];
      const int64_t end = features.offset_per_key()[first + count];
      at::Tensor ids = features.values().narrow(0, begin, end - begin);
      at::Tensor rows;
      {
        c10::NoGradGuard no_grad;
        rows = weights_[t].index_select(0, ids);
      }
      if (train && accumulating_) {
        rows.requires_grad_(true);
        rows.register_hook(
            [buffer = gradient_buffers_[t], ids](const at::Tensor& grad) {
              absl::MutexLock lock(&buffer->mu);
              buffer->ids.push_back(ids);
              buffer->grads.push_back(grad.detach());
            });
      } else if (train) {
        rows.requires_grad_(true);
        rows.register_hook([optimizer = optimizers_[t], weight = weights_[t],
                            ids](const at::Tensor& grad) {
          ApplySparseGradient(*optimizer, weight, ids, grad);
        });
      }
      hook_view.ids.push_back(ids);
      hook_view.rows.push_back(rows.detach());
      lookup.rows.push_back(std::move(rows));
    }
    return absl::OkStatus();
  });
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "module '", options_.path, "': lookup failed: ", status.message()));
  }
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module '", options_.path, "': lookup failed (an ID outside its ",
        "table?): ", status.message()));
  }
  if (!train) return lookup;
  if (accumulating_) {
    if (!post_lookup_hooks_.empty()) {
      kept_lookups_.push_back(
          {features, std::move(hook_view.ids), std::move(hook_view.rows)});
    }
    return lookup;
  }
  for (const PostLookupHook& hook : post_lookup_hooks_) {
    if (absl::Status hook_status = hook(*this, hook_view); !hook_status.ok()) {
      return hook_status;
    }
  }
  return lookup;
}

bool EmbeddingModule::has_accumulated() const {
  if (!kept_lookups_.empty()) return true;
  for (const std::shared_ptr<GradientBuffer>& buffer : gradient_buffers_) {
    absl::MutexLock lock(&buffer->mu);
    if (!buffer->ids.empty()) return true;
  }
  return false;
}

bool EmbeddingModule::AccumulatedGradientsFinite() const {
  for (const std::shared_ptr<GradientBuffer>& buffer : gradient_buffers_) {
    absl::MutexLock lock(&buffer->mu);
    for (const at::Tensor& grad : buffer->grads) {
      if (!at::isfinite(grad).all().item<bool>()) return false;
    }
  }
  return true;
}

void EmbeddingModule::DiscardAccumulated() {
  kept_lookups_.clear();
  for (const std::shared_ptr<GradientBuffer>& buffer : gradient_buffers_) {
    absl::MutexLock lock(&buffer->mu);
    buffer->ids.clear();
    buffer->grads.clear();
  }
}

absl::Status EmbeddingModule::ApplyAccumulated(double gradient_scale) {
  std::vector<KeptLookup> kept = std::move(kept_lookups_);
  kept_lookups_.clear();
  std::vector<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>>
      buffered;
  for (const std::shared_ptr<GradientBuffer>& buffer : gradient_buffers_) {
    absl::MutexLock lock(&buffer->mu);
    buffered.emplace_back(std::move(buffer->ids), std::move(buffer->grads));
    buffer->ids.clear();
    buffer->grads.clear();
  }
  for (const KeptLookup& lookup : kept) {
    const ModuleLookup view{lookup.features, lookup.ids, lookup.rows};
    for (const PostLookupHook& hook : post_lookup_hooks_) {
      if (absl::Status status = hook(*this, view); !status.ok()) return status;
    }
  }
  return CatchTorchErrors([&]() -> absl::Status {
    c10::NoGradGuard no_grad;
    for (size_t t = 0; t < buffered.size(); ++t) {
      auto& [ids, grads] = buffered[t];
      if (ids.empty()) continue;
      at::Tensor grad = grads.size() == 1 ? grads[0] : at::cat(grads, 0);
      if (gradient_scale != 1.0) grad = grad * gradient_scale;
      ApplySparseGradient(*optimizers_[t], weights_[t],
                          ids.size() == 1 ? ids[0] : at::cat(ids, 0), grad);
    }
    return absl::OkStatus();
  });
}

void EmbeddingModule::CallPostOutputHooks() const {
  if (!c10::GradMode::is_enabled()) return;
  for (const PostOutputHook& hook : post_output_hooks_) hook(*this);
}

absl::StatusOr<std::unique_ptr<EmbeddingBagCollection>>
EmbeddingBagCollection::Create(EmbeddingModuleOptions options) {
  if (absl::Status status = Validate(options, /*pooled=*/true); !status.ok()) {
    return status;
  }
  return CatchTorchErrors(
      [&]() -> absl::StatusOr<std::unique_ptr<EmbeddingBagCollection>> {
        return std::unique_ptr<EmbeddingBagCollection>(
            new EmbeddingBagCollection(std::move(options), /*pooled=*/true));
      });
}

absl::StatusOr<KeyedTensor> EmbeddingBagCollection::Forward(
    const KeyedJaggedTensor& input) {
  const bool weighted = options().is_weighted;
  if (weighted && !input.has_weights()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "module '", path(), "' is weighted but its input has no weights"));
  }
  absl::StatusOr<Lookup> lookup = LookUp(input);
  if (!lookup.ok()) return lookup.status();
  const KeyedJaggedTensor& features = lookup->features;
  const int64_t batch = features.stride();
  absl::StatusOr<KeyedTensor> output =
      CatchTorchErrors([&]() -> absl::StatusOr<KeyedTensor> {
        std::vector<at::Tensor> blocks;
        std::vector<int64_t> dims;
        for (size_t t = 0; t < tables().size(); ++t) {
          const EmbeddingTableConfig& table = tables()[t];
          const auto [first, count] = feature_range(t);
          const at::Tensor& rows = lookup->rows[t];
          const int64_t begin = features.offset_per_key()[first];
          at::Tensor offsets =
              (features.offsets().narrow(0, first * batch, count * batch) -
               begin)
                  .to(at::kLong);
          at::Tensor indices = at::arange(
              rows.size(0),
              at::TensorOptions().dtype(at::kLong).device(rows.device()));
          at::Tensor per_id_weights;
          if (weighted) {
            per_id_weights = features.weights()
                                 ->narrow(0, begin, rows.size(0))
                                 .to(rows.scalar_type());
          }
          const int64_t mode = table.pooling == Pooling::kSum ? 0 : 1;
          at::Tensor pooled = std::get<0>(at::embedding_bag(
              rows, indices, offsets, /*scale_grad_by_freq=*/false, mode,
              /*sparse=*/false, per_id_weights,
              /*include_last_offset=*/false));
          // [count * batch, dim] -> [batch, count * dim], feature-major.
          blocks.push_back(pooled.view({count, batch, table.embedding_dim})
                               .transpose(0, 1)
                               .reshape({batch, count * table.embedding_dim}));
          dims.insert(dims.end(), count, table.embedding_dim);
        }
        return KeyedTensor::Create(
            feature_names(), std::move(dims),
            blocks.size() == 1 ? blocks[0] : at::cat(blocks, 1));
      });
  if (!output.ok()) return output.status();
  CallPostOutputHooks();
  return output;
}

absl::StatusOr<KeyedTensor> EmbeddingBagCollection::Forward(
    const FeatureDict& input) {
  absl::StatusOr<KeyedJaggedTensor> kjt = input.ToKeyedJaggedTensor();
  if (!kjt.ok()) return kjt.status();
  return Forward(*kjt);
}

absl::StatusOr<std::unique_ptr<EmbeddingCollection>>
EmbeddingCollection::Create(EmbeddingModuleOptions options) {
  if (absl::Status status = Validate(options, /*pooled=*/false); !status.ok()) {
    return status;
  }
  return CatchTorchErrors(
      [&]() -> absl::StatusOr<std::unique_ptr<EmbeddingCollection>> {
        return std::unique_ptr<EmbeddingCollection>(
            new EmbeddingCollection(std::move(options), /*pooled=*/false));
      });
}

absl::StatusOr<FeatureDict> EmbeddingCollection::Forward(
    const KeyedJaggedTensor& input) {
  absl::StatusOr<Lookup> lookup = LookUp(input);
  if (!lookup.ok()) return lookup.status();
  const KeyedJaggedTensor& features = lookup->features;
  FeatureDict output;
  for (size_t t = 0; t < tables().size(); ++t) {
    const auto [first, count] = feature_range(t);
    const int64_t table_begin = features.offset_per_key()[first];
    for (int64_t k = first; k < first + count; ++k) {
      const int64_t begin = features.offset_per_key()[k] - table_begin;
      at::Tensor rows =
          lookup->rows[t].narrow(0, begin, features.length_per_key()[k]);
      absl::StatusOr<JaggedTensor> jagged = features.At(k).WithValues(rows);
      if (!jagged.ok()) return jagged.status();
      if (absl::Status status =
              output.Add(features.keys()[k], *std::move(jagged));
          !status.ok()) {
        return status;
      }
    }
  }
  CallPostOutputHooks();
  return output;
}

absl::StatusOr<FeatureDict> EmbeddingCollection::Forward(
    const FeatureDict& input) {
  absl::StatusOr<KeyedJaggedTensor> kjt = input.ToKeyedJaggedTensor();
  if (!kjt.ok()) return kjt.status();
  return Forward(*kjt);
}

}  // namespace deltastream
