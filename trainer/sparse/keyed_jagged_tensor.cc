#include "trainer/sparse/keyed_jagged_tensor.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#include <cassert>
#include <cstddef>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

absl::Status CheckKeys(const std::vector<std::string>& keys) {
  absl::flat_hash_map<absl::string_view, size_t> seen;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature key at position ", i, " is empty"));
    }
    auto [it, inserted] = seen.emplace(keys[i], i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feature key '", keys[i], "' appears twice, at positions ",
          it->second, " and ", i));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckIds(const at::Tensor& values) {
  if (values.defined() && values.dim() == 1 &&
      values.scalar_type() == at::kLong) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "values must be a 1-D int64 tensor of IDs, got ",
      values.defined()
          ? absl::StrCat(c10::toString(values.scalar_type()),
                         " tensor of shape ", c10::str(values.sizes()))
          : "an undefined tensor"));
}

at::Tensor MaybeRebase(const at::Tensor& offsets, int64_t base) {
  return base == 0 ? offsets : offsets - base;
}

}  // namespace

KeyedJaggedTensor::KeyedJaggedTensor() : offset_per_key_{0} {}

KeyedJaggedTensor::KeyedJaggedTensor(std::vector<std::string> keys,
                                     JaggedTensor jagged, int64_t stride,
                                     std::vector<int64_t> length_per_key)
    : keys_(std::move(keys)),
      jagged_(std::move(jagged)),
      stride_(stride),
      length_per_key_(std::move(length_per_key)) {
  offset_per_key_.reserve(length_per_key_.size() + 1);
  offset_per_key_.push_back(0);
  for (int64_t length : length_per_key_) {
    offset_per_key_.push_back(offset_per_key_.back() + length);
  }
}

absl::StatusOr<KeyedJaggedTensor> KeyedJaggedTensor::FromLengths(
    std::vector<std::string> keys, at::Tensor values, at::Tensor lengths,
    std::optional<at::Tensor> weights, std::optional<int64_t> stride) {
  return Build(std::move(keys), std::move(values), std::move(lengths),
               /*are_offsets=*/false, std::move(weights), stride);
}

absl::StatusOr<KeyedJaggedTensor> KeyedJaggedTensor::FromOffsets(
    std::vector<std::string> keys, at::Tensor values, at::Tensor offsets,
    std::optional<at::Tensor> weights, std::optional<int64_t> stride) {
  return Build(std::move(keys), std::move(values), std::move(offsets),
               /*are_offsets=*/true, std::move(weights), stride);
}

absl::StatusOr<KeyedJaggedTensor> KeyedJaggedTensor::Build(
    std::vector<std::string> keys, at::Tensor values,
    at::Tensor lengths_or_offsets, bool are_offsets,
    std::optional<at::Tensor> weights, std::optional<int64_t> stride) {
  if (absl::Status s = CheckKeys(keys); !s.ok()) return s;
  if (absl::Status s = CheckIds(values); !s.ok()) return s;
  if (stride.has_value() && *stride < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stride must be non-negative, got ", *stride));
  }
  at::Tensor host_lengths;
  absl::StatusOr<JaggedTensor> jagged =
      JaggedTensor::Build(std::move(values), std::move(lengths_or_offsets),
                          are_offsets, std::move(weights), &host_lengths);
  if (!jagged.ok()) return jagged.status();

  const int64_t num_keys = static_cast<int64_t>(keys.size());
  const int64_t entries = host_lengths.numel();
  // "6 lengths", for error messages.
  auto describe_entries = [&] {
    return are_offsets ? absl::StrCat(entries, " lengths (from ", entries + 1,
                                      " offsets)")
                       : absl::StrCat(entries, " lengths");
  };
  int64_t batch = 0;
  if (num_keys == 0) {
    if (entries != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe_entries(), " but no keys"));
    }
    batch = stride.value_or(0);
  } else {
    if (entries % num_keys != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe_entries(), " are not a multiple of the ",
                       num_keys, " keys"));
    }
    batch = entries / num_keys;
    if (stride.has_value() && *stride != batch) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stride ", *stride, " with ", num_keys, " keys needs ",
          *stride * num_keys, " lengths, got ", describe_entries()));
    }
  }

  std::vector<int64_t> length_per_key(num_keys, 0);
  const int64_t* data = host_lengths.data_ptr<int64_t>();
  for (int64_t k = 0; k < num_keys; ++k) {
    for (int64_t i = k * batch; i < (k + 1) * batch; ++i) {
      length_per_key[k] += data[i];
    }
  }
  return KeyedJaggedTensor(std::move(keys), *std::move(jagged), batch,
                           std::move(length_per_key));
}

