#include "trainer/models/architecture.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deltastream {

torch::nn::Sequential MakeMlp(int64_t in, const std::vector<int64_t>& widths,
                              bool relu_last) {
  torch::nn::Sequential mlp;
  for (size_t i = 0; i < widths.size(); ++i) {
    mlp->push_back(torch::nn::Linear(in, widths[i]));
    if (i + 1 < widths.size() || relu_last) mlp->push_back(torch::nn::ReLU());
    in = widths[i];
  }
  return mlp;
}

void InitializeLinearLayers(torch::nn::Module& module, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  auto fill = [&](at::Tensor& parameter, double bound) {
    at::Tensor values = at::empty(parameter.sizes(), at::kDouble);
    values.uniform_(-bound, bound, generator);
    parameter.copy_(values);
  };
  for (const std::shared_ptr<torch::nn::Module>& child :
       module.modules(/*include_self=*/true)) {
    auto* linear = child->as<torch::nn::Linear>();
    if (linear == nullptr) continue;
    const double bound =
        1.0 / std::sqrt(static_cast<double>(linear->options.in_features()));
    fill(linear->weight, bound);
    if (linear->bias.defined()) fill(linear->bias, bound);
  }
}

absl::Status ValidateArchitecture(
    int64_t num_dense, const std::vector<int64_t>& dense_arch,
    const std::vector<int64_t>& over_arch,
    const std::vector<EmbeddingTableConfig>& tables) {
  if (num_dense < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_dense must be >= 1, got ", num_dense));
  }
  for (const auto* arch : {&dense_arch, &over_arch}) {
    if (arch->empty() || std::any_of(arch->begin(), arch->end(),
                                     [](int64_t w) { return w <= 0; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          arch == &dense_arch ? "dense_arch" : "over_arch",
          " needs positive widths, got [", absl::StrJoin(*arch, ", "), "]"));
    }
  }
  if (over_arch.back() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("over_arch must end in 1 (the logit), got [",
                     absl::StrJoin(over_arch, ", "), "]"));
  }
  if (tables.empty()) return absl::InvalidArgumentError("no tables");
  for (const EmbeddingTableConfig& table : tables) {
    if (table.embedding_dim != dense_arch.back()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", table.name, "' has dim ", table.embedding_dim,
                       " but dense_arch ends in ", dense_arch.back(),
                       ": the interaction needs one dim"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateBatch(const Batch& batch, int64_t num_dense,
                           c10::Device device) {
  const at::Tensor& dense = batch.dense;
  if (!dense.defined() || dense.dim() != 2 || dense.size(1) != num_dense) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch.dense must be [batch, ", num_dense, "], got ",
        dense.defined()
            ? absl::StrCat("[", absl::StrJoin(dense.sizes(), ", "), "]")
            : "an undefined tensor"));
  }
  if (!at::isFloatingType(dense.scalar_type())) {
    return absl::InvalidArgumentError("batch.dense must be floating");
  }
  if (dense.device() != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch.dense is on ", dense.device().str(),
                     ", the model on ", device.str()));
  }
  if (batch.sparse.stride() != dense.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch.sparse has stride ", batch.sparse.stride(),
                     ", batch.dense ", dense.size(0), " rows"));
  }
  return absl::OkStatus();
}

}  // namespace deltastream
