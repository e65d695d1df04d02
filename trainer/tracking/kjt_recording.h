#ifndef DELTASTREAM_TRAINER_TRACKING_KJT_RECORDING_H_
#define DELTASTREAM_TRAINER_TRACKING_KJT_RECORDING_H_

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "tracker_service/tracker.h"
#include "trainer/sparse/keyed_jagged_tensor.h"

namespace deltastream {

// The post-lookup tracking hook: records the IDs of every key of `kjt` (one
// embedding module's input) into `tracker`, with `embeddings`, the rows the
// lookup returned for kjt.values() in order, in embedding mode. Errors are the
// tracker's (see Tracker::RecordLookup); nothing is copied to the host.
absl::Status RecordKjtLookup(Tracker& tracker, const KeyedJaggedTensor& kjt,
                             const at::Tensor& embeddings = at::Tensor());

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_TRACKING_KJT_RECORDING_H_