absl::StatusOr<int64_t> KeyedJaggedTensor::KeyIndex(
    absl::string_view key) const {
  for (int64_t i = 0; i < num_keys(); ++i) {
    if (keys_[i] == key) return i;
  }
  return absl::NotFoundError(
      absl::StrCat("no feature key '", key, "' among ", num_keys(), " keys"));
}

absl::StatusOr<JaggedTensor> KeyedJaggedTensor::Get(
    absl::string_view key) const {
  absl::StatusOr<int64_t> index = KeyIndex(key);
  if (!index.ok()) return index.status();
  return At(*index);
}

JaggedTensor KeyedJaggedTensor::At(int64_t index) const {
  assert(index >= 0 && index < num_keys());
  return JaggedTensor(
      ValuesOf(index), LengthsOf(index),
      MaybeRebase(offsets().narrow(0, index * stride_, stride_ + 1),
                  offset_per_key_[index]),
      WeightsOf(index));
}

at::Tensor KeyedJaggedTensor::ValuesOf(int64_t index) const {
  assert(index >= 0 && index < num_keys());
  return values().narrow(0, offset_per_key_[index], length_per_key_[index]);
}

at::Tensor KeyedJaggedTensor::LengthsOf(int64_t index) const {
  assert(index >= 0 && index < num_keys());
  return lengths().narrow(0, index * stride_, stride_);
}

std::optional<at::Tensor> KeyedJaggedTensor::WeightsOf(int64_t index) const {
  assert(index >= 0 && index < num_keys());
  if (!has_weights()) return std::nullopt;
  return weights()->narrow(0, offset_per_key_[index], length_per_key_[index]);
}

KeyedJaggedTensor KeyedJaggedTensor::Slice(int64_t begin, int64_t end) const {
  const int64_t first = offset_per_key_[begin];
  const int64_t count = offset_per_key_[end] - first;
  std::optional<at::Tensor> weights;
  if (has_weights()) weights = this->weights()->narrow(0, first, count);
  JaggedTensor jagged(
      values().narrow(0, first, count),
      lengths().narrow(0, begin * stride_, (end - begin) * stride_),
      MaybeRebase(
          offsets().narrow(0, begin * stride_, (end - begin) * stride_ + 1),
          first),
      std::move(weights));
  return KeyedJaggedTensor(
      std::vector<std::string>(keys_.begin() + begin, keys_.begin() + end),
      std::move(jagged), stride_,
      std::vector<int64_t>(length_per_key_.begin() + begin,
                           length_per_key_.begin() + end));
}

absl::StatusOr<KeyedJaggedTensor> KeyedJaggedTensor::Permute(
    absl::Span<const int64_t> indices) const {
  std::vector<bool> used(num_keys(), false);
  bool one_run = true;
  for (size_t j = 0; j < indices.size(); ++j) {
    const int64_t index = indices[j];
    if (index < 0 || index >= num_keys()) {
      return absl::InvalidArgumentError(
          absl::StrCat("key index ", index, " at position ", j,
                       " is out of range for ", num_keys(), " keys"));
    }
    if (used[index]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key index ", index, " appears twice (again at position ", j, ")"));
    }
    used[index] = true;
    one_run = one_run && index == indices[0] + static_cast<int64_t>(j);
  }
  if (indices.empty()) return Slice(0, 0);
  if (one_run) {
    return Slice(indices[0], indices[0] + static_cast<int64_t>(indices.size()));
  }

  std::vector<std::string> keys;
  std::vector<int64_t> length_per_key;
  std::vector<at::Tensor> values, lengths, weights;
  keys.reserve(indices.size());
  length_per_key.reserve(indices.size());
  values.reserve(indices.size());
  lengths.reserve(indices.size());
  for (int64_t index : indices) {
    keys.push_back(keys_[index]);
    length_per_key.push_back(length_per_key_[index]);
    values.push_back(ValuesOf(index));
    lengths.push_back(LengthsOf(index));
    if (has_weights()) weights.push_back(*WeightsOf(index));
  }
  at::Tensor all_lengths = at::cat(lengths);
  at::Tensor offsets = JaggedTensor::OffsetsFromLengths(all_lengths);
  std::optional<at::Tensor> all_weights;
  if (has_weights()) all_weights = at::cat(weights);
  return KeyedJaggedTensor(
      std::move(keys),
      JaggedTensor(at::cat(values), std::move(all_lengths), std::move(offsets),
                   std::move(all_weights)),
      stride_, std::move(length_per_key));
}

