#ifndef DELTASTREAM_CLIENTS_PREDICTOR_H_
#define DELTASTREAM_CLIENTS_PREDICTOR_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "clients/delta_client.h"
#include "clients/freshness_window.h"
#include "clients/replica.h"
#include "proto/predictor.pb.h"

namespace deltastream {

// How a predictor follows its trainer (the predictor binary's flags).
struct PredictorOptions {
  // The trainer's tracker, HOST:PORT (also named in messages). Required.
  std::string target;
  // The predictor's consumer name; added to the tracker when missing.
  std::string consumer = "predictor";
  // A checkpoint chain directory to bootstrap an empty replica from instead
  // of a full read, when it fits (see Predictor); empty: never.
  std::string bootstrap_chain;
  // The subscription's schedule (SubscribeRequest): a push every `every_ms`
  // (0: by steps only) or every `every_steps` batches (0: by time only; both
  // 0: every batch); dense parameters at most every `dense_every_steps`
  // batches or `dense_every_ms` (both 0: with every push).
  int64_t every_ms = 100;
  int64_t every_steps = 0;
  int64_t dense_every_steps = 0;
  int64_t dense_every_ms = 0;
  // Called on Run()'s thread with each freshness sample, in seconds: from
  // the oldest change of an applied push in the trainer to its apply (e.g.
  // PredictorMetrics::ObserveFreshness). Empty: none.
  std::function<void(double)> on_freshness;
};

// OK, or InvalidArgument naming the first bad field as one line: an empty
// target or consumer, a negative interval.
absl::Status ValidatePredictorOptions(const PredictorOptions& options);

// Keeps a replica (clients/replica.h) in step with a trainer's tracker.
//
//  - Bootstrap: an empty replica takes a full read (all_rows, with the dense
//    parameters), or loads options.bootstrap_chain when the chain ends at or
//    after the consumer's cursor, not after the trainer's batch, and holds
//    nothing the trainer's run lost (clients/delta_continuity.h). A replica
//    that is not empty (a reopened RocksDB one) resumes at its version.
//  - Then it subscribes and applies each push. A push without dense
//    parameters while the trainer sends them is staged and applied with the
//    next push that carries them, in one atomic apply: lookups never mix two
//    model versions.
//  - With the tracker's acknowledged reads, a push is committed only once it
//    is applied (and, for RocksDB, synced): a predictor killed in between
//    gets the same rows again, and applying them again is harmless.
//  - It resyncs with a full read when ClassifyDelta says so (the trainer
//    restarted behind the replica, the tracker dropped rows, a gap) or when
//    a push cannot be applied.
//  - A failed subscription is retried with backoff (100 ms doubling to the
//    channel's reconnect backoff, 1 s); lookups keep being served meanwhile.
//  - A bootstrap or resync keeps the consumer in contact with the tracker
//    until the subscription (which keeps it in contact itself): from a thread
//    of its own, at once and then every second, it touches the consumer on
//    every rank (TrackerClient::Touch), which reads and moves nothing.
//    A bootstrap that outlasts the tracker's
//    consumer expiry (TrackerOptions::expire_consumers_after: a long chain
//    load, a slow replica write) thus keeps the consumer and the rows the
//    chain lacks, instead of losing them and ending in a resync. The
//    keep-alive ends with the bootstrap, at Stop(), or when the tracker says
//    the consumer is gone (logged).
//
// Thread safety: Run() is the one thread that writes the replica (call it
// once, from one thread). Stop(), PollTrainer(), Status() and replica()'s
// reads are safe from any thread, concurrently with Run().
class Predictor {
 public:
  // Nothing is contacted yet. `client` talks to options.target; `replica`
  // receives the rows; `apply_log` (not owned, may be null, must outlive
  // the predictor) gets a line per applied version: "<from_batch>
  // <to_batch> <rows> <dense 0|1> <all_rows 0|1> <run_id>", only the
  // batches the replica did not hold yet.
  Predictor(PredictorOptions options, std::unique_ptr<TrackerClient> client,
            std::unique_ptr<Replica> replica, FILE* apply_log);
  // After Run() returned. Waits for the consumer's keep-alive thread, which
  // ends within 100 ms (a touch in flight is cancelled).
  ~Predictor();
  Predictor(const Predictor&) = delete;
  Predictor& operator=(const Predictor&) = delete;

  // Follows the tracker until Stop(). Returns OK once stopped, or an error
  // that retrying cannot fix: the tracker serves no live rows (a standalone
  // tracker_server), a refused token (Unauthenticated, PermissionDenied).
  absl::Status Run() ABSL_LOCKS_EXCLUDED(stop_mu_, mu_);

  // Ends Run() and PollTrainer() soon: cancels the subscription or the read
  // of every row in progress (within 100 ms; a unary call, at most its 10 s
  // deadline), wakes their sleeps, ends the consumer's keep-alive and a
  // chain load in progress (within one record of a link, at most 64 MiB by
  // default; nothing of it applied). Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(stop_mu_);

  // Until Stop(): polls the tracker's current batch every 200 ms (for
  // Status().lag_steps) and logs a summary to stderr every 5 s.
  void PollTrainer() ABSL_LOCKS_EXCLUDED(stop_mu_, mu_);

