#include "trainer/data/synthetic.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/tensor_values.h"
#include "trainer/data/batch.h"

namespace deltastream {
namespace {

using ::testing::HasSubstr;

SyntheticOptions SmallOptions() {
  SyntheticOptions options;
  options.batch_size = 64;
  options.num_dense = 4;
  options.features = {
      {"user", 1000, 1, 1}, {"item", 100000, 0, 5}, {"history", 5000, 2, 2}};
  options.seed = 7;
  return options;
}

std::unique_ptr<SyntheticSource> MakeSource(SyntheticOptions options) {
  absl::StatusOr<std::unique_ptr<SyntheticSource>> source =
      SyntheticSource::Create(std::move(options));
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *std::move(source) : nullptr;
}

Batch NextBatch(SyntheticSource& source) {
  absl::StatusOr<std::optional<Batch>> batch = source.Next();
  EXPECT_TRUE(batch.ok()) << batch.status();
  EXPECT_TRUE(batch.ok() && batch->has_value());
  return batch.ok() && batch->has_value() ? **std::move(batch) : Batch();
}

bool SameBatch(const Batch& a, const Batch& b) {
  if (a.sparse.keys() != b.sparse.keys()) return false;
  if (a.sparse.has_weights() != b.sparse.has_weights()) return false;
  if (a.sparse.has_weights() &&
      !at::equal(*a.sparse.weights(), *b.sparse.weights())) {
    return false;
  }
  return at::equal(a.dense, b.dense) && at::equal(a.labels, b.labels) &&
         at::equal(a.sparse.values(), b.sparse.values()) &&
         at::equal(a.sparse.lengths(), b.sparse.lengths());
}

TEST(SyntheticSourceTest, SameOptionsGiveBitIdenticalBatches) {
  std::unique_ptr<SyntheticSource> a = MakeSource(SmallOptions());
  std::unique_ptr<SyntheticSource> b = MakeSource(SmallOptions());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(SameBatch(NextBatch(*a), NextBatch(*b))) << "batch " << i;
  }
}

TEST(SyntheticSourceTest, WeightedBatchesAreDeterministicToo) {
  SyntheticOptions options = SmallOptions();
  options.weighted = true;
  std::unique_ptr<SyntheticSource> a = MakeSource(options);
  std::unique_ptr<SyntheticSource> b = MakeSource(options);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(SameBatch(NextBatch(*a), NextBatch(*b))) << "batch " << i;
  }
}

