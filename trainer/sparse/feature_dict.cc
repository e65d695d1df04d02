#include "trainer/sparse/feature_dict.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deltastream {

absl::Status FeatureDict::Add(std::string feature, JaggedTensor values) {
  if (feature.empty()) {
    return absl::InvalidArgumentError("feature name is empty");
  }
  for (const std::string& key : keys_) {
    if (key == feature) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature '", feature, "' is already present"));
    }
  }
  if (!features_.empty()) {
    const JaggedTensor& first = features_.front();
    if (values.num_examples() != first.num_examples()) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature '", feature, "' has ", values.num_examples(),
                       " examples, the others ", first.num_examples()));
    }
    if (values.has_weights() != first.has_weights()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feature '", feature, "' is ", values.has_weights() ? "" : "un",
          "weighted but the others are ", first.has_weights() ? "" : "un",
          "weighted"));
    }
    if (values.device() != first.device()) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature '", feature, "' is on ", values.device().str(),
                       ", the others on ", first.device().str()));
    }
  }
  keys_.push_back(std::move(feature));
  features_.push_back(std::move(values));
  return absl::OkStatus();
}

int64_t FeatureDict::num_examples() const {
  return features_.empty() ? 0 : features_.front().num_examples();
}

absl::StatusOr<JaggedTensor> FeatureDict::Get(absl::string_view feature) const {
  for (size_t k = 0; k < keys_.size(); ++k) {
    if (keys_[k] == feature) return features_[k];
  }
  return absl::NotFoundError(absl::StrCat("no feature '", feature, "'"));
}

absl::StatusOr<KeyedJaggedTensor> FeatureDict::ToKeyedJaggedTensor() const {
  if (features_.empty()) return KeyedJaggedTensor();
  try {
    std::vector<at::Tensor> values, lengths, weights;
    values.reserve(features_.size());
    lengths.reserve(features_.size());
    bool all_int32 = true;
    int64_t total = 0;  // Values of all features: a host number, no sync.
    for (const JaggedTensor& feature : features_) {
      values.push_back(feature.values());
      lengths.push_back(feature.lengths());
      all_int32 = all_int32 && feature.lengths().scalar_type() == at::kInt;
      total += feature.values().size(0);
      if (feature.has_weights()) weights.push_back(*feature.weights());
    }
    // int64 lengths unless every feature's are int32 and int32 offsets hold
    // the total (as KeyedJaggedTensor::Concat does); all int64 stay int64.
    if (!all_int32 || total > std::numeric_limits<int32_t>::max()) {
      for (at::Tensor& l : lengths) l = l.to(at::kLong);
    }
    auto join = [](const std::vector<at::Tensor>& parts) {
      return parts.size() == 1 ? parts[0] : at::cat(parts);
    };
    std::optional<at::Tensor> joined_weights;
    if (!weights.empty()) joined_weights = join(weights);
    return KeyedJaggedTensor::FromLengths(keys_, join(values), join(lengths),
                                          joined_weights, num_examples());
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(e.what_without_backtrace());
  }
}

FeatureDict FeatureDict::FromKeyedJaggedTensor(const KeyedJaggedTensor& kjt) {
  FeatureDict dict;
  for (int64_t k = 0; k < kjt.num_keys(); ++k) {
    dict.keys_.push_back(kjt.keys()[k]);
    dict.features_.push_back(kjt.At(k));
  }
  return dict;
}

}  // namespace deltastream
