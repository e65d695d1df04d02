#include "trainer/models/architecture.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "trainer/models/architecture_rule.h"
#include "trainer/models/model.h"

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

absl::Status ValidateArchitecture(const RecModelConfig& config) {
  std::vector<TableShape> tables;
  for (const EmbeddingTableConfig& table : config.tables) {
    tables.push_back({table.name, table.embedding_dim});
  }
  return ValidateArchitecture(config.num_dense, config.dense_arch,
                              config.over_arch, tables);
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
