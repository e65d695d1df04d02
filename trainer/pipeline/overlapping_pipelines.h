#ifndef DELTASTREAM_TRAINER_PIPELINE_OVERLAPPING_PIPELINES_H_
#define DELTASTREAM_TRAINER_PIPELINE_OVERLAPPING_PIPELINES_H_

#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/batch.h"
#include "trainer/pipeline/train_pipeline.h"
#include "trainer/pipeline/train_step.h"
#include "trainer/sharding/sharded_embedding_modules.h"

namespace deltastream {

class ProcessGroup;

// TorchRec's TrainPipelineBase: the copy of batch i+1 to the model's device
// starts before batch i trains (non-blocking; on the CPU a copy is a no-op),
// so it overlaps batch i's forward and backward. A sharded model's input
// distribution runs inline on the training thread, before batch i's forward
// (timed: PipelineStats::exposed_input_dist). Trains each batch as
// TrainStep does; the data's end, seen one batch ahead, ends the last
// accumulation window.
//
// Not thread-safe (see TrainPipeline).
class TrainPipelineBase : public StepTrainPipeline {
 public:
  TrainPipelineBase(TrainPipelineParts parts, int accumulation_steps,
                    PipelineHandover handover = {});

  absl::StatusOr<std::optional<TrainedStep>> Progress(
      BatchSource& source) override;
  absl::StatusOr<PipelineHandover> Release() override;

 private:
  BatchFeed feed_;
  std::optional<Batch> next_;  // batch i+1, on the device
};

// TorchRec's TrainPipelineSparseDist: three batches in flight. While batch i
// trains (forward from its distributed input, backward, optimizers) on the
// training thread, batch i+1's input distribution (the KJT all-to-all of
// every sharded module) runs on a background thread over `input_dist_group`
// (a sibling of the model's group: ProcessGroup::CreateSibling, so the two
// threads' collectives never interleave on one group), and batch i+2 is
// pulled and copied to the device. Lookups (and so the tracker's records)
// happen in batch i's forward, never earlier. Only the wait for batch i+1's
// distribution that batch i's training did not cover is exposed
// (PipelineStats::exposed_input_dist). An unsharded model has no input
// distribution: the pipeline then trains as TrainPipelineBase.
//
// (CUDA: the copies are non-blocking on the current stream; separate
// copy streams with events and record_stream are not implemented.)
//
// Not thread-safe (see TrainPipeline).
class TrainPipelineSparseDist : public StepTrainPipeline {
 public:
  // `input_dist_group` (owned, may be null for an unsharded model) is a
  // sibling of parts.group.
  TrainPipelineSparseDist(TrainPipelineParts parts, int accumulation_steps,
                          std::unique_ptr<ProcessGroup> input_dist_group,
                          PipelineHandover handover = {});
  ~TrainPipelineSparseDist() override;

  absl::StatusOr<std::optional<TrainedStep>> Progress(
      BatchSource& source) override;
  absl::StatusOr<PipelineHandover> Release() override;

 private:
  // A batch whose input distribution runs (or ran) on `thread`.
  struct Distributing {
    Batch batch;
    std::thread thread;
    absl::StatusOr<std::vector<DistributedBatch>> result =
        std::vector<DistributedBatch>();
  };
  // Starts batch's distribution on a background thread.
  std::unique_ptr<Distributing> StartDistribution(Batch batch);
  // Waits for it (timed as exposed).
  absl::Status Finish(Distributing& distributing);

  std::unique_ptr<ProcessGroup> input_dist_group_;
  bool sharded_;
  BatchFeed feed_;
  std::unique_ptr<Distributing> current_;  // batch i
  std::unique_ptr<Distributing> next_;     // batch i+1, distributing
  std::optional<Batch> copied_;            // batch i+2, on the device
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_PIPELINE_OVERLAPPING_PIPELINES_H_
