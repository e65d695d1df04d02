#include "trainer/sparse/jagged_tensor.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

bool IsIndexDtype(at::ScalarType dtype) {
  return dtype == at::kLong || dtype == at::kInt;
}

// "Float tensor of shape [2, 3]", for error messages.
std::string Describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return absl::StrCat(c10::toString(t.scalar_type()), " tensor of shape ",
                      c10::str(t.sizes()), " on ", t.device().str());
}

absl::Status CheckOffsets(const int64_t* offsets, int64_t count,
                          int64_t num_values) {
  if (count == 0) {
    return absl::InvalidArgumentError(
        "offsets must hold at least the leading 0, got an empty tensor");
  }
  if (offsets[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("offsets must start at 0, got ", offsets[0]));
  }
  for (int64_t i = 1; i < count; ++i) {
    if (offsets[i] < offsets[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("offsets decrease at position ", i, ": ", offsets[i - 1],
                       " then ", offsets[i]));
    }
  }
  if (offsets[count - 1] != num_values) {
    return absl::InvalidArgumentError(
        absl::StrCat("offsets end at ", offsets[count - 1], " but there are ",
                     num_values, " values"));
  }
  return absl::OkStatus();
}

absl::Status CheckLengths(const int64_t* lengths, int64_t count,
                          int64_t num_values, bool int32_offsets) {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    if (lengths[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "length ", lengths[i], " at position ", i, " is negative"));
    }
    if (lengths[i] > std::numeric_limits<int64_t>::max() - total) {
      return absl::InvalidArgumentError(
          absl::StrCat("lengths overflow int64 at position ", i, " (length ",
                       lengths[i], ") but there are ", num_values, " values"));
    }
    total += lengths[i];
  }
  if (total != num_values) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lengths sum to ", total, " but there are ", num_values, " values"));
  }
  if (int32_offsets && total > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("int32 lengths sum to ", total,
                     ", past what int32 offsets hold; use int64 lengths"));
  }
  return absl::OkStatus();
}

}  // namespace

JaggedTensor::JaggedTensor()
    : values_(at::empty({0}, at::kLong)),
      lengths_(at::empty({0}, at::kLong)),
      offsets_(at::zeros({1}, at::kLong)) {}

JaggedTensor::JaggedTensor(at::Tensor values, at::Tensor lengths,
                           at::Tensor offsets,
                           std::optional<at::Tensor> weights)
    : values_(std::move(values)),
      lengths_(std::move(lengths)),
      offsets_(std::move(offsets)),
      weights_(std::move(weights)) {}

absl::StatusOr<JaggedTensor> JaggedTensor::FromLengths(
    at::Tensor values, at::Tensor lengths, std::optional<at::Tensor> weights) {
  return Build(std::move(values), std::move(lengths), /*are_offsets=*/false,
               std::move(weights), /*host_lengths=*/nullptr);
}

absl::StatusOr<JaggedTensor> JaggedTensor::FromOffsets(
    at::Tensor values, at::Tensor offsets, std::optional<at::Tensor> weights) {
  return Build(std::move(values), std::move(offsets), /*are_offsets=*/true,
               std::move(weights), /*host_lengths=*/nullptr);
}

absl::StatusOr<JaggedTensor> JaggedTensor::Build(
    at::Tensor values, at::Tensor lengths_or_offsets, bool are_offsets,
    std::optional<at::Tensor> weights, at::Tensor* host_lengths) {
  const char* const what = are_offsets ? "offsets" : "lengths";
  if (!values.defined() || values.dim() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values must have at least 1 dimension (one row per value), got ",
        Describe(values)));
  }
  if (!lengths_or_offsets.defined() || lengths_or_offsets.dim() != 1 ||
      !IsIndexDtype(lengths_or_offsets.scalar_type())) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be a 1-D int32 or int64 tensor, got ",
                     Describe(lengths_or_offsets)));
  }
  if (lengths_or_offsets.device() != values.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " are on ", lengths_or_offsets.device().str(),
                     " but values on ", values.device().str()));
  }
  const int64_t num_values = values.size(0);
  if (weights.has_value() && !weights->defined()) weights.reset();
  if (weights.has_value()) {
    if (weights->dim() != 1 || !at::isFloatingType(weights->scalar_type()) ||
        weights->numel() != num_values) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights must be a 1-D floating tensor with one weight per value (",
          num_values, "), got ", Describe(*weights)));
    }
    if (weights->device() != values.device()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights are on ", weights->device().str(),
                       " but values on ", values.device().str()));
    }
  }

  // The one host read (a synchronisation when the tensor is on a GPU).
  at::Tensor host = lengths_or_offsets.to(at::kCPU, at::kLong).contiguous();
  const int64_t* data = host.data_ptr<int64_t>();
  at::Tensor lengths;
  at::Tensor offsets;
  if (are_offsets) {
    if (absl::Status s = CheckOffsets(data, host.numel(), num_values);
        !s.ok()) {
      return s;
    }
    const int64_t count = host.numel() - 1;
    offsets = std::move(lengths_or_offsets);
    lengths = offsets.narrow(0, 1, count) - offsets.narrow(0, 0, count);
    if (host_lengths != nullptr) {
      *host_lengths = host.narrow(0, 1, count) - host.narrow(0, 0, count);
    }
  } else {
    if (absl::Status s =
            CheckLengths(data, host.numel(), num_values,
                         lengths_or_offsets.scalar_type() == at::kInt);
        !s.ok()) {
      return s;
    }
    lengths = std::move(lengths_or_offsets);
    offsets = OffsetsFromLengths(lengths);
    if (host_lengths != nullptr) *host_lengths = std::move(host);
  }
  return JaggedTensor(std::move(values), std::move(lengths), std::move(offsets),
                      std::move(weights));
}

at::Tensor JaggedTensor::OffsetsFromLengths(const at::Tensor& lengths) {
  return at::cat({at::zeros({1}, lengths.options()),
                  at::cumsum(lengths, 0, lengths.scalar_type())});
}

JaggedTensor JaggedTensor::To(c10::Device device, bool non_blocking) const {
  auto move = [&](const at::Tensor& t) {
    return t.to(t.options().device(device), non_blocking);
  };
  std::optional<at::Tensor> weights;
  if (weights_.has_value()) weights = move(*weights_);
  return JaggedTensor(move(values_), move(lengths_), move(offsets_),
                      std::move(weights));
}

absl::StatusOr<JaggedTensor> JaggedTensor::WithValues(at::Tensor values) const {
  if (!values.defined() || values.dim() == 0 ||
      values.size(0) != values_.size(0) || values.device() != device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values must have ", values_.size(0), " rows on ", device().str(),
        ", got ",
        values.defined() ? absl::StrCat("shape ", c10::str(values.sizes()),
                                        " on ", values.device().str())
                         : "an undefined tensor"));
  }
  return JaggedTensor(std::move(values), lengths_, offsets_, weights_);
}

}  // namespace deltastream
