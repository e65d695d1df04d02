#ifndef DELTASTREAM_TRAINER_DATA_SYNTHETIC_H_
#define DELTASTREAM_TRAINER_DATA_SYNTHETIC_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/batch.h"

namespace deltastream {

struct SyntheticFeature {
  std::string name;
  int64_t num_rows = 0;  // IDs in [0, num_rows)
  // IDs per example: uniform in [min_length, max_length] (multi-hot).
  int64_t min_length = 1;
  int64_t max_length = 1;
};

struct SyntheticOptions {
  int64_t batch_size = 512;
  int64_t num_dense = 13;
  std::vector<SyntheticFeature> features;
  // The k-th most popular row of a feature is drawn with probability
  // proportional to 1 / k^zipf_exponent.
  double zipf_exponent = 1.05;
  // The task: which hidden click signal (labels' dependence on features).
  uint64_t seed = 0;
  // Which draws of that task: streams of one seed are independent samples of
  // the same signal (e.g. training data and a held-out set).
  uint64_t stream = 0;
  // Per-ID weights in (0, 1] (weighted features).
  bool weighted = false;
};

// Features "cat_0".."cat_<n-1>", one ID each, over `num_rows` rows.
std::vector<SyntheticFeature> CriteoLikeFeatures(int64_t num_features,
                                                 int64_t num_rows);

// Deterministic synthetic click data: the same options and seed give
// bit-identical batches. IDs are Zipf-skewed, popular rows scattered over the
// ID space by a fixed bijection; memory is O(1) in num_rows (an inverted
// continuous power law, no CDF table). Dense features are standard normal.
// Labels carry a learnable signal: label ~ Bernoulli(sigmoid(score)), score =
// a fixed linear function of the dense features + a fixed pseudo-random
// value in [-1, 1] per (feature, ID) summed over the example's IDs (mean per
// feature), so a model's AUC can rise well above 0.5. Never ends.
class SyntheticSource : public BatchSource {
 public:
  // InvalidArgument naming the field: batch_size <= 0, num_dense < 0, no or
  // duplicate or empty feature names, num_rows <= 0, min_length < 0,
  // max_length < min_length, zipf_exponent <= 0.
  static absl::StatusOr<std::unique_ptr<SyntheticSource>> Create(
      SyntheticOptions options);

  absl::StatusOr<std::optional<Batch>> Next() override;

 private:
  explicit SyntheticSource(SyntheticOptions options);
  int64_t DrawId(const SyntheticFeature& feature, uint64_t scatter);

  SyntheticOptions options_;
  std::vector<uint64_t> scatter_;  // per feature: an odd multiplier
  std::vector<double> dense_weights_;
  std::mt19937_64 random_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_DATA_SYNTHETIC_H_