  // The replica's version and tables with the predictor's counters
  // (proto/predictor.proto).
  v1::PredictorStatus Status() const ABSL_LOCKS_EXCLUDED(mu_);

  // The replica, for lookups (Replica is thread-safe).
  const Replica& replica() const { return *replica_; }

 private:
  // Keeps the consumer in contact while it lives (predictor.cc).
  class ConsumerKeepAlive;

  // One connection: bootstrap or resync when needed, then the subscription.
  // OK when it ended for a resync or Stop().
  absl::Status Session();
  // Fills an empty replica (the chain, else a full read) or resyncs one (a
  // full read, for resync_reason_); `cursor` is the consumer's.
  absl::Status BootstrapOrResync(const v1::StatusResponse& tracker,
                                 int64_t cursor);
  // A full read (all_rows, dense) replacing the replica's contents.
  absl::Status FullRead(const std::string& why);
  // Loads the bootstrap chain when it fits; false (logged) when it does not.
  bool BootstrapFromChain(const v1::StatusResponse& tracker, int64_t cursor);
  // The subscription's callback; false ends the subscription.
  bool OnPush(ReceivedDelta&& delta);
  // Commits `end_batch` in acknowledged mode (errors logged: the tracker
  // then delivers the rows again, which is harmless).
  void Commit(int64_t end_batch);
  void LogApply(int64_t from, int64_t to, int64_t rows, bool dense,
                bool all_rows, const std::string& run_id);
  void NoteError(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Makes `call` the one Stop() cancels, until EndCall(); false (nothing
  // set) when stopping already.
  bool StartCall(CallCanceller* call) ABSL_LOCKS_EXCLUDED(stop_mu_);
  void EndCall() ABSL_LOCKS_EXCLUDED(stop_mu_);
  // Sleeps unless stopped meanwhile; false when stopped.
  bool Sleep(absl::Duration duration) ABSL_LOCKS_EXCLUDED(stop_mu_);
  // A ConsumerKeepAlive's thread: touches the consumer at once and then
  // every kKeepAliveEvery until EndKeepAlive() or Stop(), which cancel
  // `touches`, or until the tracker says the consumer is gone (logged).
  void KeepConsumerAlive(const CallCanceller& touches)
      ABSL_LOCKS_EXCLUDED(stop_mu_);
  // Waits until `deadline` unless the keep-alive ends or Stop() comes
  // first; false then.
  bool WaitToKeepAlive(absl::Time deadline) ABSL_LOCKS_EXCLUDED(stop_mu_);
  // Starts a keep-alive's thread (KeepConsumerAlive), once the last one's
  // has ended.
  void StartKeepAlive() ABSL_LOCKS_EXCLUDED(stop_mu_);
  // Tells the keep-alive's thread to end (without waiting for it).
  void EndKeepAlive() ABSL_LOCKS_EXCLUDED(stop_mu_);

  const PredictorOptions options_;
  const std::unique_ptr<TrackerClient> client_;
  const std::unique_ptr<Replica> replica_;
  FILE* const apply_log_;  // may be null

  // Set once by Stop(); read without the lock by the threads it stops.
  std::atomic<bool> stopping_{false};
  absl::Mutex stop_mu_;
  // Signalled by Stop() and by a keep-alive's end.
  absl::CondVar stop_cv_;
  // The subscription or read in progress, which Stop() cancels.
  CallCanceller* in_flight_ ABSL_GUARDED_BY(stop_mu_) = nullptr;
  // Whether the keep-alive's thread goes on (StartKeepAlive() to
  // EndKeepAlive()).
  bool keeping_alive_ ABSL_GUARDED_BY(stop_mu_) = false;
  // Cancels the touches of the last keep-alive's thread (its end and
  // Stop()); replaced only once that thread has been joined.
  std::unique_ptr<CallCanceller> keep_alive_touches_ ABSL_GUARDED_BY(stop_mu_);
  // The last keep-alive's thread, joined by the next StartKeepAlive() or
  // the destructor (Run()'s thread and the destructor only).
  std::thread keep_alive_thread_;

  // Run()'s own state: only its thread touches it.
  std::vector<ReceivedDelta> staged_;  // pushes waiting for dense parameters
  std::string resync_reason_;          // non-empty: resync before subscribing
  absl::Status push_error_;            // a push that failed to apply
  bool first_push_ = true;             // of the current subscription
  bool chain_tried_ = false;
  bool progressed_ = false;  // the current session applied something
  // Reads of every row since the replica last applied a push: one that is
  // followed by another resync paces the next (a cause that persists, such
  // as a memory cap that drops the consumer's rows every step, would make
  // back-to-back reads of every row, each pinning the trainer's rows).
  int full_reads_since_push_ = 0;
  // When the newest batch of the replica's version was closed (0: unknown).
  int64_t version_newest_change_us_ = 0;
  bool acknowledged_ = false;
  bool fatal_ = false;  // Session() failed in a way retrying cannot fix

  // What Status() reports.
  mutable absl::Mutex mu_;
  int64_t trainer_batch_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t applied_deltas_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t applied_rows_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t resyncs_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reconnects_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t staged_count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t superseded_commits_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether the trainer sends dense parameters (a full read or a
  // subscription's first push tells).
  bool dense_expected_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  FreshnessWindow freshness_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_PREDICTOR_H_
