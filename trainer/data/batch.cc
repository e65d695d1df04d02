#include "trainer/data/batch.h"

#include <ATen/ATen.h>

namespace deltastream {
namespace {

// `tensor` on `device`; an undefined tensor stays undefined.
at::Tensor OnDevice(const at::Tensor& tensor, c10::Device device,
                    bool non_blocking) {
  if (!tensor.defined()) return tensor;
  return tensor.to(tensor.options().device(device), non_blocking);
}

}  // namespace

Batch Batch::To(c10::Device device, bool non_blocking) const {
  Batch moved;
  moved.dense = OnDevice(dense, device, non_blocking);
  moved.sparse = sparse.To(device, non_blocking);
  moved.labels = OnDevice(labels, device, non_blocking);
  return moved;
}

}  // namespace deltastream
