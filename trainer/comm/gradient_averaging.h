#ifndef DELTASTREAM_TRAINER_COMM_GRADIENT_AVERAGING_H_
#define DELTASTREAM_TRAINER_COMM_GRADIENT_AVERAGING_H_

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "trainer/comm/process_group.h"

namespace deltastream {

// Data parallelism for dense parameters (what DDP does once per step): the
// gradient of every parameter becomes its mean over the ranks, so that N
// ranks whose losses are means over B examples step as one process whose
// loss is the mean over N x B. One all-reduce of all gradients flattened
// together (per dtype); a parameter without a gradient contributes zeros
// and gets one (every rank must pass the same parameters, in the same
// order). Call after backward, before the dense optimizer's step. Errors:
// the all-reduce's (see ProcessGroup); gradients are unchanged then.
absl::Status AverageGradients(ProcessGroup& group,
                              absl::Span<const at::Tensor> parameters);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_COMM_GRADIENT_AVERAGING_H_
