#ifndef DELTASTREAM_TESTS_TESTING_TENSOR_VALUES_H_
#define DELTASTREAM_TESTS_TESTING_TENSOR_VALUES_H_

// Tensors to and from plain vectors, for EXPECT_EQ and ElementsAre in tests.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace deltastream {

// The elements of `t` (any shape, device and dtype), flattened in row-major
// order and converted to int64 / float on the host.
std::vector<int64_t> Longs(const at::Tensor& t);
std::vector<float> Floats(const at::Tensor& t);

// A 1-D int64 CPU tensor of `ids` (IDs of rows, lengths, offsets).
at::Tensor Ids(const std::vector<int64_t>& ids);

}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_TESTING_TENSOR_VALUES_H_
