#ifndef DELTASTREAM_TRAINER_SPARSE_KEYED_TENSOR_H_
#define DELTASTREAM_TRAINER_SPARSE_KEYED_TENSOR_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace deltastream {

// Dense per-key outputs side by side, TorchRec's KeyedTensor: what a pooled
// embedding collection returns, one [batch, dim] block per feature.
//
// Layout: values() is a tensor whose dimension key_dim() (1 by default)
// concatenates the keys' blocks in key order; key k spans
// length_per_key()[k] entries of that dimension, starting at
// offset_per_key()[k] (num_keys + 1 entries, the last one the dimension's
// size). Every other dimension is shared (the batch, for key_dim 1).
//
// Errors are values (InvalidArgument / NotFound naming the offending key or
// number), never exceptions. Immutable; copies are cheap and share values.
// Gradients flow through every accessor: Get/At return views (narrow) and
// Concat uses at::cat, so a loss computed from them reaches values().
class KeyedTensor {
 public:
  // No keys: an empty [0, 0] float values tensor, key_dim 1.
  KeyedTensor();

  // InvalidArgument when: values are undefined or have fewer than
  // key_dim + 1 dimensions; key_dim is negative; keys and length_per_key
  // differ in size; a key is empty or repeats; a length is negative; the
  // lengths do not sum to values.size(key_dim).
  static absl::StatusOr<KeyedTensor> Create(std::vector<std::string> keys,
                                            std::vector<int64_t> length_per_key,
                                            at::Tensor values,
                                            int64_t key_dim = 1);

  const std::vector<std::string>& keys() const { return keys_; }
  int64_t num_keys() const { return static_cast<int64_t>(keys_.size()); }
  const std::vector<int64_t>& length_per_key() const { return length_per_key_; }
  const std::vector<int64_t>& offset_per_key() const { return offset_per_key_; }
  const at::Tensor& values() const { return values_; }
  int64_t key_dim() const { return key_dim_; }

  // Position of `key`; NotFound when absent.
  absl::StatusOr<int64_t> KeyIndex(absl::string_view key) const;
  // One key's block, a view of values(). NotFound when absent.
  absl::StatusOr<at::Tensor> Get(absl::string_view key) const;
  // By position; requires 0 <= index < num_keys().
  at::Tensor At(int64_t index) const;

  // The keys of every part, in order, as one KeyedTensor (values
  // concatenated along key_dim). InvalidArgument when there are no parts,
  // key_dims differ, a key appears twice, parts lie on different devices, or
  // the other dimensions differ.
  static absl::StatusOr<KeyedTensor> Concat(
      absl::Span<const KeyedTensor> parts);

  // The blocks of `groups[j]` keys, concatenated in that order along key_dim,
  // one tensor per group (TorchRec's KeyedTensor.regroup). NotFound for an
  // absent key.
  absl::StatusOr<std::vector<at::Tensor>> Regroup(
      absl::Span<const std::vector<std::string>> groups) const;

  // The same keys with values on `device`.
  KeyedTensor To(c10::Device device, bool non_blocking = false) const;

 private:
  KeyedTensor(std::vector<std::string> keys,
              std::vector<int64_t> length_per_key, at::Tensor values,
              int64_t key_dim);

  std::vector<std::string> keys_;
  std::vector<int64_t> length_per_key_;
  std::vector<int64_t> offset_per_key_;
  at::Tensor values_;
  int64_t key_dim_ = 1;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_SPARSE_KEYED_TENSOR_H_
