#ifndef DELTASTREAM_TRAINER_SPARSE_KEYED_JAGGED_TENSOR_H_
#define DELTASTREAM_TRAINER_SPARSE_KEYED_JAGGED_TENSOR_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "trainer/sparse/jagged_tensor.h"

namespace deltastream {

// The sparse features of a batch, TorchRec's KeyedJaggedTensor: for each key
// (feature name) and each of `stride` examples, a variable-length list of IDs.
//
// Layout, key-major (all examples of key 0, then all of key 1, ...):
//   keys     num_keys distinct, non-empty feature names, in order.
//   values   [n] int64 IDs, in that order.
//   lengths  [num_keys * stride] int32 or int64, non-negative, summing to n;
//            lengths[k * stride + i] IDs for example i of key k.
//   offsets  [num_keys * stride + 1], lengths' dtype: 0, then the running sum
//            of lengths.
//   weights  optional [n] floating, one per value (weighted features).
//
// Devices. Values, lengths, offsets and weights live together on the CPU or on
// a GPU. Per-key slicing needs each key's total (length_per_key()) on the host;
// it is computed once, at construction, from a host read of lengths (a
// device-to-host copy and a synchronisation when lengths are on a GPU), and
// carried by every operation below, To() included. So the cheap path for GPU
// training is to build on the CPU and call To(cuda): after that, nothing here
// copies values to the host or synchronises (Get, Split and ValuesOf return
// views; Permute, SplitByKeys and Concat run their copies on the device).
//
// Errors are values: invalid input gives InvalidArgument (or NotFound for an
// absent key) with the offending number in the message, never an exception.
//
// Immutable after construction; a const KeyedJaggedTensor is safe to share
// between threads. Copies are cheap and share the tensors.
class KeyedJaggedTensor {
 public:
  // No keys, stride 0, empty int64 values and lengths, offsets [0], on the CPU.
  KeyedJaggedTensor();

  // Validates and builds. InvalidArgument, naming the offending number, when:
  // a key is empty or repeats; values are not 1-D int64; lengths are not 1-D
  // int32/int64, have a negative entry, do not sum to values.numel(), or their
  // count is not a multiple of the number of keys (not num_keys * `stride`
  // when `stride` is given, or non-empty with no keys); `stride` is negative;
  // weights are not 1-D floating or not one per value; the tensors are on
  // different devices. `stride` defaults to lengths.numel() / num_keys (0 with
  // no keys). An undefined `weights` tensor means "unweighted".
  static absl::StatusOr<KeyedJaggedTensor> FromLengths(
      std::vector<std::string> keys, at::Tensor values, at::Tensor lengths,
      std::optional<at::Tensor> weights = std::nullopt,
      std::optional<int64_t> stride = std::nullopt);

  // Same, from offsets (num_keys * stride + 1 entries, starting at 0,
  // non-decreasing, ending at values.numel(); kept as given, and lengths are
  // computed from them on their device). InvalidArgument also when they break
  // one of those rules.
  static absl::StatusOr<KeyedJaggedTensor> FromOffsets(
      std::vector<std::string> keys, at::Tensor values, at::Tensor offsets,
      std::optional<at::Tensor> weights = std::nullopt,
      std::optional<int64_t> stride = std::nullopt);

  const std::vector<std::string>& keys() const { return keys_; }
  int64_t num_keys() const { return static_cast<int64_t>(keys_.size()); }
  // Batch size: the number of examples of every key.
  int64_t stride() const { return stride_; }
  const at::Tensor& values() const { return jagged_.values(); }
  const at::Tensor& lengths() const { return jagged_.lengths(); }
  const at::Tensor& offsets() const { return jagged_.offsets(); }
  // std::nullopt for unweighted features; otherwise a defined tensor.
  const std::optional<at::Tensor>& weights() const { return jagged_.weights(); }
  bool has_weights() const { return jagged_.has_weights(); }
  c10::Device device() const { return jagged_.device(); }

  // Host-side metadata, computed at construction (see "Devices" above): the
  // number of IDs of each key (num_keys entries), and where each key's IDs
  // start in values() (num_keys + 1 entries, the last one values().numel()).
  const std::vector<int64_t>& length_per_key() const { return length_per_key_; }
  const std::vector<int64_t>& offset_per_key() const { return offset_per_key_; }

