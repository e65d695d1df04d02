#ifndef DELTASTREAM_TRAINER_MODELS_METRICS_H_
#define DELTASTREAM_TRAINER_MODELS_METRICS_H_

#include <ATen/core/Tensor.h>

namespace deltastream {

// Mean binary cross-entropy of `logits` [B] against 0/1 `labels` [B]
// (numerically stable; differentiable in logits).
at::Tensor BinaryCrossEntropyWithLogits(const at::Tensor& logits,
                                        const at::Tensor& labels);

// Area under the ROC curve of `scores` [n] for 0/1 `labels` [n] (any device;
// read on the host): the probability that a random positive scores above a
// random negative, ties counting one half (average ranks). 0.5 when one
// class is absent.
double Auc(const at::Tensor& scores, const at::Tensor& labels);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODELS_METRICS_H_
