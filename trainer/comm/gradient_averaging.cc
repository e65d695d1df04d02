#include "trainer/comm/gradient_averaging.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <map>
#include <vector>

namespace deltastream {

absl::Status AverageGradients(ProcessGroup& group,
                              absl::Span<const at::Tensor> parameters) {
  c10::NoGradGuard no_grad;
  // Grouped by dtype: one flat buffer each.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const at::Tensor& parameter : parameters) {
    at::Tensor grad = parameter.grad();
    if (!grad.defined()) {
      grad = at::zeros_like(parameter);
      parameter.mutable_grad() = grad;
    }
    by_dtype[grad.scalar_type()].push_back(grad);
  }
  for (auto& [dtype, grads] : by_dtype) {
    std::vector<at::Tensor> flat;
    for (const at::Tensor& grad : grads) flat.push_back(grad.reshape({-1}));
    at::Tensor buffer = at::cat(flat);
    if (absl::Status status = group.AllReduceSum(buffer, "dense.gradients");
        !status.ok()) {
      return status;
    }
    buffer.div_(group.world_size());
    int64_t offset = 0;
    for (const at::Tensor& grad : grads) {
      grad.copy_(buffer.narrow(0, offset, grad.numel()).view_as(grad));
      offset += grad.numel();
    }
  }
  return absl::OkStatus();
}

}  // namespace deltastream
