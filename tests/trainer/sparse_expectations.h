#ifndef DELTASTREAM_TESTS_TRAINER_SPARSE_EXPECTATIONS_H_
#define DELTASTREAM_TESTS_TRAINER_SPARSE_EXPECTATIONS_H_

// GoogleTest expectations on the sparse types (trainer/sparse/), for the
// tests of the types and of what builds them.

#include <gtest/gtest.h>

#include "tests/testing/tensor_values.h"
#include "trainer/sparse/keyed_jagged_tensor.h"

namespace deltastream {
namespace testing {

// Every observable part of two KJTs is equal (values compared, not
// identity): keys, stride, values, lengths and their dtype, offsets, the
// per-key totals, and the weights when there are any.
inline void ExpectSameKjt(const KeyedJaggedTensor& actual,
                          const KeyedJaggedTensor& expected) {
  EXPECT_EQ(actual.keys(), expected.keys());
  EXPECT_EQ(actual.stride(), expected.stride());
  EXPECT_EQ(Longs(actual.values()), Longs(expected.values()));
  EXPECT_EQ(actual.lengths().scalar_type(), expected.lengths().scalar_type());
  EXPECT_EQ(Longs(actual.lengths()), Longs(expected.lengths()));
  EXPECT_EQ(Longs(actual.offsets()), Longs(expected.offsets()));
  EXPECT_EQ(actual.length_per_key(), expected.length_per_key());
  EXPECT_EQ(actual.offset_per_key(), expected.offset_per_key());
  ASSERT_EQ(actual.has_weights(), expected.has_weights());
  if (actual.has_weights()) {
    EXPECT_EQ(Floats(*actual.weights()), Floats(*expected.weights()));
  }
}

}  // namespace testing
}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_TRAINER_SPARSE_EXPECTATIONS_H_
