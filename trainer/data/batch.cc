#include "trainer/data/batch.h"

#include <ATen/core/Tensor.h>

#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

// `tensor` on `device`; an undefined tensor stays undefined.
at::Tensor OnDevice(const at::Tensor& tensor, c10::Device device,
                    bool non_blocking) {
  if (!tensor.defined()) return tensor;
  return tensor.to(tensor.options().device(device), non_blocking);
}

}  // namespace

absl::StatusOr<int64_t> BatchSource::Skip(int64_t batches) {
  for (int64_t skipped = 0; skipped < batches; ++skipped) {
    absl::StatusOr<std::optional<Batch>> batch = Next();
    if (!batch.ok()) return batch.status();
    if (!batch->has_value()) return skipped;
  }
  return batches;
}

absl::Status Batch::ConvertSparseDict() {
  if (!sparse_dict.has_value()) return absl::OkStatus();
  absl::StatusOr<KeyedJaggedTensor> converted =
      sparse_dict->ToKeyedJaggedTensor();
  if (!converted.ok()) {
    return absl::Status(converted.status().code(),
                        absl::StrCat("the batch's sparse_dict: ",
                                     converted.status().message()));
  }
  sparse = *std::move(converted);
  sparse_dict.reset();
  return absl::OkStatus();
}

Batch Batch::To(c10::Device device, bool non_blocking) const {
  Batch moved;
  moved.dense = OnDevice(dense, device, non_blocking);
  moved.sparse = sparse.To(device, non_blocking);
  moved.sparse_dict = sparse_dict;
  moved.labels = OnDevice(labels, device, non_blocking);
  return moved;
}

absl::StatusOr<Batch> Batch::Examples(int64_t begin, int64_t end) const {
  if (sparse_dict.has_value()) {
    return absl::FailedPreconditionError(
        "examples of a batch whose sparse features are still a feature dict "
        "(ConvertSparseDict first)");
  }
  if (begin < 0 || begin > end || end > size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "examples [", begin, ", ", end, ") of a batch of ", size()));
  }
  absl::StatusOr<KeyedJaggedTensor> sparse_part = sparse.Examples(begin, end);
  if (!sparse_part.ok()) return sparse_part.status();
  Batch part;
  part.dense = dense.slice(0, begin, end);
  part.sparse = *std::move(sparse_part);
  part.labels = labels.slice(0, begin, end);
  return part;
}

}  // namespace deltastream
