#include "clients/delta_continuity.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace deltastream {

bool RunLostHeldBatches(const HeldVersion& held, absl::string_view run_id,
                        int64_t run_start_batch) {
  return !run_id.empty() && held.end_batch >= 0 && held.run_id != run_id &&
         held.end_batch > run_start_batch;
}

DeltaVerdict ClassifyDelta(const HeldVersion& held, int64_t covered_end,
                           const v1::DeltaHeader& header) {
  DeltaVerdict verdict;
  if (RunLostHeldBatches(held, header.run_id(), header.run_start_batch())) {
    verdict.fit = DeltaFit::kRunRestarted;
    verdict.reason = absl::StrFormat(
        "the trainer restarted (run %s from batch %d) behind version %d of "
        "run %s",
        header.run_id(), header.run_start_batch(), held.end_batch,
        held.run_id.empty() ? "unknown" : held.run_id);
    return verdict;
  }
  if (header.resync_required()) {
    verdict.fit = DeltaFit::kRowsDropped;
    verdict.reason =
        header.lost_rows() > 0
            ? absl::StrFormat(
                  "the tracker dropped %d IDs this consumer had not read "
                  "(its memory cap)",
                  header.lost_rows())
            : std::string(
                  "the trainer asks for a resync (a tracker restored behind "
                  "its model, or ranks whose cursors for this consumer "
                  "disagree after a restart)");
    return verdict;
  }
  const int64_t covered = std::max(covered_end, held.end_batch);
  const int64_t start = std::max<int64_t>(header.start_batch(), 0);
  if (held.end_batch < 0 || start > covered) {
    verdict.fit = DeltaFit::kGap;
    verdict.reason =
        held.end_batch < 0
            ? std::string("nothing is held yet")
            : absl::StrFormat(
                  "a gap: the delta starts at batch %d, what is held covers "
                  "batches up to %d",
                  start, covered);
    return verdict;
  }
  verdict.fit = header.end_batch() > covered ? DeltaFit::kContinues
                                             : DeltaFit::kHeldAlready;
  return verdict;
}

}  // namespace deltastream
