#include "tracker_service/tracking_mode.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deltastream {

absl::string_view TrackingModeName(TrackingMode mode) {
  switch (mode) {
    case TrackingMode::kIdOnly:
      return "id_only";
    case TrackingMode::kEmbedding:
      return "embedding";
    case TrackingMode::kMomentumLast:
      return "momentum_last";
    case TrackingMode::kMomentumDiff:
      return "momentum_diff";
    case TrackingMode::kRowwiseAdagrad:
      return "rowwise_adagrad";
  }
  return "unknown";
}

absl::StatusOr<TrackingMode> ParseTrackingMode(absl::string_view name) {
  for (TrackingMode mode :
       {TrackingMode::kIdOnly, TrackingMode::kEmbedding,
        TrackingMode::kMomentumLast, TrackingMode::kMomentumDiff,
        TrackingMode::kRowwiseAdagrad}) {
    if (name == TrackingModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tracking mode '", name,
                   "': expected id_only, embedding, momentum_last, "
                   "momentum_diff or rowwise_adagrad"));
}

UpdateMode UpdateModeFor(TrackingMode mode) {
  switch (mode) {
    case TrackingMode::kIdOnly:
      return UpdateMode::kNone;
    case TrackingMode::kMomentumLast:
      return UpdateMode::kLast;
    default:
      return UpdateMode::kFirst;
  }
}

bool TracksOptimizerState(TrackingMode mode) {
  return mode == TrackingMode::kMomentumLast ||
         mode == TrackingMode::kMomentumDiff ||
         mode == TrackingMode::kRowwiseAdagrad;
}

}  // namespace deltastream
