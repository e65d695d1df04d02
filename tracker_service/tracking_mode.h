#ifndef DELTASTREAM_TRACKER_SERVICE_TRACKING_MODE_H_
#define DELTASTREAM_TRACKER_SERVICE_TRACKING_MODE_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "store/update_mode.h"

namespace deltastream {

// What the tracker records with each looked-up ID, and what a delta carries.
enum class TrackingMode {
  // IDs only.
  kIdOnly,
  // The embedding rows returned by the lookup; a delta carries each row's
  // value before its first change since the consumer's last read.
  kEmbedding,
  // The L2 norm of each row's optimizer momentum, latest value kept.
  kMomentumLast,
  // The optimizer's row state at first lookup; a delta carries latest - first.
  kMomentumDiff,
  // As kMomentumDiff, for row-wise Adagrad's per-row sum of squared gradients.
  kRowwiseAdagrad,
};

// "id_only", "embedding", "momentum_last", "momentum_diff", "rowwise_adagrad".
absl::string_view TrackingModeName(TrackingMode mode);
absl::StatusOr<TrackingMode> ParseTrackingMode(absl::string_view name);

// How the store keeps repeated rows in this mode: kNone for kIdOnly, kLast for
// kMomentumLast, kFirst otherwise.
UpdateMode UpdateModeFor(TrackingMode mode);

// Whether the mode records the optimizer's row state rather than embeddings.
bool TracksOptimizerState(TrackingMode mode);

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_TRACKING_MODE_H_
