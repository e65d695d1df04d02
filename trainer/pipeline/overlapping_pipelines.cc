#include "trainer/pipeline/overlapping_pipelines.h"

#include <c10/core/GradMode.h>
#include <c10/core/StreamGuard.h>

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "trainer/comm/process_group.h"
#include "trainer/models/model.h"

namespace deltastream {
namespace {

// `batch` on the model's device. CUDA: queued non-blocking on `stream` (the
// memcpy stream), so that it overlaps what the training thread queues next,
// with the event after it. CPU (no stream): Batch::To, a no-op.
CopiedBatch ToDevice(const Batch& batch, c10::Device device,
                     const std::optional<c10::Stream>& stream) {
  CopiedBatch copied;
  if (!stream.has_value()) {
    copied.batch = batch.To(device, /*non_blocking=*/device.is_cuda());
    return copied;
  }
  c10::StreamGuard on_stream(*stream);
  copied.batch = batch.To(device, /*non_blocking=*/true);
  copied.ready = StreamEvent::OnCurrentStream(device);
  return copied;
}

// Before the thread's current stream uses `copied`: waits (on the device)
// for its copy and records its tensors there. Nothing on the CPU.
void UseOnCurrentStream(const CopiedBatch& copied) {
  copied.ready.BlockCurrentStream();
  RecordOnCurrentStream(copied.batch);
}

}  // namespace

TrainPipelineBase::TrainPipelineBase(TrainPipelineParts parts,
                                     int accumulation_steps,
                                     PipelineHandover handover)
    : StepTrainPipeline(parts, accumulation_steps, handover),
      memcpy_stream_(SideStream(parts.model->device())),
      feed_(std::move(handover.batches)) {}

absl::StatusOr<std::optional<TrainedStep>> TrainPipelineBase::Progress(
    BatchSource& source) {
  RecModel& model = *step_.parts().model;
  // The training thread is the only one here: batch i+1's dict is converted
  // as it is pulled, before its copy.
  if (!next_.has_value()) {
    absl::StatusOr<std::optional<Batch>> first = feed_.NextConverted(source);
    if (!first.ok()) return first.status();
    if (!first->has_value()) return std::nullopt;
    next_ = ToDevice(**first, model.device(), memcpy_stream_);
  }
  // Batch i stays in next_ until batch i+1 is pulled: when that pull fails,
  // Release still hands batch i over.
  absl::StatusOr<std::optional<Batch>> after = feed_.NextConverted(source);
  if (!after.ok()) return after.status();
  const CopiedBatch current = *std::move(next_);
  next_.reset();
  if (after->has_value()) {
    next_ = ToDevice(**after, model.device(), memcpy_stream_);
  }
  UseOnCurrentStream(current);
  const Batch& batch = current.batch;
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
  // The next pipeline gets complete batches.
  SynchronizeStream(memcpy_stream_);
  if (next_.has_value()) feed_.PushFront(std::move(next_->batch));
  next_.reset();
  return HandOver(feed_.Take());
}

TrainPipelineSparseDist::TrainPipelineSparseDist(
    TrainPipelineParts parts, int accumulation_steps,
    std::unique_ptr<ProcessGroup> input_dist_group, PipelineHandover handover)
    : StepTrainPipeline(parts, accumulation_steps, handover),
      input_dist_group_(std::move(input_dist_group)),
      sharded_(!parts.model->sharded_modules().empty()),
      memcpy_stream_(SideStream(parts.model->device())),
      data_dist_stream_(SideStream(parts.model->device())),
      feed_(std::move(handover.batches)) {}

TrainPipelineSparseDist::~TrainPipelineSparseDist() {
  for (std::unique_ptr<Distributing>* in_flight : {&current_, &next_}) {
    if (*in_flight != nullptr && (*in_flight)->thread.joinable()) {
      (*in_flight)->thread.join();
    }
  }
}

void TrainPipelineSparseDist::Distribute(
    Distributing& distributing, RecModel& model, ProcessGroup* group,
    const std::optional<c10::Stream>& stream) {
  c10::OptionalStreamGuard on_stream;
  if (stream.has_value()) {
    on_stream.reset_stream(*stream);
    UseOnCurrentStream(distributing.copied);
  }
  c10::NoGradGuard no_grad;
  // A feature dict is converted here, on the distribution's thread (CPU).
  if (absl::Status converted = distributing.copied.batch.ConvertSparseDict();
      !converted.ok()) {
    distributing.result = converted;
    return;
  }
  try {
    distributing.result =
        DistributeInputs(model, distributing.copied.batch.sparse, group);
  } catch (const std::exception& e) {
    distributing.result = absl::InternalError(
        absl::StrCat("input distribution failed: ", e.what()));
  }
  if (stream.has_value()) {
    distributing.distributed = StreamEvent::OnCurrentStream(stream->device());
  }
}

std::unique_ptr<TrainPipelineSparseDist::Distributing>
TrainPipelineSparseDist::StartDistribution(CopiedBatch copied) {
  auto distributing = std::make_unique<Distributing>();
  distributing->copied = std::move(copied);
  if (!sharded_) return distributing;
  RecModel* model = step_.parts().model;
  ProcessGroup* group = input_dist_group_.get();
  if (data_dist_stream_.has_value()) {
    // CUDA: queued from this thread (the host waits only for what the
    // distribution reads back).
    const absl::Time start = absl::Now();
    Distribute(*distributing, *model, group, data_dist_stream_);
    stats_.exposed_input_dist += absl::Now() - start;
    return distributing;
  }
  Distributing* target = distributing.get();
  target->thread = std::thread([target, model, group] {
    Distribute(*target, *model, group, std::nullopt);
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
  auto pull = [&]() -> absl::StatusOr<std::optional<CopiedBatch>> {
    if (copied_.has_value()) {
      std::optional<CopiedBatch> batch = std::move(copied_);
      copied_.reset();
      return batch;
    }
    // A feature dict waits for the distribution's thread on the CPU; it is
    // converted here, before the copy, on CUDA or without a distribution.
    const bool convert_here = !sharded_ || data_dist_stream_.has_value();
    absl::StatusOr<std::optional<Batch>> pulled =
        convert_here ? feed_.NextConverted(source) : feed_.Next(source);
    if (!pulled.ok()) return pulled.status();
    if (!pulled->has_value()) return std::optional<CopiedBatch>();
    return std::optional<CopiedBatch>(
        ToDevice(**pulled, model.device(), memcpy_stream_));
  };
  // A Progress that failed before its batch trained left it in current_:
  // start again from the batches in flight, in order.
  if (current_ != nullptr) {
    if (absl::Status put_back = PutBackInFlight(); !put_back.ok()) {
      return put_back;
    }
  }
  // Batch i: the one distributed while the previous batch trained.
  if (next_ == nullptr) {
    absl::StatusOr<std::optional<CopiedBatch>> first = pull();
    if (!first.ok()) return first.status();
    if (!first->has_value()) return std::nullopt;
    next_ = StartDistribution(**std::move(first));
  }
  // Until it trains, batch i is current_: when an error comes first
  // (its distribution's, or a later batch's pull), Release hands it over.
  current_ = std::move(next_);
  if (absl::Status finished = Finish(*current_); !finished.ok()) {
    return finished;
  }
  // Batch i+1's distribution, then batch i+2's copy, while batch i trains.
  // On CUDA batch i+1 is distributed right after batch i's forward.
  absl::StatusOr<std::optional<CopiedBatch>> after = pull();
  if (!after.ok()) return after.status();
  std::optional<CopiedBatch> after_forward;
  if (after->has_value()) {
    if (data_dist_stream_.has_value()) {
      after_forward = **std::move(after);
    } else {
      next_ = StartDistribution(**std::move(after));
    }
  }
  const bool last = next_ == nullptr && !after_forward.has_value();
  // Batch i+1, when its distribution has not started (CUDA), goes back in
  // front of the feed (copied_, batch i+2, before it): not lost.
  auto put_back_after_forward = [&] {
    if (!after_forward.has_value()) return;
    if (copied_.has_value()) feed_.PushFront(std::move(copied_->batch));
    copied_.reset();
    feed_.PushFront(std::move(after_forward->batch));
    after_forward.reset();
  };
  absl::StatusOr<std::optional<CopiedBatch>> later = pull();
  if (!later.ok()) {
    put_back_after_forward();
    return later.status();
  }
  if (later->has_value()) copied_ = **std::move(later);

  const Batch& batch = current_->copied.batch;
  absl::StatusOr<TrainedStep> step = step_.Train(
      batch,
      [&]() -> absl::StatusOr<at::Tensor> {
        UseOnCurrentStream(current_->copied);
        if (!sharded_) return model.Forward(batch);
        current_->distributed.BlockCurrentStream();
        RecordOnCurrentStream(*current_->result);
        return model.ForwardDistributed(batch, *current_->result);
      },
      /*ends_window=*/last,
      [&]() -> absl::Status {
        if (after_forward.has_value()) {
          std::optional<CopiedBatch> starting =
              std::exchange(after_forward, std::nullopt);
          next_ = StartDistribution(*std::move(starting));
        }
        return absl::OkStatus();
      });
  current_.reset();
  // The step failed before after_forward ran.
  put_back_after_forward();
  if (!step.ok()) return step.status();
  ++stats_.batches;
  return *std::move(step);
}

absl::Status TrainPipelineSparseDist::PutBackInFlight() {
  absl::Status status;
  // In order: batch i (left by a Progress that failed before training it),
  // i+1 (distributing), i+2 (copied), then the feed's.
  std::deque<Batch> batches = feed_.Take();
  if (copied_.has_value()) batches.push_front(std::move(copied_->batch));
  copied_.reset();
  if (next_ != nullptr) {
    status = Finish(*next_);
    // An invalid feature dict, refused before any collective, is the
    // batch's own error, not the release's: the batch (still holding its
    // dict) is handed over, and fails the next pipeline's step in turn.
    if (!status.ok() && next_->copied.batch.sparse_dict.has_value()) {
      status = absl::OkStatus();
    }
    batches.push_front(std::move(next_->copied.batch));
  }
  if (current_ != nullptr) {
    if (current_->thread.joinable()) current_->thread.join();
    batches.push_front(std::move(current_->copied.batch));
  }
  // The batches are complete (their copies done), and the distributions'
  // results are dropped only once their stream is done.
  SynchronizeStream(memcpy_stream_);
  SynchronizeStream(data_dist_stream_);
  next_.reset();
  current_.reset();
  feed_ = BatchFeed(std::move(batches));
  return status;
}

absl::StatusOr<PipelineHandover> TrainPipelineSparseDist::Release() {
  if (absl::Status status = PutBackInFlight(); !status.ok()) return status;
  return HandOver(feed_.Take());
}

}  // namespace deltastream
