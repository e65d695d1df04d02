#ifndef DELTASTREAM_TRAINER_PIPELINE_SEQUENTIAL_PIPELINE_H_
#define DELTASTREAM_TRAINER_PIPELINE_SEQUENTIAL_PIPELINE_H_

#include <optional>

#include "absl/status/statusor.h"
#include "trainer/data/batch.h"
#include "trainer/pipeline/train_pipeline.h"
#include "trainer/pipeline/train_step.h"

namespace deltastream {

// The plain step loop: each Progress pulls one batch, copies it to the
// model's device (blocking), then trains it (TrainStep: forward, loss, and
// under the rows reader's update guard backward, the optimizers at the end
// of an accumulation window, Tracker::Step). Nothing overlaps. Without
// accumulation no batch is in flight between calls; with it, the next batch
// is pulled before this one trains, to know whether the data ends the
// window. The reference the overlapping pipelines are compared with.
//
// Not thread-safe (see TrainPipeline).
class SequentialTrainPipeline : public StepTrainPipeline {
 public:
  // `parts.model` and `parts.dense_optimizer` must be non-null; rows_reader
  // and tracker are both set (tracking on) or both null.
  explicit SequentialTrainPipeline(TrainPipelineParts parts,
                                   int accumulation_steps = 1,
                                   PipelineHandover handover = {});

  absl::StatusOr<std::optional<TrainedStep>> Progress(
      BatchSource& source) override;
  absl::StatusOr<PipelineHandover> Release() override;

 private:
  int accumulation_steps_;
  BatchFeed feed_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_PIPELINE_SEQUENTIAL_PIPELINE_H_
