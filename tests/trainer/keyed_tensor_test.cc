#include "trainer/sparse/keyed_tensor.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tests/testing/tensor_values.h"

namespace deltastream {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A batch of 2, keys "a" (width 1), "b" (width 2), "c" (width 3):
//   values = [[0, 1, 2, 3, 4, 5],
//             [6, 7, 8, 9, 10, 11]]
at::Tensor ExampleValues() { return at::arange(12, at::kFloat).view({2, 6}); }

KeyedTensor Example(at::Tensor values = ExampleValues()) {
  absl::StatusOr<KeyedTensor> kt =
      KeyedTensor::Create({"a", "b", "c"}, {1, 2, 3}, values);
  EXPECT_TRUE(kt.ok()) << kt.status();
  return *std::move(kt);
}

// The columns [begin, begin + count) of ExampleValues().
at::Tensor Columns(int64_t begin, int64_t count) {
  return ExampleValues().narrow(1, begin, count);
}

// ---------------------------------------------------------------------------
// Construction

TEST(KeyedTensorTest, CreateComputesOffsets) {
  at::Tensor values = ExampleValues();
  KeyedTensor kt = Example(values);
  EXPECT_THAT(kt.keys(), ElementsAre("a", "b", "c"));
  EXPECT_EQ(kt.num_keys(), 3);
  EXPECT_EQ(kt.key_dim(), 1);
  EXPECT_EQ(kt.length_per_key(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(kt.offset_per_key(), (std::vector<int64_t>{0, 1, 3, 6}));
  // Values are kept as given, not copied.
  EXPECT_TRUE(kt.values().is_same(values));
}

TEST(KeyedTensorTest, DefaultIsEmpty) {
  KeyedTensor kt;
  EXPECT_EQ(kt.num_keys(), 0);
  EXPECT_THAT(kt.keys(), IsEmpty());
  EXPECT_THAT(kt.length_per_key(), IsEmpty());
  EXPECT_THAT(kt.offset_per_key(), ElementsAre(0));
  EXPECT_EQ(kt.key_dim(), 1);
  ASSERT_TRUE(kt.values().defined());
  EXPECT_EQ(kt.values().sizes().vec(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(kt.values().scalar_type(), at::kFloat);
  EXPECT_EQ(kt.KeyIndex("a").status().code(), absl::StatusCode::kNotFound);
}

TEST(KeyedTensorTest, NoKeysAndZeroWidthKeys) {
  absl::StatusOr<KeyedTensor> none =
      KeyedTensor::Create({}, {}, at::zeros({4, 0}));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->num_keys(), 0);
  EXPECT_THAT(none->offset_per_key(), ElementsAre(0));

  absl::StatusOr<KeyedTensor> zero =
      KeyedTensor::Create({"x", "y"}, {0, 2}, at::ones({4, 2}));
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->offset_per_key(), (std::vector<int64_t>{0, 0, 2}));
  absl::StatusOr<at::Tensor> x = zero->Get("x");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->sizes().vec(), (std::vector<int64_t>{4, 0}));
}

TEST(KeyedTensorTest, KeyDimZeroAndHigherRankValues) {
  // Keys along dimension 0 of a [5, 2] tensor.
  absl::StatusOr<KeyedTensor> rows = KeyedTensor::Create(
      {"p", "q"}, {2, 3}, at::arange(10, at::kFloat).view({5, 2}),
      /*key_dim=*/0);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->key_dim(), 0);
  absl::StatusOr<at::Tensor> q = rows->Get("q");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->sizes().vec(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(Floats(*q), (std::vector<float>{4, 5, 6, 7, 8, 9}));

  // 3-D values, keys along dimension 1: every other dimension is kept.
  at::Tensor cube = at::arange(24, at::kFloat).view({2, 3, 4});
  absl::StatusOr<KeyedTensor> kt =
      KeyedTensor::Create({"u", "v"}, {1, 2}, cube);
  ASSERT_TRUE(kt.ok()) << kt.status();
  EXPECT_EQ(kt->At(1).sizes().vec(), (std::vector<int64_t>{2, 2, 4}));
  EXPECT_TRUE(at::equal(kt->At(1), cube.narrow(1, 1, 2)));
}

// ---------------------------------------------------------------------------
// Validation: every error is InvalidArgument naming the offending key/number.

TEST(KeyedTensorTest, InvalidInputIsAnErrorNamingIt) {
  const at::Tensor values = ExampleValues();  // [2, 6]
  struct Case {
    std::string name;
    absl::StatusOr<KeyedTensor> result;
    std::string message;  // A part of the expected message.
  };
  std::vector<Case> cases;
  cases.push_back({"undefined values",
                   KeyedTensor::Create({"a"}, {6}, at::Tensor()),
                   "an undefined tensor"});
  cases.push_back({"too few dimensions for key_dim 1",
                   KeyedTensor::Create({"a"}, {6}, at::ones({6})),
                   "more than key_dim (1) dimensions, got [6]"});
  cases.push_back({"too few dimensions for key_dim 2",
                   KeyedTensor::Create({"a"}, {6}, values, /*key_dim=*/2),
                   "more than key_dim (2) dimensions, got [2, 6]"});
  cases.push_back({"huge key_dim does not overflow",
                   KeyedTensor::Create({"a"}, {6}, values,
                                       std::numeric_limits<int64_t>::max()),
                   "more than key_dim (9223372036854775807) dimensions"});
  cases.push_back({"0-D values",
                   KeyedTensor::Create({}, {}, at::scalar_tensor(1.0),
                                       /*key_dim=*/0),
                   "more than key_dim (0) dimensions, got []"});
  cases.push_back({"negative key_dim",
                   KeyedTensor::Create({"a"}, {6}, values, /*key_dim=*/-1),
                   "key_dim must be >= 0, got -1"});
  cases.push_back({"keys and lengths differ in size",
                   KeyedTensor::Create({"a", "b"}, {6}, values),
                   "2 keys but 1 lengths"});
  cases.push_back({"empty key", KeyedTensor::Create({"a", ""}, {3, 3}, values),
                   "key at position 1 is empty"});
  cases.push_back({"repeated key",
                   KeyedTensor::Create({"a", "b", "a"}, {2, 2, 2}, values),
                   "key 'a' appears twice, at positions 0 and 2"});
  cases.push_back({"negative length",
                   KeyedTensor::Create({"a", "b"}, {6, -1}, values),
                   "key 'b' has negative length -1"});
  cases.push_back({"lengths sum short",
                   KeyedTensor::Create({"a", "b"}, {2, 3}, values),
                   "lengths sum to 5 but values have 6 entries along "
                   "dimension 1"});
  cases.push_back({"lengths sum past",
                   KeyedTensor::Create({"a", "b"}, {4, 3}, values),
                   "key 'b' (position 1, length 3) sum past the 6 entries"});
  cases.push_back(
      {"lengths that would overflow int64",
       KeyedTensor::Create({"a", "b"},
                           {std::numeric_limits<int64_t>::max(),
                            std::numeric_limits<int64_t>::max()},
                           values),
       "key 'a' (position 0, length 9223372036854775807) sum past"});
  cases.push_back(
      {"lengths along key_dim 0",
       KeyedTensor::Create({"a"}, {1}, values, /*key_dim=*/0),
       "lengths sum to 1 but values have 2 entries along dimension 0"});
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_FALSE(c.result.ok());
    EXPECT_EQ(c.result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.result.status().message()), HasSubstr(c.message));
  }
}

