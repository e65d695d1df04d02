#ifndef DELTASTREAM_TRACKER_SERVICE_STEP_CUTS_H_
#define DELTASTREAM_TRACKER_SERVICE_STEP_CUTS_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/shared_mutex.h"

namespace deltastream {

// Consistent cuts across the ranks of a sharded trainer (issue 16): a
// fan-in client sends one read to every rank with the same cut id
// (GetDeltaRequest.cut), and every rank must serve its part at the same step
// boundary, with the same end batch, rows and dense parameters of the same
// step. One StepCuts per rank joins the two sides:
//
//  - the service's read of a cut waits in Await until its trainer holds at
//    a boundary where every rank has that cut waiting (or the trainer is not
//    stepping), reads, and calls Finish;
//  - the trainer, at every step boundary, offers Waiting() to the other
//    ranks (one collective, trainer/step_boundary.h), and Serve()s the cuts
//    that all ranks hold: it opens them and waits until each is finished
//    before it trains the next step.
//
// While the trainer is not stepping (SetStepping(false): before it was
// built as a group, or after the ranks stopped together at the same step)
// a cut is read at once: every rank is at the same step already.
//
// Thread-safe.
class StepCuts {
 public:
  // Cuts agreed at one boundary, at most: later ones wait for the next.
  static constexpr int kMaxPerBoundary = 8;

  // `stepping`: whether cuts wait for a boundary from the start.
  explicit StepCuts(bool stepping) : stepping_(stepping) {}
  StepCuts(const StepCuts&) = delete;
  StepCuts& operator=(const StepCuts&) = delete;

  // Service side. Blocks until `cut` (nonzero) may be read: OK once the
  // trainer opened it (or does not step); the caller then reads and calls
  // Finish(cut), whatever the read's outcome. DeadlineExceeded at
  // `deadline`, Cancelled once `cancelled` (when given: polled every 20 ms,
  // e.g. the RPC's ServerContext::IsCancelled) says so; either way the cut
  // is withdrawn (no Finish). AlreadyExists when `cut` waits here already;
  // InvalidArgument for 0. An id may be used again once finished.
  absl::Status Await(int64_t cut, absl::Time deadline,
                     const std::function<bool()>& cancelled = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  void Finish(int64_t cut) ABSL_LOCKS_EXCLUDED(mu_);

  // Trainer side, at a step boundary: the cuts waiting and not yet opened,
  // oldest first, at most kMaxPerBoundary.
  std::vector<int64_t> Waiting() const ABSL_LOCKS_EXCLUDED(mu_);
  // Opens `cuts` (those every rank has waiting; ids not waiting here any
  // more are skipped) and blocks until each opened one is finished, or
  // `deadline`. Returns how many were read.
  int Serve(absl::Span<const int64_t> cuts, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the trainer steps (see the class comment); false also releases
  // every cut waiting now.
  void SetStepping(bool stepping) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // kOpen and kFinished: opened by a Serve that waits for it (and erases
  // it); kAbandoned: opened, and Serve stopped waiting for it (its
  // deadline); kUnserved: read while the trainer did not step, nobody's to
  // wait for. Finish erases all but the first two.
  enum class State { kWaiting, kOpen, kFinished, kAbandoned, kUnserved };

  // A SharedMutex and condition_variable_any (base/exclusive_lockable.h),
  // not absl::Mutex: ThreadSanitizer sees them.
  mutable SharedMutex mu_;
  std::condition_variable_any cv_;  // signalled on every change of cuts_
  bool stepping_ ABSL_GUARDED_BY(mu_);
  // By cut id; arrival order kept by `order_`.
  std::map<int64_t, State> cuts_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_STEP_CUTS_H_
