#include "trainer/pipeline/gradient_scaler.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/scalar_tensor.h>

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"

namespace deltastream {

void GradientScaler::Update(bool found_non_finite) {
  if (found_non_finite) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    ++skipped_steps_;
    return;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
}

std::vector<std::pair<std::string, at::Tensor>> GradientScaler::StateTensors()
    const {
  return {{"scale", at::scalar_tensor(scale_, at::kDouble)},
          {"growth_tracker", at::scalar_tensor(growth_tracker_, at::kLong)}};
}

absl::Status GradientScaler::LoadStateTensors(
    const std::vector<std::pair<std::string, at::Tensor>>& states) {
  std::map<std::string, at::Tensor> given(states.begin(), states.end());
  if (given.size() != 2 || !given.count("scale") ||
      !given.count("growth_tracker") || !given["scale"].defined() ||
      !given["growth_tracker"].defined() || given["scale"].numel() != 1 ||
      given["growth_tracker"].numel() != 1) {
    return absl::InvalidArgumentError(
        "gradient scaler state: expected exactly 'scale' and "
        "'growth_tracker', one value each");
  }
  const double scale = given["scale"].item<double>();
  if (!std::isfinite(scale) || scale <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient scaler state: scale must be positive and finite, got ",
        scale));
  }
  scale_ = scale;
  growth_tracker_ = given["growth_tracker"].item<int64_t>();
  return absl::OkStatus();
}

}  // namespace deltastream