// ---------------------------------------------------------------------------
// Access

TEST(KeyedTensorTest, KeyIndexGetAndAt) {
  KeyedTensor kt = Example();
  EXPECT_EQ(*kt.KeyIndex("a"), 0);
  EXPECT_EQ(*kt.KeyIndex("c"), 2);
  absl::StatusOr<int64_t> missing = kt.KeyIndex("zz");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("no key 'zz' among 3 keys"));

  absl::StatusOr<at::Tensor> b = kt.Get("b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->sizes().vec(), (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(at::equal(*b, Columns(1, 2)));
  EXPECT_TRUE(at::equal(kt.At(0), Columns(0, 1)));
  EXPECT_TRUE(at::equal(kt.At(2), Columns(3, 3)));

  absl::StatusOr<at::Tensor> absent = kt.Get("zz");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(absent.status().message()), HasSubstr("'zz'"));
}

TEST(KeyedTensorTest, GetAndAtAreViewsSharingStorage) {
  at::Tensor values = ExampleValues();
  KeyedTensor kt = Example(values);
  at::Tensor b = *kt.Get("b");
  at::Tensor c = kt.At(2);
  EXPECT_TRUE(b.is_alias_of(values));
  EXPECT_TRUE(c.is_alias_of(values));
  EXPECT_EQ(b.data_ptr(),
            static_cast<void*>(values.data_ptr<float>() + 1));  // Column 1.

  // A write through the view shows in values(), and the reverse.
  b.fill_(-1);
  EXPECT_EQ(Floats(values), (std::vector<float>{0, -1, -1, 3, 4, 5,  //
                                                6, -1, -1, 9, 10, 11}));
  values.select(1, 5).fill_(42);
  EXPECT_EQ(Floats(c), (std::vector<float>{3, 4, 42, 9, 10, 42}));

  // Copies of a KeyedTensor share the values too.
  KeyedTensor copy = kt;  // NOLINT(performance-unnecessary-copy-initialization)
  EXPECT_TRUE(copy.values().is_same(kt.values()));
}

