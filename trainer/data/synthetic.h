#ifndef DELTASTREAM_TRAINER_DATA_SYNTHETIC_H_
#define DELTASTREAM_TRAINER_DATA_SYNTHETIC_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/batch.h"

namespace deltastream {

struct SyntheticFeature {
  // The KeyedJaggedTensor key: non-empty, unique among the features.
  std::string name;
  // IDs are in [0, num_rows); > 0.
  int64_t num_rows = 0;
  // IDs per example (multi-hot): uniform in [min_length, max_length],
  // 0 <= min_length <= max_length.
  int64_t min_length = 1;
  int64_t max_length = 1;
};

struct SyntheticOptions {
  // Examples per batch; > 0.
  int64_t batch_size = 512;
  // Dense features per example; >= 0 (0: dense is [B, 0]).
  int64_t num_dense = 13;
  // At least one.
  std::vector<SyntheticFeature> features;
  // The k-th most popular row of a feature (k = 1, 2, ...) is drawn with
  // probability proportional to 1 / k^zipf_exponent; finite and > 0.
  double zipf_exponent = 1.05;
  // The task: the hidden click signal (the labels' dependence on the
  // features) and which rows are popular.
  uint64_t seed = 0;
  // Which draws of that task: streams of one seed are independent samples of
  // the same signal (e.g. training data and a held-out set).
  uint64_t stream = 0;
  // Per-ID weights in (0, 1] (weighted features); none when false.
  bool weighted = false;
};

// Features "cat_0".."cat_<num_features - 1>", one ID per example each, over
// `num_rows` rows: the shape of Criteo's 26 categorical features.
std::vector<SyntheticFeature> CriteoLikeFeatures(int64_t num_features,
                                                 int64_t num_rows);

// Deterministic synthetic click data; never ends.
//
// Determinism: the same options give bit-identical batches (on one build of
// the library: the draws use their own generator and distributions, and the
// standard maths library); another seed or stream gives other batches. The
// k-th batch depends only on the options and k (each batch has a generator
// of its own), so Skip() jumps ahead at no cost.
//
// Batches: dense float [B, num_dense], standard normal. Sparse: one key per
// feature, in the order given, int64 lengths and values; each example's
// length uniform in [min_length, max_length]; float weights in (0, 1], one
// per ID, when `weighted`. Labels float [B], 0 or 1.
//
// IDs: each feature's ranks follow Zipf(zipf_exponent) over num_rows rows,
// drawn exactly by rejection-inversion (Hörmann & Derflinger), in O(1) memory
// and time per ID whatever num_rows; rank k becomes an ID by a fixed,
// seed-dependent bijection of [0, num_rows) (an affine map), so popular rows
// are scattered over the ID space as hashed feature values are.
//
// Labels carry a learnable signal: label ~ Bernoulli(sigmoid(logit)),
//   logit = w . dense + sum over features f of 2 * (sum over the example's
//           IDs of f of weight * HiddenScore(f, id)) / (its number of IDs),
// with w a fixed pseudo-random vector (norm about 1) and HiddenScore a fixed
// pseudo-random value per (seed, feature name, ID); weight is 1 when
// unweighted, and a feature with no IDs in an example adds nothing. So both
// classes occur (about half the labels are 1) and a model's AUC can rise well
// above 0.5.
//
// Cost: one batch of 512 examples x 26 one-hot features takes a few hundred
// microseconds on one core; memory is O(batch) plus O(1) per feature.
class SyntheticSource : public BatchSource {
 public:
  // InvalidArgument naming the bad field: batch_size <= 0, num_dense < 0,
  // zipf_exponent not finite and > 0, no features, an empty or repeated
  // feature name, num_rows <= 0, min_length < 0, max_length < min_length, or
  // batch_size * (sum of max_length) above 2^31 IDs per batch.
  static absl::StatusOr<std::unique_ptr<SyntheticSource>> Create(
      SyntheticOptions options);
  ~SyntheticSource() override;

  // The next batch; never std::nullopt, never an error.
  absl::StatusOr<std::optional<Batch>> Next() override;
  // Jumps ahead: batch k depends only on the options and k.
  absl::StatusOr<int64_t> Skip(int64_t batches) override;

  const SyntheticOptions& options() const { return options_; }

  // The hidden per-ID part of the click signal (see above): a fixed value in
  // [-1, 1] for (options().seed, feature name, id), the same for every
  // stream. Exposed for tests and diagnostics.
  static double HiddenScore(uint64_t seed, const std::string& feature,
                            int64_t id);

 private:
  class Impl;
  explicit SyntheticSource(SyntheticOptions options);

  SyntheticOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_DATA_SYNTHETIC_H_
