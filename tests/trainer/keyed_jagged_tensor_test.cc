#include "trainer/sparse/keyed_jagged_tensor.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace deltastream {
namespace {

std::vector<int64_t> ToVector(const at::Tensor& t) {
  at::Tensor c = t.to(at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Two features over a batch of 3:
//   f1: [1, 2], [], [3]      f2: [4], [5, 6], [7]
KeyedJaggedTensor Example(at::Tensor weights = at::Tensor()) {
  auto kjt = KeyedJaggedTensor::FromLengths(
      {"f1", "f2"}, at::arange(1, 8, at::kLong),
      at::tensor({2, 0, 1, 1, 2, 1}, at::kInt), weights);
  EXPECT_TRUE(kjt.ok()) << kjt.status();
  return *std::move(kjt);
}

TEST(KeyedJaggedTensorTest, PerKeyAccessFromLengths) {
  KeyedJaggedTensor kjt = Example();
  EXPECT_EQ(kjt.stride(), 3);
  EXPECT_EQ(kjt.length_per_key(), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(kjt.offset_per_key(), (std::vector<int64_t>{0, 3, 7}));
  EXPECT_EQ(ToVector(kjt.offsets()),
            (std::vector<int64_t>{0, 2, 2, 3, 4, 6, 7}));
  EXPECT_EQ(ToVector(kjt.ValuesOf(0)), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ToVector(kjt.ValuesOf(1)), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(ToVector(kjt.LengthsOf(1)), (std::vector<int64_t>{1, 2, 1}));
  EXPECT_EQ(*kjt.KeyIndex("f2"), 1);
  EXPECT_EQ(kjt.KeyIndex("f9").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(kjt.WeightsOf(0).defined());
  // Per-key values are views, not copies.
  EXPECT_EQ(kjt.ValuesOf(1).data_ptr<int64_t>(),
            kjt.values().data_ptr<int64_t>() + 3);
}

TEST(KeyedJaggedTensorTest, FromOffsetsEqualsFromLengthsAndCarriesWeights) {
  at::Tensor weights = at::linspace(0.1, 0.7, 7);
  auto kjt = KeyedJaggedTensor::FromOffsets(
      {"f1", "f2"}, at::arange(1, 8, at::kLong),
      at::tensor({0, 2, 2, 3, 4, 6, 7}, at::kLong), weights);
  ASSERT_TRUE(kjt.ok()) << kjt.status();
  KeyedJaggedTensor from_lengths = Example(weights);
  EXPECT_EQ(ToVector(kjt->lengths()), ToVector(from_lengths.lengths()));
  EXPECT_TRUE(at::equal(kjt->WeightsOf(1), weights.narrow(0, 3, 4)));
}

TEST(KeyedJaggedTensorTest, EmptyKeysAndZeroLengths) {
  auto empty = KeyedJaggedTensor::FromLengths({}, at::empty({0}, at::kLong),
                                              at::empty({0}, at::kLong));
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->num_keys(), 0);
  auto zeros = KeyedJaggedTensor::FromLengths({"a"}, at::empty({0}, at::kLong),
                                              at::zeros({4}, at::kLong));
  ASSERT_TRUE(zeros.ok());
  EXPECT_EQ(zeros->stride(), 4);
  EXPECT_EQ(zeros->ValuesOf(0).numel(), 0);
}

TEST(KeyedJaggedTensorTest, InvalidInputIsAnErrorNamingTheNumber) {
  const at::Tensor values = at::arange(1, 8, at::kLong);
  struct Case {
    absl::StatusOr<KeyedJaggedTensor> result;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back(
      {KeyedJaggedTensor::FromLengths({"f1", "f2"}, values,
                                      at::tensor({2, 0, 1, 1, 2, 2}, at::kInt)),
       "sum to 8"});
  cases.push_back({KeyedJaggedTensor::FromLengths(
                       {"f1", "f2"}, values, at::tensor({3, 4, 0}, at::kInt)),
                   "3 lengths"});
  cases.push_back({KeyedJaggedTensor::FromLengths(
                       {"f1"}, values, at::tensor({8, -1}, at::kInt)),
                   "-1"});
  cases.push_back({KeyedJaggedTensor::FromLengths({"f1", "f1"}, values,
                                                  at::tensor({3, 4}, at::kInt)),
                   "twice"});
  cases.push_back({KeyedJaggedTensor::FromLengths({"f1"}, values.to(at::kFloat),
                                                  at::tensor({7}, at::kInt)),
                   "int64"});
  cases.push_back(
      {KeyedJaggedTensor::FromLengths({"f1"}, values, at::tensor({7}, at::kInt),
                                      at::ones({6})),
       "one per value (7)"});
  cases.push_back({KeyedJaggedTensor::FromLengths({"f1", "f2"}, values,
                                                  at::tensor({3, 4}, at::kInt),
                                                  at::Tensor(), /*stride=*/2),
                   "stride 2"});
  cases.push_back({KeyedJaggedTensor::FromOffsets(
                       {"f1"}, values, at::tensor({1, 7}, at::kLong)),
                   "start at 0"});
  for (Case& c : cases) {
    ASSERT_FALSE(c.result.ok()) << c.message;
    EXPECT_EQ(c.result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.result.status().message().find(c.message), std::string::npos)
        << c.result.status().message();
  }
}

}  // namespace
}  // namespace deltastream
