#include "trainer/data/batch.h"

#include <ATen/ATen.h>

namespace deltastream {

Batch Batch::To(c10::Device device, bool non_blocking) const {
  Batch moved;
  moved.dense = dense.to(dense.options().device(device), non_blocking);
  moved.sparse = sparse.To(device, non_blocking);
  moved.labels = labels.to(labels.options().device(device), non_blocking);
  return moved;
}

}  // namespace deltastream
