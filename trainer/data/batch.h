#ifndef DELTASTREAM_TRAINER_DATA_BATCH_H_
#define DELTASTREAM_TRAINER_DATA_BATCH_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "trainer/sparse/keyed_jagged_tensor.h"

namespace deltastream {

// One training batch of B examples.
struct Batch {
  // float [B, num_dense]: dense features (num_dense may be 0).
  at::Tensor dense;
  // The sparse features, stride B.
  KeyedJaggedTensor sparse;
  // float [B], 0 or 1: the click label.
  at::Tensor labels;

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  // Every tensor on `device` (see KeyedJaggedTensor::To).
  Batch To(c10::Device device, bool non_blocking = false) const;
  // Examples [begin, end) (see KeyedJaggedTensor::Examples: a CPU batch).
  // InvalidArgument unless 0 <= begin <= end <= size().
  absl::StatusOr<Batch> Examples(int64_t begin, int64_t end) const;
};

// A stream of batches. Next() returns the next batch, std::nullopt at the end
// of the data (a synthetic source never ends), or an error (e.g. a file that
// cannot be read, too many malformed lines). Not thread-safe: one reader.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual absl::StatusOr<std::optional<Batch>> Next() = 0;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_DATA_BATCH_H_
