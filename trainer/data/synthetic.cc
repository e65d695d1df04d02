#include "trainer/data/synthetic.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/torch_status.h"

namespace deltastream {
namespace {

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;
// Salts keep the seed's uses apart.
constexpr uint64_t kStreamSalt = 0x5851F42D4C957F2Dull;
constexpr uint64_t kDenseSalt = 0xD1B54A32D192ED03ull;
constexpr uint64_t kScatterSalt = 0xA0761D6478BD642Full;
constexpr uint64_t kBatchSalt = 0xE7037ED1A0B428DBull;
constexpr uint64_t kScoreSalt = 0xE7037ED1A0B428DBull;
// The most IDs one batch may hold.
constexpr int64_t kMaxIdsPerBatch = int64_t{1} << 31;

// splitmix64's finaliser: a bijective 64-bit mix.
uint64_t Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a: a stable hash of a feature name (absl::Hash is salted per process).
uint64_t NameHash(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return Mix(h);
}

double ScoreOf(uint64_t seed_and_name, int64_t id) {
  const uint64_t h = Mix(seed_and_name ^ Mix(static_cast<uint64_t>(id)));
  return static_cast<double>(h >> 11) * 0x1.0p-53 * 2 - 1;
}

uint64_t SeedAndName(uint64_t seed, const std::string& name) {
  return Mix(Mix(seed ^ kScoreSalt) ^ NameHash(name));
}

// splitmix64 as a generator, with its own (portable) distributions.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}

  uint64_t Bits() {
    state_ += kGoldenGamma;
    return Mix(state_);
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Bits() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1].
  double UniformNonZero() {
    return static_cast<double>((Bits() >> 11) + 1) * 0x1.0p-53;
  }
  // Uniform in [low, high] (multiply-shift; the bias, below range / 2^64, is
  // negligible).
  int64_t UniformInt(int64_t low, int64_t high) {
    const uint64_t range =
        static_cast<uint64_t>(high) - static_cast<uint64_t>(low) + 1;
    if (range == 0) return static_cast<int64_t>(Bits());  // the full range
    const uint64_t offset = static_cast<uint64_t>(
        (static_cast<unsigned __int128>(Bits()) * range) >> 64);
    return static_cast<int64_t>(static_cast<uint64_t>(low) + offset);
  }
  // Standard normal (Box-Muller, both values used).
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double radius = std::sqrt(-2 * std::log(UniformNonZero()));
    const double angle = 2 * M_PI * Uniform();
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// Zipf ranks in [1, n]: P(k) proportional to 1 / k^s, s > 0. Rejection-
// inversion (W. Hörmann, G. Derflinger, "Rejection-inversion to generate
// variates from monotone discrete distributions", 1996), as in Apache Commons
// RNG: O(1) memory, and mostly one log1p and one exp per draw (the squeeze
// accepts nearly every candidate).
class ZipfRanks {
 public:
  ZipfRanks(int64_t n, double s) : n_(n), s_(s) {
    h_integral_x1_ = HIntegral(1.5) - 1;
    h_integral_n_ = HIntegral(static_cast<double>(n) + 0.5);
    squeeze_ = 2 - HIntegralInverse(HIntegral(2.5) - H(2));
  }

  int64_t Draw(Random& random) const {
    while (true) {
      // In (h_integral_x1_, h_integral_n_].
      const double u =
          h_integral_n_ + random.Uniform() * (h_integral_x1_ - h_integral_n_);
      const double x = HIntegralInverse(u);
      // x >= 1 up to rounding; clamp before the cast (x may exceed int64).
      const double rounded = std::max(x + 0.5, 1.0);
      const int64_t k = rounded >= static_cast<double>(n_)
                            ? n_
                            : static_cast<int64_t>(rounded);
      const double kd = static_cast<double>(k);
      if (kd - x <= squeeze_ || u >= HIntegral(kd + 0.5) - H(kd)) return k;
    }
  }

 private:
  // h(x) = x^-s.
  double H(double x) const { return std::exp(-s_ * std::log(x)); }
  // The integral of h from 1 to x: (x^(1-s) - 1) / (1 - s), or log(x).
  double HIntegral(double x) const {
    const double log_x = std::log(x);
    return ExpM1Over((1 - s_) * log_x) * log_x;
  }
  double HIntegralInverse(double x) const {
    double t = x * (1 - s_);
    if (t < -1) t = -1;  // rounding
    return std::exp(Log1pOver(t) * x);
  }
  // log1p(x) / x and expm1(x) / x, continuous at 0.
  static double Log1pOver(double x) {
    if (std::abs(x) > 1e-8) return std::log1p(x) / x;
    return 1 - x * (0.5 - x * (1.0 / 3 - 0.25 * x));
  }
  static double ExpM1Over(double x) {
    if (std::abs(x) > 1e-8) return std::expm1(x) / x;
    return 1 + x * 0.5 * (1 + x / 3 * (1 + 0.25 * x));
  }