  // Position of `key` in keys(); NotFound when absent. Linear in num_keys.
  absl::StatusOr<int64_t> KeyIndex(absl::string_view key) const;

  // One key's jagged tensor (stride examples): its values and weights are
  // views of values() and weights() (no copy), its lengths a view of
  // lengths(), its offsets rebased to start at 0 (a small device op, no
  // synchronisation). NotFound when `key` is absent.
  absl::StatusOr<JaggedTensor> Get(absl::string_view key) const;

  // The same by position, for loops over keys. Requires 0 <= index <
  // num_keys(). Each returns a view, no copy: the IDs of key `index`, its
  // lengths [stride], and its weights (std::nullopt when unweighted).
  JaggedTensor At(int64_t index) const;
  at::Tensor ValuesOf(int64_t index) const;
  at::Tensor LengthsOf(int64_t index) const;
  std::optional<at::Tensor> WeightsOf(int64_t index) const;

  // The keys at `indices`, in that order: a permutation, or a selection of
  // distinct keys (TorchRec's permute). Values, lengths and weights are
  // gathered on their device (views when `indices` is one ascending run of
  // consecutive keys). Same stride. InvalidArgument, naming it, when an index
  // is out of range or repeats.
  absl::StatusOr<KeyedJaggedTensor> Permute(
      absl::Span<const int64_t> indices) const;

  // Consecutive groups of keys: segments[j] keys go to part j, in order
  // (TorchRec's split). Each part's tensors are views (no copy), with the same
  // stride. InvalidArgument when a segment is negative or the segments do not
  // sum to num_keys().
  absl::StatusOr<std::vector<KeyedJaggedTensor>> Split(
      absl::Span<const int64_t> segments) const;

  // Part j holds the keys of groups[j], in that order (Permute by name).
  // NotFound for an absent key; InvalidArgument for a key repeated within a
  // group. A key may appear in several groups.
  absl::StatusOr<std::vector<KeyedJaggedTensor>> SplitByKeys(
      absl::Span<const std::vector<std::string>> groups) const;

  // The keys of every part, in order, as one KeyedJaggedTensor. Parts with
  // keys must share one stride (parts without keys are ignored, whatever their
  // stride); the result has that stride. InvalidArgument when there are no
  // parts, strides differ, a key appears twice, some parts are weighted and
  // others not, or parts lie on different devices. Lengths of mixed int32 and
  // int64 parts become int64; weights, the promoted floating type.
  static absl::StatusOr<KeyedJaggedTensor> Concat(
      absl::Span<const KeyedJaggedTensor> parts);

  // Examples [begin, end) of every key (stride end - begin): what rank r of
  // a data-parallel job takes of a global batch. Values, lengths and weights
  // are gathered on their device (the lengths are read on the host: call it
  // on CPU batches, before they move to a device). InvalidArgument unless
  // 0 <= begin <= end <= stride().
  absl::StatusOr<KeyedJaggedTensor> Examples(int64_t begin, int64_t end) const;

  // The same features with every tensor on `device` (no copy for those
  // already there); the host metadata comes along, so the result does not
  // need to read lengths again. `non_blocking` as in at::Tensor::to.
  KeyedJaggedTensor To(c10::Device device, bool non_blocking = false) const;

 private:
  KeyedJaggedTensor(std::vector<std::string> keys, JaggedTensor jagged,
                    int64_t stride, std::vector<int64_t> length_per_key);

  // FromLengths (`are_offsets` false) and FromOffsets.
  static absl::StatusOr<KeyedJaggedTensor> Build(
      std::vector<std::string> keys, at::Tensor values,
      at::Tensor lengths_or_offsets, bool are_offsets,
      std::optional<at::Tensor> weights, std::optional<int64_t> stride);

  // Keys [begin, end) as views.
  KeyedJaggedTensor Slice(int64_t begin, int64_t end) const;

  std::vector<std::string> keys_;
  // All keys' values, lengths, offsets and weights, flattened.
  JaggedTensor jagged_;
  int64_t stride_ = 0;
  std::vector<int64_t> length_per_key_;
  std::vector<int64_t> offset_per_key_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_SPARSE_KEYED_JAGGED_TENSOR_H_
