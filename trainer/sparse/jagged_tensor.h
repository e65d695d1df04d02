#ifndef DELTASTREAM_TRAINER_SPARSE_JAGGED_TENSOR_H_
#define DELTASTREAM_TRAINER_SPARSE_JAGGED_TENSOR_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>

#include "absl/status/statusor.h"

namespace deltastream {

// One feature of a batch, TorchRec's JaggedTensor: example i holds the
// lengths[i] rows values[offsets[i], offsets[i + 1]).
//
//   values   [n, ...]  the rows of every example back to back (for IDs: 1-D
//                      int64); any dtype, at least 1-D.
//   lengths  [b]       int32 or int64, non-negative, summing to n.
//   offsets  [b + 1]   same dtype as lengths; 0, then the running sum of
//                      lengths (so offsets[b] == n).
//   weights  [n]       optional, floating, one per value.
//
// All tensors live on one device (CPU or CUDA). Construction validates on the
// host: it reads lengths (or offsets) there once, which on CUDA is a
// device-to-host copy and a synchronisation. Nothing else here synchronises.
//
// Immutable after construction; a const JaggedTensor is safe to share between
// threads. Copies are cheap and share the tensors (as at::Tensor copies do).
class JaggedTensor {
 public:
  // No examples: empty int64 values, lengths and weights-free, offsets [0], on
  // the CPU.
  JaggedTensor();

  // Validates and builds; offsets are computed from lengths on their device.
  // InvalidArgument, naming the offending number, when: values are undefined
  // or 0-D; lengths are not 1-D int32/int64 or lie on another device than
  // values; a length is negative; lengths do not sum to values.size(0); int32
  // lengths sum past what int32 offsets hold; weights are not 1-D floating,
  // not one per value, or on another device. An undefined `weights` tensor
  // means "unweighted", as std::nullopt does.
  static absl::StatusOr<JaggedTensor> FromLengths(
      at::Tensor values, at::Tensor lengths,
      std::optional<at::Tensor> weights = std::nullopt);

  // Same, from offsets (kept as given; lengths are computed on their device).
  // InvalidArgument also when offsets are empty, do not start at 0, decrease,
  // or do not end at values.size(0).
  static absl::StatusOr<JaggedTensor> FromOffsets(
      at::Tensor values, at::Tensor offsets,
      std::optional<at::Tensor> weights = std::nullopt);

  const at::Tensor& values() const { return values_; }
  const at::Tensor& lengths() const { return lengths_; }
  const at::Tensor& offsets() const { return offsets_; }
  // std::nullopt when unweighted; otherwise a defined tensor.
  const std::optional<at::Tensor>& weights() const { return weights_; }
  bool has_weights() const { return weights_.has_value(); }

  // Number of examples, lengths().numel().
  int64_t num_examples() const { return lengths_.numel(); }
  c10::Device device() const { return values_.device(); }

  // The same jagged tensor with every tensor on `device` (no copy for those
  // already there). `non_blocking` as in at::Tensor::to: asynchronous only
  // from pinned host memory, or device to host.
  JaggedTensor To(c10::Device device, bool non_blocking = false) const;

  // The same lengths, offsets and weights around other `values` (e.g. the
  // embedding rows of these IDs), checked on the host only: InvalidArgument
  // unless `values` is defined, at least 1-D, with size(0) equal to
  // values().size(0), on the same device. No synchronisation.
  absl::StatusOr<JaggedTensor> WithValues(at::Tensor values) const;

 private:
  friend class KeyedJaggedTensor;

  JaggedTensor(at::Tensor values, at::Tensor lengths, at::Tensor offsets,
               std::optional<at::Tensor> weights);

  // FromLengths (`are_offsets` false) and FromOffsets: all of their checks,
  // in one place. On success, when `host_lengths` is not null, it receives the
  // lengths as a contiguous CPU int64 tensor (which KeyedJaggedTensor needs
  // for its per-key totals) without a second device read.
  static absl::StatusOr<JaggedTensor> Build(at::Tensor values,
                                            at::Tensor lengths_or_offsets,
                                            bool are_offsets,
                                            std::optional<at::Tensor> weights,
                                            at::Tensor* host_lengths);

  // 0, then the running sum of `lengths`, computed on their device, in their
  // dtype. Does not synchronise.
  static at::Tensor OffsetsFromLengths(const at::Tensor& lengths);

  at::Tensor values_;
  at::Tensor lengths_;
  at::Tensor offsets_;
  std::optional<at::Tensor> weights_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_SPARSE_JAGGED_TENSOR_H_