// ---------------------------------------------------------------------------
// Gradients

TEST(KeyedTensorTest, GradientsFlowThroughGetAndAt) {
  at::Tensor values = ExampleValues().clone().requires_grad_(true);
  KeyedTensor kt = Example(values);
  at::Tensor b = *kt.Get("b");
  EXPECT_TRUE(b.requires_grad());
  (b * 2).sum().backward();
  kt.At(2).sum().backward();
  ASSERT_TRUE(values.grad().defined());
  // 2 on b's columns, 1 on c's, 0 on a's (gradients accumulate).
  EXPECT_EQ(Floats(values.grad()), (std::vector<float>{0, 2, 2, 1, 1, 1,  //
                                                       0, 2, 2, 1, 1, 1}));
}

TEST(KeyedTensorTest, GradientsFlowThroughConcat) {
  at::Tensor left = at::ones({2, 3}).requires_grad_(true);
  at::Tensor right = at::ones({2, 2}).requires_grad_(true);
  KeyedTensor l = *KeyedTensor::Create({"a", "b"}, {1, 2}, left);
  KeyedTensor r = *KeyedTensor::Create({"c"}, {2}, right);
  absl::StatusOr<KeyedTensor> joined = KeyedTensor::Concat({l, r});
  ASSERT_TRUE(joined.ok()) << joined.status();
  // Sum a block that spans only the second part, weighted by column.
  at::Tensor c = *joined->Get("c");
  (c * at::tensor({3.0f, 5.0f})).sum().backward();
  ASSERT_TRUE(right.grad().defined());
  EXPECT_EQ(Floats(right.grad()), (std::vector<float>{3, 5, 3, 5}));
  // The first part took no part in the loss: zero or no gradient.
  if (left.grad().defined()) {
    EXPECT_EQ(left.grad().abs().sum().item<float>(), 0.0f);
  }
  // And one that spans the first.
  joined->At(1).sum().backward();
  ASSERT_TRUE(left.grad().defined());
  EXPECT_EQ(Floats(left.grad()), (std::vector<float>{0, 1, 1, 0, 1, 1}));
}

