#include "trainer/pipeline/sequential_pipeline.h"

#include <torch/torch.h>

#include <utility>

#include "base/torch_status.h"
#include "tracker_service/tracker.h"
#include "trainer/comm/gradient_averaging.h"
#include "trainer/models/metrics.h"
#include "trainer/models/model.h"
#include "trainer/tracking/module_tracking.h"

namespace deltastream {

SequentialTrainPipeline::SequentialTrainPipeline(TrainPipelineParts parts)
    : parts_(parts) {}

absl::StatusOr<std::optional<TrainedStep>> SequentialTrainPipeline::Progress(
    BatchSource& source) {
  absl::StatusOr<std::optional<Batch>> next = source.Next();
  if (!next.ok()) return next.status();
  if (!next->has_value()) return std::nullopt;
  RecModel& model = *parts_.model;
  torch::optim::Optimizer& dense_optimizer = *parts_.dense_optimizer;
  TrainedStep step;
  absl::Status status = CatchTorchErrors([&]() -> absl::Status {
    const Batch batch = (*next)->To(model.device());
    absl::StatusOr<at::Tensor> logits = model.Forward(batch);
    if (!logits.ok()) return logits.status();
    at::Tensor loss = BinaryCrossEntropyWithLogits(*logits, batch.labels);
    {
      // Rows, dense parameters and the batch index change together: a read
      // (which pins the rows) sees the model after a whole step or before it.
      std::optional<ModuleRowsReader::UpdateGuard> guard;
      if (parts_.rows_reader != nullptr) guard.emplace(*parts_.rows_reader);
      dense_optimizer.zero_grad();
      loss.backward();
      if (parts_.group != nullptr) {
        if (absl::Status averaged =
                AverageGradients(*parts_.group, model.dense().parameters());
            !averaged.ok()) {
          return averaged;
        }
      }
      dense_optimizer.step();
      if (parts_.tracker != nullptr) parts_.tracker->Step();
    }
    step.loss = loss.detach();
    step.examples = batch.size();
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return step;
}

}  // namespace deltastream
