#ifndef DELTASTREAM_CLIENTS_DELTA_CONTINUITY_H_
#define DELTASTREAM_CLIENTS_DELTA_CONTINUITY_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "proto/tracker.pb.h"

namespace deltastream {

// The one rule every consumer that keeps a trainer's rows (the predictor's
// replica, the checkpoint job's chain, a chain a predictor bootstraps from)
// applies to decide whether a delta continues what it holds or whether it
// must start again from a read of every row (all_rows, "resync").
//
// Pure functions of their arguments: safe to call from any thread.

// What a consumer holds: the trainer's rows after `end_batch` batches (a
// delta's end_batch) of run `run_id`. end_batch -1: nothing yet; run_id
// empty: the run is not known.
struct HeldVersion {
  int64_t end_batch = -1;
  std::string run_id;
};

// Whether trainer run `run_id`, which started (or restored a snapshot) at
// batch `run_start_batch`, lost batches `held` holds: another run, and
// `held` ends after that run's start. Those batches' changes are not in the
// trainer any more; what held them must go back to run_start_batch (a
// checkpoint chain drops its later links) or resync. A run id that is not
// known (empty in `held`) counts as another run; a delta without a run id
// (a tracker that does not say) never reports a restart.
bool RunLostHeldBatches(const HeldVersion& held, absl::string_view run_id,
                        int64_t run_start_batch);

// How an incremental delta (not all_rows) fits what a consumer holds.
enum class DeltaFit {
  // It brings batches the consumer lacks and starts no later than what the
  // consumer covers: apply it (rows it holds already are rewritten with the
  // same or newer values, which is harmless).
  kContinues,
  // Nothing the consumer lacks (a redelivery, or a push of no new batch).
  kHeldAlready,
  // RunLostHeldBatches: the trainer restarted behind the consumer.
  kRunRestarted,
  // The tracker dropped rows the consumer had not read (resync_required).
  kRowsDropped,
  // It starts after what the consumer covers (or the consumer holds
  // nothing): batches in between were never read.
  kGap,
};

struct DeltaVerdict {
  DeltaFit fit = DeltaFit::kContinues;
  // Why, in one sentence for a log: empty for kContinues and kHeldAlready.
  std::string reason;

  // Whether the consumer must go back or resync (kRunRestarted, kRowsDropped,
  // kGap) rather than apply or skip.
  bool must_resync() const {
    return fit != DeltaFit::kContinues && fit != DeltaFit::kHeldAlready;
  }
};

// Classifies the incremental delta of `header` for a consumer holding `held`
// whose rows, with deltas it received but has not applied yet, cover the
// batches before `covered_end` (>= held.end_batch; held.end_batch when it
// holds nothing pending). The checks run in this order: a restart, dropped
// rows, a gap, then whether it brings anything new (end_batch > covered_end).
DeltaVerdict ClassifyDelta(const HeldVersion& held, int64_t covered_end,
                           const v1::DeltaHeader& header);

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_DELTA_CONTINUITY_H_
