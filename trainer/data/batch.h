#ifndef DELTASTREAM_TRAINER_DATA_BATCH_H_
#define DELTASTREAM_TRAINER_DATA_BATCH_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/sparse/feature_dict.h"
#include "trainer/sparse/keyed_jagged_tensor.h"

namespace deltastream {

// One training batch of B examples.
struct Batch {
  // float [B, num_dense]: dense features (num_dense may be 0).
  at::Tensor dense;
  // The sparse features, stride B.
  KeyedJaggedTensor sparse;
  // A source may hand the sparse features over as a feature dict instead
  // (TorchRec's dict[str, JaggedTensor] input, B examples per feature):
  // then `sparse` stays empty until ConvertSparseDict(). The train
  // pipelines convert where they prepare a batch ahead of its training
  // (TrainPipelineSparseDist on the CPU: on the thread that distributes it,
  // off the training thread); code that reads `sparse` converts first.
  std::optional<FeatureDict> sparse_dict;
  // float [B], 0 or 1: the click label.
  at::Tensor labels;

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  // Moves sparse_dict into `sparse` (FeatureDict::ToKeyedJaggedTensor: the
  // features' values, lengths and weights concatenated in key order) and
  // clears it; OK, doing nothing, without one. InvalidArgument, naming the
  // batch's sparse_dict, when the dict is no valid KeyedJaggedTensor: the
  // batch is then unchanged.
  absl::Status ConvertSparseDict();
  // Every tensor on `device` (see KeyedJaggedTensor::To). A sparse_dict is
  // carried as it is (on its device): convert it before moving a batch to
  // another device.
  Batch To(c10::Device device, bool non_blocking = false) const;
  // Examples [begin, end) (see KeyedJaggedTensor::Examples: a CPU batch).
  // InvalidArgument unless 0 <= begin <= end <= size(); FailedPrecondition
  // while the batch holds a sparse_dict.
  absl::StatusOr<Batch> Examples(int64_t begin, int64_t end) const;
};

// A stream of batches. Next() returns the next batch, std::nullopt at the end
// of the data (a synthetic source never ends), or an error (e.g. a file that
// cannot be read, too many malformed lines). Not thread-safe: one reader.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual absl::StatusOr<std::optional<Batch>> Next() = 0;
  // Skips the next `batches` batches, as that many Next() calls would,
  // without returning them (a trainer resuming from a checkpoint): the
  // number skipped (fewer at the end of the data), or Next()'s error. This
  // one calls Next(); a source that can jump ahead says so by overriding it.
  virtual absl::StatusOr<int64_t> Skip(int64_t batches);
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_DATA_BATCH_H_
