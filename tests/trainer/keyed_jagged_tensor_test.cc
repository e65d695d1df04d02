#include "trainer/sparse/keyed_jagged_tensor.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/tensor_values.h"
#include "tests/trainer/sparse_expectations.h"
#include "trainer/sparse/jagged_tensor.h"

namespace deltastream {
namespace {

using ::deltastream::testing::ExpectSameKjt;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Two features over a batch of 3:
//   f1: [1, 2], [], [3]      f2: [4], [5, 6], [7]
// weighted, when asked, with 0.1 .. 0.7 (one per value, in order).
at::Tensor ExampleWeights() { return at::linspace(0.1, 0.7, 7); }

KeyedJaggedTensor Example(bool weighted = false) {
  std::optional<at::Tensor> weights;
  if (weighted) weights = ExampleWeights();
  absl::StatusOr<KeyedJaggedTensor> kjt = KeyedJaggedTensor::FromLengths(
      {"f1", "f2"}, at::arange(1, 8, at::kLong),
      at::tensor({2, 0, 1, 1, 2, 1}, at::kInt), weights);
  EXPECT_TRUE(kjt.ok()) << kjt.status();
  return *std::move(kjt);
}

// Three features over a batch of 2, weighted:
//   a: [10], [11, 12]    b: [], []    c: [13, 14, 15], [16]
KeyedJaggedTensor ThreeKeys() {
  absl::StatusOr<KeyedJaggedTensor> kjt = KeyedJaggedTensor::FromLengths(
      {"a", "b", "c"}, at::arange(10, 17, at::kLong),
      at::tensor({1, 2, 0, 0, 3, 1}, at::kLong), at::arange(0, 7, at::kFloat));
  EXPECT_TRUE(kjt.ok()) << kjt.status();
  return *std::move(kjt);
}

// ---------------------------------------------------------------------------
// Construction

TEST(KeyedJaggedTensorTest, FromLengthsComputesOffsetsAndPerKeyTotals) {
  KeyedJaggedTensor kjt = Example();
  EXPECT_THAT(kjt.keys(), ElementsAre("f1", "f2"));
  EXPECT_EQ(kjt.num_keys(), 2);
  EXPECT_EQ(kjt.stride(), 3);
  EXPECT_EQ(Longs(kjt.values()), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(Longs(kjt.lengths()), (std::vector<int64_t>{2, 0, 1, 1, 2, 1}));
  EXPECT_EQ(Longs(kjt.offsets()), (std::vector<int64_t>{0, 2, 2, 3, 4, 6, 7}));
  // Offsets follow the lengths' dtype, as in TorchRec.
  EXPECT_EQ(kjt.lengths().scalar_type(), at::kInt);
  EXPECT_EQ(kjt.offsets().scalar_type(), at::kInt);
  EXPECT_EQ(kjt.length_per_key(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(kjt.offset_per_key(), (std::vector<int64_t>{0, 3, 7}));
  EXPECT_FALSE(kjt.has_weights());
  EXPECT_FALSE(kjt.weights().has_value());
  EXPECT_EQ(kjt.device(), at::Device(at::kCPU));
}

TEST(KeyedJaggedTensorTest, ExplicitStrideIsAccepted) {
  absl::StatusOr<KeyedJaggedTensor> kjt = KeyedJaggedTensor::FromLengths(
      {"f1", "f2"}, at::arange(1, 8, at::kLong),
      at::tensor({2, 0, 1, 1, 2, 1}, at::kLong), std::nullopt, /*stride=*/3);
  ASSERT_TRUE(kjt.ok()) << kjt.status();
  EXPECT_EQ(kjt->stride(), 3);
  EXPECT_EQ(kjt->offsets().scalar_type(), at::kLong);
}

TEST(KeyedJaggedTensorTest, FromOffsetsEqualsFromLengths) {
  at::Tensor offsets = at::tensor({0, 2, 2, 3, 4, 6, 7}, at::kInt);
  absl::StatusOr<KeyedJaggedTensor> kjt = KeyedJaggedTensor::FromOffsets(
      {"f1", "f2"}, at::arange(1, 8, at::kLong), offsets, ExampleWeights());
  ASSERT_TRUE(kjt.ok()) << kjt.status();
  ExpectSameKjt(*kjt, Example(/*weighted=*/true));
  // The offsets are kept as given.
  EXPECT_TRUE(kjt->offsets().is_same(offsets));
  EXPECT_EQ(kjt->lengths().scalar_type(), at::kInt);
}

// Offsets kept as given may be strided: Examples reads them as their
// values, not as the memory behind them.
TEST(KeyedJaggedTensorTest, ExamplesOfStridedOffsets) {
  const at::Tensor every_other =
      at::tensor({0, 9, 2, 9, 2, 9, 3, 9, 4, 9, 6, 9, 7, 9}, at::kLong)
          .slice(0, 0, 14, 2);
  absl::StatusOr<KeyedJaggedTensor> strided = KeyedJaggedTensor::FromOffsets(
      {"f1", "f2"}, at::arange(1, 8, at::kLong), every_other, ExampleWeights());
  ASSERT_TRUE(strided.ok()) << strided.status();
  absl::StatusOr<KeyedJaggedTensor> dense = KeyedJaggedTensor::FromOffsets(
      {"f1", "f2"}, at::arange(1, 8, at::kLong), every_other.contiguous(),
      ExampleWeights());
  ASSERT_TRUE(dense.ok()) << dense.status();
  for (const auto& [begin, end] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 3}, {2, 3}}) {
    absl::StatusOr<KeyedJaggedTensor> got = strided->Examples(begin, end);
    ASSERT_TRUE(got.ok()) << got.status();
    absl::StatusOr<KeyedJaggedTensor> want = dense->Examples(begin, end);
    ASSERT_TRUE(want.ok()) << want.status();
    ExpectSameKjt(*got, *want);
  }
}

// A weighted tensor of no keys (SplitByKeys of an empty group keeps the
// stride and the weights): its examples are a status, not an exception.
TEST(KeyedJaggedTensorTest, ExamplesOfAWeightedTensorOfNoKeys) {
  absl::StatusOr<KeyedJaggedTensor> none = KeyedJaggedTensor::FromLengths(
      {}, at::empty({0}, at::kLong), at::empty({0}, at::kLong),
      at::empty({0}, at::kFloat), /*stride=*/4);
  ASSERT_TRUE(none.ok()) << none.status();
  absl::StatusOr<KeyedJaggedTensor> part = none->Examples(0, 2);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->stride(), 2);
  EXPECT_EQ(part->num_keys(), 0);
  ASSERT_TRUE(part->has_weights());
  EXPECT_EQ(part->weights()->numel(), 0);
}

TEST(KeyedJaggedTensorTest, UndefinedWeightsMeanUnweighted) {
  absl::StatusOr<KeyedJaggedTensor> kjt = KeyedJaggedTensor::FromLengths(
      {"f"}, Ids({1, 2}), at::tensor({2}, at::kLong), at::Tensor());
  ASSERT_TRUE(kjt.ok()) << kjt.status();
  EXPECT_FALSE(kjt->has_weights());
}

TEST(KeyedJaggedTensorTest, EmptyKeysAndZeroLengths) {
  absl::StatusOr<KeyedJaggedTensor> empty = KeyedJaggedTensor::FromLengths(
      {}, at::empty({0}, at::kLong), at::empty({0}, at::kLong));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->num_keys(), 0);
  EXPECT_EQ(empty->stride(), 0);
  EXPECT_THAT(empty->length_per_key(), IsEmpty());
  EXPECT_THAT(empty->offset_per_key(), ElementsAre(0));
  EXPECT_EQ(Longs(empty->offsets()), (std::vector<int64_t>{0}));

