#ifndef DELTASTREAM_TRACKER_SERVICE_STATES_FILL_H_
#define DELTASTREAM_TRACKER_SERVICE_STATES_FILL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/shared_mutex.h"

namespace deltastream {

struct Delta;

// A read in progress on the tracker's fill thread (Tracker::GetDeltaFilling):
// the thread hands out the delta as soon as its IDs are known, then copies
// the tables' state rows into it in pieces, telling which rows are there, so
// that a caller sends the first rows while later ones are copied.
//
// Thread-safe. The destructor waits until the read has finished (its copies
// take what GetDelta's copies take).
class StatesFill {
 public:
  StatesFill() = default;
  StatesFill(const StatesFill&) = delete;
  StatesFill& operator=(const StatesFill&) = delete;
  ~StatesFill();

  // Waits until rows [0, rows) of table `fqn`'s states are written (OK): at
  // once for a table whose states came complete (or that has none), and for
  // every table once the read has ended well. The read's status when it
  // failed before writing them: they never will be, and the delta handed out
  // must not be sent.
  absl::Status AwaitRows(const std::string& fqn, int64_t rows)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether AwaitRows(fqn, rows) would return at once.
  bool HasRows(const std::string& fqn, int64_t rows) ABSL_LOCKS_EXCLUDED(mu_);

  // The read's thread (Tracker): the delta (or why there is none), once
  // (later calls do nothing); then, for each table it copies, that rows are
  // to come (before HandOut), and the rows copied so far.
  void HandOut(absl::StatusOr<Delta> delta) ABSL_LOCKS_EXCLUDED(mu_);
  void Expect(const std::string& fqn) ABSL_LOCKS_EXCLUDED(mu_);
  void Copied(const std::string& fqn, int64_t rows) ABSL_LOCKS_EXCLUDED(mu_);
  // Called last: every copy is done (`status` OK), or the read failed with
  // `status` and rows not yet copied will not be. The read's thread touches
  // this object no more.
  void Finish(absl::Status status = absl::OkStatus()) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class Tracker;

  // The caller: waits for HandOut.
  absl::StatusOr<Delta> AwaitDelta() ABSL_LOCKS_EXCLUDED(mu_);

  // Whether rows [0, rows) of `fqn` are written.
  bool CopiedLocked(const std::string& fqn, int64_t rows) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether AwaitRows(fqn, rows) is done waiting: the rows are written, or
  // the read's thread is finished and never will write them.
  bool SettledLocked(const std::string& fqn, int64_t rows) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SharedMutex mu_;
  std::condition_variable_any changed_;
  std::unique_ptr<absl::StatusOr<Delta>> delta_ ABSL_GUARDED_BY(mu_);
  bool handed_out_ ABSL_GUARDED_BY(mu_) = false;
  // Rows copied of each table still being copied (of every table not
  // copied whole when the read failed).
  absl::flat_hash_map<std::string, int64_t> copied_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // Finish's status
};

// One thread that runs a tracker's filling reads one after another, in the
// order given (Tracker::GetDeltaFilling): started by the first, and kept, so
// that a read does not pay for a thread of its own (its start, its stack's
// page faults, the malloc arena it picks, its exit: 0.2-0.3 ms of CPU a read
// per serving process in fan_in_bench at load 6-8). The reads lose nothing
// by the queue: each waits for the one before it to end its copy
// (Tracker::ChangeLock), so two never ran at once.
//
// Thread-safe. The destructor runs what is queued, then joins the thread.
class FillThread {
 public:
  FillThread() = default;
  FillThread(const FillThread&) = delete;
  FillThread& operator=(const FillThread&) = delete;
  ~FillThread() ABSL_LOCKS_EXCLUDED(mu_);

  // Queues `read` to run on the thread. `read` must not wait for a later
  // read (none does: a read waits only for the tracker's lock, the copy of
  // the read before it and its LiveRowsReader's pin).
  void Run(std::function<void()> read) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  SharedMutex mu_;
  std::condition_variable_any queued_;
  std::deque<std::function<void()>> reads_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started by the first Run, under mu_
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_STATES_FILL_H_