absl::StatusOr<std::vector<KeyedJaggedTensor>> KeyedJaggedTensor::Split(
    absl::Span<const int64_t> segments) const {
  int64_t begin = 0;
  for (size_t j = 0; j < segments.size(); ++j) {
    if (segments[j] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("segment ", j, " is negative: ", segments[j]));
    }
    if (segments[j] > num_keys() - begin) {
      return absl::InvalidArgumentError(
          absl::StrCat("segments up to ", j, " hold more than the ", num_keys(),
                       " keys (segment ", j, " is ", segments[j], " with ",
                       num_keys() - begin, " keys left)"));
    }
    begin += segments[j];
  }
  if (begin != num_keys()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "segments sum to ", begin, " but there are ", num_keys(), " keys"));
  }
  std::vector<KeyedJaggedTensor> parts;
  parts.reserve(segments.size());
  begin = 0;
  for (int64_t segment : segments) {
    parts.push_back(Slice(begin, begin + segment));
    begin += segment;
  }
  return parts;
}

absl::StatusOr<std::vector<KeyedJaggedTensor>> KeyedJaggedTensor::SplitByKeys(
    absl::Span<const std::vector<std::string>> groups) const {
  std::vector<KeyedJaggedTensor> parts;
  parts.reserve(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<int64_t> indices;
    indices.reserve(groups[g].size());
    absl::flat_hash_set<absl::string_view> seen;
    for (const std::string& key : groups[g]) {
      if (!seen.insert(key).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("feature key '", key, "' appears twice in group ", g));
      }
      absl::StatusOr<int64_t> index = KeyIndex(key);
      if (!index.ok()) {
        return absl::NotFoundError(
            absl::StrCat(index.status().message(), " (group ", g, ")"));
      }
      indices.push_back(*index);
    }
    absl::StatusOr<KeyedJaggedTensor> part = Permute(indices);
    if (!part.ok()) return part.status();
    parts.push_back(*std::move(part));
  }
  return parts;
}