TEST(KeyedTensorTest, GradientsFlowThroughRegroup) {
  at::Tensor values = ExampleValues().clone().requires_grad_(true);
  KeyedTensor kt = Example(values);
  absl::StatusOr<std::vector<at::Tensor>> groups =
      kt.Regroup({{"c", "a"}, {"b"}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 2u);
  // Group 0: c's 3 columns, then a's.
  EXPECT_EQ((*groups)[0].sizes().vec(), (std::vector<int64_t>{2, 4}));
  (*groups)[0].select(1, 3).sum().backward();  // The "a" column.
  EXPECT_EQ(Floats(values.grad()), (std::vector<float>{1, 0, 0, 0, 0, 0,  //
                                                       1, 0, 0, 0, 0, 0}));
  values.grad().zero_();
  ((*groups)[1] * 10).sum().backward();
  EXPECT_EQ(Floats(values.grad()), (std::vector<float>{0, 10, 10, 0, 0, 0,  //
                                                       0, 10, 10, 0, 0, 0}));
}

// ---------------------------------------------------------------------------
// Concat

TEST(KeyedTensorTest, ConcatJoinsKeysInOrder) {
  KeyedTensor kt = Example();
  KeyedTensor d = *KeyedTensor::Create({"d"}, {2}, at::full({2, 2}, 100.0));
  absl::StatusOr<KeyedTensor> joined = KeyedTensor::Concat({kt, d});
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_THAT(joined->keys(), ElementsAre("a", "b", "c", "d"));
  EXPECT_EQ(joined->length_per_key(), (std::vector<int64_t>{1, 2, 3, 2}));
  EXPECT_EQ(joined->offset_per_key(), (std::vector<int64_t>{0, 1, 3, 6, 8}));
  EXPECT_EQ(joined->values().sizes().vec(), (std::vector<int64_t>{2, 8}));
  EXPECT_TRUE(at::equal(*joined->Get("c"), Columns(3, 3)));
  EXPECT_EQ(Floats(*joined->Get("d")), (std::vector<float>(4, 100.0f)));

  // One part: the same keys, sharing its values.
  absl::StatusOr<KeyedTensor> one = KeyedTensor::Concat({kt});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(one->values().is_same(kt.values()));
  EXPECT_EQ(one->keys(), kt.keys());

  // Along key_dim 0.
  KeyedTensor p = *KeyedTensor::Create({"p"}, {1}, at::zeros({1, 3}), 0);
  KeyedTensor q = *KeyedTensor::Create({"q"}, {2}, at::ones({2, 3}), 0);
  absl::StatusOr<KeyedTensor> rows = KeyedTensor::Concat({p, q});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->key_dim(), 0);
  EXPECT_EQ(rows->values().sizes().vec(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(Floats(*rows->Get("q")), (std::vector<float>(6, 1.0f)));
}

TEST(KeyedTensorTest, ConcatErrors) {
  KeyedTensor kt = Example();  // [2, 6], keys a, b, c.
  struct Case {
    std::string name;
    absl::StatusOr<KeyedTensor> result;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back(
      {"no parts", KeyedTensor::Concat({}), "Concat needs at least one part"});
  cases.push_back(
      {"key_dims differ",
       KeyedTensor::Concat(
           {kt, *KeyedTensor::Create({"d"}, {2}, at::ones({2, 6}), 0)}),
       "part 1 has key_dim 0, part 0 has 1"});
  cases.push_back(
      {"key repeated across parts",
       KeyedTensor::Concat(
           {kt, *KeyedTensor::Create({"d", "b"}, {1, 1}, at::ones({2, 2}))}),
       "key 'b' appears in parts 0 and 1"});
  cases.push_back({"batch differs",
                   KeyedTensor::Concat({kt, *KeyedTensor::Create(
                                                {"d"}, {2}, at::ones({3, 2}))}),
                   "part 1 has shape [3, 2], part 0 has [2, 6]"});
  cases.push_back(
      {"rank differs",
       KeyedTensor::Concat(
           {kt, *KeyedTensor::Create({"d"}, {2}, at::ones({2, 2, 1}))}),
       "part 1 has shape [2, 2, 1], part 0 has [2, 6]"});
  cases.push_back({"an empty default part has other dimensions",
                   KeyedTensor::Concat({kt, KeyedTensor()}),
                   "part 1 has shape [0, 0], part 0 has [2, 6]"});
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_FALSE(c.result.ok());
    EXPECT_EQ(c.result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.result.status().message()), HasSubstr(c.message));
  }
}

// ---------------------------------------------------------------------------
// Regroup

TEST(KeyedTensorTest, RegroupConcatenatesGroupsInOrder) {
  KeyedTensor kt = Example();
  absl::StatusOr<std::vector<at::Tensor>> groups =
      kt.Regroup({{"c", "a"}, {"b"}, {}, {"a", "b", "c"}, {"b", "b"}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->size(), 5u);
  EXPECT_TRUE(
      at::equal((*groups)[0], at::cat({Columns(3, 3), Columns(0, 1)}, 1)));
  EXPECT_TRUE(at::equal((*groups)[1], Columns(1, 2)));
  // An empty group: no columns, the same batch.
  EXPECT_EQ((*groups)[2].sizes().vec(), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ((*groups)[2].scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal((*groups)[3], ExampleValues()));
  // A key may repeat (as in TorchRec).
  EXPECT_TRUE(
      at::equal((*groups)[4], at::cat({Columns(1, 2), Columns(1, 2)}, 1)));

  absl::StatusOr<std::vector<at::Tensor>> none = kt.Regroup({});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_THAT(*none, IsEmpty());

  // Along key_dim 0.
  KeyedTensor rows =
      *KeyedTensor::Create({"p", "q"}, {1, 2}, at::arange(6).view({3, 2}), 0);
  absl::StatusOr<std::vector<at::Tensor>> by_row = rows.Regroup({{"q", "p"}});
  ASSERT_TRUE(by_row.ok()) << by_row.status();
  EXPECT_EQ(Floats((*by_row)[0]), (std::vector<float>{2, 3, 4, 5, 0, 1}));
}

TEST(KeyedTensorTest, RegroupAbsentKeyIsNotFound) {
  KeyedTensor kt = Example();
  absl::StatusOr<std::vector<at::Tensor>> groups =
      kt.Regroup({{"a"}, {"b", "nope"}});
  EXPECT_EQ(groups.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(groups.status().message()),
              HasSubstr("no key 'nope' among 3 keys (group 1)"));
}

// ---------------------------------------------------------------------------
// Devices

TEST(KeyedTensorTest, ToCpuIsNoCopy) {
  KeyedTensor kt = Example();
  KeyedTensor moved = kt.To(at::kCPU);
  EXPECT_TRUE(moved.values().is_same(kt.values()));
  EXPECT_EQ(moved.keys(), kt.keys());
  EXPECT_EQ(moved.offset_per_key(), kt.offset_per_key());
}

TEST(KeyedTensorTest, ToCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::Tensor values = ExampleValues().clone().requires_grad_(true);
  KeyedTensor kt = Example(values);
  KeyedTensor gpu = kt.To(at::Device(at::kCUDA, 0));
  EXPECT_TRUE(gpu.values().is_cuda());
  EXPECT_EQ(gpu.keys(), kt.keys());
  EXPECT_EQ(gpu.length_per_key(), kt.length_per_key());
  EXPECT_EQ(gpu.offset_per_key(), kt.offset_per_key());
  absl::StatusOr<at::Tensor> b = gpu.Get("b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->is_cuda());
  EXPECT_TRUE(at::equal(b->cpu(), Columns(1, 2)));

  // Regroup and gradients on the GPU reach the CPU leaf through To().
  absl::StatusOr<std::vector<at::Tensor>> groups = gpu.Regroup({{"c", "b"}});
  ASSERT_TRUE(groups.ok()) << groups.status();
  EXPECT_TRUE((*groups)[0].is_cuda());
  (*groups)[0].sum().backward();
  EXPECT_EQ(Floats(values.grad()), (std::vector<float>{0, 1, 1, 1, 1, 1,  //
                                                       0, 1, 1, 1, 1, 1}));

  // Parts on different devices are refused.
  absl::StatusOr<KeyedTensor> mixed = KeyedTensor::Concat(
      {gpu, *KeyedTensor::Create({"d"}, {1}, at::ones({2, 1}))});
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(mixed.status().message()),
              HasSubstr("part 1 is on cpu, part 0 on cuda:0"));
}

}  // namespace
}  // namespace deltastream
