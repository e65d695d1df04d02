#ifndef DELTASTREAM_TRAINER_SPARSE_FEATURE_DICT_H_
#define DELTASTREAM_TRAINER_SPARSE_FEATURE_DICT_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/sparse/jagged_tensor.h"
#include "trainer/sparse/keyed_jagged_tensor.h"

namespace deltastream {

// Sparse input as a dict of per-feature jagged tensors (the C++ counterpart of
// TorchRec's dict[str, JaggedTensor] / TensorDict input): the same information
// as a KeyedJaggedTensor, kept per feature, in insertion order.
//
// Every feature has the same number of examples (the batch size); all are
// weighted or none; all lie on one device. Conversion to a KeyedJaggedTensor
// keeps the insertion order as key order, and converting back gives the same
// features (values, lengths and weights equal), so an embedding module fed
// either form computes the same output.
class FeatureDict {
 public:
  FeatureDict() = default;

  // Appends a feature. InvalidArgument (naming the feature) when the name is
  // empty or already present, its example count differs from the features
  // already added, it is weighted and they are not (or the reverse), or it
  // lies on another device.
  absl::Status Add(std::string feature, JaggedTensor values);

  // Feature names in insertion order.
  const std::vector<std::string>& keys() const { return keys_; }
  int64_t size() const { return static_cast<int64_t>(keys_.size()); }
  bool empty() const { return keys_.empty(); }
  // Examples per feature; 0 when empty.
  int64_t num_examples() const;

  // NotFound when absent.
  absl::StatusOr<JaggedTensor> Get(absl::string_view feature) const;
  // By position; requires 0 <= index < size().
  const JaggedTensor& At(int64_t index) const { return features_[index]; }

  // One KeyedJaggedTensor, keys in insertion order, stride num_examples():
  // values, lengths (int64 when the features' lengths dtypes differ, or when
  // int32 offsets could not hold the total) and weights concatenated on their
  // device. An empty dict gives an empty KJT. InvalidArgument when the result
  // is not a valid KeyedJaggedTensor (e.g. values that are not 1-D int64 IDs,
  // such as the embedding rows an EmbeddingCollection returns). Builds through
  // KeyedJaggedTensor::FromLengths, so it reads lengths on the host once (a
  // synchronisation on a GPU).
  absl::StatusOr<KeyedJaggedTensor> ToKeyedJaggedTensor() const;

  // Every key of `kjt`, in key order (views, no copy).
  static FeatureDict FromKeyedJaggedTensor(const KeyedJaggedTensor& kjt);

 private:
  std::vector<std::string> keys_;
  std::vector<JaggedTensor> features_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_SPARSE_FEATURE_DICT_H_
