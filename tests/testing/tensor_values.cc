#include "tests/testing/tensor_values.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>

namespace deltastream {

std::vector<int64_t> Longs(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

std::vector<float> Floats(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kFloat).contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

at::Tensor Ids(const std::vector<int64_t>& ids) {
  return at::tensor(ids, at::kLong);
}

}  // namespace deltastream
