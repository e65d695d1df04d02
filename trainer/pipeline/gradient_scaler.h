#ifndef DELTASTREAM_TRAINER_PIPELINE_GRADIENT_SCALER_H_
#define DELTASTREAM_TRAINER_PIPELINE_GRADIENT_SCALER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace deltastream {

struct GradientScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  // Finite steps in a row after which the scale grows.
  int64_t growth_interval = 2000;
};

// Dynamic loss scaling (torch.cuda.amp.GradScaler's rule) for mixed
// precision: the loss is multiplied by scale() before backward; a step whose
// gradients (dense or sparse) hold an Inf or NaN is skipped for every
// parameter and the scale shrinks by backoff_factor; growth_interval finite
// steps in a row grow it by growth_factor. TrainStep applies it once per
// accumulation window. Not thread-safe (the training thread's).
class GradientScaler {
 public:
  explicit GradientScaler(GradientScalerOptions options = {})
      : options_(options), scale_(options.init_scale) {}

  double scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  // Records one step's outcome and adjusts the scale.
  void Update(bool found_non_finite);

  // For checkpoints: "scale" (double) and "growth_tracker" (int64) as 0-dim
  // CPU tensors (copies).
  std::vector<std::pair<std::string, at::Tensor>> StateTensors() const;
  // Loads what StateTensors returned. InvalidArgument for a missing or
  // unknown name or a scale that is not positive and finite; nothing
  // changes then.
  absl::Status LoadStateTensors(
      const std::vector<std::pair<std::string, at::Tensor>>& states);

 private:
  GradientScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t skipped_steps_ = 0;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_PIPELINE_GRADIENT_SCALER_H_
