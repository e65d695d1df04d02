#include "trainer/sparse/feature_dict.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/tensor_values.h"
#include "tests/trainer/sparse_expectations.h"
#include "trainer/sparse/jagged_tensor.h"
#include "trainer/sparse/keyed_jagged_tensor.h"

namespace deltastream {
namespace {

using ::deltastream::testing::ExpectSameKjt;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

JaggedTensor Jagged(std::vector<int64_t> ids, std::vector<int64_t> lengths,
                    at::ScalarType lengths_dtype = at::kLong,
                    std::optional<std::vector<float>> weights = std::nullopt) {
  std::optional<at::Tensor> w;
  if (weights.has_value()) w = at::tensor(*weights, at::kFloat);
  absl::StatusOr<JaggedTensor> jt = JaggedTensor::FromLengths(
      at::tensor(ids, at::kLong), at::tensor(lengths, lengths_dtype), w);
  EXPECT_TRUE(jt.ok()) << jt.status();
  return *std::move(jt);
}

// Two features over a batch of 3 (as in keyed_jagged_tensor_test):
//   f1: [1, 2], [], [3]      f2: [4], [5, 6], [7]
// weighted, when asked, with 0.1 .. 0.7 (one per value, in order).
FeatureDict Example(bool weighted = false,
                    at::ScalarType f2_lengths = at::kLong) {
  FeatureDict dict;
  std::optional<std::vector<float>> w1, w2;
  if (weighted) {
    w1 = std::vector<float>{0.1f, 0.2f, 0.3f};
    w2 = std::vector<float>{0.4f, 0.5f, 0.6f, 0.7f};
  }
  EXPECT_TRUE(dict.Add("f1", Jagged({1, 2, 3}, {2, 0, 1}, at::kLong, w1)).ok());
  EXPECT_TRUE(
      dict.Add("f2", Jagged({4, 5, 6, 7}, {1, 2, 1}, f2_lengths, w2)).ok());
  return dict;
}

// The same features, built directly as a KJT.
KeyedJaggedTensor ExampleKjt(bool weighted = false) {
  std::optional<at::Tensor> weights;
  if (weighted)
    weights = at::tensor({0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f});
  absl::StatusOr<KeyedJaggedTensor> kjt = KeyedJaggedTensor::FromLengths(
      {"f1", "f2"}, at::arange(1, 8, at::kLong),
      at::tensor({2, 0, 1, 1, 2, 1}, at::kLong), weights);
  EXPECT_TRUE(kjt.ok()) << kjt.status();
  return *std::move(kjt);
}

void ExpectSameJagged(const JaggedTensor& actual,
                      const JaggedTensor& expected) {
  EXPECT_EQ(actual.values().scalar_type(), expected.values().scalar_type());
  EXPECT_EQ(Longs(actual.values()), Longs(expected.values()));
  EXPECT_EQ(actual.lengths().scalar_type(), expected.lengths().scalar_type());
  EXPECT_EQ(Longs(actual.lengths()), Longs(expected.lengths()));
  EXPECT_EQ(Longs(actual.offsets()), Longs(expected.offsets()));
  ASSERT_EQ(actual.has_weights(), expected.has_weights());
  if (actual.has_weights()) {
    EXPECT_EQ(actual.weights()->scalar_type(),
              expected.weights()->scalar_type());
    EXPECT_EQ(Floats(*actual.weights()), Floats(*expected.weights()));
  }
}

void ExpectSameDict(const FeatureDict& actual, const FeatureDict& expected) {
  ASSERT_EQ(actual.keys(), expected.keys());
  EXPECT_EQ(actual.num_examples(), expected.num_examples());
  for (int64_t k = 0; k < actual.size(); ++k) {
    SCOPED_TRACE(actual.keys()[k]);
    ExpectSameJagged(actual.At(k), expected.At(k));
  }
}

// ---------------------------------------------------------------------------
// Building and access

TEST(FeatureDictTest, AddKeepsInsertionOrder) {
  FeatureDict dict;
  ASSERT_TRUE(dict.Add("z", Jagged({1}, {1, 0})).ok());
  ASSERT_TRUE(dict.Add("a", Jagged({2, 3}, {0, 2})).ok());
  ASSERT_TRUE(dict.Add("m", Jagged({}, {0, 0})).ok());
  EXPECT_THAT(dict.keys(), ElementsAre("z", "a", "m"));
  EXPECT_EQ(dict.size(), 3);
  EXPECT_FALSE(dict.empty());
  EXPECT_EQ(dict.num_examples(), 2);
  EXPECT_EQ(Longs(dict.At(1).values()), (std::vector<int64_t>{2, 3}));
}

TEST(FeatureDictTest, GetAndAtShareTheFeatureTensors) {
  at::Tensor ids = at::tensor({5, 6, 7}, at::kLong);
  JaggedTensor jt = *JaggedTensor::FromLengths(ids, at::tensor({1, 2}));
  FeatureDict dict;
  ASSERT_TRUE(dict.Add("f", jt).ok());
  absl::StatusOr<JaggedTensor> f = dict.Get("f");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->values().is_same(ids));
  EXPECT_TRUE(f->lengths().is_same(jt.lengths()));
  EXPECT_TRUE(dict.At(0).values().is_same(ids));