absl::StatusOr<KeyedJaggedTensor> KeyedJaggedTensor::Concat(
    absl::Span<const KeyedJaggedTensor> parts) {
  if (parts.empty()) {
    return absl::InvalidArgumentError(
        "Concat needs at least one KeyedJaggedTensor, got none");
  }
  // Parts with keys, checked against the first of them.
  std::vector<size_t> keyed;
  absl::flat_hash_map<absl::string_view, size_t> key_part;
  for (size_t j = 0; j < parts.size(); ++j) {
    const KeyedJaggedTensor& part = parts[j];
    if (part.num_keys() == 0) continue;
    if (!keyed.empty()) {
      const size_t f = keyed.front();
      const KeyedJaggedTensor& first = parts[f];
      if (part.stride() != first.stride()) {
        return absl::InvalidArgumentError(
            absl::StrCat("part ", j, " has stride ", part.stride(),
                         " but part ", f, " has stride ", first.stride()));
      }
      if (part.device() != first.device()) {
        return absl::InvalidArgumentError(
            absl::StrCat("part ", j, " is on ", part.device().str(),
                         " but part ", f, " on ", first.device().str()));
      }
      if (part.has_weights() != first.has_weights()) {
        return absl::InvalidArgumentError(
            absl::StrCat("part ", j, " is ", part.has_weights() ? "" : "un",
                         "weighted but part ", f, " is ",
                         first.has_weights() ? "" : "un", "weighted"));
      }
    }
    for (const std::string& key : part.keys()) {
      auto [it, inserted] = key_part.emplace(key, j);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("feature key '", key,
                                                       "' appears in parts ",
                                                       it->second, " and ", j));
      }
    }
    keyed.push_back(j);
  }
  if (keyed.empty()) return parts.front();
  if (keyed.size() == 1) return parts[keyed.front()];

  const KeyedJaggedTensor& first = parts[keyed.front()];
  // Lengths in int64 unless every part's are int32 and int32 offsets hold the
  // total.
  int64_t total = 0;
  bool all_int32 = true;
  at::ScalarType weights_dtype = at::kFloat;
  if (first.has_weights()) weights_dtype = first.weights()->scalar_type();
  for (size_t j : keyed) {
    total += parts[j].values().numel();
    all_int32 = all_int32 && parts[j].lengths().scalar_type() == at::kInt;
    if (first.has_weights()) {
      weights_dtype =
          c10::promoteTypes(weights_dtype, parts[j].weights()->scalar_type());
    }
  }
  const at::ScalarType lengths_dtype =
      all_int32 && total <= std::numeric_limits<int32_t>::max() ? at::kInt
                                                                : at::kLong;

  std::vector<std::string> keys;
  std::vector<int64_t> length_per_key;
  std::vector<at::Tensor> values, lengths, weights;
  for (size_t j : keyed) {
    const KeyedJaggedTensor& part = parts[j];
    keys.insert(keys.end(), part.keys().begin(), part.keys().end());
    length_per_key.insert(length_per_key.end(), part.length_per_key().begin(),
                          part.length_per_key().end());
    values.push_back(part.values());
    lengths.push_back(part.lengths().to(lengths_dtype));
    if (part.has_weights())
      weights.push_back(part.weights()->to(weights_dtype));
  }
  at::Tensor all_lengths = at::cat(lengths);
  at::Tensor offsets = JaggedTensor::OffsetsFromLengths(all_lengths);
  std::optional<at::Tensor> all_weights;
  if (first.has_weights()) all_weights = at::cat(weights);
  return KeyedJaggedTensor(
      std::move(keys),
      JaggedTensor(at::cat(values), std::move(all_lengths), std::move(offsets),
                   std::move(all_weights)),
      first.stride(), std::move(length_per_key));
}

absl::StatusOr<KeyedJaggedTensor> KeyedJaggedTensor::Examples(
    int64_t begin, int64_t end) const {
  if (begin < 0 || begin > end || end > stride_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "examples [", begin, ", ", end, ") outside the stride ", stride_));
  }
  const int64_t keys = num_keys();
  if (begin == 0 && end == stride_) return *this;
  // Per key, the lengths of examples [begin, end) and the values between
  // their offsets.
  const at::Tensor offsets =
      jagged_.offsets().to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* offset = offsets.data_ptr<int64_t>();
  std::vector<at::Tensor> lengths, values, weights;
  lengths.reserve(keys);
  values.reserve(keys);
  for (int64_t k = 0; k < keys; ++k) {
    const int64_t first = k * stride_ + begin, last = k * stride_ + end;
    lengths.push_back(jagged_.lengths().slice(0, first, last));
    values.push_back(jagged_.values().slice(0, offset[first], offset[last]));
    if (has_weights()) {
      weights.push_back(
          jagged_.weights()->slice(0, offset[first], offset[last]));
    }
  }
  if (keys == 0) {
    values.push_back(jagged_.values().slice(0, 0, 0));
    lengths.push_back(jagged_.lengths().slice(0, 0, 0));
    if (has_weights()) weights.push_back(jagged_.weights()->slice(0, 0, 0));
  }
  std::optional<at::Tensor> all_weights;
  if (has_weights()) all_weights = at::cat(weights);
  return FromLengths(keys_, at::cat(values), at::cat(lengths),
                     std::move(all_weights), end - begin);
}

KeyedJaggedTensor KeyedJaggedTensor::To(c10::Device device,
                                        bool non_blocking) const {
  return KeyedJaggedTensor(keys_, jagged_.To(device, non_blocking), stride_,
                           length_per_key_);
}

}  // namespace deltastream
