// Batch::ConvertSparseDict: a feature-dict batch becomes the same batch with
// a KeyedJaggedTensor; an invalid dict is refused and changes nothing.
#include "trainer/data/batch.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/testing/tensor_values.h"

namespace deltastream {
namespace {

// Two examples: feature "a" {1}, {2, 3}; feature "b" {}, {4}.
Batch DictBatch() {
  Batch batch;
  batch.dense = at::zeros({2, 3});
  batch.labels = at::zeros({2});
  FeatureDict features;
  EXPECT_TRUE(
      features.Add("a", *JaggedTensor::FromLengths(Ids({1, 2, 3}), Ids({1, 2})))
          .ok());
  EXPECT_TRUE(
      features.Add("b", *JaggedTensor::FromLengths(Ids({4}), Ids({0, 1})))
          .ok());
  batch.sparse_dict = std::move(features);
  return batch;
}

TEST(BatchTest, ConvertSparseDictBuildsTheKeyedJaggedTensor) {
  Batch batch = DictBatch();
  ASSERT_TRUE(batch.ConvertSparseDict().ok());
  EXPECT_FALSE(batch.sparse_dict.has_value());
  EXPECT_EQ(batch.sparse.keys(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(batch.sparse.stride(), 2);
  EXPECT_EQ(Longs(batch.sparse.values()), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(Longs(batch.sparse.lengths()), (std::vector<int64_t>{1, 2, 0, 1}));
  // Without a dict: nothing to do.
  ASSERT_TRUE(batch.ConvertSparseDict().ok());
  EXPECT_EQ(Longs(batch.sparse.values()), (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(BatchTest, AnInvalidDictIsRefusedAndKept) {
  Batch batch;
  batch.labels = at::zeros({2});
  FeatureDict features;
  ASSERT_TRUE(features
                  .Add("a", *JaggedTensor::FromLengths(
                                at::ones({3}, at::kFloat), Ids({1, 2})))
                  .ok());
  batch.sparse_dict = std::move(features);
  const absl::Status status = batch.ConvertSparseDict();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr("sparse_dict"));
  ASSERT_TRUE(batch.sparse_dict.has_value());
  EXPECT_EQ(batch.sparse_dict->keys(), (std::vector<std::string>{"a"}));
  EXPECT_EQ(batch.sparse.num_keys(), 0);
}

TEST(BatchTest, ExamplesNeedTheConvertedFeatures) {
  Batch batch = DictBatch();
  EXPECT_EQ(batch.Examples(0, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(batch.ConvertSparseDict().ok());
  absl::StatusOr<Batch> first = batch.Examples(0, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Longs(first->sparse.values()), (std::vector<int64_t>{1}));
}

}  // namespace
}  // namespace deltastream
