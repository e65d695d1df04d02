#include "trainer/optim/dense_optimizer.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "absl/strings/str_cat.h"

namespace deltastream {

absl::Status ValidateDenseOptimizer(absl::string_view name) {
  if (name == "sgd" || name == "adagrad" || name == "adam") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("sgd, adagrad or adam, got '", name, "'"));
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> MakeDenseOptimizer(
    absl::string_view name, double learning_rate,
    const std::vector<at::Tensor>& parameters) {
  if (absl::Status status = ValidateDenseOptimizer(name); !status.ok()) {
    return status;
  }
  if (name == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        parameters, torch::optim::SGDOptions(learning_rate));
  }
  if (name == "adam") {
    return std::make_unique<torch::optim::Adam>(
        parameters, torch::optim::AdamOptions(learning_rate));
  }
  return std::make_unique<torch::optim::Adagrad>(
      parameters, torch::optim::AdagradOptions(learning_rate));
}

}  // namespace deltastream
