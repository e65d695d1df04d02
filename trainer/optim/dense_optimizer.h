#ifndef DELTASTREAM_TRAINER_OPTIM_DENSE_OPTIMIZER_H_
#define DELTASTREAM_TRAINER_OPTIM_DENSE_OPTIMIZER_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// LibTorch's optimizer base, declared here so that headers that only hold
// one need not include <torch/torch.h>.
namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace deltastream {

// OK for the dense optimizers MakeDenseOptimizer knows ("sgd", "adagrad",
// "adam"); InvalidArgument naming them otherwise.
absl::Status ValidateDenseOptimizer(absl::string_view name);

// LibTorch's optimizer `name` over `parameters` (the dense model's, not the
// embedding tables, which the fused sparse optimizers update), with
// `learning_rate` and LibTorch's defaults for every other option.
// InvalidArgument for a name ValidateDenseOptimizer refuses. The optimizer
// references the parameters' tensors; it is not thread-safe.
absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeDenseOptimizer(
    absl::string_view name, double learning_rate,
    const std::vector<at::Tensor>& parameters);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_OPTIM_DENSE_OPTIMIZER_H_