  int64_t n_;
  double s_;
  double h_integral_x1_;
  double h_integral_n_;
  double squeeze_;
};

// A bijection of [0, n): rank -> (rank * multiplier + offset) mod n, with the
// multiplier coprime to n.
class Scatter {
 public:
  Scatter(int64_t n, uint64_t bits)
      : n_(static_cast<uint64_t>(n)), multiplier_(1), offset_(0) {
    if (n_ <= 1) return;
    offset_ = Mix(bits) % n_;
    multiplier_ = 1 + Mix(bits ^ kGoldenGamma) % (n_ - 1);
    while (std::gcd(multiplier_, n_) != 1) {
      multiplier_ = multiplier_ + 1 == n_ ? 1 : multiplier_ + 1;
    }
  }

  int64_t operator()(int64_t rank) const {
    const uint64_t r = static_cast<uint64_t>(rank);
    if (n_ <= (uint64_t{1} << 32)) {  // no overflow: r, multiplier_ < 2^32
      return static_cast<int64_t>((r * multiplier_ + offset_) % n_);
    }
    return static_cast<int64_t>(
        (static_cast<unsigned __int128>(r) * multiplier_ + offset_) % n_);
  }

 private:
  uint64_t n_;
  uint64_t multiplier_;
  uint64_t offset_;
};

struct FeatureDraws {
  int64_t min_length;
  int64_t max_length;
  ZipfRanks ranks;
  Scatter scatter;
  uint64_t seed_and_name;  // for ScoreOf
};

}  // namespace

class SyntheticSource::Impl {
 public:
  explicit Impl(const SyntheticOptions& options)
      : stream_key_(Mix(Mix(options.seed) ^ Mix(options.stream ^ kStreamSalt))),
        random_(stream_key_) {
    for (const SyntheticFeature& feature : options.features) {
      keys_.push_back(feature.name);
      features_.push_back(FeatureDraws{
          feature.min_length, feature.max_length,
          ZipfRanks(feature.num_rows, options.zipf_exponent),
          Scatter(feature.num_rows,
                  Mix(options.seed ^ kScatterSalt) ^ NameHash(feature.name)),
          SeedAndName(options.seed, feature.name)});
    }
    Random weights_random(Mix(options.seed ^ kDenseSalt));
    const double scale =
        1 /
        std::sqrt(static_cast<double>(std::max<int64_t>(options.num_dense, 1)));
    for (int64_t d = 0; d < options.num_dense; ++d) {
      dense_weights_.push_back(weights_random.Normal() * scale);
    }
  }

  // Each batch draws from a generator of its own, seeded by (seed, stream,
  // its index): batch k is the same whether the batches before it were
  // drawn or skipped.
  absl::StatusOr<Batch> Next(const SyntheticOptions& options) {
    random_ = Random(Mix(stream_key_ ^ Mix(next_batch_ + kBatchSalt)));
    ++next_batch_;
    const int64_t b = options.batch_size;
    const int64_t num_dense = options.num_dense;
    const int64_t num_features = static_cast<int64_t>(features_.size());
    std::vector<double> logits(b, 0.0);

    at::Tensor dense = at::empty({b, num_dense}, at::kFloat);
    float* dense_data = dense.data_ptr<float>();
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t d = 0; d < num_dense; ++d) {
        const double value = random_.Normal();
        dense_data[i * num_dense + d] = static_cast<float>(value);
        logits[i] += dense_weights_[d] * value;
      }
    }

    at::Tensor lengths = at::empty({num_features * b}, at::kLong);
    int64_t* length_data = lengths.data_ptr<int64_t>();
    int64_t total = 0;
    for (int64_t f = 0; f < num_features; ++f) {
      const FeatureDraws& feature = features_[f];
      for (int64_t i = 0; i < b; ++i) {
        const int64_t n =
            feature.min_length == feature.max_length
                ? feature.min_length
                : random_.UniformInt(feature.min_length, feature.max_length);
        length_data[f * b + i] = n;
        total += n;
      }
    }

    at::Tensor values = at::empty({total}, at::kLong);
    int64_t* value_data = values.data_ptr<int64_t>();
    at::Tensor weights;
    float* weight_data = nullptr;
    if (options.weighted) {
      weights = at::empty({total}, at::kFloat);
      weight_data = weights.data_ptr<float>();
    }
    int64_t position = 0;
    for (int64_t f = 0; f < num_features; ++f) {
      const FeatureDraws& feature = features_[f];
      for (int64_t i = 0; i < b; ++i) {
        const int64_t n = length_data[f * b + i];
        double signal = 0;
        for (int64_t k = 0; k < n; ++k, ++position) {
          const int64_t id = feature.scatter(feature.ranks.Draw(random_) - 1);
          value_data[position] = id;
          double weight = 1;
          if (weight_data != nullptr) {
            const float w = static_cast<float>(random_.UniformNonZero());
            weight_data[position] = w;
            weight = w;
          }
          signal += weight * ScoreOf(feature.seed_and_name, id);
        }
        if (n > 0) logits[i] += 2 * signal / static_cast<double>(n);
      }
    }