// A trainer resuming at step k skips k batches: at no cost (it drew them
// all, 0.66 ms a step, so a restart after a day took minutes), and the
// batches after are those an unbroken run draws.
TEST(SyntheticSourceTest, SkipJumpsAheadToTheSameBatches) {
  SyntheticOptions options = SmallOptions();
  options.weighted = true;
  std::unique_ptr<SyntheticSource> drawn = MakeSource(options);
  std::unique_ptr<SyntheticSource> skipping = MakeSource(options);
  for (int i = 0; i < 7; ++i) NextBatch(*drawn);
  absl::StatusOr<int64_t> skipped = skipping->Skip(7);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(*skipped, 7);
  for (int i = 7; i < 10; ++i) {
    EXPECT_TRUE(SameBatch(NextBatch(*drawn), NextBatch(*skipping)))
        << "batch " << i;
  }
  // A billion batches ahead, at once.
  EXPECT_EQ(*skipping->Skip(int64_t{1} << 30), int64_t{1} << 30);
  EXPECT_EQ(skipping->Skip(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SyntheticSourceTest, ConsecutiveBatchesDiffer) {
  std::unique_ptr<SyntheticSource> source = MakeSource(SmallOptions());
  const Batch first = NextBatch(*source);
  const Batch second = NextBatch(*source);
  EXPECT_FALSE(SameBatch(first, second));
}

TEST(SyntheticSourceTest, OtherSeedOrStreamGivesOtherBatches) {
  const Batch base = NextBatch(*MakeSource(SmallOptions()));
  SyntheticOptions other_seed = SmallOptions();
  other_seed.seed = 8;
  const Batch seeded = NextBatch(*MakeSource(other_seed));
  EXPECT_FALSE(at::equal(base.dense, seeded.dense));
  EXPECT_FALSE(at::equal(base.sparse.values(), seeded.sparse.values()));

  SyntheticOptions other_stream = SmallOptions();
  other_stream.stream = 1;
  const Batch streamed = NextBatch(*MakeSource(other_stream));
  EXPECT_FALSE(at::equal(base.dense, streamed.dense));
  EXPECT_FALSE(at::equal(base.sparse.values(), streamed.sparse.values()));
}

TEST(SyntheticSourceTest, ShapesRangesAndLengths) {
  SyntheticOptions options = SmallOptions();
  std::unique_ptr<SyntheticSource> source = MakeSource(options);
  std::vector<int64_t> item_length_counts(6, 0);
  for (int round = 0; round < 20; ++round) {
    const Batch batch = NextBatch(*source);
    ASSERT_EQ(batch.size(), 64);
    EXPECT_EQ(batch.dense.scalar_type(), at::kFloat);
    EXPECT_EQ(batch.dense.sizes(), (std::vector<int64_t>{64, 4}));
    EXPECT_EQ(batch.labels.scalar_type(), at::kFloat);
    EXPECT_EQ(batch.labels.sizes(), (std::vector<int64_t>{64}));
    for (float label : Floats(batch.labels)) {
      EXPECT_TRUE(label == 0.0f || label == 1.0f) << label;
    }
    const KeyedJaggedTensor& sparse = batch.sparse;
    EXPECT_EQ(sparse.keys(),
              (std::vector<std::string>{"user", "item", "history"}));
    EXPECT_EQ(sparse.stride(), 64);
    EXPECT_FALSE(sparse.has_weights());
    EXPECT_EQ(sparse.values().scalar_type(), at::kLong);
    for (int64_t f = 0; f < 3; ++f) {
      const SyntheticFeature& feature = options.features[f];
      for (int64_t length : Longs(sparse.LengthsOf(f))) {
        EXPECT_GE(length, feature.min_length) << feature.name;
        EXPECT_LE(length, feature.max_length) << feature.name;
        if (feature.name == "item") ++item_length_counts[length];
      }
      for (int64_t id : Longs(sparse.ValuesOf(f))) {
        EXPECT_GE(id, 0) << feature.name;
        EXPECT_LT(id, feature.num_rows) << feature.name;
      }
    }
  }
  // Uniform over 0..5: 1280 draws, about 213 each.
  for (int64_t length = 0; length <= 5; ++length) {
    EXPECT_GT(item_length_counts[length], 150) << "length " << length;
  }
}

TEST(SyntheticSourceTest, DenseFeaturesAreRoughlyStandardNormal) {
  SyntheticOptions options = SmallOptions();
  options.batch_size = 4096;
  const std::vector<float> dense =
      Floats(NextBatch(*MakeSource(options)).dense);
  double sum = 0, sum_squares = 0;
  for (float x : dense) {
    sum += x;
    sum_squares += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(dense.size());
  EXPECT_NEAR(sum / n, 0.0, 0.05);
  EXPECT_NEAR(sum_squares / n, 1.0, 0.05);
}

TEST(SyntheticSourceTest, NoDenseFeatures) {
  SyntheticOptions options = SmallOptions();
  options.num_dense = 0;
  const Batch batch = NextBatch(*MakeSource(options));
  EXPECT_EQ(batch.dense.sizes(), (std::vector<int64_t>{64, 0}));
}

// The exact Zipf probability of rank k (from 1) over n rows.
double ZipfProbability(int64_t k, int64_t n, double exponent) {
  double normaliser = 0;
  for (int64_t j = n; j >= 1; --j) {
    normaliser += std::pow(static_cast<double>(j), -exponent);
  }
  return std::pow(static_cast<double>(k), -exponent) / normaliser;
}

// Counts of each ID of feature 0 over `batches` batches, most frequent first.
std::vector<std::pair<int64_t, int64_t>> CountIds(SyntheticSource& source,
                                                  int batches) {
  absl::flat_hash_map<int64_t, int64_t> counts;
  for (int i = 0; i < batches; ++i) {
    for (int64_t id : Longs(NextBatch(source).sparse.ValuesOf(0))) {
      ++counts[id];
    }
  }
  std::vector<std::pair<int64_t, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  return sorted;
}

TEST(SyntheticSourceTest, IdsFollowZipfAndPopularRowsAreScattered) {
  SyntheticOptions options;
  options.batch_size = 4096;
  options.num_dense = 0;
  options.features = {{"f", 100000, 1, 1}};
  options.zipf_exponent = 1.05;
  std::unique_ptr<SyntheticSource> source = MakeSource(options);
  const int batches = 25;
  const double draws = 4096.0 * batches;
  const std::vector<std::pair<int64_t, int64_t>> counts =
      CountIds(*source, batches);
  ASSERT_GE(counts.size(), 10u);
  // Uniform would give each row about 1 draw; the top row gets ~10%.
  EXPECT_GT(counts[0].second, 5000);
  // The top ranks' frequencies match Zipf's (within ~3 standard errors).
  for (int k = 1; k <= 3; ++k) {
    const double expected = ZipfProbability(k, 100000, 1.05);
    const double observed = counts[k - 1].second / draws;
    EXPECT_NEAR(observed / expected, 1.0, 0.06) << "rank " << k;
  }
  // The 10 most popular rows are spread over the ID space, not 0..9.
  int64_t low = counts[0].first, high = counts[0].first;
  for (int k = 0; k < 10; ++k) {
    low = std::min(low, counts[k].first);
    high = std::max(high, counts[k].first);
  }
  EXPECT_GT(high - low, 10000);
}

class ZipfExponentTest : public ::testing::TestWithParam<double> {};

// P(rank 1) / P(rank 2) = 2^s exactly, whatever s (the sampler is exact, not
// a continuous approximation).
TEST_P(ZipfExponentTest, TopRanksHaveTheExactRatio) {
  const double exponent = GetParam();
  SyntheticOptions options;
  options.batch_size = 8192;
  options.num_dense = 0;
  options.features = {{"f", 1000, 1, 1}};
  options.zipf_exponent = exponent;
  std::unique_ptr<SyntheticSource> source = MakeSource(options);
  const std::vector<std::pair<int64_t, int64_t>> counts = CountIds(*source, 12);
  const double draws = 8192.0 * 12;
  const double p1 = ZipfProbability(1, 1000, exponent);
  const double p2 = ZipfProbability(2, 1000, exponent);
  EXPECT_NEAR(counts[0].second / draws / p1, 1.0, 0.08);
  EXPECT_NEAR(counts[1].second / draws / p2, 1.0, 0.1);
}

INSTANTIATE_TEST_SUITE_P(Exponents, ZipfExponentTest,
                         ::testing::Values(0.6, 1.0, 1.05, 1.5, 3.0));

TEST(SyntheticSourceTest, HugeRowCountsNeedNoMemory) {
  SyntheticOptions options;
  options.batch_size = 256;
  options.num_dense = 1;
  options.features = {{"huge", int64_t{1} << 40, 1, 1},
                      {"max", std::numeric_limits<int64_t>::max(), 1, 3},
                      {"one", 1, 1, 2}};
  std::unique_ptr<SyntheticSource> source = MakeSource(options);
  ASSERT_NE(source, nullptr);
  for (int i = 0; i < 5; ++i) {
    const Batch batch = NextBatch(*source);
    for (int64_t id : Longs(batch.sparse.ValuesOf(0))) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, int64_t{1} << 40);
    }
    for (int64_t id : Longs(batch.sparse.ValuesOf(1))) EXPECT_GE(id, 0);
    for (int64_t id : Longs(batch.sparse.ValuesOf(2))) EXPECT_EQ(id, 0);
  }
}

TEST(SyntheticSourceTest, WeightsWhenWeighted) {
  SyntheticOptions options = SmallOptions();
  options.weighted = true;
  const Batch batch = NextBatch(*MakeSource(options));
  ASSERT_TRUE(batch.sparse.has_weights());
  const at::Tensor weights = *batch.sparse.weights();
  EXPECT_EQ(weights.scalar_type(), at::kFloat);
  EXPECT_EQ(weights.numel(), batch.sparse.values().numel());
  std::vector<float> values = Floats(weights);
  for (float w : values) {
    EXPECT_GT(w, 0.0f);
    EXPECT_LE(w, 1.0f);
  }
  std::sort(values.begin(), values.end());
  EXPECT_LT(values.front(), 0.2f);  // spread over (0, 1]
  EXPECT_GT(values.back(), 0.8f);
}

TEST(SyntheticSourceTest, LabelsFollowTheHiddenScore) {
  SyntheticOptions options;
  options.batch_size = 1024;
  options.num_dense = 13;
  options.features = CriteoLikeFeatures(4, 1000);
  options.seed = 3;
  std::unique_ptr<SyntheticSource> source = MakeSource(options);
  // Examples binned by their sparse score: label rates rise with it.
  std::vector<std::pair<double, float>> scored;
  for (int round = 0; round < 8; ++round) {
    const Batch batch = NextBatch(*source);
    const std::vector<float> labels = Floats(batch.labels);
    std::vector<double> scores(labels.size(), 0.0);
    for (int64_t f = 0; f < 4; ++f) {
      const std::vector<int64_t> ids = Longs(batch.sparse.ValuesOf(f));
      ASSERT_EQ(ids.size(), labels.size());  // one-hot
      for (size_t i = 0; i < ids.size(); ++i) {
        const double score = SyntheticSource::HiddenScore(
            options.seed, options.features[f].name, ids[i]);
        EXPECT_GE(score, -1.0);
        EXPECT_LE(score, 1.0);
        scores[i] += 2 * score;
      }
    }
    for (size_t i = 0; i < labels.size(); ++i) {
      scored.emplace_back(scores[i], labels[i]);
    }
  }
  std::sort(scored.begin(), scored.end());
  const size_t quarter = scored.size() / 4;
  double low_rate = 0, high_rate = 0, all_rate = 0;
  for (size_t i = 0; i < quarter; ++i) {
    low_rate += scored[i].second;
    high_rate += scored[scored.size() - 1 - i].second;
  }
  for (const auto& [score, label] : scored) all_rate += label;
  low_rate /= quarter;
  high_rate /= quarter;
  all_rate /= scored.size();
  EXPECT_GT(all_rate, 0.2);  // both classes
  EXPECT_LT(all_rate, 0.8);
  EXPECT_LT(low_rate, 0.2);
  EXPECT_GT(high_rate, 0.8);
}

TEST(SyntheticSourceTest, HiddenScoreIsFixedPerSeedFeatureAndId) {
  EXPECT_EQ(SyntheticSource::HiddenScore(1, "a", 5),
            SyntheticSource::HiddenScore(1, "a", 5));
  EXPECT_NE(SyntheticSource::HiddenScore(1, "a", 5),
            SyntheticSource::HiddenScore(2, "a", 5));
  EXPECT_NE(SyntheticSource::HiddenScore(1, "a", 5),
            SyntheticSource::HiddenScore(1, "b", 5));
  EXPECT_NE(SyntheticSource::HiddenScore(1, "a", 5),
            SyntheticSource::HiddenScore(1, "a", 6));
}

TEST(SyntheticSourceTest, CriteoLikeFeatures) {
  const std::vector<SyntheticFeature> features = CriteoLikeFeatures(26, 1000);
  ASSERT_EQ(features.size(), 26u);
  for (int f = 0; f < 26; ++f) {
    EXPECT_EQ(features[f].name, "cat_" + std::to_string(f));
    EXPECT_EQ(features[f].num_rows, 1000);
    EXPECT_EQ(features[f].min_length, 1);
    EXPECT_EQ(features[f].max_length, 1);
  }
}

void ExpectInvalid(const SyntheticOptions& options, const std::string& field) {
  absl::StatusOr<std::unique_ptr<SyntheticSource>> source =
      SyntheticSource::Create(options);
  ASSERT_FALSE(source.ok()) << field;
  EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(source.status().message()), HasSubstr(field));
}

