#include "trainer/sparse/keyed_tensor.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>

#include <cassert>
#include <utility>

#include "absl/container/flat_hash_map.h"
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
  // values.dim() <= key_dim, not < key_dim + 1: no overflow for a huge key_dim.
  if (!values.defined() || values.dim() <= key_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values must have more than key_dim (", key_dim, ") dimensions, got ",
        values.defined() ? c10::str(values.sizes()) : "an undefined tensor"));
  }
  if (keys.size() != length_per_key.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        keys.size(), " keys but ", length_per_key.size(), " lengths"));
  }
  const int64_t size = values.size(key_dim);
  absl::flat_hash_map<absl::string_view, size_t> seen;
  int64_t total = 0;
  for (size_t k = 0; k < keys.size(); ++k) {
    if (keys[k].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("key at position ", k, " is empty"));
    }
    auto [it, inserted] = seen.emplace(keys[k], k);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("key '", keys[k], "' appears twice, at positions ",
                       it->second, " and ", k));
    }
    if (length_per_key[k] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key '", keys[k], "' has negative length ", length_per_key[k]));
    }
    // 0 <= total <= size here, so this comparison cannot overflow.
    if (length_per_key[k] > size - total) {
      return absl::InvalidArgumentError(
          absl::StrCat("lengths up to key '", keys[k], "' (position ", k,
                       ", length ", length_per_key[k], ") sum past the ", size,
                       " entries of values along dimension ", key_dim));
    }
    total += length_per_key[k];
  }
  if (total != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("lengths sum to ", total, " but values have ", size,
                     " entries along dimension ", key_dim));
  }
  return KeyedTensor(std::move(keys), std::move(length_per_key),
                     std::move(values), key_dim);
}

absl::StatusOr<int64_t> KeyedTensor::KeyIndex(absl::string_view key) const {
  for (size_t k = 0; k < keys_.size(); ++k) {
    if (keys_[k] == key) return static_cast<int64_t>(k);
  }
  return absl::NotFoundError(
      absl::StrCat("no key '", key, "' among ", num_keys(), " keys"));
}

absl::StatusOr<at::Tensor> KeyedTensor::Get(absl::string_view key) const {
  absl::StatusOr<int64_t> index = KeyIndex(key);
  if (!index.ok()) return index.status();
  return At(*index);
}

at::Tensor KeyedTensor::At(int64_t index) const {
  assert(index >= 0 && index < num_keys());
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
  // Key -> the part it came from, to name both parts of a repeated key before
  // any copy.
  absl::flat_hash_map<absl::string_view, size_t> key_part;
  for (size_t p = 0; p < parts.size(); ++p) {
    const KeyedTensor& part = parts[p];
    if (part.key_dim_ != key_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("part ", p, " has key_dim ", part.key_dim_,
                       ", part 0 has ", key_dim));
    }
    if (part.values_.device() != parts[0].values_.device()) {
      return absl::InvalidArgumentError(
          absl::StrCat("part ", p, " is on ", part.values_.device().str(),
                       ", part 0 on ", parts[0].values_.device().str()));
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
    for (const std::string& key : part.keys_) {
      auto [it, inserted] = key_part.emplace(key, p);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            "key '", key, "' appears in parts ", it->second, " and ", p));
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
  regrouped.reserve(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<at::Tensor> blocks;
    blocks.reserve(groups[g].size());
    for (const std::string& key : groups[g]) {
      absl::StatusOr<int64_t> index = KeyIndex(key);
      if (!index.ok()) {
        return absl::NotFoundError(
            absl::StrCat(index.status().message(), " (group ", g, ")"));
      }
      blocks.push_back(At(*index));
    }
    if (blocks.empty()) {
      // An empty group: a zero-width block (narrow keeps the other sizes).
      regrouped.push_back(values_.narrow(key_dim_, 0, 0));
    } else if (blocks.size() == 1) {
      regrouped.push_back(std::move(blocks[0]));
    } else {
      try {
        regrouped.push_back(at::cat(blocks, key_dim_));
      } catch (const c10::Error& e) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", g, ": ", e.what_without_backtrace()));
      }
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
