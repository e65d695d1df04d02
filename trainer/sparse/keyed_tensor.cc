#include "trainer/sparse/keyed_tensor.h"

#include <ATen/ATen.h>

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deltastream {

KeyedTensor::KeyedTensor()
    : offset_per_key_{0}, values_(at::zeros({0, 0}, at::kFloat)) {}

KeyedTensor::KeyedTensor(std::vector<std::string> keys,
                         std::vector<int64_t> length_per_key, at::Tensor values,
                         int64_t key_dim)
    : keys_(std::move(keys)),
      length_per_key_(std::move(length_per_key)),
      values_(std::move(values)),
      key_dim_(key_dim) {
  offset_per_key_.reserve(length_per_key_.size() + 1);
  offset_per_key_.push_back(0);
  for (int64_t length : length_per_key_) {
    offset_per_key_.push_back(offset_per_key_.back() + length);
  }
}

absl::StatusOr<KeyedTensor> KeyedTensor::Create(
    std::vector<std::string> keys, std::vector<int64_t> length_per_key,
    at::Tensor values, int64_t key_dim) {
  if (key_dim < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("key_dim must be >= 0, got ", key_dim));
  }
  if (!values.defined() || values.dim() < key_dim + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values must have more than key_dim (", key_dim, ") dimensions, got ",
        values.defined() ? c10::str(values.sizes()) : "an undefined tensor"));
  }
  if (keys.size() != length_per_key.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        keys.size(), " keys but ", length_per_key.size(), " lengths"));
  }
  absl::flat_hash_set<absl::string_view> seen;
  int64_t total = 0;
  for (size_t k = 0; k < keys.size(); ++k) {
    if (keys[k].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("key at position ", k, " is empty"));
    }
    if (!seen.insert(keys[k]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", keys[k], "' appears twice"));
    }
    if (length_per_key[k] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", keys[k], "' has negative length ", length_per_key[k]));
    }
    total += length_per_key[k];
  }
  if (total != values.size(key_dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lengths sum to ", total, " but values have ", values.size(key_dim),
        " entries along dimension ", key_dim));
  }
  return KeyedTensor(std::move(keys), std::move(length_per_key),
                     std::move(values), key_dim);
}

absl::StatusOr<int64_t> KeyedTensor::KeyIndex(absl::string_view key) const {
  for (size_t k = 0; k < keys_.size(); ++k) {
    if (keys_[k] == key) return static_cast<int64_t>(k);
  }
  return absl::NotFoundError(absl::StrCat("no key '", key, "'"));
}

absl::StatusOr<at::Tensor> KeyedTensor::Get(absl::string_view key) const {
  absl::StatusOr<int64_t> index = KeyIndex(key);
  if (!index.ok()) return index.status();
  return At(*index);
}

at::Tensor KeyedTensor::At(int64_t index) const {
  return values_.narrow(key_dim_, offset_per_key_[index],
                        length_per_key_[index]);
}

absl::StatusOr<KeyedTensor> KeyedTensor::Concat(
    absl::Span<const KeyedTensor> parts) {
  if (parts.empty()) {
    return absl::InvalidArgumentError("Concat needs at least one part");
  }
  const int64_t key_dim = parts[0].key_dim_;
  std::vector<std::string> keys;
  std::vector<int64_t> lengths;
  std::vector<at::Tensor> values;
  for (size_t p = 0; p < parts.size(); ++p) {
    const KeyedTensor& part = parts[p];
    if (part.key_dim_ != key_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("part ", p, " has key_dim ", part.key_dim_,
                       ", part 0 has ", key_dim));
    }
    if (part.values_.dim() != parts[0].values_.dim()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "part ", p, " has shape ", c10::str(part.values_.sizes()),
          ", part 0 has ", c10::str(parts[0].values_.sizes())));
    }
    for (int64_t d = 0; d < part.values_.dim(); ++d) {
      if (d != key_dim && part.values_.size(d) != parts[0].values_.size(d)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "part ", p, " has shape ", c10::str(part.values_.sizes()),
            ", part 0 has ", c10::str(parts[0].values_.sizes())));
      }
    }
    keys.insert(keys.end(), part.keys_.begin(), part.keys_.end());
    lengths.insert(lengths.end(), part.length_per_key_.begin(),
                   part.length_per_key_.end());
    values.push_back(part.values_);
  }
  try {
    at::Tensor joined =
        values.size() == 1 ? values[0] : at::cat(values, key_dim);
    return Create(std::move(keys), std::move(lengths), std::move(joined),
                  key_dim);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(e.what_without_backtrace());
  }
}

absl::StatusOr<std::vector<at::Tensor>> KeyedTensor::Regroup(
    absl::Span<const std::vector<std::string>> groups) const {
  std::vector<at::Tensor> regrouped;
  for (const std::vector<std::string>& group : groups) {
    std::vector<at::Tensor> blocks;
    for (const std::string& key : group) {
      absl::StatusOr<at::Tensor> block = Get(key);
      if (!block.ok()) return block.status();
      blocks.push_back(*block);
    }
    if (blocks.empty()) {
      std::vector<int64_t> sizes = values_.sizes().vec();
      sizes[key_dim_] = 0;
      regrouped.push_back(at::empty(sizes, values_.options()));
    } else {
      regrouped.push_back(blocks.size() == 1 ? blocks[0]
                                             : at::cat(blocks, key_dim_));
    }
  }
  return regrouped;
}

KeyedTensor KeyedTensor::To(c10::Device device, bool non_blocking) const {
  return KeyedTensor(keys_, length_per_key_,
                     values_.to(values_.options().device(device), non_blocking),
                     key_dim_);
}

}  // namespace deltastream