  absl::StatusOr<JaggedTensor> absent = dict.Get("g");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(absent.status().message()),
              HasSubstr("no feature 'g'"));
}

TEST(FeatureDictTest, EmptyDict) {
  FeatureDict dict;
  EXPECT_TRUE(dict.empty());
  EXPECT_EQ(dict.size(), 0);
  EXPECT_EQ(dict.num_examples(), 0);
  EXPECT_THAT(dict.keys(), IsEmpty());
  EXPECT_EQ(dict.Get("f").status().code(), absl::StatusCode::kNotFound);

  absl::StatusOr<KeyedJaggedTensor> kjt = dict.ToKeyedJaggedTensor();
  ASSERT_TRUE(kjt.ok()) << kjt.status();
  ExpectSameKjt(*kjt, KeyedJaggedTensor());

  FeatureDict back = FeatureDict::FromKeyedJaggedTensor(KeyedJaggedTensor());
  EXPECT_TRUE(back.empty());
  EXPECT_EQ(back.num_examples(), 0);
}

// ---------------------------------------------------------------------------
// Validation: InvalidArgument naming the feature.

TEST(FeatureDictTest, AddRefusesInconsistentFeatures) {
  FeatureDict dict = Example();  // f1, f2: 3 examples, unweighted, CPU.
  struct Case {
    std::string name;
    absl::Status status;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back(
      {"empty name", dict.Add("", Jagged({1}, {1, 0, 0})), "name is empty"});
  cases.push_back({"repeated name", dict.Add("f2", Jagged({1}, {1, 0, 0})),
                   "feature 'f2' is already present"});
  cases.push_back({"example count", dict.Add("f3", Jagged({1}, {1, 0})),
                   "feature 'f3' has 2 examples, the others 3"});
  cases.push_back({"weighted among unweighted",
                   dict.Add("f4", Jagged({1}, {1, 0, 0}, at::kLong,
                                         std::vector<float>{1.0f})),
                   "feature 'f4' is weighted but the others are unweighted"});
  FeatureDict weighted = Example(/*weighted=*/true);
  cases.push_back({"unweighted among weighted",
                   weighted.Add("f5", Jagged({1}, {1, 0, 0})),
                   "feature 'f5' is unweighted but the others are weighted"});
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status.message()), HasSubstr(c.message));
  }
  // Refused features are not added.
  EXPECT_THAT(dict.keys(), ElementsAre("f1", "f2"));
  EXPECT_THAT(weighted.keys(), ElementsAre("f1", "f2"));
}

TEST(FeatureDictTest, NonIdValuesCannotBecomeAKjt) {
  // Embedding rows (what an EmbeddingCollection returns) fit a FeatureDict
  // but not a KeyedJaggedTensor: an error, not an exception.
  FeatureDict dict;
  ASSERT_TRUE(dict.Add("f", *JaggedTensor::FromLengths(at::ones({3, 4}),
                                                       at::tensor({1, 2})))
                  .ok());
  absl::StatusOr<KeyedJaggedTensor> kjt = dict.ToKeyedJaggedTensor();
  EXPECT_EQ(kjt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(kjt.status().message()),
              HasSubstr("values must be a 1-D int64 tensor of IDs"));
}

// ---------------------------------------------------------------------------
// Conversion

