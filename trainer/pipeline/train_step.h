#ifndef DELTASTREAM_TRAINER_PIPELINE_TRAIN_STEP_H_
#define DELTASTREAM_TRAINER_PIPELINE_TRAIN_STEP_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/batch.h"
#include "trainer/pipeline/gradient_scaler.h"
#include "trainer/pipeline/train_pipeline.h"

namespace deltastream {

class ProcessGroup;
class RecModel;
struct DistributedBatch;

// Where a pipeline's batches come from: the batches a previous pipeline
// handed over (PipelineHandover), then the source's.
class BatchFeed {
 public:
  explicit BatchFeed(std::deque<Batch> carried)
      : carried_(std::move(carried)) {}
  // The next batch: a carried one first, then the source's; std::nullopt at
  // the end of the data.
  absl::StatusOr<std::optional<Batch>> Next(BatchSource& source);
  // Next(), with the batch's feature dict converted (Batch::ConvertSparseDict).
  // A batch that fails to convert is put back in front (not lost: a later
  // pipeline's handover carries it on) and its InvalidArgument returned.
  absl::StatusOr<std::optional<Batch>> NextConverted(BatchSource& source);
  // Puts `batch` back in front (it is pulled again next).
  void PushFront(Batch batch) { carried_.push_front(std::move(batch)); }
  // The carried batches, emptied.
  std::deque<Batch> Take() { return std::move(carried_); }

 private:
  std::deque<Batch> carried_;
};

// The input distribution of `sparse` for each of model's sharded modules,
// in sharded_modules() order, over `group` (null: each module's own group).
absl::StatusOr<std::vector<DistributedBatch>> DistributeInputs(
    RecModel& model, const KeyedJaggedTensor& sparse, ProcessGroup* group);

// The part of a step every pipeline shares, with exact gradient
// accumulation over `accumulation_steps` (K) micro-batches:
//   - the first micro-batch of a window zeroes the dense gradients and sets
//     the window's norm N = K x its examples;
//   - forward, then the loss (mean over the micro-batch's b examples) times
//     b / N (1/K when the micro-batches are equal), then backward: dense
//     gradients add up, and the embedding modules (set accumulating when
//     K > 1, see EmbeddingModule::SetAccumulating) keep their row gradients
//     and lookups instead of updating rows;
//   - at the window's end (the K-th micro-batch, or the last one of the
//     data or of the run: the caller says so) the window is applied:
//     gradients rescaled by N / T for a window of T examples (K / m for m
//     equal micro-batches; 1 for K equal ones), so that each micro-batch
//     weighs b / T: the mean over the window's examples; the modules' hooks
//     called and row gradients applied once (ApplyAccumulated), dense
//     gradients averaged over the group once (AverageGradients), the dense
//     optimizer stepped once;
//   - Tracker::Step() after every micro-batch.
// Backward through Tracker::Step() runs under the rows reader's update
// guard. A window's micro-batches then train exactly as one batch of all
// their examples (K x B for K micro-batches of B; a short or partial last
// window as one batch of what it holds): dense and sparse parameters and
// optimizer states, to rounding. On several ranks the weights are each
// rank's own: AverageGradients' mean over the ranks is the mean over every
// rank's examples when every rank trains the same number of examples in
// each micro-batch. The tracker records a window's IDs at its last
// micro-batch, the batch whose step changes their rows: a consumer reading
// between micro-batches sees no row changed before it has.
//
// Mixed precision (a `scaler`): the forward runs under bf16 autocast on
// CUDA (on the CPU, where the factory refuses mixed precision, only the
// scaling applies: what the tests exercise), the loss is multiplied by the
// scale, the modules always accumulate (so that sparse updates wait for the
// check), and at the window's end a non-finite dense or sparse gradient
// skips the whole step: no row, no optimizer state, no dense parameter
// changes and the tracker records nothing for the window; otherwise
// gradients are unscaled as they are applied.
//
// Not thread-safe: the training thread drives it.
class TrainStep {
 public:
  // `parts` as TrainPipelineParts documents; accumulation_steps >= 1 (the
  // factory validates). The model's embedding modules are set accumulating
  // here when K > 1, not accumulating otherwise.
  TrainStep(TrainPipelineParts parts, int accumulation_steps,
            std::shared_ptr<GradientScaler> scaler = nullptr);

  // Trains `batch` (on the model's device): `forward` returns its logits.
  // `ends_window` forces the window's end (the data ends after it).
  // `after_forward`, when set, runs right after `forward` (outside mixed
  // precision's autocast), before the loss and backward: where a pipeline
  // on CUDA issues the next batch's input distribution (TorchRec's place);
  // its error fails the step.
  absl::StatusOr<TrainedStep> Train(
      const Batch& batch,
      const std::function<absl::StatusOr<at::Tensor>()>& forward,
      bool ends_window,
      const std::function<absl::Status()>& after_forward = nullptr);

  // Micro-batches trained in the open window (0 at a window boundary).
  int window_position() const { return position_; }
  // Continues the window another pipeline opened (switching pipelines):
  // its position, examples and norm (PipelineHandover's window fields).
  void ContinueWindow(const PipelineHandover& handover);
  // Writes the open window's fields into `handover` (Release).
  void HandOverWindow(PipelineHandover& handover) const;
  // The next Train ends the window whatever its `ends_window` says
  // (TrainPipeline::EndWindowAtNextStep).
  void EndWindowAtNextStep() { end_window_ = true; }

  const TrainPipelineParts& parts() const { return parts_; }
  const std::shared_ptr<GradientScaler>& scaler() const { return scaler_; }

 private:
  // Steps the window's optimizers; `position_` micro-batches were trained.
  absl::Status ApplyWindow();

  TrainPipelineParts parts_;
  int accumulation_steps_;
  std::shared_ptr<GradientScaler> scaler_;
  // Whether the modules buffer row gradients (K > 1 or a scaler).
  bool accumulating_;
  int position_ = 0;
  // The open window's examples so far, and its norm (K x its first
  // micro-batch's examples): micro-batch losses are scaled by b / norm.
  int64_t window_examples_ = 0;
  int64_t window_norm_ = 0;
  bool end_window_ = false;
};

// The part every pipeline built on TrainStep shares: the step, the stats it
// reports (window_position from the step), the loss scale, and the start
// from a handover (its scaler and window; the subclass takes its batches).
class StepTrainPipeline : public TrainPipeline {
 public:
  PipelineStats stats() const override {
    PipelineStats stats = stats_;
    stats.window_position = step_.window_position();
    return stats;
  }
  GradientScaler* gradient_scaler() const override {
    return step_.scaler().get();
  }
  void EndWindowAtNextStep() override { step_.EndWindowAtNextStep(); }

 protected:
  StepTrainPipeline(TrainPipelineParts parts, int accumulation_steps,
                    const PipelineHandover& handover)
      : step_(parts, accumulation_steps, handover.scaler) {
    step_.ContinueWindow(handover);
  }
  // A handover of `batches` with the step's window and scaler (Release).
  PipelineHandover HandOver(std::deque<Batch> batches) const {
    PipelineHandover handover;
    handover.batches = std::move(batches);
    step_.HandOverWindow(handover);
    handover.scaler = step_.scaler();
    return handover;
  }

  TrainStep step_;
  PipelineStats stats_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_PIPELINE_TRAIN_STEP_H_
