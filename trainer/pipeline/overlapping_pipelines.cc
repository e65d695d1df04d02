#include "trainer/pipeline/overlapping_pipelines.h"

#include <c10/core/GradMode.h>

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "trainer/comm/process_group.h"
#include "trainer/models/model.h"

namespace deltastream {
namespace {

// `batch` on the model's device; non-blocking, so that a CUDA copy overlaps
// what the training thread queues next.
Batch ToDevice(const Batch& batch, c10::Device device) {
  return batch.To(device, /*non_blocking=*/device.is_cuda());
}

}  // namespace

TrainPipelineBase::TrainPipelineBase(TrainPipelineParts parts,
                                     int accumulation_steps,
                                     PipelineHandover handover)
    : StepTrainPipeline(parts, accumulation_steps, handover),
      feed_(std::move(handover.batches)) {}

absl::StatusOr<std::optional<TrainedStep>> TrainPipelineBase::Progress(
    BatchSource& source) {
  RecModel& model = *step_.parts().model;
  if (!next_.has_value()) {
    absl::StatusOr<std::optional<Batch>> first = feed_.Next(source);
    if (!first.ok()) return first.status();
    if (!first->has_value()) return std::nullopt;
    next_ = ToDevice(**first, model.device());
  }
  const Batch batch = *std::move(next_);
  next_.reset();
  absl::StatusOr<std::optional<Batch>> after = feed_.Next(source);
  if (!after.ok()) return after.status();
  if (after->has_value()) next_ = ToDevice(**after, model.device());
  const bool sharded = !model.sharded_modules().empty();
  absl::StatusOr<TrainedStep> step = step_.Train(
      batch,
      [&]() -> absl::StatusOr<at::Tensor> {
        if (!sharded) return model.Forward(batch);
        const absl::Time start = absl::Now();
        absl::StatusOr<std::vector<DistributedBatch>> distributed =
            DistributeInputs(model, batch.sparse, nullptr);
        stats_.exposed_input_dist += absl::Now() - start;
        if (!distributed.ok()) return distributed.status();
        return model.ForwardDistributed(batch, *distributed);
      },
      /*ends_window=*/!next_.has_value());
  if (!step.ok()) return step.status();
  ++stats_.batches;
  return *std::move(step);
}

absl::StatusOr<PipelineHandover> TrainPipelineBase::Release() {
  PipelineHandover handover;
  if (next_.has_value()) feed_.PushFront(*std::move(next_));
  next_.reset();
  handover.batches = feed_.Take();
  handover.window_position = step_.window_position();
  handover.scaler = step_.scaler();
  return handover;
}

TrainPipelineSparseDist::TrainPipelineSparseDist(
    TrainPipelineParts parts, int accumulation_steps,
    std::unique_ptr<ProcessGroup> input_dist_group, PipelineHandover handover)
    : StepTrainPipeline(parts, accumulation_steps, handover),
      input_dist_group_(std::move(input_dist_group)),
      sharded_(!parts.model->sharded_modules().empty()),
      feed_(std::move(handover.batches)) {}

TrainPipelineSparseDist::~TrainPipelineSparseDist() {
  for (std::unique_ptr<Distributing>* in_flight : {&current_, &next_}) {
    if (*in_flight != nullptr && (*in_flight)->thread.joinable()) {
      (*in_flight)->thread.join();
    }
  }
}

std::unique_ptr<TrainPipelineSparseDist::Distributing>
TrainPipelineSparseDist::StartDistribution(Batch batch) {
  auto distributing = std::make_unique<Distributing>();
  distributing->batch = std::move(batch);
  if (!sharded_) return distributing;
  Distributing* target = distributing.get();
  RecModel* model = step_.parts().model;
  ProcessGroup* group = input_dist_group_.get();
  target->thread = std::thread([target, model, group] {
    c10::NoGradGuard no_grad;
    try {
      target->result = DistributeInputs(*model, target->batch.sparse, group);
    } catch (const std::exception& e) {
      target->result = absl::InternalError(
          absl::StrCat("input distribution failed: ", e.what()));
    }
  });
  return distributing;
}

absl::Status TrainPipelineSparseDist::Finish(Distributing& distributing) {
  if (distributing.thread.joinable()) {
    const absl::Time start = absl::Now();
    distributing.thread.join();
    stats_.exposed_input_dist += absl::Now() - start;
  }
  return distributing.result.status();
}

absl::StatusOr<std::optional<TrainedStep>> TrainPipelineSparseDist::Progress(
    BatchSource& source) {
  RecModel& model = *step_.parts().model;
  auto pull = [&]() -> absl::StatusOr<std::optional<Batch>> {
    if (copied_.has_value()) {
      std::optional<Batch> batch = std::move(copied_);
      copied_.reset();
      return batch;
    }
    absl::StatusOr<std::optional<Batch>> pulled = feed_.Next(source);
    if (!pulled.ok() || !pulled->has_value()) return pulled;
    return ToDevice(**pulled, model.device());
  };
  // Batch i: the one distributed while the previous batch trained.
  if (next_ == nullptr) {
    absl::StatusOr<std::optional<Batch>> first = pull();
    if (!first.ok()) return first.status();
    if (!first->has_value()) return std::nullopt;
    next_ = StartDistribution(**std::move(first));
  }
  current_ = std::move(next_);
  if (absl::Status finished = Finish(*current_); !finished.ok()) {
    return finished;
  }
  // Batch i+1's distribution, then batch i+2's copy, while batch i trains.
  absl::StatusOr<std::optional<Batch>> after = pull();
  if (!after.ok()) return after.status();
  if (after->has_value()) next_ = StartDistribution(**std::move(after));
  absl::StatusOr<std::optional<Batch>> later = pull();
  if (!later.ok()) return later.status();
  if (later->has_value()) copied_ = **std::move(later);

  const Batch& batch = current_->batch;
  absl::StatusOr<TrainedStep> step = step_.Train(
      batch,
      [&]() -> absl::StatusOr<at::Tensor> {
        if (!sharded_) return model.Forward(batch);
        return model.ForwardDistributed(batch, *current_->result);
      },
      /*ends_window=*/next_ == nullptr);
  current_.reset();
  if (!step.ok()) return step.status();
  ++stats_.batches;
  return *std::move(step);
}

absl::StatusOr<PipelineHandover> TrainPipelineSparseDist::Release() {
  PipelineHandover handover;
  absl::Status status;
  std::deque<Batch> batches = feed_.Take();
  if (copied_.has_value()) batches.push_front(*std::move(copied_));
  copied_.reset();
  if (next_ != nullptr) {
    status = Finish(*next_);
    batches.push_front(std::move(next_->batch));
    next_.reset();
  }
  feed_ = BatchFeed(std::move(batches));
  if (!status.ok()) return status;
  handover.batches = feed_.Take();
  handover.window_position = step_.window_position();
  handover.scaler = step_.scaler();
  return handover;
}

}  // namespace deltastream