TEST(FeatureDictTest, ToKeyedJaggedTensorConcatenatesInInsertionOrder) {
  FeatureDict dict = Example();
  absl::StatusOr<KeyedJaggedTensor> kjt = dict.ToKeyedJaggedTensor();
  ASSERT_TRUE(kjt.ok()) << kjt.status();
  EXPECT_THAT(kjt->keys(), ElementsAre("f1", "f2"));
  EXPECT_EQ(kjt->stride(), 3);
  EXPECT_EQ(Longs(kjt->values()), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(Longs(kjt->lengths()), (std::vector<int64_t>{2, 0, 1, 1, 2, 1}));
  EXPECT_EQ(Longs(kjt->offsets()), (std::vector<int64_t>{0, 2, 2, 3, 4, 6, 7}));
  EXPECT_EQ(kjt->length_per_key(), (std::vector<int64_t>{3, 4}));
  EXPECT_FALSE(kjt->has_weights());

  // Insertion order, not name order, is the key order.
  FeatureDict reversed;
  ASSERT_TRUE(reversed.Add("f2", *dict.Get("f2")).ok());
  ASSERT_TRUE(reversed.Add("f1", *dict.Get("f1")).ok());
  absl::StatusOr<KeyedJaggedTensor> r = reversed.ToKeyedJaggedTensor();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->keys(), ElementsAre("f2", "f1"));
  EXPECT_EQ(Longs(r->values()), (std::vector<int64_t>{4, 5, 6, 7, 1, 2, 3}));
  EXPECT_EQ(Longs(r->lengths()), (std::vector<int64_t>{1, 2, 1, 2, 0, 1}));
}

TEST(FeatureDictTest, SameAsKjtBuiltDirectly) {
  for (bool weighted : {false, true}) {
    SCOPED_TRACE(weighted ? "weighted" : "unweighted");
    absl::StatusOr<KeyedJaggedTensor> from_dict =
        Example(weighted).ToKeyedJaggedTensor();
    ASSERT_TRUE(from_dict.ok()) << from_dict.status();
    KeyedJaggedTensor direct = ExampleKjt(weighted);
    ExpectSameKjt(*from_dict, direct);
    // And per key, through the KJT's own views.
    for (int64_t k = 0; k < direct.num_keys(); ++k) {
      ExpectSameJagged(from_dict->At(k), direct.At(k));
    }
    // The other way: the dict of the direct KJT equals the dict built by hand.
    ExpectSameDict(FeatureDict::FromKeyedJaggedTensor(direct),
                   Example(weighted));
  }
}

TEST(FeatureDictTest, RoundTripKeepsEverything) {
  for (bool weighted : {false, true}) {
    SCOPED_TRACE(weighted ? "weighted" : "unweighted");
    FeatureDict dict = Example(weighted);
    absl::StatusOr<KeyedJaggedTensor> kjt = dict.ToKeyedJaggedTensor();
    ASSERT_TRUE(kjt.ok()) << kjt.status();
    FeatureDict back = FeatureDict::FromKeyedJaggedTensor(*kjt);
    ExpectSameDict(back, dict);
    // And KJT -> dict -> KJT.
    absl::StatusOr<KeyedJaggedTensor> again = back.ToKeyedJaggedTensor();
    ASSERT_TRUE(again.ok()) << again.status();
    ExpectSameKjt(*again, *kjt);
  }
}

