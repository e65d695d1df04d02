#ifndef DELTASTREAM_CLIENTS_CHECKPOINT_JOB_H_
#define DELTASTREAM_CLIENTS_CHECKPOINT_JOB_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "clients/delta_client.h"
#include "clients/delta_continuity.h"

namespace deltastream {

// What a checkpoint job does (the checkpoint_job binary's flags).
struct CheckpointJobOptions {
  // The chain's directory (clients/checkpoint_chain.h). Required.
  std::string dir;
  // The job's consumer name. Required.
  std::string consumer = "checkpoint";
  // The pull period.
  int64_t every_ms = 1000;
  // Stop after this many links (0: never).
  int64_t count = 0;
  // Compact the chain into one full link every N links written (0: never).
  int64_t compact_every = 0;
  // Store the model's dense parameters in every link.
  bool dense = true;
  // How long an unreachable service (a trainer restarting) is retried from
  // its first failure before the job fails; 0: fail at once.
  int64_t retry_s = 60;
};

// OK, or InvalidArgument naming the first bad field as one line: an empty
// dir or consumer, a negative count or interval.
absl::Status ValidateCheckpointJobOptions(const CheckpointJobOptions& options);

// Where the chain in `dir` ends and the trainer run its last applied link
// came from: end_batch -1 for an empty (or missing) directory.
// FailedPrecondition naming the first problem when the chain is broken; the
// chain's read errors.
absl::StatusOr<HeldVersion> ReadChainEnd(const std::string& dir);

// Whether a failed call is retried: Unavailable, Cancelled (a server that
// shuts down cancels the calls in flight) and DeadlineExceeded (a stopped or
// hung trainer: a read silent for the client's stream_idle_timeout) are, for
// `limit` from the first such failure since the last success; every other
// error is not. Not thread-safe.
class UnreachableRetry {
 public:
  explicit UnreachableRetry(absl::Duration limit) : limit_(limit) {}

  // Whether to retry `status`, a call failing at `now`.
  bool ShouldRetry(const absl::Status& status, absl::Time now);
  // A call succeeded: the next failure starts a new window.
  void Succeeded() { since_.reset(); }
  // Whether ShouldRetry's last true started a window (worth a log line).
  bool just_started() const { return just_started_; }

 private:
  const absl::Duration limit_;
  std::optional<absl::Time> since_;
  bool just_started_ = false;
};

// What a checkpoint job has done so far (its metrics read it).
struct CheckpointJobStats {
  int64_t full_links = 0;       // links written from a read of every row
  int64_t increment_links = 0;  // links written from a delta
  int64_t bytes_written = 0;    // by those links
  int64_t rows_written = 0;
  int64_t resyncs = 0;           // reads that started the chain again
  int64_t removed_links = 0;     // dropped after a trainer lost their batches
  int64_t chain_end_batch = -1;  // the batch the chain ends at (-1: empty)
  // When the latest link was on disk (InfinitePast: none yet), and how long
  // its pull and write took.
  absl::Time last_link_time = absl::InfinitePast();
  absl::Duration last_link_duration;
};

// Pulls deltas on a schedule as its own consumer and writes incremental
// checkpoints (clients/checkpoint_chain.h) into options.dir, one link per
// pull that brought new batches.
//
// The first link is a full one, from a read of every row (all_rows). Then
// one increment per pull, continuing where the chain ends; with the
// tracker's acknowledged reads a pull is committed only once its link is on
// disk, so a job killed in between reads the same batches again and writes
// only what its chain lacks. Whether a read continues the chain is
// ClassifyDelta's rule (clients/delta_continuity.h): dropped rows or a gap
// start the chain again with a full read; a trainer that restarted behind
// the chain's end makes the job remove the links after the run's start
// batch. A consumer the service does not know is added (with a warning),
// and the next link is a full one. Every step is reported as one line on
// `out`: "full"/"increment" links, "resync: ..." and "removed ..." lines.
//
// Thread safety: Run() on one thread; Stop() and Stats() from any thread.
class CheckpointJob {
 public:
  // `client` talks to the trainer's tracker; `out` (not owned, must outlive
  // the job) receives the report lines.
  CheckpointJob(CheckpointJobOptions options,
                std::unique_ptr<TrackerClient> client, FILE* out);

  // Reads where the chain in options.dir ends and checks the links a load
  // applies (a damaged one makes the next link a full one), removes the
  // temporaries of writes a crash cut short and syncs the directory. An
  // error is the chain's (a broken chain: FailedPrecondition; one that
  // cannot be read: the OS error), found before the service is contacted.
  absl::Status Open();

  // Pulls until options.count links are written or Stop() is called (OK),
  // or until a pull, write or commit fails in a way retrying cannot fix
  // (that error; an unreachable service is retried for options.retry_s).
  // Opens the chain first unless Open() did.
  absl::Status Run();

  // Ends Run() soon: a read in progress is cancelled (within 100 ms; it was
  // not committed, so nothing of it is lost), a link being written is
  // finished first.
  void Stop();

  // What it has done so far. Thread-safe (concurrently with Run()).
  CheckpointJobStats Stats() const ABSL_LOCKS_EXCLUDED(stats_mu_);

 private:
  // One pull and what follows from it. Sets `*again` when the next pull
  // should come at once (a resync, a retried call).
  absl::Status Pull(bool* again);
  // Adds options.consumer on the service, which does not know it (OK also
  // when it knows it by now), with a warning; the next link is a full one.
  absl::Status AddOwnConsumer();
  // Removes the links a restarted trainer lost, reporting each.
  absl::Status DropLostLinks(const v1::DeltaHeader& header);
  // Before a full link from the read `header` is written on a chain whose
  // end is not known (the newest link's description is damaged): removes
  // the links after the read's end, which the full link could not be
  // continued past (they overlap it), reporting each, when the trainer's
  // run lost them (RunLostHeldBatches, a link whose run cannot be read
  // counting as another run). FailedPrecondition, nothing removed, when a
  // readable one is of the read's run.
  absl::Status DropLinksPastFull(const v1::DeltaHeader& header);
  // Removes the links that end after `batch` (TruncateChainAfter), reporting
  // and counting each.
  absl::Status RemoveLinksAfter(int64_t batch);
  // Sleeps `duration` unless stopped meanwhile.
  void Wait(absl::Duration duration);
  void Report(const std::string& line);

  const CheckpointJobOptions options_;
  const std::unique_ptr<TrackerClient> client_;
  FILE* const out_;
  std::atomic<bool> stopping_{false};
  // Every read's canceller: Stop() cancels it for good.
  CallCanceller stop_reads_;
  UnreachableRetry retry_;
  HeldVersion chain_;
  bool opened_ = false;
  bool need_full_ = false;
  // Whether the service reads in acknowledged mode (commits are due), from
  // its Status; unknown again after a failed call.
  std::optional<bool> acknowledged_;
  // Set when the job has added its consumer, until a read succeeds: an
  // "unknown consumer" in between (removed again at once) ends the job.
  bool consumer_added_ = false;
  int64_t written_ = 0;
  mutable absl::Mutex stats_mu_;
  CheckpointJobStats stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_CHECKPOINT_JOB_H_
