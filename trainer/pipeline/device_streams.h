#ifndef DELTASTREAM_TRAINER_PIPELINE_DEVICE_STREAMS_H_
#define DELTASTREAM_TRAINER_PIPELINE_DEVICE_STREAMS_H_

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <optional>
#include <vector>

namespace deltastream {

struct Batch;
struct DistributedBatch;

// The stream discipline of the overlapping pipelines on a CUDA device
// (TorchRec's train_pipeline: a memcpy stream, a data-dist stream, compute on
// the thread's current stream), written with LibTorch's device-generic API
// (c10::Stream, c10::Event, the registered CUDA guard implementation), so it
// builds against a CPU-only LibTorch. On any other device these functions do
// nothing and make no CUDA call: a CPU pipeline behaves as without them.
//
// The rules they serve:
//   - work queued on a side stream (a copy, an input distribution) is waited
//     for by the stream that uses its results through an event recorded after
//     it (StreamEvent), never by the host;
//   - a tensor allocated on one stream and used on another is recorded on the
//     user (Tensor::record_stream: RecordOnCurrentStream), so that the CUDA
//     caching allocator does not hand its memory out again, once the host
//     drops the tensor, before the user's queued work is done.

// A stream from LibTorch's pool on `device` (a CUDA device; index -1 means
// the current one), for a pipeline stage; std::nullopt for any other device.
std::optional<c10::Stream> SideStream(c10::Device device);

// Blocks the calling thread until the work queued on `stream` is done
// (nothing when nullopt). For a pipeline's Release: batches it hands over
// are complete on the device.
void SynchronizeStream(const std::optional<c10::Stream>& stream);

// A point in one stream's work: an event recorded there. Empty (nothing to
// wait for) off CUDA. Movable, not copyable; not thread-safe, but it may be
// recorded on one thread and waited on by another after a join.
class StreamEvent {
 public:
  StreamEvent() = default;

  // Records an event now on this thread's current stream of `device` when
  // `device` is CUDA (what was queued there so far precedes it); empty
  // otherwise.
  static StreamEvent OnCurrentStream(c10::Device device);

  // Makes this thread's current stream of the event's device wait for it
  // (queued on the device: the host does not wait). Nothing when empty.
  void BlockCurrentStream() const;

 private:
  std::optional<c10::Event> event_;
};

// Records the CUDA tensors of `batch` (dense, labels, the sparse features'
// values, lengths, offsets and weights) as used on this thread's current
// stream of their device. CPU tensors are skipped (no call is made).
void RecordOnCurrentStream(const Batch& batch);
// The same for the tensors of an input distribution's results (each
// DistributedBatch's input and local features and sent positions).
void RecordOnCurrentStream(const std::vector<DistributedBatch>& distributed);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_PIPELINE_DEVICE_STREAMS_H_
