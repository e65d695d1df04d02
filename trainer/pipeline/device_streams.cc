#include "trainer/pipeline/device_streams.h"

#include <ATen/core/Tensor.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <utility>

#include "trainer/data/batch.h"
#include "trainer/sharding/sharded_embedding_modules.h"
#include "trainer/sparse/keyed_jagged_tensor.h"

namespace deltastream {
namespace {

// The registered CUDA guard implementation (only reached for CUDA devices:
// a CPU-only LibTorch has none).
c10::impl::VirtualGuardImpl CudaGuard() {
  return c10::impl::VirtualGuardImpl(c10::DeviceType::CUDA);
}

// `device` with its index: the thread's current CUDA device for "cuda".
c10::Device Indexed(const c10::impl::VirtualGuardImpl& guard,
                    c10::Device device) {
  return device.has_index() ? device : guard.getDevice();
}

void RecordTensor(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.is_cuda()) return;
  tensor.record_stream(CudaGuard().getStream(tensor.device()));
}

void RecordKjt(const KeyedJaggedTensor& features) {
  RecordTensor(features.values());
  RecordTensor(features.lengths());
  RecordTensor(features.offsets());
  if (features.weights().has_value()) RecordTensor(*features.weights());
}

}  // namespace

std::optional<c10::Stream> SideStream(c10::Device device) {
  if (!device.is_cuda()) return std::nullopt;
  const c10::impl::VirtualGuardImpl guard = CudaGuard();
  return guard.getStreamFromGlobalPool(Indexed(guard, device));
}

void SynchronizeStream(const std::optional<c10::Stream>& stream) {
  if (!stream.has_value()) return;
  CudaGuard().synchronizeStream(*stream);
}

StreamEvent StreamEvent::OnCurrentStream(c10::Device device) {
  StreamEvent point;
  if (!device.is_cuda()) return point;
  const c10::impl::VirtualGuardImpl guard = CudaGuard();
  point.event_.emplace(c10::DeviceType::CUDA);
  point.event_->record(guard.getStream(Indexed(guard, device)));
  return point;
}

void StreamEvent::BlockCurrentStream() const {
  if (!event_.has_value()) return;
  const c10::Device device(event_->device_type(), event_->device_index());
  event_->block(CudaGuard().getStream(device));
}

void RecordOnCurrentStream(const Batch& batch) {
  RecordTensor(batch.dense);
  RecordTensor(batch.labels);
  RecordKjt(batch.sparse);
}

void RecordOnCurrentStream(const std::vector<DistributedBatch>& distributed) {
  for (const DistributedBatch& one : distributed) {
    RecordKjt(one.input);
    RecordKjt(one.local);
    for (const std::vector<at::Tensor>& positions : one.sent_positions) {
      for (const at::Tensor& tensor : positions) RecordTensor(tensor);
    }
  }
}

}  // namespace deltastream
