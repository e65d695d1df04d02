#ifndef DELTASTREAM_TRAINER_PIPELINE_SEQUENTIAL_PIPELINE_H_
#define DELTASTREAM_TRAINER_PIPELINE_SEQUENTIAL_PIPELINE_H_

#include <optional>

#include "absl/status/statusor.h"
#include "trainer/data/batch.h"
#include "trainer/pipeline/train_pipeline.h"

namespace deltastream {

// The plain step loop: each Progress pulls one batch, copies it to the
// model's device (blocking), then forward, loss, and under the rows
// reader's update guard zero_grad, backward, dense step and Tracker::Step.
// Nothing overlaps; no batch is in flight between calls. The reference the
// overlapping pipelines are compared with.
//
// Not thread-safe (see TrainPipeline).
class SequentialTrainPipeline : public TrainPipeline {
 public:
  // `parts.model` and `parts.dense_optimizer` must be non-null; rows_reader
  // and tracker are both set (tracking on) or both null.
  explicit SequentialTrainPipeline(TrainPipelineParts parts);

  absl::StatusOr<std::optional<TrainedStep>> Progress(
      BatchSource& source) override;

 private:
  TrainPipelineParts parts_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_PIPELINE_SEQUENTIAL_PIPELINE_H_
