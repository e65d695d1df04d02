#ifndef DELTASTREAM_TRAINER_SHARDING_COLLECTIVE_AUTOGRAD_H_
#define DELTASTREAM_TRAINER_SHARDING_COLLECTIVE_AUTOGRAD_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace deltastream {

// Maps the gradient of a collective's output to the gradient of its input,
// running the reverse collective. Throws c10::Error (autograd's only way to
// fail a backward) with the collective's Status message when it fails.
using CollectiveBackwardFn = std::function<at::Tensor(const at::Tensor&)>;

// The collectives one forward of a sharded module issued, joined into ONE
// autograd node, so that their reverse collectives run in a fixed order on
// every rank (separate nodes could be run in different orders by different
// ranks' autograd engines, and deadlock).
//
// Usage: compute each collective's output without gradients, Add it with its
// input and backward function, then Attach(): each output then requires
// grad and its gradient flows to its input through `backward`. The node is
// attached whenever gradients are enabled, even when no input requires
// grad (a rank with no shard must still take part in the reverse
// collectives). A part whose output is not used gets a zero gradient.
class CollectiveGradients {
 public:
  explicit CollectiveGradients(std::string name) : name_(std::move(name)) {}
  // `output` must not require grad yet; it is updated in place by Attach.
  void Add(const at::Tensor& input, at::Tensor* output,
           CollectiveBackwardFn backward);
  void Attach();

 private:
  std::string name_;
  std::vector<at::Tensor> inputs_;
  std::vector<at::Tensor*> outputs_;
  std::vector<CollectiveBackwardFn> backwards_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_SHARDING_COLLECTIVE_AUTOGRAD_H_
