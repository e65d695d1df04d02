#include "trainer/sparse/keyed_jagged_tensor.h"

#include <ATen/ATen.h>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

bool IsIndexDtype(at::ScalarType dtype) {
  return dtype == at::kLong || dtype == at::kInt;
}

absl::Status ValidateKeysAndValues(const std::vector<std::string>& keys,
                                   const at::Tensor& values,
                                   const at::Tensor& weights) {
  absl::flat_hash_set<absl::string_view> seen;
  for (const std::string& key : keys) {
    if (key.empty()) return absl::InvalidArgumentError("empty feature key");
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature key '", key, "' appears twice"));
    }
  }
  if (!values.defined() || values.dim() != 1 ||
      values.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError(
        "values must be a 1-D int64 tensor of IDs");
  }
  if (weights.defined() &&
      (!at::isFloatingType(weights.scalar_type()) || weights.dim() != 1 ||
       weights.numel() != values.numel())) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights must be 1-D floating with one per value (",
                     values.numel(), "), got ", c10::str(weights.sizes())));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KeyedJaggedTensor> KeyedJaggedTensor::FromLengths(
    std::vector<std::string> keys, at::Tensor values, at::Tensor lengths,
    at::Tensor weights, std::optional<int64_t> stride) {
  if (absl::Status s = ValidateKeysAndValues(keys, values, weights); !s.ok()) {
    return s;
  }
  if (!lengths.defined() || lengths.dim() != 1 ||
      !IsIndexDtype(lengths.scalar_type())) {
    return absl::InvalidArgumentError(
        "lengths must be a 1-D int32/int64 tensor");
  }
  const int64_t num_keys = static_cast<int64_t>(keys.size());
  const int64_t entries = lengths.numel();
  int64_t batch = 0;
  if (num_keys == 0) {
    if (entries != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("no keys but ", entries, " lengths"));
    }
    batch = stride.value_or(0);
  } else {
    if (entries % num_keys != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          entries, " lengths are not a multiple of ", num_keys, " keys"));
    }
    batch = entries / num_keys;
    if (stride.has_value() && *stride != batch) {
      return absl::InvalidArgumentError(
          absl::StrCat("stride ", *stride, " with ", num_keys, " keys needs ",
                       *stride * num_keys, " lengths, got ", entries));
    }
  }
  at::Tensor host_lengths = lengths.to(at::kCPU, at::kLong).contiguous();
  const int64_t* l = host_lengths.data_ptr<int64_t>();
  KeyedJaggedTensor kjt;
  kjt.length_per_key_.assign(num_keys, 0);
  kjt.offset_per_key_.assign(num_keys + 1, 0);
  for (int64_t i = 0; i < entries; ++i) {
    if (l[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("length ", l[i], " at position ", i, " is negative"));
    }
    kjt.length_per_key_[i / batch] += l[i];
  }
  for (int64_t k = 0; k < num_keys; ++k) {
    kjt.offset_per_key_[k + 1] =
        kjt.offset_per_key_[k] + kjt.length_per_key_[k];
  }
  if (kjt.offset_per_key_.back() != values.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lengths sum to ", kjt.offset_per_key_.back(),
                     " but there are ", values.numel(), " values"));
  }
  kjt.keys_ = std::move(keys);
  kjt.values_ = std::move(values);
  kjt.lengths_ = std::move(lengths);
  kjt.offsets_ =
      at::cat({at::zeros({1}, host_lengths.options()), host_lengths.cumsum(0)})
          .to(kjt.lengths_.device());
  kjt.weights_ = std::move(weights);
  kjt.stride_ = batch;
  return kjt;
}

absl::StatusOr<KeyedJaggedTensor> KeyedJaggedTensor::FromOffsets(
    std::vector<std::string> keys, at::Tensor values, at::Tensor offsets,
    at::Tensor weights, std::optional<int64_t> stride) {
  if (!offsets.defined() || offsets.dim() != 1 ||
      !IsIndexDtype(offsets.scalar_type()) || offsets.numel() < 1) {
    return absl::InvalidArgumentError(
        "offsets must be a non-empty 1-D int32/int64 tensor");
  }
  at::Tensor host = offsets.to(at::kCPU, at::kLong).contiguous();
  if (host.data_ptr<int64_t>()[0] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offsets must start at 0, got ", host.data_ptr<int64_t>()[0]));
  }
  at::Tensor lengths =
      host.narrow(0, 1, host.numel() - 1) - host.narrow(0, 0, host.numel() - 1);
  return FromLengths(std::move(keys), std::move(values),
                     lengths.to(offsets.device()), std::move(weights), stride);
}

absl::StatusOr<int64_t> KeyedJaggedTensor::KeyIndex(
    absl::string_view key) const {
  for (int64_t i = 0; i < num_keys(); ++i) {
    if (keys_[i] == key) return i;
  }
  return absl::NotFoundError(absl::StrCat("no feature key '", key, "'"));
}

at::Tensor KeyedJaggedTensor::ValuesOf(int64_t index) const {
  return values_.narrow(0, offset_per_key_[index], length_per_key_[index]);
}

at::Tensor KeyedJaggedTensor::LengthsOf(int64_t index) const {
  return lengths_.narrow(0, index * stride_, stride_);
}

at::Tensor KeyedJaggedTensor::WeightsOf(int64_t index) const {
  if (!weights_.defined()) return at::Tensor();
  return weights_.narrow(0, offset_per_key_[index], length_per_key_[index]);
}

}  // namespace deltastream
