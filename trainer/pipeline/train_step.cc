#include "trainer/pipeline/train_step.h"

#include <ATen/autocast_mode.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "base/torch_status.h"
#include "tracker_service/tracker.h"
#include "trainer/comm/gradient_averaging.h"
#include "trainer/comm/process_group.h"
#include "trainer/models/metrics.h"
#include "trainer/models/model.h"
#include "trainer/sharding/sharded_embedding_modules.h"
#include "trainer/tracking/module_tracking.h"

namespace deltastream {

absl::StatusOr<std::optional<Batch>> BatchFeed::Next(BatchSource& source) {
  if (carried_.empty()) return source.Next();
  Batch batch = std::move(carried_.front());
  carried_.pop_front();
  return batch;
}

absl::StatusOr<std::optional<Batch>> BatchFeed::NextConverted(
    BatchSource& source) {
  absl::StatusOr<std::optional<Batch>> next = Next(source);
  if (!next.ok() || !next->has_value()) return next;
  if (absl::Status converted = (*next)->ConvertSparseDict(); !converted.ok()) {
    PushFront(**std::move(next));
    return converted;
  }
  return next;
}

absl::StatusOr<std::vector<DistributedBatch>> DistributeInputs(
    RecModel& model, const KeyedJaggedTensor& sparse, ProcessGroup* group) {
  std::vector<DistributedBatch> distributed;
  for (ShardedEmbeddingModule* module : model.sharded_modules()) {
    absl::StatusOr<DistributedBatch> one =
        group != nullptr ? module->DistributeInput(sparse, *group)
                         : module->DistributeInput(sparse);
    if (!one.ok()) return one.status();
    distributed.push_back(*std::move(one));
  }
  return distributed;
}

namespace {

// bf16 autocast on CUDA for the guard's lifetime (thread-local).
class CudaAutocast {
 public:
  explicit CudaAutocast(bool enable) : enabled_(enable) {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    was_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    was_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
#else
    was_enabled_ = at::autocast::is_enabled();
    was_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
    at::autocast::set_enabled(true);
#endif
  }
  ~CudaAutocast() {
    if (!enabled_) return;
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
    at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, was_dtype_);
#else
    at::autocast::set_enabled(was_enabled_);
    at::autocast::set_autocast_gpu_dtype(was_dtype_);
#endif
    at::autocast::clear_cache();
  }
  CudaAutocast(const CudaAutocast&) = delete;
  CudaAutocast& operator=(const CudaAutocast&) = delete;