TEST(SyntheticSourceTest, RejectsBadOptionsNamingTheField) {
  SyntheticOptions options = SmallOptions();
  options.batch_size = 0;
  ExpectInvalid(options, "batch_size");
  options = SmallOptions();
  options.num_dense = -1;
  ExpectInvalid(options, "num_dense");
  options = SmallOptions();
  options.zipf_exponent = 0;
  ExpectInvalid(options, "zipf_exponent");
  options.zipf_exponent = -1;
  ExpectInvalid(options, "zipf_exponent");
  options.zipf_exponent = std::nan("");
  ExpectInvalid(options, "zipf_exponent");
  options.zipf_exponent = std::numeric_limits<double>::infinity();
  ExpectInvalid(options, "zipf_exponent");
  options = SmallOptions();
  options.features.clear();
  ExpectInvalid(options, "features");
  options = SmallOptions();
  options.features[1].name = "";
  ExpectInvalid(options, "features[1].name");
  options = SmallOptions();
  options.features[2].name = "user";
  ExpectInvalid(options, "features[2].name 'user' appears twice");
  options = SmallOptions();
  options.features[1].num_rows = 0;
  ExpectInvalid(options, "features[1].num_rows");
  options = SmallOptions();
  options.features[0].min_length = -1;
  ExpectInvalid(options, "features[0].min_length");
  options = SmallOptions();
  options.features[0].min_length = 3;
  options.features[0].max_length = 2;
  ExpectInvalid(options, "features[0].max_length");
  options = SmallOptions();
  options.features[0].max_length = std::numeric_limits<int64_t>::max();
  ExpectInvalid(options, "features[0].max_length");
}