TEST(FeatureDictTest, FromKeyedJaggedTensorGivesViews) {
  KeyedJaggedTensor kjt = ExampleKjt(/*weighted=*/true);
  FeatureDict dict = FeatureDict::FromKeyedJaggedTensor(kjt);
  EXPECT_THAT(dict.keys(), ElementsAre("f1", "f2"));
  EXPECT_EQ(dict.num_examples(), 3);
  const JaggedTensor& f2 = dict.At(1);
  EXPECT_TRUE(f2.values().is_alias_of(kjt.values()));
  EXPECT_EQ(f2.values().data_ptr(),
            static_cast<void*>(kjt.values().data_ptr<int64_t>() + 3));
  EXPECT_TRUE(f2.lengths().is_alias_of(kjt.lengths()));
  EXPECT_TRUE(f2.weights()->is_alias_of(*kjt.weights()));
  // Offsets are per feature, starting at 0.
  EXPECT_EQ(Longs(f2.offsets()), (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(Floats(*f2.weights()),
            (std::vector<float>{0.4f, 0.5f, 0.6f, 0.7f}));
}

TEST(FeatureDictTest, MixedInt32AndInt64LengthsBecomeInt64) {
  FeatureDict mixed = Example(/*weighted=*/false, /*f2_lengths=*/at::kInt);
  EXPECT_EQ(mixed.At(0).lengths().scalar_type(), at::kLong);
  EXPECT_EQ(mixed.At(1).lengths().scalar_type(), at::kInt);
  absl::StatusOr<KeyedJaggedTensor> kjt = mixed.ToKeyedJaggedTensor();
  ASSERT_TRUE(kjt.ok()) << kjt.status();
  EXPECT_EQ(kjt->lengths().scalar_type(), at::kLong);
  EXPECT_EQ(kjt->offsets().scalar_type(), at::kLong);
  ExpectSameKjt(*kjt, ExampleKjt());

  // All int32: they stay int32.
  FeatureDict narrow;
  ASSERT_TRUE(narrow.Add("a", Jagged({1, 2}, {2, 0}, at::kInt)).ok());
  ASSERT_TRUE(narrow.Add("b", Jagged({3}, {0, 1}, at::kInt)).ok());
  absl::StatusOr<KeyedJaggedTensor> n = narrow.ToKeyedJaggedTensor();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->lengths().scalar_type(), at::kInt);
  EXPECT_EQ(n->offsets().scalar_type(), at::kInt);
  EXPECT_EQ(Longs(n->offsets()), (std::vector<int64_t>{0, 2, 2, 2, 3}));
  // Round trip keeps each feature's (common) dtype.
  ExpectSameDict(FeatureDict::FromKeyedJaggedTensor(*n), narrow);
}

TEST(FeatureDictTest, FeaturesWithoutExamples) {
  FeatureDict dict;
  ASSERT_TRUE(dict.Add("a", Jagged({}, {})).ok());
  ASSERT_TRUE(dict.Add("b", Jagged({}, {})).ok());
  EXPECT_EQ(dict.num_examples(), 0);
  absl::StatusOr<KeyedJaggedTensor> kjt = dict.ToKeyedJaggedTensor();
  ASSERT_TRUE(kjt.ok()) << kjt.status();
  EXPECT_THAT(kjt->keys(), ElementsAre("a", "b"));
  EXPECT_EQ(kjt->stride(), 0);
  EXPECT_EQ(kjt->length_per_key(), (std::vector<int64_t>{0, 0}));
  ExpectSameDict(FeatureDict::FromKeyedJaggedTensor(*kjt), dict);
}

// ---------------------------------------------------------------------------
// Devices

TEST(FeatureDictTest, CudaFeatures) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  FeatureDict cpu = Example(/*weighted=*/true, /*f2_lengths=*/at::kInt);
  FeatureDict gpu;
  for (int64_t k = 0; k < cpu.size(); ++k) {
    ASSERT_TRUE(gpu.Add(cpu.keys()[k], cpu.At(k).To(cuda)).ok());
  }
  absl::StatusOr<KeyedJaggedTensor> kjt = gpu.ToKeyedJaggedTensor();
  ASSERT_TRUE(kjt.ok()) << kjt.status();
  EXPECT_EQ(kjt->device(), cuda);
  EXPECT_TRUE(kjt->values().is_cuda());
  EXPECT_TRUE(kjt->lengths().is_cuda());
  EXPECT_TRUE(kjt->weights()->is_cuda());
  ExpectSameKjt(kjt->To(at::kCPU), ExampleKjt(/*weighted=*/true));
  FeatureDict back = FeatureDict::FromKeyedJaggedTensor(*kjt);
  EXPECT_TRUE(back.At(1).values().is_cuda());
  // The same features as the CPU dict's round trip (lengths now int64).
  absl::StatusOr<KeyedJaggedTensor> cpu_kjt = cpu.ToKeyedJaggedTensor();
  ASSERT_TRUE(cpu_kjt.ok()) << cpu_kjt.status();
  ExpectSameDict(back, FeatureDict::FromKeyedJaggedTensor(*cpu_kjt));

  // A feature on another device is refused, naming it.
  absl::Status status = gpu.Add(
      "f3", Jagged({1}, {1, 0, 0}, at::kLong, std::vector<float>{1.0f}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("feature 'f3' is on cpu, the others on cuda:0"));
}

}  // namespace
}  // namespace deltastream