 private:
  bool enabled_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

bool AllFinite(const std::vector<at::Tensor>& parameters) {
  for (const at::Tensor& parameter : parameters) {
    const at::Tensor& grad = parameter.grad();
    if (grad.defined() && !at::isfinite(grad).all().item<bool>()) return false;
  }
  return true;
}

}  // namespace

TrainStep::TrainStep(TrainPipelineParts parts, int accumulation_steps,
                     std::shared_ptr<GradientScaler> scaler)
    : parts_(parts),
      accumulation_steps_(accumulation_steps),
      scaler_(std::move(scaler)),
      accumulating_(accumulation_steps > 1 || scaler_ != nullptr) {
  for (EmbeddingModule* module : parts_.model->embedding_modules()) {
    module->SetAccumulating(accumulating_);
  }
}

void TrainStep::ContinueWindow(const PipelineHandover& handover) {
  position_ = handover.window_position;
  window_examples_ = handover.window_examples;
  window_norm_ = handover.window_norm;
}

void TrainStep::HandOverWindow(PipelineHandover& handover) const {
  handover.window_position = position_;
  handover.window_examples = window_examples_;
  handover.window_norm = window_norm_;
}

absl::Status TrainStep::ApplyWindow() {
  const int trained = position_;
  const int64_t examples = window_examples_;
  const int64_t norm = window_norm_;
  position_ = 0;
  window_examples_ = 0;
  window_norm_ = 0;
  if (trained == 0) return absl::OkStatus();
  RecModel& model = *parts_.model;
  std::vector<EmbeddingModule*> modules = model.embedding_modules();
  // N / T: each micro-batch then weighs its share of the window's examples
  // (1 for K equal micro-batches, K / m for a last window of m equal ones);
  // times 1 / scale under mixed precision.
  double scale = examples > 0
                     ? static_cast<double>(norm) / static_cast<double>(examples)
                     : 1.0;
  return CatchTorchErrors([&]() -> absl::Status {
    std::vector<at::Tensor> dense = model.dense().parameters();
    if (scaler_ != nullptr) {
      bool finite = AllFinite(dense);
      for (EmbeddingModule* module : modules) {
        finite = finite && module->AccumulatedGradientsFinite();
      }
      if (parts_.group != nullptr) {
        // Every rank skips the same steps.
        absl::StatusOr<int64_t> all_finite = parts_.group->AllReduceMin(
            finite ? 1 : 0, "mixed_precision.finite");
        if (!all_finite.ok()) return all_finite.status();
        finite = *all_finite == 1;
      }
      const double used_scale = scaler_->scale();
      scaler_->Update(!finite);
      if (!finite) {
        for (EmbeddingModule* module : modules) module->DiscardAccumulated();
        parts_.dense_optimizer->zero_grad();
        return absl::OkStatus();
      }
      scale /= used_scale;
    }
    if (accumulating_) {
      c10::NoGradGuard no_grad;
      if (scale != 1.0) {
        for (at::Tensor& parameter : dense) {
          if (parameter.grad().defined()) parameter.mutable_grad().mul_(scale);
        }
      }
      for (EmbeddingModule* module : modules) {
        if (absl::Status applied = module->ApplyAccumulated(scale);
            !applied.ok()) {
          return applied;
        }
      }
    }
    if (parts_.group != nullptr) {
      if (absl::Status averaged = AverageGradients(*parts_.group, dense);
          !averaged.ok()) {
        return averaged;
      }
    }
    parts_.dense_optimizer->step();
    return absl::OkStatus();
  });
}

absl::StatusOr<TrainedStep> TrainStep::Train(
    const Batch& batch,
    const std::function<absl::StatusOr<at::Tensor>()>& forward,
    bool ends_window, const std::function<absl::Status()>& after_forward) {
  TrainedStep step;
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    if (position_ == 0) {
      parts_.dense_optimizer->zero_grad();
      window_examples_ = 0;
      // At least 1: an empty batch does not divide by zero.
      window_norm_ = accumulation_steps_ * std::max<int64_t>(batch.size(), 1);
    }
    absl::StatusOr<at::Tensor> logits;
    {
      CudaAutocast autocast(scaler_ != nullptr &&
                            parts_.model->device().is_cuda());
      logits = forward();
    }
    if (!logits.ok()) return logits.status();
    if (after_forward) {
      if (absl::Status after = after_forward(); !after.ok()) return after;
    }
    at::Tensor loss =
        BinaryCrossEntropyWithLogits(logits->to(at::kFloat), batch.labels);
    // Rows, dense parameters and the batch index change together: a read
    // (which pins the rows) sees the model after a whole step or before it.
    std::optional<ModuleRowsReader::UpdateGuard> guard;
    if (parts_.rows_reader != nullptr) guard.emplace(*parts_.rows_reader);
    // b / N: 1/K for a micro-batch as large as the window's first (and
    // exactly 1 at K = 1, where the modules update rows in backward).
    double loss_scale =
        static_cast<double>(batch.size()) / static_cast<double>(window_norm_);
    if (scaler_ != nullptr) loss_scale *= scaler_->scale();
    if (loss_scale != 1.0) {
      (loss * loss_scale).backward();
    } else {
      loss.backward();
    }
    ++position_;
    window_examples_ += batch.size();
    if (ends_window || end_window_ || position_ >= accumulation_steps_) {
      end_window_ = false;
      if (absl::Status applied = ApplyWindow(); !applied.ok()) return applied;
    }
    if (parts_.tracker != nullptr) parts_.tracker->Step();
    step.loss = loss.detach();
    step.examples = batch.size();
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return step;
}

}  // namespace deltastream
