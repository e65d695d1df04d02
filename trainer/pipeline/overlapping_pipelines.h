#ifndef DELTASTREAM_TRAINER_PIPELINE_OVERLAPPING_PIPELINES_H_
#define DELTASTREAM_TRAINER_PIPELINE_OVERLAPPING_PIPELINES_H_

#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/batch.h"
#include "trainer/pipeline/device_streams.h"
#include "trainer/pipeline/train_pipeline.h"
#include "trainer/pipeline/train_step.h"
#include "trainer/sharding/sharded_embedding_modules.h"

namespace deltastream {

class ProcessGroup;
class RecModel;

// A batch copied to the model's device, with the event after its copy
// (CUDA; empty on the CPU).
struct CopiedBatch {
  Batch batch;
  StreamEvent ready;
};

// TorchRec's TrainPipelineBase: the copy of batch i+1 to the model's device
// starts before batch i trains (non-blocking; on the CPU a copy is a no-op),
// so it overlaps batch i's forward and backward. A sharded model's input
// distribution runs inline on the training thread, before batch i's forward
// (timed: PipelineStats::exposed_input_dist). A feature-dict batch is
// converted as it is pulled, one batch ahead. Trains each batch as TrainStep
// does; the data's end, seen one batch ahead, ends the last
// accumulation window.
//
// CUDA: the copy is queued on a memcpy stream from LibTorch's pool; the
// thread's current stream (compute) waits for an event recorded after the
// copy before it uses the batch, and the batch's tensors are recorded on the
// compute stream (record_stream), so that their memory is not reused while
// compute still reads it (device_streams.h).
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
  std::optional<c10::Stream> memcpy_stream_;  // CUDA only
  BatchFeed feed_;
  std::optional<CopiedBatch> next_;  // batch i+1, on the device
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
// (PipelineStats::exposed_input_dist); a feature-dict batch
// (Batch::sparse_dict) is converted on that thread too, just before its
// distribution, off the training thread. An unsharded model has no input
// distribution: the pipeline then trains as TrainPipelineBase.
//
// CUDA (TorchRec's streams): batch i+2 is copied on a memcpy stream; batch
// i+1's input distribution is queued on a data-dist stream, which first
// waits for the copy's event and records the batch's tensors; compute runs
// on the thread's current stream, which waits for the distribution's event
// and records its results and the batch. The distribution is issued from
// the training thread (no background thread), right after batch i's
// forward, as TorchRec does (a feature dict is converted before the copy): NCCL
// collectives of two communicators issued from two threads could reach the
// ranks' GPUs in different orders and deadlock. With NCCL the collective itself
// runs on NCCL's stream, which waits for the data-dist stream when issued and
// which the data-dist stream waits for at the collective's wait(). The host
// still waits inside the distribution for what it reads back (the splits):
// timed as exposed.
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
  // A batch whose input distribution runs (or ran) on `thread` (CPU) or
  // on the data-dist stream (CUDA).
  struct Distributing {
    CopiedBatch copied;
    std::thread thread;
    absl::StatusOr<std::vector<DistributedBatch>> result =
        std::vector<DistributedBatch>();
    StreamEvent distributed;  // CUDA: after the distribution's work
  };
  // Starts batch's distribution: on a background thread on the CPU, on the
  // data-dist stream from this thread on CUDA (timed as exposed).
  std::unique_ptr<Distributing> StartDistribution(CopiedBatch copied);
  // The distribution itself, on the calling thread (on `stream` when set).
  static void Distribute(Distributing& distributing, RecModel& model,
                         ProcessGroup* group,
                         const std::optional<c10::Stream>& stream);
  // Waits for it (timed as exposed).
  absl::Status Finish(Distributing& distributing);
  // Puts every batch pulled and not trained (current_, next_, copied_) back
  // in front of feed_, in order, once the side streams are done with them.
  // Errors: next_'s distribution's (a failed collective; an invalid feature
  // dict is not one: its batch fails when it is trained).
  absl::Status PutBackInFlight();

  std::unique_ptr<ProcessGroup> input_dist_group_;
  bool sharded_;
  std::optional<c10::Stream> memcpy_stream_;     // CUDA only
  std::optional<c10::Stream> data_dist_stream_;  // CUDA only
  BatchFeed feed_;
  // Batch i; after Progress only when it failed before training it.
  std::unique_ptr<Distributing> current_;
  std::unique_ptr<Distributing> next_;  // batch i+1, distributing
  std::optional<CopiedBatch> copied_;   // batch i+2, on the device
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_PIPELINE_OVERLAPPING_PIPELINES_H_
