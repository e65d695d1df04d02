#ifndef DELTASTREAM_TRAINER_PIPELINE_PIPELINE_FACTORY_H_
#define DELTASTREAM_TRAINER_PIPELINE_PIPELINE_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/pipeline/train_pipeline.h"

namespace deltastream {

// What the trainer's config chooses (trainer_config.proto: pipeline,
// accumulation_steps, mixed_precision).
struct TrainPipelineOptions {
  // "sequential" (SequentialTrainPipeline), "base" (TrainPipelineBase) or
  // "sparse_dist" (TrainPipelineSparseDist).
  std::string pipeline = "sequential";
  // K >= 1: micro-batches per optimizer step (exact accumulation, see
  // TrainStep). At most kMaxAccumulationSteps.
  int accumulation_steps = 1;
  // bf16 autocast with gradient scaling: CUDA only.
  bool mixed_precision = false;
};

inline constexpr int kMaxAccumulationSteps = 1 << 16;

// OK when MakeTrainPipeline would accept `options` for a model on
// `device_is_cuda`; InvalidArgument naming the field otherwise (an unknown
// pipeline, K outside [1, kMaxAccumulationSteps]); FailedPrecondition for
// mixed_precision on a CPU model (autocast to bf16 and gradient scaling
// apply to CUDA training only).
absl::Status ValidatePipelineOptions(const TrainPipelineOptions& options,
                                     bool device_is_cuda);

// The pipeline `options` names over `parts` (TrainPipelineParts: model and
// dense optimizer non-null), continuing from `handover` (what the previous
// pipeline's Release returned). With mixed_precision the pipeline holds a
// GradientScaler (the handover's, or a new one; gradient_scaler() exposes
// it for checkpoints). For "sparse_dist" on a sharded model this creates
// the input distribution's group (ProcessGroup::CreateSibling of the
// model's group): every rank must call it at the same point.
//
// Mid-window (handover.window_position > 0) the open window continues with
// its weights: with a different accumulation_steps K it ends at the new K
// micro-batches and still trains as one batch of all its examples
// (TrainStep); K must be above the window's position (InvalidArgument
// otherwise, as for a handover without the window's examples). Turning
// mixed_precision on or off mid-window is refused (FailedPrecondition): the
// window's micro-batches were scaled by the previous pipeline's loss scale
// (or none), which the new one would not undo. At a window boundary any
// options are accepted.
//
// Errors: those above; ValidatePipelineOptions's; the sibling group's
// rendezvous errors.
absl::StatusOr<std::unique_ptr<TrainPipeline>> MakeTrainPipeline(
    const TrainPipelineOptions& options, TrainPipelineParts parts,
    PipelineHandover handover = {});

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_PIPELINE_PIPELINE_FACTORY_H_
