#ifndef DELTASTREAM_TRAINER_SPARSE_KEYED_JAGGED_TENSOR_H_
#define DELTASTREAM_TRAINER_SPARSE_KEYED_JAGGED_TENSOR_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// Sparse features of a batch, TorchRec's KeyedJaggedTensor: for each key
// (feature name) and each of `stride` examples, a variable-length list of IDs.
//
// Layout, key-major: `lengths` has num_keys * stride entries (all examples of
// key 0, then key 1, ...); `values` holds the IDs in that order; `offsets` is
// the exclusive prefix sum of `lengths` (num_keys * stride + 1 entries);
// optional `weights` has one float per value.
//
// Values and weights may live on any device; lengths are read on the host
// when building (per-key lengths are needed to slice), so construct on host
// lengths or accept one copy of them. Immutable; safe to share between
// threads.
class KeyedJaggedTensor {
 public:
  // Validates and builds. InvalidArgument, naming the offending number, when:
  // keys repeat or are empty; values are not 1-D int64; lengths are not 1-D
  // int32/int64, negative, not a multiple of the number of keys (or not
  // num_keys * stride when `stride` is given), or do not sum to the number of
  // values; weights are not floating or not one per value.
  static absl::StatusOr<KeyedJaggedTensor> FromLengths(
      std::vector<std::string> keys, at::Tensor values, at::Tensor lengths,
      at::Tensor weights = at::Tensor(),
      std::optional<int64_t> stride = std::nullopt);

  // Same, from offsets (num_keys * stride + 1 entries, starting at 0,
  // non-decreasing, ending at the number of values).
  static absl::StatusOr<KeyedJaggedTensor> FromOffsets(
      std::vector<std::string> keys, at::Tensor values, at::Tensor offsets,
      at::Tensor weights = at::Tensor(),
      std::optional<int64_t> stride = std::nullopt);

  const std::vector<std::string>& keys() const { return keys_; }
  int64_t num_keys() const { return static_cast<int64_t>(keys_.size()); }
  int64_t stride() const { return stride_; }
  const at::Tensor& values() const { return values_; }
  const at::Tensor& lengths() const { return lengths_; }
  const at::Tensor& offsets() const { return offsets_; }
  // Undefined when the features are unweighted.
  const at::Tensor& weights() const { return weights_; }

  // Number of values of each key, and where each key's values start
  // (num_keys + 1 entries).
  const std::vector<int64_t>& length_per_key() const { return length_per_key_; }
  const std::vector<int64_t>& offset_per_key() const { return offset_per_key_; }

  // Position of `key`; NotFound when absent.
  absl::StatusOr<int64_t> KeyIndex(absl::string_view key) const;

  // The IDs of key `index` (a view of values(), no copy).
  at::Tensor ValuesOf(int64_t index) const;
  // Its per-example lengths [stride] (a view of lengths()).
  at::Tensor LengthsOf(int64_t index) const;
  // Its weights (a view), or undefined when unweighted.
  at::Tensor WeightsOf(int64_t index) const;

 private:
  KeyedJaggedTensor() = default;

  std::vector<std::string> keys_;
  at::Tensor values_, lengths_, offsets_, weights_;
  int64_t stride_ = 0;
  std::vector<int64_t> length_per_key_;
  std::vector<int64_t> offset_per_key_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_SPARSE_KEYED_JAGGED_TENSOR_H_
