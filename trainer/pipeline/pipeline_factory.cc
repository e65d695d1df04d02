#include "trainer/pipeline/pipeline_factory.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/comm/process_group.h"
#include "trainer/models/model.h"
#include "trainer/pipeline/gradient_scaler.h"
#include "trainer/pipeline/overlapping_pipelines.h"
#include "trainer/pipeline/sequential_pipeline.h"
#include "trainer/sharding/sharded_embedding_modules.h"

namespace deltastream {

absl::Status ValidatePipelineOptions(const TrainPipelineOptions& options,
                                     bool device_is_cuda) {
  if (options.pipeline != "sequential" && options.pipeline != "base" &&
      options.pipeline != "sparse_dist") {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: sequential, base or sparse_dist, got '",
                     options.pipeline, "'"));
  }
  if (options.accumulation_steps < 1 ||
      options.accumulation_steps > kMaxAccumulationSteps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "accumulation_steps must be in [1, ", kMaxAccumulationSteps, "], got ",
        options.accumulation_steps));
  }
  if (options.mixed_precision && !device_is_cuda) {
    return absl::FailedPreconditionError(
        "mixed_precision (bf16 autocast with gradient scaling) applies to "
        "CUDA training only; this model is on the CPU: turn it off");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TrainPipeline>> MakeTrainPipeline(
    const TrainPipelineOptions& options, TrainPipelineParts parts,
    PipelineHandover handover) {
  if (parts.model == nullptr || parts.dense_optimizer == nullptr) {
    return absl::InvalidArgumentError(
        "a pipeline needs a model and a dense optimizer");
  }
  if (absl::Status valid =
          ValidatePipelineOptions(options, parts.model->device().is_cuda());
      !valid.ok()) {
    return valid;
  }
  const int k = options.accumulation_steps;
  const int position = handover.window_position;
  if (position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the handover's window_position is ", position));
  }
  if (position >= k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the previous pipeline's open accumulation window holds ", position,
        " micro-batches, which accumulation_steps ", k,
        " does not allow: switch at a window boundary "
        "(stats().window_position == 0), or to accumulation_steps above ",
        position, " (the open window then ends at the new value)"));
  }
  if (position > 0 &&
      (handover.window_examples <= 0 || handover.window_norm <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a handover in an open accumulation window (", position,
        " micro-batches) needs its window_examples and window_norm, got ",
        handover.window_examples, " and ", handover.window_norm,
        ": hand over what the previous pipeline's Release returned"));
  }
  const bool scaled = handover.scaler != nullptr;
  if (position > 0 && scaled != options.mixed_precision) {
    // The window's micro-batches were trained with (without) the loss
    // scale; its end would unscale all of them by the new pipeline's.
    return absl::FailedPreconditionError(absl::StrCat(
        "the open accumulation window's ", position,
        " micro-batches were trained ", scaled ? "with" : "without",
        " mixed precision's loss scale: mixed_precision cannot turn ",
        options.mixed_precision ? "on" : "off",
        " mid-window; switch at a window boundary "
        "(stats().window_position == 0)"));
  }
  if (options.mixed_precision && !scaled) {
    handover.scaler = std::make_shared<GradientScaler>();
  }
  if (!options.mixed_precision) handover.scaler = nullptr;
  if (options.pipeline == "sequential") {
    return std::unique_ptr<TrainPipeline>(
        new SequentialTrainPipeline(parts, k, std::move(handover)));
  }
  if (options.pipeline == "base") {
    return std::unique_ptr<TrainPipeline>(
        new TrainPipelineBase(parts, k, std::move(handover)));
  }
  std::unique_ptr<ProcessGroup> input_dist_group;
  const std::vector<ShardedEmbeddingModule*> sharded =
      parts.model->sharded_modules();
  if (!sharded.empty()) {
    // Every rank makes its pipelines in the same order: the same count
    // names the same sibling everywhere.
    static std::atomic<int> siblings{0};
    absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
        sharded.front()->group().CreateSibling(
            absl::StrCat("input_dist_", siblings.fetch_add(1)));
    if (!group.ok()) return group.status();
    input_dist_group = *std::move(group);
  }
  return std::unique_ptr<TrainPipeline>(new TrainPipelineSparseDist(
      parts, k, std::move(input_dist_group), std::move(handover)));
}

}  // namespace deltastream
