#include "trainer/data/synthetic.h"

#include <ATen/ATen.h>

#include <cmath>
#include <numeric>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A fixed value in [-1, 1] for (seed, feature, id): the hidden click signal.
double HiddenScore(uint64_t seed, size_t feature, int64_t id) {
  const uint64_t h = Mix(seed ^ Mix(feature * 0x100000001B3ull + 1) ^
                         Mix(static_cast<uint64_t>(id)));
  return static_cast<double>(h >> 11) / static_cast<double>(1ull << 53) * 2 - 1;
}

}  // namespace

std::vector<SyntheticFeature> CriteoLikeFeatures(int64_t num_features,
                                                 int64_t num_rows) {
  std::vector<SyntheticFeature> features;
  for (int64_t f = 0; f < num_features; ++f) {
    features.push_back({absl::StrCat("cat_", f), num_rows, 1, 1});
  }
  return features;
}

absl::StatusOr<std::unique_ptr<SyntheticSource>> SyntheticSource::Create(
    SyntheticOptions options) {
  auto invalid = [](absl::string_view field, auto... message) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic data: ", field, ": ", message...));
  };
  if (options.batch_size <= 0) {
    return invalid("batch_size", "must be positive, got ", options.batch_size);
  }
  if (options.num_dense < 0) {
    return invalid("num_dense", "must be >= 0, got ", options.num_dense);
  }
  if (!(options.zipf_exponent > 0)) {
    return invalid("zipf_exponent", "must be positive, got ",
                   options.zipf_exponent);
  }
  if (options.features.empty()) return invalid("features", "none given");
  absl::flat_hash_set<std::string> names;
  for (const SyntheticFeature& f : options.features) {
    if (f.name.empty()) return invalid("features", "a name is empty");
    if (!names.insert(f.name).second) {
      return invalid("features", "'", f.name, "' appears twice");
    }
    if (f.num_rows <= 0) {
      return invalid(f.name, "num_rows must be positive, got ", f.num_rows);
    }
    if (f.min_length < 0 || f.max_length < f.min_length) {
      return invalid(f.name, "need 0 <= min_length <= max_length, got ",
                     f.min_length, " and ", f.max_length);
    }
  }
  return std::unique_ptr<SyntheticSource>(
      new SyntheticSource(std::move(options)));
}

SyntheticSource::SyntheticSource(SyntheticOptions options)
    : options_(std::move(options)),
      random_(Mix(options_.seed) ^ Mix(~options_.stream)) {
  for (size_t f = 0; f < options_.features.size(); ++f) {
    // An odd multiplier coprime to num_rows: ID = rank * m mod num_rows is a
    // bijection that scatters the popular ranks.
    const uint64_t rows = static_cast<uint64_t>(options_.features[f].num_rows);
    uint64_t m = (Mix(options_.seed + f) | 1) % std::max<uint64_t>(rows, 2);
    while (rows > 1 && std::gcd(m, rows) != 1) m = (m + 1) % rows;
    scatter_.push_back(rows > 1 ? m : 1);
  }
  std::normal_distribution<double> normal;
  std::mt19937_64 weights_random(Mix(options_.seed ^ 0xD1B54A32D192ED03ull));
  for (int64_t d = 0; d < options_.num_dense; ++d) {
    dense_weights_.push_back(
        normal(weights_random) /
        std::sqrt(static_cast<double>(options_.num_dense)));
  }
}

int64_t SyntheticSource::DrawId(const SyntheticFeature& feature,
                                uint64_t scatter) {
  // Inverse CDF of the continuous power law x^-s on [1, n + 1): rank - 1.
  const double n = static_cast<double>(feature.num_rows);
  const double s = options_.zipf_exponent;
  const double u = std::uniform_real_distribution<double>(0, 1)(random_);
  double x;
  if (std::abs(s - 1) < 1e-9) {
    x = std::exp(u * std::log(n + 1));
  } else {
    const double a = std::pow(n + 1, 1 - s);
    x = std::pow(1 + u * (a - 1), 1 / (1 - s));
  }
  const int64_t rank =
      std::min<int64_t>(feature.num_rows - 1, static_cast<int64_t>(x) - 1);
  return static_cast<int64_t>(
      (static_cast<unsigned __int128>(std::max<int64_t>(rank, 0)) * scatter) %
      static_cast<uint64_t>(feature.num_rows));
}

absl::StatusOr<std::optional<Batch>> SyntheticSource::Next() {
  const int64_t b = options_.batch_size;
  const size_t num_features = options_.features.size();
  std::normal_distribution<double> normal;
  std::vector<float> dense(b * options_.num_dense);
  std::vector<double> score(b, 0.0);
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t d = 0; d < options_.num_dense; ++d) {
      const double value = normal(random_);
      dense[i * options_.num_dense + d] = static_cast<float>(value);
      score[i] += dense_weights_[d] * value;
    }
  }
  std::vector<std::string> keys;
  std::vector<int64_t> ids, lengths;
  std::vector<float> weights;
  for (size_t f = 0; f < num_features; ++f) {
    const SyntheticFeature& feature = options_.features[f];
    keys.push_back(feature.name);
    std::uniform_int_distribution<int64_t> length(feature.min_length,
                                                  feature.max_length);
    for (int64_t i = 0; i < b; ++i) {
      const int64_t n = length(random_);
      lengths.push_back(n);
      double signal = 0;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t id = DrawId(feature, scatter_[f]);
        ids.push_back(id);
        signal += HiddenScore(options_.seed, f, id);
        if (options_.weighted) {
          weights.push_back(static_cast<float>(
              1 - std::uniform_real_distribution<double>(0, 1)(random_)));
        }
      }
      // Scaled so the sparse signal dominates, as in click data.
      if (n > 0) score[i] += 2.0 * signal / n;
    }
  }
  std::vector<float> labels(b);
  for (int64_t i = 0; i < b; ++i) {
    const double p = 1 / (1 + std::exp(-score[i]));
    labels[i] = std::uniform_real_distribution<double>(0, 1)(random_) < p;
  }
  auto tensor = [](auto& values, at::ScalarType type) {
    return at::from_blob(values.data(), {static_cast<int64_t>(values.size())},
                         type)
        .clone();
  };
  std::optional<at::Tensor> weight_tensor;
  if (options_.weighted) weight_tensor = tensor(weights, at::kFloat);
  absl::StatusOr<KeyedJaggedTensor> sparse = KeyedJaggedTensor::FromLengths(
      std::move(keys), tensor(ids, at::kLong), tensor(lengths, at::kLong),
      weight_tensor, b);
  if (!sparse.ok()) return sparse.status();
  Batch batch;
  batch.dense = tensor(dense, at::kFloat).view({b, options_.num_dense});
  batch.sparse = *std::move(sparse);
  batch.labels = tensor(labels, at::kFloat);
  return batch;
}

}  // namespace deltastream
