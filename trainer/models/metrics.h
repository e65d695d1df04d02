#ifndef DELTASTREAM_TRAINER_MODELS_METRICS_H_
#define DELTASTREAM_TRAINER_MODELS_METRICS_H_

#include <ATen/core/Tensor.h>

namespace deltastream {

// Mean binary cross-entropy of `logits` [B] against 0/1 `labels` [B] (any
// numeric dtype, converted to logits'; same device): numerically stable,
// differentiable in logits. B == 0 gives NaN (a mean over nothing). The
// shapes must match: that is the caller's contract (LibTorch throws
// c10::Error otherwise).
at::Tensor BinaryCrossEntropyWithLogits(const at::Tensor& logits,
                                        const at::Tensor& labels);

// Area under the ROC curve of `scores` [n] for 0/1 `labels` [n] (any device;
// read on the host): the probability that a random positive scores above a
// random negative, ties counting one half (average ranks); a label > 0.5 is
// positive. 0.5 when one class is absent (or n == 0); NaN when a score is
// NaN or the sizes differ. Copies both to the host (a device sync): for
// evaluation, not for the training step.
double Auc(const at::Tensor& scores, const at::Tensor& labels);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODELS_METRICS_H_