    at::Tensor labels = at::empty({b}, at::kFloat);
    float* label_data = labels.data_ptr<float>();
    for (int64_t i = 0; i < b; ++i) {
      const double p = 1 / (1 + std::exp(-logits[i]));
      label_data[i] = random_.Uniform() < p ? 1.0f : 0.0f;
    }

    absl::StatusOr<KeyedJaggedTensor> sparse = KeyedJaggedTensor::FromLengths(
        keys_, std::move(values), std::move(lengths),
        options.weighted ? std::optional<at::Tensor>(std::move(weights))
                         : std::nullopt,
        b);
    if (!sparse.ok()) return sparse.status();
    Batch batch;
    batch.dense = std::move(dense);
    batch.sparse = *std::move(sparse);
    batch.labels = std::move(labels);
    return batch;
  }

  void Skip(int64_t batches) { next_batch_ += static_cast<uint64_t>(batches); }

 private:
  const uint64_t stream_key_;
  uint64_t next_batch_ = 0;  // the index of the batch Next() draws
  Random random_;            // the current batch's draws
  std::vector<std::string> keys_;
  std::vector<FeatureDraws> features_;
  std::vector<double> dense_weights_;
};

std::vector<SyntheticFeature> CriteoLikeFeatures(int64_t num_features,
                                                 int64_t num_rows) {
  std::vector<SyntheticFeature> features;
  for (int64_t f = 0; f < num_features; ++f) {
    features.push_back({absl::StrCat("cat_", f), num_rows, 1, 1});
  }
  return features;
}

double SyntheticSource::HiddenScore(uint64_t seed, const std::string& feature,
                                    int64_t id) {
  return ScoreOf(SeedAndName(seed, feature), id);
}

absl::StatusOr<std::unique_ptr<SyntheticSource>> SyntheticSource::Create(
    SyntheticOptions options) {
  auto invalid = [](auto... message) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic data: ", message...));
  };
  if (options.batch_size <= 0) {
    return invalid("batch_size must be positive, got ", options.batch_size);
  }
  if (options.num_dense < 0) {
    return invalid("num_dense must be >= 0, got ", options.num_dense);
  }
  if (!(options.zipf_exponent > 0) || !std::isfinite(options.zipf_exponent)) {
    return invalid("zipf_exponent must be finite and positive, got ",
                   options.zipf_exponent);
  }
  if (options.features.empty()) return invalid("features: none given");
  absl::flat_hash_set<std::string> names;
  // Sum of max_length, capped once past the limit (no overflow).
  int64_t max_ids_per_example = 0;
  for (size_t f = 0; f < options.features.size(); ++f) {
    const SyntheticFeature& feature = options.features[f];
    const std::string field = absl::StrCat("features[", f, "]");
    if (feature.name.empty()) return invalid(field, ".name is empty");
    if (!names.insert(feature.name).second) {
      return invalid(field, ".name '", feature.name, "' appears twice");
    }
    const std::string named = absl::StrCat(" (feature '", feature.name, "')");
    if (feature.num_rows <= 0) {
      return invalid(field, ".num_rows must be positive, got ",
                     feature.num_rows, named);
    }
    if (feature.min_length < 0) {
      return invalid(field, ".min_length must be >= 0, got ",
                     feature.min_length, named);
    }
    if (feature.max_length < feature.min_length) {
      return invalid(field, ".max_length must be >= min_length (",
                     feature.min_length, "), got ", feature.max_length, named);
    }
    max_ids_per_example =
        std::min(kMaxIdsPerBatch + 1,
                 max_ids_per_example +
                     std::min(feature.max_length, kMaxIdsPerBatch + 1));
    if (max_ids_per_example > kMaxIdsPerBatch / options.batch_size) {
      return invalid(field, ".max_length ", feature.max_length, named,
                     " allows more than 2^31 IDs in a batch of ",
                     options.batch_size);
    }
  }
  return std::unique_ptr<SyntheticSource>(
      new SyntheticSource(std::move(options)));
}

SyntheticSource::SyntheticSource(SyntheticOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>(options_)) {}

SyntheticSource::~SyntheticSource() = default;

absl::StatusOr<std::optional<Batch>> SyntheticSource::Next() {
  // A batch larger than memory (a huge batch_size or lengths) is
  // ResourceExhausted, never an exception through the training loop.
  absl::StatusOr<Batch> batch =
      CatchTorchErrors([&] { return impl_->Next(options_); });
  if (!batch.ok()) return batch.status();
  return std::optional<Batch>(*std::move(batch));
}

absl::StatusOr<int64_t> SyntheticSource::Skip(int64_t batches) {
  if (batches < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot skip ", batches, " batches"));
  }
  impl_->Skip(batches);
  return batches;
}

}  // namespace deltastream