TEST(SyntheticSourceTest, ZeroLengthFeatures) {
  SyntheticOptions options = SmallOptions();
  options.features = {{"empty", 10, 0, 0}, {"one", 10, 1, 1}};
  const Batch batch = NextBatch(*MakeSource(options));
  EXPECT_EQ(batch.sparse.ValuesOf(0).numel(), 0);
  EXPECT_EQ(batch.sparse.ValuesOf(1).numel(), 64);
}

TEST(BatchTest, ToKeepsEveryTensor) {
  SyntheticOptions options = SmallOptions();
  options.weighted = true;
  const Batch batch = NextBatch(*MakeSource(options));
  const Batch moved = batch.To(c10::Device(c10::kCPU));
  EXPECT_TRUE(SameBatch(batch, moved));
  EXPECT_EQ(moved.size(), 64);
  EXPECT_EQ(Batch().To(c10::Device(c10::kCPU)).size(), 0);
}

// Rough cost of a Criteo-shaped batch (512 x 26 one-hot features of 1M rows,
// 13 dense); printed, and bounded loosely (sanitizer builds are slower).
TEST(SyntheticSourceTest, BatchCost) {
  SyntheticOptions options;
  options.features = CriteoLikeFeatures(26, 1000000);
  std::unique_ptr<SyntheticSource> source = MakeSource(options);
  NextBatch(*source);  // warm up
  const int batches = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < batches; ++i) NextBatch(*source);
  const double micros = std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - start)
                            .count() /
                        batches;
  std::printf("synthetic batch 512 x 26 features: %.1f us\n", micros);
  RecordProperty("batch_micros", static_cast<int>(micros));
  EXPECT_LT(micros, 50000);
}

}  // namespace
}  // namespace deltastream
