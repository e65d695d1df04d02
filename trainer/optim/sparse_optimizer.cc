#include "trainer/optim/sparse_optimizer.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"

namespace deltastream {

absl::string_view SparseOptimizerName(SparseOptimizerType type) {
  switch (type) {
    case SparseOptimizerType::kSgd:
      return "sgd";
    case SparseOptimizerType::kAdagrad:
      return "adagrad";
    case SparseOptimizerType::kRowwiseAdagrad:
      return "rowwise_adagrad";
    case SparseOptimizerType::kAdam:
      return "adam";
  }
  return "unknown";
}

absl::StatusOr<SparseOptimizerType> ParseSparseOptimizer(
    absl::string_view name) {
  for (SparseOptimizerType type :
       {SparseOptimizerType::kSgd, SparseOptimizerType::kAdagrad,
        SparseOptimizerType::kRowwiseAdagrad, SparseOptimizerType::kAdam}) {
    if (name == SparseOptimizerName(type)) return type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown sparse optimizer '", name,
                   "' (sgd, adagrad, rowwise_adagrad or adam)"));
}

absl::Status ValidateOptimizer(const SparseOptimizerConfig& config) {
  // Finite too: an infinite rate or state trains to NaN without a word.
  const auto finite = [](double value) { return std::isfinite(value); };
  if (!(config.learning_rate >= 0) || !(config.eps > 0) ||
      !(config.beta1 >= 0 && config.beta1 < 1) ||
      !(config.beta2 >= 0 && config.beta2 < 1) || !(config.weight_decay >= 0) ||
      !(config.initial_accumulator_value >= 0) ||
      !finite(config.learning_rate) || !finite(config.eps) ||
      !finite(config.weight_decay) ||
      !finite(config.initial_accumulator_value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad ", SparseOptimizerName(config.type),
                     " settings: need finite values, learning_rate >= 0 (got ",
                     config.learning_rate, "), eps > 0 (", config.eps,
                     "), 0 <= beta1, beta2 < 1 (", config.beta1, ", ",
                     config.beta2, "), weight_decay >= 0 (",
                     config.weight_decay, "), initial_accumulator_value >= 0 (",
                     config.initial_accumulator_value, ")"));
  }
  return absl::OkStatus();
}

SparseTableOptimizer::SparseTableOptimizer(SparseOptimizerConfig config,
                                           const at::Tensor& weight)
    : config_(config) {
  const int64_t rows = weight.size(0);
  switch (config_.type) {
    case SparseOptimizerType::kSgd:
      break;
    case SparseOptimizerType::kAdagrad:
      momentum1_ =
          at::full_like(weight, config_.initial_accumulator_value).detach();
      break;
    case SparseOptimizerType::kRowwiseAdagrad:
      momentum1_ = at::full({rows, 1}, config_.initial_accumulator_value,
                            weight.options())
                       .detach();
      break;
    case SparseOptimizerType::kAdam:
      momentum1_ = at::zeros_like(weight).detach();
      momentum2_ = at::zeros_like(weight).detach();
      break;
  }
}

void SparseTableOptimizer::Update(at::Tensor& weight, const at::Tensor& ids,
                                  const at::Tensor& grad_in) {
  c10::NoGradGuard no_grad;
  at::Tensor rows = weight.index_select(0, ids);
  at::Tensor grad = grad_in.to(weight.scalar_type());
  if (config_.weight_decay != 0) grad = grad + config_.weight_decay * rows;
  const double lr = config_.learning_rate;
  switch (config_.type) {
    case SparseOptimizerType::kSgd:
      rows.sub_(grad, lr);
      break;
    case SparseOptimizerType::kAdagrad: {
      at::Tensor sum = momentum1_.index_select(0, ids).addcmul_(grad, grad);
      momentum1_.index_copy_(0, ids, sum);
      rows.addcdiv_(grad, sum.sqrt().add_(config_.eps), -lr);
      break;
    }
    case SparseOptimizerType::kRowwiseAdagrad: {
      at::Tensor sum =
          momentum1_.index_select(0, ids).add_(grad.square().mean(1, true));
      momentum1_.index_copy_(0, ids, sum);
      rows.addcdiv_(grad, sum.sqrt().add_(config_.eps), -lr);
      break;
    }
    case SparseOptimizerType::kAdam: {
      ++step_;
      const double b1 = config_.beta1, b2 = config_.beta2;
      at::Tensor m =
          momentum1_.index_select(0, ids).mul_(b1).add_(grad, 1 - b1);
      at::Tensor v =
          momentum2_.index_select(0, ids).mul_(b2).addcmul_(grad, grad, 1 - b2);
      momentum1_.index_copy_(0, ids, m);
      momentum2_.index_copy_(0, ids, v);
      const double bias1 = 1 - std::pow(b1, static_cast<double>(step_));
      const double bias2 = 1 - std::pow(b2, static_cast<double>(step_));
      at::Tensor denom = (v / bias2).sqrt_().add_(config_.eps);
      rows.addcdiv_(m, denom, -lr / bias1);
      break;
    }
  }
  weight.index_copy_(0, ids, rows);
}

absl::StatusOr<at::Tensor> SparseTableOptimizer::RowStates(
    const at::Tensor& ids) const {
  if (!momentum1_.defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat(SparseOptimizerName(config_.type),
                     " keeps no per-row optimizer state"));
  }
  return momentum1_.index_select(0, ids);
}

std::vector<std::pair<std::string, at::Tensor>>
SparseTableOptimizer::StateTensors() const {
  std::vector<std::pair<std::string, at::Tensor>> states;
  if (momentum1_.defined()) states.emplace_back("momentum1", momentum1_);
  if (momentum2_.defined()) states.emplace_back("momentum2", momentum2_);
  if (config_.type == SparseOptimizerType::kAdam) {
    states.emplace_back("step", at::scalar_tensor(step_, at::kLong));
  }
  return states;
}

absl::Status SparseTableOptimizer::LoadStateTensors(
    const std::vector<std::pair<std::string, at::Tensor>>& states) {
  std::map<std::string, at::Tensor> given(states.begin(), states.end());
  std::vector<std::pair<std::string, at::Tensor>> expected = StateTensors();
  if (given.size() != expected.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(SparseOptimizerName(config_.type), " has ",
                     expected.size(), " state tensors, got ", given.size()));
  }
  for (const auto& [name, live] : expected) {
    auto it = given.find(name);
    if (it == given.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          SparseOptimizerName(config_.type), " state '", name, "' missing"));
    }
    if (!it->second.defined() || it->second.sizes() != live.sizes() ||
        it->second.scalar_type() != live.scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(
          SparseOptimizerName(config_.type), " state '", name, "': expected ",
          c10::toString(live.scalar_type()), c10::str(live.sizes()), ", got ",
          it->second.defined()
              ? absl::StrCat(c10::toString(it->second.scalar_type()),
                             c10::str(it->second.sizes()))
              : "undefined"));
    }
  }
  c10::NoGradGuard no_grad;
  if (momentum1_.defined()) momentum1_.copy_(given["momentum1"]);
  if (momentum2_.defined()) momentum2_.copy_(given["momentum2"]);
  if (config_.type == SparseOptimizerType::kAdam) {
    step_ = given["step"].item<int64_t>();
  }
  return absl::OkStatus();
}

}  // namespace deltastream