  // No keys, but a batch size all the same.
  absl::StatusOr<KeyedJaggedTensor> no_keys = KeyedJaggedTensor::FromLengths(
      {}, at::empty({0}, at::kLong), at::empty({0}, at::kInt), std::nullopt,
      /*stride=*/5);
  ASSERT_TRUE(no_keys.ok()) << no_keys.status();
  EXPECT_EQ(no_keys->stride(), 5);

  absl::StatusOr<KeyedJaggedTensor> zeros = KeyedJaggedTensor::FromLengths(
      {"a", "b"}, at::empty({0}, at::kLong), at::zeros({8}, at::kLong));
  ASSERT_TRUE(zeros.ok()) << zeros.status();
  EXPECT_EQ(zeros->stride(), 4);
  EXPECT_EQ(zeros->length_per_key(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(zeros->ValuesOf(1).numel(), 0);
  absl::StatusOr<JaggedTensor> b = zeros->Get("b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Longs(b->lengths()), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(Longs(b->offsets()), (std::vector<int64_t>{0, 0, 0, 0, 0}));

  // Keys with a batch of 0.
  absl::StatusOr<KeyedJaggedTensor> no_batch = KeyedJaggedTensor::FromLengths(
      {"a", "b"}, at::empty({0}, at::kLong), at::empty({0}, at::kLong));
  ASSERT_TRUE(no_batch.ok()) << no_batch.status();
  EXPECT_EQ(no_batch->stride(), 0);
  EXPECT_EQ(no_batch->length_per_key(), (std::vector<int64_t>{0, 0}));

  KeyedJaggedTensor defaulted;
  EXPECT_EQ(defaulted.num_keys(), 0);
  EXPECT_EQ(defaulted.stride(), 0);
  EXPECT_EQ(defaulted.values().numel(), 0);
  EXPECT_EQ(Longs(defaulted.offsets()), (std::vector<int64_t>{0}));
  EXPECT_THAT(defaulted.offset_per_key(), ElementsAre(0));
}

// ---------------------------------------------------------------------------
// Validation: every error is InvalidArgument naming the offending number.

struct InvalidCase {
  std::string name;
  absl::StatusOr<KeyedJaggedTensor> result;
  std::string message;  // A part of the expected message.
};

TEST(KeyedJaggedTensorTest, InvalidInputIsAnErrorNamingTheNumber) {
  const at::Tensor values = at::arange(1, 8, at::kLong);  // 7 values.
  const std::vector<std::string> two = {"f1", "f2"};
  std::vector<InvalidCase> cases;
  cases.push_back({"sum of lengths != number of values",
                   KeyedJaggedTensor::FromLengths(
                       two, values, at::tensor({2, 0, 1, 1, 2, 2}, at::kInt)),
                   "lengths sum to 8 but there are 7 values"});
  cases.push_back({"lengths not a multiple of the keys",
                   KeyedJaggedTensor::FromLengths(
                       two, values, at::tensor({3, 4, 0}, at::kInt)),
                   "3 lengths are not a multiple of the 2 keys"});
  cases.push_back({"negative length",
                   KeyedJaggedTensor::FromLengths(
                       {"f1"}, values, at::tensor({8, -1}, at::kInt)),
                   "length -1 at position 1 is negative"});
  cases.push_back(
      {"duplicate keys",
       KeyedJaggedTensor::FromLengths({"f1", "f2", "f1"}, values,
                                      at::tensor({3, 4, 0}, at::kInt)),
       "'f1' appears twice, at positions 0 and 2"});
  cases.push_back({"empty key",
                   KeyedJaggedTensor::FromLengths({"f1", ""}, values,
                                                  at::tensor({3, 4}, at::kInt)),
                   "key at position 1 is empty"});
  cases.push_back({"float values",
                   KeyedJaggedTensor::FromLengths({"f1"}, values.to(at::kFloat),
                                                  at::tensor({7}, at::kInt)),
                   "int64"});
  cases.push_back({"int32 values",
                   KeyedJaggedTensor::FromLengths({"f1"}, values.to(at::kInt),
                                                  at::tensor({7}, at::kInt)),
                   "Int tensor of shape [7]"});
  cases.push_back({"2-D values",
                   KeyedJaggedTensor::FromLengths({"f1"}, values.view({7, 1}),
                                                  at::tensor({7}, at::kInt)),
                   "shape [7, 1]"});
  cases.push_back({"undefined values",
                   KeyedJaggedTensor::FromLengths({"f1"}, at::Tensor(),
                                                  at::tensor({7}, at::kInt)),
                   "undefined"});
  cases.push_back({"float lengths",
                   KeyedJaggedTensor::FromLengths(
                       {"f1"}, values, at::tensor({7.0}, at::kFloat)),
                   "lengths must be a 1-D int32 or int64 tensor, got Float"});
  cases.push_back({"2-D lengths",
                   KeyedJaggedTensor::FromLengths(
                       two, values, at::tensor({3, 4}, at::kLong).view({1, 2})),
                   "shape [1, 2]"});
  cases.push_back(
      {"weights size mismatch",
       KeyedJaggedTensor::FromLengths({"f1"}, values, at::tensor({7}, at::kInt),
                                      at::ones({6})),
       "one weight per value (7), got Float tensor of shape [6]"});
  cases.push_back(
      {"integer weights",
       KeyedJaggedTensor::FromLengths({"f1"}, values, at::tensor({7}, at::kInt),
                                      at::ones({7}, at::kLong)),
       "got Long tensor of shape [7]"});
  cases.push_back(
      {"stride mismatch",
       KeyedJaggedTensor::FromLengths(two, values, at::tensor({3, 4}, at::kInt),
                                      std::nullopt, /*stride=*/2),
       "stride 2 with 2 keys needs 4 lengths, got 2 lengths"});
  cases.push_back({"negative stride",
                   KeyedJaggedTensor::FromLengths({}, at::empty({0}, at::kLong),
                                                  at::empty({0}, at::kLong),
                                                  std::nullopt, /*stride=*/-3),
                   "stride must be non-negative, got -3"});
  cases.push_back(
      {"lengths but no keys",
       KeyedJaggedTensor::FromLengths({}, values, at::tensor({7}, at::kInt)),
       "1 lengths but no keys"});
  cases.push_back(
      {"int32 lengths summed without wrapping",
       KeyedJaggedTensor::FromLengths({"f1"}, at::zeros({0}, at::kLong),
                                      at::tensor({2147483647, 1}, at::kInt)),
       "lengths sum to 2147483648 but there are 0 values"});
  cases.push_back({"offsets not starting at 0",
                   KeyedJaggedTensor::FromOffsets(
                       {"f1"}, values, at::tensor({1, 7}, at::kLong)),
                   "offsets must start at 0, got 1"});
  cases.push_back({"decreasing offsets",
                   KeyedJaggedTensor::FromOffsets(
                       two, values, at::tensor({0, 5, 3, 7, 7}, at::kLong)),
                   "offsets decrease at position 2: 5 then 3"});
  cases.push_back({"offsets not ending at the values",
                   KeyedJaggedTensor::FromOffsets(
                       two, values, at::tensor({0, 2, 3}, at::kLong)),
                   "offsets end at 3 but there are 7 values"});
  cases.push_back({"empty offsets",
                   KeyedJaggedTensor::FromOffsets({"f1"}, values,
                                                  at::empty({0}, at::kLong)),
                   "offsets must hold at least the leading 0"});
  cases.push_back(
      {"offsets not a multiple of the keys",
       KeyedJaggedTensor::FromOffsets(two, values,
                                      at::tensor({0, 3, 5, 7}, at::kLong)),
       "3 lengths (from 4 offsets) are not a multiple of the 2 keys"});
  for (InvalidCase& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_FALSE(c.result.ok());
    EXPECT_EQ(c.result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.result.status().message()), HasSubstr(c.message));
  }
}

// ---------------------------------------------------------------------------
// Per-key access

TEST(KeyedJaggedTensorTest, GetReturnsEachKeysJaggedTensor) {
  KeyedJaggedTensor kjt = Example(/*weighted=*/true);
  absl::StatusOr<JaggedTensor> f1 = kjt.Get("f1");
  ASSERT_TRUE(f1.ok()) << f1.status();
  EXPECT_EQ(Longs(f1->values()), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(Longs(f1->lengths()), (std::vector<int64_t>{2, 0, 1}));
  EXPECT_EQ(Longs(f1->offsets()), (std::vector<int64_t>{0, 2, 2, 3}));
  ASSERT_TRUE(f1->has_weights());
  EXPECT_THAT(Floats(*f1->weights()),
              ::testing::Pointwise(::testing::FloatEq(),
                                   std::vector<float>{0.1f, 0.2f, 0.3f}));

  absl::StatusOr<JaggedTensor> f2 = kjt.Get("f2");
  ASSERT_TRUE(f2.ok()) << f2.status();
  EXPECT_EQ(f2->num_examples(), 3);
  EXPECT_EQ(Longs(f2->values()), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(Longs(f2->lengths()), (std::vector<int64_t>{1, 2, 1}));
  // Offsets are rebased to the key's own values.
  EXPECT_EQ(Longs(f2->offsets()), (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(f2->offsets().scalar_type(), at::kInt);
  EXPECT_THAT(Floats(*f2->weights()),
              ::testing::Pointwise(::testing::FloatEq(),
                                   std::vector<float>{0.4f, 0.5f, 0.6f, 0.7f}));

  // Values, lengths and weights are views of the KJT's tensors, not copies.
  EXPECT_EQ(f2->values().data_ptr<int64_t>(),
            kjt.values().data_ptr<int64_t>() + 3);
  EXPECT_EQ(f2->lengths().data_ptr<int32_t>(),
            kjt.lengths().data_ptr<int32_t>() + 3);
  EXPECT_EQ(f2->weights()->data_ptr<float>(),
            kjt.weights()->data_ptr<float>() + 3);
  EXPECT_EQ(kjt.ValuesOf(1).data_ptr<int64_t>(),
            kjt.values().data_ptr<int64_t>() + 3);
  EXPECT_EQ(Longs(kjt.LengthsOf(1)), (std::vector<int64_t>{1, 2, 1}));
  EXPECT_EQ(Longs(kjt.At(0).values()), (std::vector<int64_t>{1, 2, 3}));
}

TEST(KeyedJaggedTensorTest, KeyIndexAndMissingKeys) {
  KeyedJaggedTensor kjt = Example();
  EXPECT_EQ(*kjt.KeyIndex("f1"), 0);
  EXPECT_EQ(*kjt.KeyIndex("f2"), 1);
  absl::StatusOr<int64_t> missing = kjt.KeyIndex("f9");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'f9'"));
  EXPECT_EQ(kjt.Get("f9").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(kjt.WeightsOf(0).has_value());
  EXPECT_FALSE(kjt.Get("f1")->has_weights());
}

// ---------------------------------------------------------------------------
// Permute, Split, SplitByKeys, Concat

TEST(KeyedJaggedTensorTest, PermuteReordersKeysAndCarriesWeights) {
  KeyedJaggedTensor kjt = ThreeKeys();
  absl::StatusOr<KeyedJaggedTensor> permuted = kjt.Permute({2, 0, 1});
  ASSERT_TRUE(permuted.ok()) << permuted.status();
  EXPECT_THAT(permuted->keys(), ElementsAre("c", "a", "b"));
  EXPECT_EQ(permuted->stride(), 2);
  EXPECT_EQ(Longs(permuted->values()),
            (std::vector<int64_t>{13, 14, 15, 16, 10, 11, 12}));
  EXPECT_EQ(Longs(permuted->lengths()),
            (std::vector<int64_t>{3, 1, 1, 2, 0, 0}));
  EXPECT_EQ(Longs(permuted->offsets()),
            (std::vector<int64_t>{0, 3, 4, 5, 7, 7, 7}));
  EXPECT_EQ(permuted->length_per_key(), (std::vector<int64_t>{4, 3, 0}));
  EXPECT_EQ(permuted->offset_per_key(), (std::vector<int64_t>{0, 4, 7, 7}));
  EXPECT_EQ(Floats(*permuted->weights()),
            (std::vector<float>{3, 4, 5, 6, 0, 1, 2}));
  // Per-key views agree with the original's.
  for (const std::string& key : kjt.keys()) {
    EXPECT_EQ(Longs(permuted->Get(key)->values()),
              Longs(kjt.Get(key)->values()));
    EXPECT_EQ(Floats(*permuted->Get(key)->weights()),
              Floats(*kjt.Get(key)->weights()));
  }

  // The inverse permutation gives back the original.
  absl::StatusOr<KeyedJaggedTensor> back = permuted->Permute({1, 2, 0});
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameKjt(*back, kjt);
}

TEST(KeyedJaggedTensorTest, PermuteSelectsAndKeepsViewsForARun) {
  KeyedJaggedTensor kjt = ThreeKeys();
  absl::StatusOr<KeyedJaggedTensor> selected = kjt.Permute({2, 0});
  ASSERT_TRUE(selected.ok()) << selected.status();
  EXPECT_THAT(selected->keys(), ElementsAre("c", "a"));
  EXPECT_EQ(Longs(selected->values()),
            (std::vector<int64_t>{13, 14, 15, 16, 10, 11, 12}));

  absl::StatusOr<KeyedJaggedTensor> run = kjt.Permute({1, 2});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_THAT(run->keys(), ElementsAre("b", "c"));
  EXPECT_EQ(run->values().data_ptr<int64_t>(),
            kjt.values().data_ptr<int64_t>() + 3);
  EXPECT_EQ(Longs(run->offsets()), (std::vector<int64_t>{0, 0, 0, 3, 4}));

  absl::StatusOr<KeyedJaggedTensor> none = kjt.Permute({});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->num_keys(), 0);
  EXPECT_EQ(none->stride(), 2);
  EXPECT_EQ(none->values().numel(), 0);
  EXPECT_EQ(Longs(none->offsets()), (std::vector<int64_t>{0}));
}

TEST(KeyedJaggedTensorTest, PermuteRejectsBadIndices) {
  KeyedJaggedTensor kjt = ThreeKeys();
  absl::StatusOr<KeyedJaggedTensor> out_of_range = kjt.Permute({0, 3});
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out_of_range.status().message()),
              HasSubstr("key index 3 at position 1 is out of range for 3"));
  absl::StatusOr<KeyedJaggedTensor> negative = kjt.Permute({-1});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(negative.status().message()), HasSubstr("-1"));
  absl::StatusOr<KeyedJaggedTensor> repeated = kjt.Permute({1, 0, 1});
  EXPECT_EQ(repeated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(repeated.status().message()),
              HasSubstr("key index 1 appears twice (again at position 2)"));
}

TEST(KeyedJaggedTensorTest, SplitGivesViewsAndConcatRestores) {
  KeyedJaggedTensor kjt = ThreeKeys();
  absl::StatusOr<std::vector<KeyedJaggedTensor>> parts = kjt.Split({1, 0, 2});
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 3u);
  const KeyedJaggedTensor& a = (*parts)[0];
  const KeyedJaggedTensor& nothing = (*parts)[1];
  const KeyedJaggedTensor& bc = (*parts)[2];
  EXPECT_THAT(a.keys(), ElementsAre("a"));
  EXPECT_EQ(Longs(a.values()), (std::vector<int64_t>{10, 11, 12}));
  EXPECT_EQ(Longs(a.offsets()), (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(nothing.num_keys(), 0);
  EXPECT_EQ(nothing.stride(), 2);
  EXPECT_THAT(bc.keys(), ElementsAre("b", "c"));
  EXPECT_EQ(bc.stride(), 2);
  EXPECT_EQ(Longs(bc.lengths()), (std::vector<int64_t>{0, 0, 3, 1}));
  EXPECT_EQ(Longs(bc.offsets()), (std::vector<int64_t>{0, 0, 0, 3, 4}));
  EXPECT_EQ(bc.length_per_key(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(bc.offset_per_key(), (std::vector<int64_t>{0, 0, 4}));
  EXPECT_EQ(Floats(*bc.weights()), (std::vector<float>{3, 4, 5, 6}));
  // Views: no copy of values or weights.
  EXPECT_EQ(bc.values().data_ptr<int64_t>(),
            kjt.values().data_ptr<int64_t>() + 3);
  EXPECT_EQ(bc.weights()->data_ptr<float>(),
            kjt.weights()->data_ptr<float>() + 3);

  absl::StatusOr<KeyedJaggedTensor> whole = KeyedJaggedTensor::Concat(*parts);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ExpectSameKjt(*whole, kjt);
}

TEST(KeyedJaggedTensorTest, SplitRejectsBadSegments) {
  KeyedJaggedTensor kjt = ThreeKeys();
  absl::StatusOr<std::vector<KeyedJaggedTensor>> negative =
      kjt.Split({2, -1, 2});
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(negative.status().message()),
              HasSubstr("segment 1 is negative: -1"));
  absl::StatusOr<std::vector<KeyedJaggedTensor>> short_by_one =
      kjt.Split({1, 1});
  EXPECT_EQ(short_by_one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(short_by_one.status().message()),
              HasSubstr("segments sum to 2 but there are 3 keys"));
  absl::StatusOr<std::vector<KeyedJaggedTensor>> too_many = kjt.Split({2, 2});
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_many.status().message()),
              HasSubstr("segment 1 is 2 with 1 keys left"));
}

TEST(KeyedJaggedTensorTest, SplitByKeysThenConcatAndPermuteRestores) {
  KeyedJaggedTensor kjt = ThreeKeys();
  absl::StatusOr<std::vector<KeyedJaggedTensor>> parts =
      kjt.SplitByKeys({{"c", "a"}, {"b"}});
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_THAT((*parts)[0].keys(), ElementsAre("c", "a"));
  EXPECT_EQ(Longs((*parts)[0].values()),
            (std::vector<int64_t>{13, 14, 15, 16, 10, 11, 12}));
  EXPECT_THAT((*parts)[1].keys(), ElementsAre("b"));
  EXPECT_EQ((*parts)[1].values().numel(), 0);

  absl::StatusOr<KeyedJaggedTensor> joined = KeyedJaggedTensor::Concat(*parts);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_THAT(joined->keys(), ElementsAre("c", "a", "b"));
  absl::StatusOr<KeyedJaggedTensor> back = joined->Permute({1, 2, 0});
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameKjt(*back, kjt);
}

TEST(KeyedJaggedTensorTest, SplitByKeysRejectsUnknownAndRepeatedKeys) {
  KeyedJaggedTensor kjt = ThreeKeys();
  absl::StatusOr<std::vector<KeyedJaggedTensor>> unknown =
      kjt.SplitByKeys({{"a"}, {"b", "zz"}});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("'zz' among 3 keys (group 1)"));
  absl::StatusOr<std::vector<KeyedJaggedTensor>> repeated =
      kjt.SplitByKeys({{"a", "a"}});
  EXPECT_EQ(repeated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(repeated.status().message()),
              HasSubstr("'a' appears twice in group 0"));
}

TEST(KeyedJaggedTensorTest, ConcatJoinsKeysAndPromotesLengths) {
  absl::StatusOr<KeyedJaggedTensor> x = KeyedJaggedTensor::FromLengths(
      {"x"}, Ids({1, 2}), at::tensor({2, 0}, at::kInt));
  absl::StatusOr<KeyedJaggedTensor> y = KeyedJaggedTensor::FromLengths(
      {"y", "z"}, Ids({3, 4, 5}), at::tensor({0, 1, 1, 1}, at::kLong));
  ASSERT_TRUE(x.ok() && y.ok());
  // A part without keys (here default-constructed) is ignored.
  absl::StatusOr<KeyedJaggedTensor> xyz =
      KeyedJaggedTensor::Concat({*x, KeyedJaggedTensor(), *y});
  ASSERT_TRUE(xyz.ok()) << xyz.status();
  EXPECT_THAT(xyz->keys(), ElementsAre("x", "y", "z"));
  EXPECT_EQ(xyz->stride(), 2);
  EXPECT_EQ(Longs(xyz->values()), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(Longs(xyz->lengths()), (std::vector<int64_t>{2, 0, 0, 1, 1, 1}));
  EXPECT_EQ(xyz->lengths().scalar_type(), at::kLong);
  EXPECT_EQ(Longs(xyz->offsets()), (std::vector<int64_t>{0, 2, 2, 2, 3, 4, 5}));
  EXPECT_EQ(xyz->length_per_key(), (std::vector<int64_t>{2, 1, 2}));
  EXPECT_EQ(xyz->offset_per_key(), (std::vector<int64_t>{0, 2, 3, 5}));
  EXPECT_FALSE(xyz->has_weights());
  EXPECT_EQ(Longs(xyz->Get("z")->values()), (std::vector<int64_t>{4, 5}));

  // int32 lengths throughout stay int32.
  absl::StatusOr<KeyedJaggedTensor> xx = KeyedJaggedTensor::Concat(
      {*x, *KeyedJaggedTensor::FromLengths({"w"}, Ids({9}),
                                           at::tensor({0, 1}, at::kInt))});
  ASSERT_TRUE(xx.ok()) << xx.status();
  EXPECT_EQ(xx->lengths().scalar_type(), at::kInt);
  EXPECT_EQ(Longs(xx->offsets()), (std::vector<int64_t>{0, 2, 2, 2, 3}));

  // One part: itself.
  absl::StatusOr<KeyedJaggedTensor> alone = KeyedJaggedTensor::Concat({*y});
  ASSERT_TRUE(alone.ok()) << alone.status();
  ExpectSameKjt(*alone, *y);
}

TEST(KeyedJaggedTensorTest, ConcatCarriesWeights) {
  KeyedJaggedTensor kjt = ThreeKeys();
  absl::StatusOr<KeyedJaggedTensor> c = kjt.Permute({2});
  absl::StatusOr<KeyedJaggedTensor> ab = kjt.Permute({0, 1});
  ASSERT_TRUE(c.ok() && ab.ok());
  absl::StatusOr<KeyedJaggedTensor> cab = KeyedJaggedTensor::Concat({*c, *ab});
  ASSERT_TRUE(cab.ok()) << cab.status();
  EXPECT_EQ(Floats(*cab->weights()), (std::vector<float>{3, 4, 5, 6, 0, 1, 2}));

  // Mixed float and double weights: the promoted type.
  absl::StatusOr<KeyedJaggedTensor> d = KeyedJaggedTensor::FromLengths(
      {"d"}, Ids({1}), at::tensor({1, 0}, at::kLong),
      at::ones({1}, at::kDouble));
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<KeyedJaggedTensor> cd = KeyedJaggedTensor::Concat({*c, *d});
  ASSERT_TRUE(cd.ok()) << cd.status();
  EXPECT_EQ(cd->weights()->scalar_type(), at::kDouble);
  EXPECT_EQ(Floats(*cd->weights()), (std::vector<float>{3, 4, 5, 6, 1}));
}

TEST(KeyedJaggedTensorTest, ConcatRejectsMismatchedParts) {
  KeyedJaggedTensor example = Example();  // f1, f2; stride 3; unweighted.
  absl::StatusOr<KeyedJaggedTensor> stride2 = KeyedJaggedTensor::FromLengths(
      {"g"}, Ids({1}), at::tensor({1, 0}, at::kLong));
  absl::StatusOr<KeyedJaggedTensor> weighted = KeyedJaggedTensor::FromLengths(
      {"h"}, Ids({1}), at::tensor({1, 0, 0}, at::kLong), at::ones({1}));
  absl::StatusOr<KeyedJaggedTensor> f2 = KeyedJaggedTensor::FromLengths(
      {"f2"}, Ids({1}), at::tensor({1, 0, 0}, at::kLong));
  ASSERT_TRUE(stride2.ok() && weighted.ok() && f2.ok());

  std::vector<InvalidCase> cases;
  cases.push_back({"no parts", KeyedJaggedTensor::Concat({}),
                   "at least one KeyedJaggedTensor"});
  cases.push_back({"strides differ",
                   KeyedJaggedTensor::Concat({example, *stride2}),
                   "part 1 has stride 2 but part 0 has stride 3"});
  cases.push_back({"weighted and unweighted",
                   KeyedJaggedTensor::Concat({example, *weighted}),
                   "part 1 is weighted but part 0 is unweighted"});
  cases.push_back({"duplicate key", KeyedJaggedTensor::Concat({example, *f2}),
                   "'f2' appears in parts 0 and 1"});
  for (InvalidCase& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_FALSE(c.result.ok());
    EXPECT_EQ(c.result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.result.status().message()), HasSubstr(c.message));
  }
}

// ---------------------------------------------------------------------------
// Devices

TEST(KeyedJaggedTensorTest, ToCpuKeepsEverything) {
  KeyedJaggedTensor kjt = Example(/*weighted=*/true);
  KeyedJaggedTensor moved = kjt.To(at::kCPU);
  ExpectSameKjt(moved, kjt);
  // Already there: no copy.
  EXPECT_TRUE(moved.values().is_same(kjt.values()));
}

TEST(KeyedJaggedTensorTest, ToCudaCarriesHostMetadata) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  KeyedJaggedTensor kjt = ThreeKeys();
  KeyedJaggedTensor gpu = kjt.To(at::Device(at::kCUDA, 0));
  EXPECT_TRUE(gpu.values().is_cuda());
  EXPECT_TRUE(gpu.lengths().is_cuda());
  EXPECT_TRUE(gpu.offsets().is_cuda());
  EXPECT_TRUE(gpu.weights()->is_cuda());
  EXPECT_EQ(gpu.length_per_key(), kjt.length_per_key());
  absl::StatusOr<JaggedTensor> c = gpu.Get("c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->values().is_cuda());
  EXPECT_EQ(Longs(c->values()), (std::vector<int64_t>{13, 14, 15, 16}));
  EXPECT_EQ(Longs(c->offsets()), (std::vector<int64_t>{0, 3, 4}));
  absl::StatusOr<KeyedJaggedTensor> permuted = gpu.Permute({2, 0, 1});
  ASSERT_TRUE(permuted.ok()) << permuted.status();
  EXPECT_TRUE(permuted->values().is_cuda());
  absl::StatusOr<KeyedJaggedTensor> back = permuted->Permute({1, 2, 0});
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameKjt(back->To(at::kCPU), kjt);

  // Built on the GPU directly (one host read of the lengths).
  absl::StatusOr<KeyedJaggedTensor> direct = KeyedJaggedTensor::FromLengths(
      kjt.keys(), gpu.values(), gpu.lengths(), *gpu.weights());
  ASSERT_TRUE(direct.ok()) << direct.status();
  ExpectSameKjt(*direct, kjt);

  // Tensors on different devices are refused.
  absl::StatusOr<KeyedJaggedTensor> mixed =
      KeyedJaggedTensor::FromLengths(kjt.keys(), gpu.values(), kjt.lengths());
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mixed.status().message()),
              HasSubstr("lengths are on cpu but values on cuda:0"));
}

// ---------------------------------------------------------------------------
// JaggedTensor on its own

TEST(JaggedTensorTest, FromLengthsAndFromOffsetsAgree) {
  at::Tensor values = at::arange(12, at::kFloat).view({4, 3});  // 4 rows.
  absl::StatusOr<JaggedTensor> a = JaggedTensor::FromLengths(
      values, at::tensor({1, 0, 3}, at::kLong), at::ones({4}));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->num_examples(), 3);
  EXPECT_EQ(Longs(a->offsets()), (std::vector<int64_t>{0, 1, 1, 4}));
  EXPECT_TRUE(a->has_weights());
  absl::StatusOr<JaggedTensor> b =
      JaggedTensor::FromOffsets(values, at::tensor({0, 1, 1, 4}, at::kInt));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Longs(b->lengths()), (std::vector<int64_t>{1, 0, 3}));
  EXPECT_FALSE(b->has_weights());
  EXPECT_TRUE(b->values().is_same(values));

  JaggedTensor empty;
  EXPECT_EQ(empty.num_examples(), 0);
  EXPECT_EQ(Longs(empty.offsets()), (std::vector<int64_t>{0}));
  EXPECT_TRUE(a->To(at::kCPU).values().is_same(values));
}

TEST(JaggedTensorTest, InvalidInputIsAnError) {
  const at::Tensor values = at::arange(5, at::kLong);
  struct Case {
    absl::StatusOr<JaggedTensor> result;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back(
      {JaggedTensor::FromLengths(values, at::tensor({2, 2}, at::kLong)),
       "lengths sum to 4 but there are 5 values"});
  cases.push_back(
      {JaggedTensor::FromLengths(values, at::tensor({6, -1}, at::kLong)),
       "length -1 at position 1"});
  cases.push_back({JaggedTensor::FromLengths(at::scalar_tensor(3, at::kLong),
                                             at::tensor({1}, at::kLong)),
                   "at least 1 dimension"});
  cases.push_back({JaggedTensor::FromLengths(values, at::tensor({5}, at::kLong),
                                             at::ones({4})),
                   "one weight per value (5)"});
  cases.push_back(
      {JaggedTensor::FromOffsets(values, at::tensor({0, 6}, at::kLong)),
       "offsets end at 6 but there are 5 values"});
  for (Case& c : cases) {
    SCOPED_TRACE(c.message);
    ASSERT_FALSE(c.result.ok());
    EXPECT_EQ(c.result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.result.status().message()), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace deltastream
