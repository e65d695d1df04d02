#include "trainer/pipeline/sequential_pipeline.h"

#include <utility>

#include "trainer/models/model.h"

namespace deltastream {

SequentialTrainPipeline::SequentialTrainPipeline(TrainPipelineParts parts,
                                                 int accumulation_steps,
                                                 PipelineHandover handover)
    : StepTrainPipeline(parts, accumulation_steps, handover),
      accumulation_steps_(accumulation_steps),
      feed_(std::move(handover.batches)) {}

absl::StatusOr<std::optional<TrainedStep>> SequentialTrainPipeline::Progress(
    BatchSource& source) {
  absl::StatusOr<std::optional<Batch>> next = feed_.NextConverted(source);
  if (!next.ok()) return next.status();
  if (!next->has_value()) return std::nullopt;
  bool ends_window = false;
  if (accumulation_steps_ > 1) {
    // Whether the data ends this window: the batch after this one.
    absl::StatusOr<std::optional<Batch>> after = feed_.Next(source);
    if (!after.ok()) {
      // Not lost: a later Progress, or the handover, has it.
      feed_.PushFront(**std::move(next));
      return after.status();
    }
    ends_window = !after->has_value();
    if (!ends_window) feed_.PushFront(**std::move(after));
  }
  RecModel& model = *step_.parts().model;
  const Batch batch = (*next)->To(model.device());
  absl::StatusOr<TrainedStep> step = step_.Train(
      batch, [&] { return model.Forward(batch); }, ends_window);
  if (!step.ok()) return step.status();
  ++stats_.batches;
  return *std::move(step);
}

absl::StatusOr<PipelineHandover> SequentialTrainPipeline::Release() {
  return HandOver(feed_.Take());
}

}  // namespace deltastream
