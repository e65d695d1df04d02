#include "trainer/pipeline/train_step.h"

#include <torch/torch.h>

#include <optional>
#include <utility>

#include "base/torch_status.h"
#include "tracker_service/tracker.h"
#include "trainer/comm/gradient_averaging.h"
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

TrainStep::TrainStep(TrainPipelineParts parts, int accumulation_steps)
    : parts_(parts), accumulation_steps_(accumulation_steps) {
  for (EmbeddingModule* module : parts_.model->embedding_modules()) {
    module->SetAccumulating(accumulation_steps_ > 1);
  }
}

absl::Status TrainStep::ApplyWindow() {
  const int trained = position_;
  position_ = 0;
  if (trained == 0) return absl::OkStatus();
  const double scale = static_cast<double>(accumulation_steps_) / trained;
  RecModel& model = *parts_.model;
  return CatchTorchErrors([&]() -> absl::Status {
    if (accumulation_steps_ > 1) {
      c10::NoGradGuard no_grad;
      if (scale != 1.0) {
        for (at::Tensor& parameter : model.dense().parameters()) {
          if (parameter.grad().defined()) parameter.mutable_grad().mul_(scale);
        }
      }
      for (EmbeddingModule* module : model.embedding_modules()) {
        if (absl::Status applied = module->ApplyAccumulated(scale);
            !applied.ok()) {
          return applied;
        }
      }
    }
    if (parts_.group != nullptr) {
      if (absl::Status averaged =
              AverageGradients(*parts_.group, model.dense().parameters());
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
    bool ends_window) {
  TrainedStep step;
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    if (position_ == 0) parts_.dense_optimizer->zero_grad();
    absl::StatusOr<at::Tensor> logits = forward();
    if (!logits.ok()) return logits.status();
    at::Tensor loss = BinaryCrossEntropyWithLogits(*logits, batch.labels);
    // Rows, dense parameters and the batch index change together: a read
    // (which pins the rows) sees the model after a whole step or before it.
    std::optional<ModuleRowsReader::UpdateGuard> guard;
    if (parts_.rows_reader != nullptr) guard.emplace(*parts_.rows_reader);
    if (accumulation_steps_ > 1) {
      (loss / static_cast<double>(accumulation_steps_)).backward();
    } else {
      loss.backward();
    }
    ++position_;
    if (ends_window || position_ >= accumulation_steps_) {
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

absl::Status TrainStep::Flush() {
  if (position_ == 0) return absl::OkStatus();
  std::optional<ModuleRowsReader::UpdateGuard> guard;
  if (parts_.rows_reader != nullptr) guard.emplace(*parts_.rows_reader);
  return ApplyWindow();
}

}  // namespace deltastream
