#ifndef DELTASTREAM_TRAINER_PIPELINE_TRAIN_PIPELINE_H_
#define DELTASTREAM_TRAINER_PIPELINE_TRAIN_PIPELINE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainer/data/batch.h"
#include "trainer/optim/dense_optimizer.h"

namespace deltastream {

class GradientScaler;
class ModuleRowsReader;
class ProcessGroup;
class RecModel;
class Tracker;

// What a pipeline trains: the model with its fused sparse optimizers, the
// dense optimizer over model->dense(), and, when tracking is on, the rows
// reader whose update guard orders row changes against the tracker's reads
// and the tracker whose batch index follows the steps. Owned by the caller
// (the Trainer); they outlive the pipeline.
struct TrainPipelineParts {
  RecModel* model = nullptr;
  torch::optim::Optimizer* dense_optimizer = nullptr;
  ModuleRowsReader* rows_reader = nullptr;  // null when tracking is off
  Tracker* tracker = nullptr;               // null when tracking is off
  // A sharded model's group (RecModelConfig::group): the dense gradients
  // are averaged over its ranks after backward (AverageGradients). Null:
  // one process.
  ProcessGroup* group = nullptr;
};

// One trained step, as the caller accounts it.
struct TrainedStep {
  // The step's mean loss: a 0-dim tensor on the model's device, detached
  // (reading it synchronises with the device: callers sum it and read the sum
  // at progress lines only).
  at::Tensor loss;
  int64_t examples = 0;  // the batch's examples
};

// What one pipeline hands the next when the trainer switches pipelines on
// the same model mid-run (TorchRec's _sync_pipeline): the batches it pulled
// and did not train, in order (on the host or the device), and how far the
// open accumulation window got. The next pipeline trains those batches
// first and continues the window, so a switch with the same options changes
// no result (MakeTrainPipeline says which changes it accepts mid-window).
struct PipelineHandover {
  std::deque<Batch> batches;
  // Micro-batches trained in the open window (0 at a window boundary).
  int window_position = 0;
  // The open window's examples so far, and the examples its micro-batches'
  // losses are weighted against (TrainStep: K x the window's first
  // micro-batch's examples). Both 0 at a window boundary; Release fills them.
  int64_t window_examples = 0;
  int64_t window_norm = 0;
  // Mixed precision's loss scale (null: off). MakeTrainPipeline creates one
  // for mixed_precision when none is handed over; a pipeline given one
  // scales losses and skips non-finite steps (see TrainStep).
  std::shared_ptr<GradientScaler> scaler;
};

// Where the training thread's time went, since the pipeline was made.
struct PipelineStats {
  int64_t batches = 0;
  // Micro-batches trained in the open accumulation window: 0 at a window
  // boundary, where every row and optimizer state is applied (checkpoints
  // of a model with accumulation belong there: the buffered gradients of an
  // open window are in no checkpoint).
  int window_position = 0;
  // Time the training thread spent in, or waiting for, the input
  // distribution (the KJT all-to-all of sharded modules): all of it for
  // TrainPipelineBase (which runs it inline), only the part not hidden
  // behind the previous batch's training for TrainPipelineSparseDist (on
  // CUDA: the host's time issuing it on the data-dist stream, which includes
  // its waits for the counts it reads back).
  // SequentialTrainPipeline runs it inside the model's forward and does not
  // measure it (zero).
  absl::Duration exposed_input_dist;
};

// A training step loop, TorchRec's TrainPipeline: each Progress call trains
// one batch through the whole step (copy to the device, forward with the
// modules' lookup hooks recording into the tracker, loss, backward with the
// fused sparse optimizers, dense optimizer step, Tracker::Step). A pipelined
// implementation may hold later batches in flight (copied, distributed)
// while it trains this one; the order in which batches are trained is the
// source's, and every batch pulled is trained before Progress reports the
// end of the data.
//
// Every implementation keeps the tracking contract (DESIGN.md): a batch's
// backward (the sparse row updates), the dense optimizer step and
// Tracker::Step happen under one ModuleRowsReader::UpdateGuard, so a
// consumer's read (which pins the rows) sees the model after a whole step or
// before it; and the IDs a batch records belong to the step that changes
// their rows.
//
// Not thread-safe: one thread drives a pipeline (the tracker service reads
// concurrently through the rows reader, which the guard serialises).
class TrainPipeline {
 public:
  virtual ~TrainPipeline() = default;

  // Trains the next batch of `source`. Returns the step, or nullopt when
  // the source has no more batches and none is in flight (then nothing
  // changed). A batch whose sparse features come as a feature dict
  // (Batch::sparse_dict) is converted to a KeyedJaggedTensor before its
  // forward, where the pipeline prepares it. Errors: the source's, a
  // sparse_dict that is no valid KeyedJaggedTensor (InvalidArgument), and
  // the model's or LibTorch's as absl::Status (after an error the model may
  // hold a partial step: the caller stops training).
  virtual absl::StatusOr<std::optional<TrainedStep>> Progress(
      BatchSource& source) = 0;

  // Stops the pipeline for a switch: waits for work in flight (every rank
  // must release at the same step, as collectives may be in flight) and
  // hands back what MakeTrainPipeline's next pipeline continues from: every
  // batch pulled and not trained, in order, also after a Progress that
  // failed before its batch trained (a later batch's pull or feature dict
  // failing: the failing batch is handed over too, its dict unconverted).
  // The pipeline must not be used afterwards. Errors: a failed collective
  // in flight.
  virtual absl::StatusOr<PipelineHandover> Release() = 0;

  // Makes the next trained batch end the open accumulation window, as the
  // data's last batch would (a window of m < K micro-batches, trained as one
  // batch of its examples): for a run that stops there, so that its
  // checkpoint holds every step it counts. Nothing at K = 1 or when the next
  // batch ends the window anyway.
  virtual void EndWindowAtNextStep() = 0;

  virtual PipelineStats stats() const = 0;

  // Mixed precision's loss scale, for checkpoints (its StateTensors): null
  // when mixed precision is off. Owned by the pipeline (shared with the
  // pipelines it is handed over to).
  virtual GradientScaler* gradient_scaler() const = 0;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_PIPELINE_TRAIN_PIPELINE_H_
