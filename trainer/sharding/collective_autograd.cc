#include "trainer/sharding/collective_autograd.h"

#include <ATen/core/Tensor.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <memory>
#include <utility>

namespace deltastream {
namespace {

class CollectiveBackwardNode : public torch::autograd::Node {
 public:
  CollectiveBackwardNode(std::string name,
                         std::vector<CollectiveBackwardFn> backwards,
                         std::vector<at::Tensor> output_shapes)
      : name_(std::move(name)),
        backwards_(std::move(backwards)),
        output_shapes_(std::move(output_shapes)) {}

  torch::autograd::variable_list apply(
      torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list input_grads;
    for (size_t i = 0; i < backwards_.size(); ++i) {
      at::Tensor grad = i < grads.size() ? grads[i] : at::Tensor();
      if (!grad.defined()) grad = at::zeros_like(output_shapes_[i]);
      input_grads.push_back(backwards_[i](grad.contiguous()));
    }
    return input_grads;
  }

  std::string name() const override { return name_; }

  void release_variables() override { output_shapes_.clear(); }

 private:
  std::string name_;
  std::vector<CollectiveBackwardFn> backwards_;
  // Empty tensors of each output's shape and options, for unused outputs.
  std::vector<at::Tensor> output_shapes_;
};

}  // namespace

void CollectiveGradients::Add(const at::Tensor& input, at::Tensor* output,
                              CollectiveBackwardFn backward) {
  inputs_.push_back(input);
  outputs_.push_back(output);
  backwards_.push_back(std::move(backward));
}

void CollectiveGradients::Attach() {
  if (!c10::GradMode::is_enabled() || outputs_.empty()) return;
  std::vector<at::Tensor> shapes;
  for (at::Tensor* output : outputs_) {
    shapes.push_back(at::empty(output->sizes(), output->options()));
  }
  std::shared_ptr<CollectiveBackwardNode> node(
      new CollectiveBackwardNode(name_, backwards_, std::move(shapes)),
      torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(inputs_));
  for (at::Tensor* output : outputs_) {
    torch::autograd::set_history(*output, node);
  }
}

}  // namespace deltastream
