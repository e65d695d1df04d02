#ifndef DELTASTREAM_TRAINER_MODELS_ATTENTION_POOLING_H_
#define DELTASTREAM_TRAINER_MODELS_ATTENTION_POOLING_H_

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace deltastream {

// DIN-style attention pooling of jagged rows against one query per example.
//
// `rows` [n, D] holds B examples' rows back to back, example i owning
// lengths[i] consecutive rows; `lengths` [B] is int32 or int64 and must sum
// to n (not checked: checking would read lengths on the host); `queries`
// [B, D] is floating. All three on one device. For example i with rows r_j:
//   score_j = <r_j, q_i>,  w = softmax_j(score),  out_i = sum_j w_j r_j,
// and out_i = 0 when lengths[i] == 0. Returns [B, D] in queries' dtype (rows
// are converted to it), differentiable in rows and queries.
//
// Runs on the inputs' device with segment ops (repeat_interleave with a known
// output size, scatter_reduce, index_add): no loop over examples and no
// device-to-host copy. The softmax is shifted by each example's own maximum,
// so examples whose scores differ wildly in scale stay finite.
//
// InvalidArgument for undefined inputs, shapes, dtypes or devices outside
// this contract (checked on metadata only); Internal for another LibTorch
// error.
absl::StatusOr<at::Tensor> AttentionPool(const at::Tensor& rows,
                                         const at::Tensor& lengths,
                                         const at::Tensor& queries);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_MODELS_ATTENTION_POOLING_H_
