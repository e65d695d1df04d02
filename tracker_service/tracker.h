#ifndef DELTASTREAM_TRACKER_SERVICE_TRACKER_H_
#define DELTASTREAM_TRACKER_SERVICE_TRACKER_H_

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/shared_mutex.h"
#include "store/delta_store.h"
#include "tracker_service/live_rows_reader.h"
#include "tracker_service/states_fill.h"
#include "tracker_service/top_k.h"
#include "tracker_service/tracked_modules.h"
#include "tracker_service/tracking_mode.h"

namespace deltastream {

struct TrackerOptions {
  TrackingMode mode = TrackingMode::kIdOnly;
  // Named consumers, each with its own cursor. Empty means {"default"}.
  std::vector<std::string> consumers;
  // Delete what every consumer has read.
  bool delete_on_read = true;
  // TriggerCompaction() compacts; otherwise it does nothing and reads compact.
  bool auto_compact = false;
  // A read is final only when the consumer commits it (Commit()); until then
  // the consumer's next read returns the same rows again, plus newer ones.
  // Reads delivered and not yet committed stay committable (Commit()), so a
  // consumer may read ahead of its commits.
  bool acknowledged_reads = false;
  // Module path components and table names not to track.
  std::vector<std::string> fqns_to_skip;
  // Bytes the store may hold; 0 means unbounded. See "Memory cap" below.
  int64_t memory_cap_bytes = 0;
  // The trainer's tables, for feature-to-FQN mapping. Empty means "open": any
  // table FQN may be recorded with RecordTables (a standalone server).
  std::vector<TrackedModule> modules;
  // Every table of the model, when the model is sharded across processes and
  // this tracker holds only part of it (a sharded trainer's rank: the tables
  // of its plan); empty otherwise. A read naming a table of the model that
  // this tracker does not track (other ranks hold all of it) answers that
  // table with no rows and moves its cursor as for any table, so one read of
  // chosen tables can go to every rank; reads of every table leave such
  // tables out.
  std::vector<std::string> model_fqns;
  // Consumers not in `consumers` (added at run time: a predictor named after
  // its pod) that have neither read nor committed for this long, with a
  // batch unread that was closed that long ago, are removed at a Step(), as
  // RemoveConsumer would (never the last consumer): one that is gone (its pod
  // scaled down, rescheduled or crashed) would otherwise hold every row it has
  // not read, and the end-of-run drain. If it comes back, its next read is
  // NotFound; it adds itself again and resyncs (a gap,
  // clients/delta_continuity.h). Zero: never.
  absl::Duration expire_consumers_after = absl::ZeroDuration();
  // Receives one line per decision the tracker takes on its own (a consumer
  // expired), after its locks are released; may be empty.
  std::function<void(const std::string&)> log;
};

struct DeltaRequest {
  std::string consumer = "default";
  // Tables to read; empty means all. Reading a subset moves the consumer's
  // cursor for those tables only: the others are still delivered later.
  std::vector<std::string> fqns;
  // Keep only the top rows by score, in every table...
  std::optional<TopK> top_k;
  // ...or per table (overrides `top_k` for that table).
  std::map<std::string, TopK> per_table_top_k;
  // Score every row even without top-k.
  bool include_scores = false;
  // Read through the current batch (TorchRec's get_delta: end = curr + 1), for
  // callers on the training thread between its lookups and Step(). When false,
  // only batches closed by Step() are read (end = curr): what a concurrent
  // reader uses so that it never sees half a batch.
  bool through_current_batch = true;
  // Every row of every table read (all tracked tables when `fqns` is empty),
  // not only the changed ones: the live tables at the end batch, with values
  // and without states or scores. The cursor moves as for any read. Needs a
  // LiveRowsReader that knows table sizes; top-k does not apply.
  bool all_rows = false;
  // Also read the model's dense parameters (LiveRowsReader::ReadDense), at
  // the same step boundary as the rows' values.
  bool include_dense = false;
  // Acknowledged mode: start at this batch instead of the consumer's cursor
  // in every table where it is the end of one of the consumer's pending reads
  // (a subscription's previous push): the rows before it were delivered
  // already, and until a commit they are still held for a redelivery. Where
  // it is no such end (committed, forgotten, another table), the read starts
  // at the cursor as usual. Not with all_rows.
  std::optional<int64_t> continue_from;
};

// One table's rows in a delta; every tensor is on the host, row i for ids[i].
struct TableDelta {
  at::Tensor ids;  // int64 [n], ascending
  // The tracked state, by mode: kIdOnly: undefined. kEmbedding: each row's
  // value before its first change since the consumer's last read.
  // kMomentumLast: [n, 1] latest momentum norm. kMomentumDiff, kRowwiseAdagrad:
  // latest - first optimizer row state when a LiveRowsReader is attached, else
  // the first state.
  at::Tensor states;
  // Current embedding rows [n, dim], when a LiveRowsReader is attached.
  at::Tensor values;
  // float [n], when top-k or include_scores was asked: kEmbedding:
  // ||current - first||_2 (needs a LiveRowsReader); kMomentumLast: the stored
  // norm; kMomentumDiff, kRowwiseAdagrad: ||latest - first||_2.
  at::Tensor scores;
};

struct Delta {
  std::string consumer;
  // Batches [start, end) were read (start is the smallest per-table cursor).
  int64_t start_batch = 0;
  int64_t end_batch = 0;
  std::map<std::string, TableDelta> tables;
  // Rows this consumer had not read were dropped under the memory cap since
  // its last read: it must resync from a checkpoint. `lost_rows` counts the
  // IDs dropped (repeats included).
  bool resync_required = false;
  int64_t lost_rows = 0;
  // Every row of the tables (DeltaRequest::all_rows).
  bool all_rows = false;
  // The model's dense parameters at end_batch (DeltaRequest::include_dense).
  std::vector<std::pair<std::string, at::Tensor>> dense;
  // When the oldest batch read (start_batch, or 0) and the newest (end_batch
  // - 1) were closed; InfinitePast when the read covers no batch.
  absl::Time oldest_change = absl::InfinitePast();
  absl::Time newest_change = absl::InfinitePast();
  // The tracker's run (see Tracker::run_id()).
  std::string run_id;
  int64_t run_start_batch = 0;
};

struct ConsumerStatus {
  std::string name;
  int64_t cursor = 0;     // smallest per-table cursor
  int64_t lag_steps = 0;  // current batch - cursor
  // Time since the oldest closed batch it has not read was opened; zero when
  // it has read every closed batch. Batches restored from a snapshot count
  // as opened at the restore.
  absl::Duration lag;
  std::optional<int64_t> pending_end;  // the newest uncommitted read's end
  int pending_reads = 0;               // uncommitted reads
  bool resync_required = false;
  // Since this process started: the times the consumer was made to resync
  // (it lost unread rows to the memory cap, or RequireResync), and the row
  // IDs it had not read that the memory cap dropped (repeats included).
  int64_t resyncs = 0;
  int64_t dropped_ids = 0;
};

struct TrackerStatus {
  TrackingMode mode = TrackingMode::kIdOnly;
  int64_t current_batch = 0;
  bool delete_on_read = true;
  bool auto_compact = false;
  bool acknowledged_reads = false;
  std::vector<ConsumerStatus> consumers;
  StoreUsage usage;
  int64_t memory_cap_bytes = 0;
  // Memory-cap policy counters since start.
  int64_t cap_compactions = 0;
  int64_t cap_drops = 0;
  int64_t dropped_ids = 0;
  int64_t dropped_bytes = 0;
  // Consumers removed by TrackerOptions::expire_consumers_after since start.
  int64_t consumers_expired = 0;
  // Batches whose open time the tracker holds (for lags, expiry and
  // freshness): at most about 2^16, however long a consumer stays behind.
  int64_t opened_batches = 0;
  std::vector<std::string> warnings;
  std::string run_id;
  int64_t run_start_batch = 0;
  // A LiveRowsReader is attached: values, all_rows and dense reads work.
  bool serves_live_rows = false;
};

// A read delivered in acknowledged mode and not yet committed.
struct PendingRead {
  int64_t end = 0;
  std::vector<std::string> fqns;  // empty: every table
  // Rows of batches up to this one were dropped (memory cap, RequireResync)
  // after the read was delivered, so it did not tell the consumer: committing
  // it ends the consumer's resync only when this is below `end` (what was
  // dropped below `end`, the read held). INT64_MIN: nothing dropped since.
  int64_t lost_through = INT64_MIN;

  // Whether the read covers table `fqn`.
  bool Reads(const std::string& fqn) const {
    return fqns.empty() ||
           std::find(fqns.begin(), fqns.end(), fqn) != fqns.end();
  }
};

// A consumer's position, for snapshots.
struct ConsumerState {
  std::string name;
  int64_t cursor = -1;
  // Tables read on their own, with their cursors.
  std::map<std::string, int64_t> table_cursors;
  // Uncommitted reads, oldest first (acknowledged mode).
  std::vector<PendingRead> pending_reads;
  bool resync_required = false;
  int64_t lost_ids = 0;

  // The cursor of table `fqn`: its own entry, else `cursor`.
  int64_t CursorOf(const std::string& fqn) const {
    auto it = table_cursors.find(fqn);
    return it == table_cursors.end() ? cursor : it->second;
  }
};

// Everything a tracker holds, for snapshots and restarts
// (tracker_service/tracker_snapshots.h).
struct TrackerState {
  TrackingMode mode = TrackingMode::kIdOnly;
  int64_t current_batch = 0;
  int64_t compact_index = 0;
  std::vector<ConsumerState> consumers;
  // The memory cap's counters when the state was saved, for operators
  // reading a snapshot: RestoreState leaves them out (a process's counters
  // start at 0, as Prometheus expects).
  int64_t cap_compactions = 0;
  int64_t cap_drops = 0;
  int64_t dropped_ids = 0;
  int64_t dropped_bytes = 0;
  std::vector<StoredTable> tables;
};

// Tracker: which rows of which tables changed, per named consumer, following
// TorchRec's ModelDeltaTracker, then extending it.
//
// Batch index `curr` starts at 0; Step() adds 1. Each consumer has a cursor,
// -1 at start (per table, once it reads a subset of tables).
//  - RecordTables appends, per table FQN, one lookup at `curr`.
//  - TriggerCompaction (auto_compact; once per step): per table, compacts
//    [max(cursors), curr).
//  - GetDelta(c): end = curr + 1 (or curr, see DeltaRequest); per table,
//    compacts between consecutive cursors up to end (TorchRec: only
//    [max(cursors), end)), returns the unique rows since c's cursor and
//    moves the cursor to end; with delete_on_read, deletes every lookup below
//    min(cursors). IDs ascending. Consumers whose cursors stand at the same
//    batch and that read the same closed batches get the same rows, gathered
//    once: a delta's tensors may be shared with other reads and must not be
//    changed in place.
//  Unlike TorchRec, compaction never reaches into the open batch `curr`
//  (windows end at curr at most): rows recorded into it later, or read by a
//  consumer that reads closed batches only, can then never hide inside a
//  compacted lookup below a cursor. Results are the same.
//  - Clear(c) moves c's cursor to the present (the open batch) and deletes
//    what no consumer still needs; Clear() deletes everything recorded.
//
// Memory cap: after a record pushes the store over `memory_cap_bytes`, the
// tracker (1) deletes what no consumer needs, (2) compacts between cursors,
// (3) drops the oldest batches until under the cap. Step 3 is counted in
// TrackerStatus and every consumer that lost unread rows gets
// Delta::resync_required on its next read: never a silent loss.
//
// Errors are values; a rejected call changes nothing, and a read that fails
// moves no cursor. Thread safety: every method may be called from any thread;
// calls are serialised, except that records and steps go on while a read
// reads live rows or copies recorded rows: a read blocks recording while it
// compacts and finds its rows, and copies them with the lock released (unless
// it goes through the open batch). During a read's copy the memory cap and
// auto-compaction wait for its end. Calls that read rows pin them first
// (LiveRowsReader::PinRows), then take the tracker's lock: the trainer
// neither changes rows nor closes a batch during such a read, so the values
// it returns are exactly the tables after its end batch.
class Tracker {
 public:
  static constexpr absl::string_view kDefaultConsumer = "default";
  // Uncommitted reads kept per consumer (acknowledged mode); an older one can
  // no longer be committed, and its rows are delivered again.
  static constexpr int kMaxPendingReads = 64;

  // InvalidArgument for a bad option (a consumer name or a tracked table's
  // FQN that breaks the name rule of tracker_service/names.h, a duplicate
  // consumer, a module description); FailedPrecondition for kEmbedding on a
  // pooled module. `reader` may be null; it must outlive the tracker.
  static absl::StatusOr<std::unique_ptr<Tracker>> Create(
      TrackerOptions options, LiveRowsReader* reader = nullptr);

  Tracker(const Tracker&) = delete;
  Tracker& operator=(const Tracker&) = delete;
  ~Tracker();

  // Records one lookup per table FQN at the current batch: the one way rows
  // get into the tracker, for the trainer's modules (their post-lookup hook,
  // trainer/tracking/module_tracking.h, which maps features to FQNs through
  // feature_map()) and for producers over the network (the service).
  // `states` per mode: kIdOnly ignored; kEmbedding the embedding rows
  // [n, dim]; optimizer modes the optimizer row states ([n] or [n, k]; read
  // through the LiveRowsReader when absent). Float64 states (a "double"
  // table's rows or optimizer states) are kept as float32: they rank rows and
  // report movement, while values are read from the table itself.
  //
  // Refused, all or nothing (InvalidArgument unless said): a name that breaks
  // the name rule (tracker_service/names.h); with declared modules, an FQN
  // not tracked (NotFound); IDs not 1-D int64; states not [n, d] with d >= 1
  // once converted; with `check_values` (records from the network; costs a
  // device synchronisation) also IDs outside [0, rows) (rows from the
  // LiveRowsReader, else any non-negative ID) and states that are not finite.
  // FQNs skipped by fqns_to_skip are ignored. Without `check_values` nothing
  // is copied to the host and nothing synchronises with a device.
  absl::Status RecordTables(std::vector<TableLookup> tables,
                            bool check_values = false) ABSL_LOCKS_EXCLUDED(mu_);

  // Advances the batch index, and expires consumers
  // (TrackerOptions::expire_consumers_after; not while a filling read is
  // copying: then at a later step). Returns the new index.
  int64_t Step() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t current_batch() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until the current batch is past `batch` or `deadline` passes;
  // returns the current batch.
  int64_t WaitForBatchAfter(int64_t batch, absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_, step_mu_);

  // Auto-compaction after output distribution; once per step; a no-op unless
  // auto_compact.
  void TriggerCompaction() ABSL_LOCKS_EXCLUDED(mu_);

  // Compacts [start, end) in every table: TorchRec's compact(). Callers must
  // not compact across a consumer's cursor.
  void Compact(int64_t start, int64_t end) ABSL_LOCKS_EXCLUDED(mu_);

  // Compacts every table between consecutive consumer cursors and up to the
  // open batch: the most compaction that changes no consumer's reads.
  void CompactAll() ABSL_LOCKS_EXCLUDED(mu_);

  // Reads a delta (see above); a read that copies recorded rows copies them
  // on this thread with the lock released, as GetDeltaFilling's thread does,
  // and returns once they are all there. NotFound for an unknown consumer or
  // table; InvalidArgument for a bad top-k; FailedPrecondition for scores
  // that need a LiveRowsReader when there is none.
  absl::StatusOr<Delta> GetDelta(const DeltaRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  // GetDelta for a caller that sends the rows as they come (the service's
  // stream): the read runs on the tracker's fill thread (FillThread, one per
  // tracker, kept), which hands out the delta once its IDs are known and then
  // copies the tables' state rows into it in pieces, with the tracker's lock
  // released (records and steps go on; every other change waits) unless the
  // read goes through the open batch, and delivers the read (moves the
  // cursors) once they are copied. Send a table's rows once
  // (*fill)->AwaitRows says they are there, and nothing more of the delta
  // when it returns an error (a copy failed: the read moved nothing and the
  // rows it names were never written); `*fill` (set on success and on
  // error) must go before the tracker (its destructor waits for the read). A
  // read that works with the states itself (scores, top-k, momentum_diff,
  // rowwise_adagrad) copies them before it hands out; one that leaves no
  // copy for later (those, id_only, all_rows) runs on the calling thread, as
  // GetDelta. Errors as GetDelta.
  absl::StatusOr<Delta> GetDeltaFilling(const DeltaRequest& request,
                                        std::unique_ptr<StatesFill>* fill)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Acknowledged mode: makes the consumer's read ending at `end_batch` final:
  // its cursors move to `end_batch`, and the reads it delivered earlier over
  // the same tables are final too. Reads delivered after it stay pending, so
  // a consumer that applies one read while the next is in flight commits each
  // in turn. The newest kMaxPendingReads reads are kept. FailedPrecondition
  // when no uncommitted read ends at `end_batch` (committed already, or
  // superseded by a later commit), or when not in acknowledged mode; NotFound
  // for an unknown consumer.
  absl::Status Commit(absl::string_view consumer, int64_t end_batch)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Marks `consumer` in contact now, as its reads and commits do, for
  // TrackerOptions::expire_consumers_after: the service touches a consumer
  // when a read's stream has been sent and while a subscription waits for its
  // next push, so that neither a long transfer nor a long schedule is taken
  // for a consumer gone, and at a client's Touch call (a consumer busy
  // elsewhere). NotFound for an unknown name (a consumer removed or
  // expired: a subscription then ends). Does not wait for a filling read's
  // copy.
  absl::Status Touch(absl::string_view consumer) ABSL_LOCKS_EXCLUDED(mu_);

  // Adds a consumer whose cursor starts at the current batch. InvalidArgument
  // for a bad name (tracker_service/names.h), AlreadyExists if present.
  absl::Status AddConsumer(absl::string_view name) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes a consumer; what only it needed is deleted (with delete_on_read).
  // NotFound if absent; FailedPrecondition for the last consumer.
  absl::Status RemoveConsumer(absl::string_view name) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::string> Consumers() const ABSL_LOCKS_EXCLUDED(mu_);

  // Clear(c): c's cursor moves to the present, the open batch (as a read of
  // the closed batches leaves it: rows recorded after the clear reach c, and
  // rows the open batch held before it may reach c too); every lookup no
  // consumer still needs is deleted. NotFound for an unknown consumer.
  // (TorchRec moves the cursor past the open batch, whose later rows that
  // consumer would then never see.)
  absl::Status Clear(absl::string_view consumer) ABSL_LOCKS_EXCLUDED(mu_);
  // Clear(): deletes everything recorded so far; every cursor moves to the
  // present, as above.
  void ClearAll() ABSL_LOCKS_EXCLUDED(mu_);

  TrackerStatus Status() const ABSL_LOCKS_EXCLUDED(mu_);

  // A consistent copy of everything the tracker holds, taken between two
  // calls (see DeltaStore::Export for its cost).
  TrackerState SaveState() const ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces everything the tracker holds with `state`, so that consumers
  // resume where they were. Consumers of this tracker's options that the state
  // lacks are added at the state's current batch. All or nothing:
  // FailedPrecondition when the state's mode is not this tracker's or it holds
  // a table this tracker does not track; InvalidArgument for a bad consumer
  // name or table (see DeltaStore::Import).
  absl::Status RestoreState(TrackerState state) ABSL_LOCKS_EXCLUDED(mu_);

  // Every consumer's position and the current batch, without the store's
  // rows (SaveState's `mode`, `current_batch` and `consumers`; the rest left
  // at its defaults): cheap, for ranks that agree on cursors
  // (trainer/cursor_agreement.h).
  TrackerState SaveConsumers() const ABSL_LOCKS_EXCLUDED(mu_);
  // Sets each consumer of `consumers` to that position (adding the ones this
  // tracker lacks), as ranks agreed it after a restore, and keeps the others.
  // A cursor never moves back: where a consumer already stands further (a
  // commit that came in since SaveConsumers), it stays, and pending reads
  // ending at or before its cursors are dropped. The store's rows are kept;
  // with delete_on_read, what no consumer needs any more is deleted. The
  // counters since start (ConsumerStatus::resyncs) count a resync flag that
  // this sets. InvalidArgument for a bad or repeated name, changing nothing.
  absl::Status SetConsumers(std::vector<ConsumerState> consumers)
      ABSL_LOCKS_EXCLUDED(mu_);

  // This run of the tracker: a random id drawn at Create, and the batch the
  // run started at (0, the batch of a restored state, or what the owner
  // marks). Every delta carries both, so that a consumer holding rows newer
  // than run_start_batch from another run knows they were lost in a restart.
  const std::string& run_id() const { return run_id_; }
  // Marks the batch this run continues from (e.g. a trainer whose model
  // checkpoint is older than the tracker's snapshot).
  void MarkRunStart(int64_t batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Tells every consumer, on its next read, that rows may be missing
  // (Delta::resync_required): for a trainer whose model and tracker were
  // restored from different steps, so that changes were never recorded.
  void RequireResync() ABSL_LOCKS_EXCLUDED(mu_);
  // The same for the consumers whose cursor stands before `batch` (a trainer
  // whose tracker was restored from an older step than its model: the
  // steps before `batch` were never recorded, and only a consumer that had
  // not read through them needs them). Committing a pending read that ends
  // at or after `batch` ends such a consumer's resync: that read held them.
  void RequireResyncBefore(int64_t batch) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for one consumer (nothing for an unknown one): without
  // acknowledged reads, a read delivered to it whose rows never reached it
  // (the service's send failed: the client went away, or refused a message).
  void RequireResyncOf(absl::string_view consumer) ABSL_LOCKS_EXCLUDED(mu_);

  // The feature -> table FQN map and tracked table FQNs.
  const FeatureMap& feature_map() const { return feature_map_; }
  const TrackerOptions& options() const { return options_; }

 private:
  struct Consumer;

  // Now by the monotonic clock, as a duration since an arbitrary start: for
  // how long ago things happened (consumer expiry, lag), which a step of the
  // wall clock (NTP, a resumed VM) must not move.
  static absl::Duration MonotonicNow() {
    return absl::FromChrono(
        std::chrono::steady_clock::now().time_since_epoch());
  }
  // When a batch was opened: by the wall clock, which deltas carry to other
  // hosts (their freshness), and by MonotonicNow.
  struct Opened {
    absl::Time wall;
    absl::Duration monotonic;
    static Opened Now() { return {absl::Now(), MonotonicNow()}; }
  };

  Tracker(TrackerOptions options, FeatureMap feature_map,
          LiveRowsReader* reader);

  absl::Status RecordTablesLocked(std::vector<TableLookup> tables,
                                  bool check_values)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<at::Tensor> TrackedStates(const std::string& fqn,
                                           const at::Tensor& ids,
                                           const at::Tensor& states);
  Consumer* FindConsumer(absl::string_view name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t CursorOf(const Consumer& consumer, const std::string& fqn) const;
  // Where `request` reads `fqn` from: the cursor, or continue_from.
  int64_t ReadFrom(const Consumer& consumer, const std::string& fqn,
                   const DeltaRequest& request, int64_t end) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MaxCursor(const std::string& fqn) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MinCursor(const std::string& fqn) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetCursor(Consumer& consumer, const std::string& fqn, int64_t cursor)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the consumer's cursors to `end` (for `only_fqns`, or every table when
  // empty), ends the pending reads it covers (over those tables, ending at
  // `end` or before) and deletes what no one needs (delete_on_read).
  void AdvanceLocked(Consumer& consumer,
                     const std::vector<std::string>& only_fqns, int64_t end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rows of batches up to `batch` that `consumer` had not read were dropped,
  // of table `fqn` (null: of every table): it must resync, and no read it
  // holds uncommitted told it so. Committing one of those reads ends the
  // resync only if the read held what was dropped: it covers the table (every
  // table, for a loss of every table) and ends after `batch`.
  void MarkLostLocked(Consumer& consumer, int64_t batch,
                      const std::string* fqn = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SaveState's mode, current batch and consumers.
  void SaveConsumersLocked(TrackerState& state) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Clear(): the consumer has read everything up to now.
  void MoveToPresentLocked(Consumer& consumer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes, per table, the lookups below every consumer's cursor.
  void DeleteUnneededLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompactAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Compacts one table between consecutive cursors (and pending ends), up to
  // the open batch: never across a boundary any consumer reads from.
  void CompactBetweenCursorsLocked(const std::string& fqn)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EnforceMemoryCapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Auto-compaction of every table from its furthest cursor to the open
  // batch, once per step (TriggerCompaction).
  void CompactOpenWindowLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells WaitForBatchAfter callers the current batch.
  void PublishBatch(int64_t batch) ABSL_LOCKS_EXCLUDED(step_mu_);
  // When batch `batch` was opened (the first one known at or after it).
  Opened OpenedAt(int64_t batch) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Whether a filling read of `request` may copy the states of a table read
  // with `spec` (its top-k, or null) after it hands the delta out.
  bool DefersStates(const DeltaRequest& request, const TopK* spec) const;
  // A read of recorded rows (GetDelta, GetDeltaFilling); with `fill`,
  // hands the delta out to it and copies the deferred states afterwards:
  // with the lock released (copying_), as the dense parameters are read,
  // unless the read goes through the open batch, and delivers the read once
  // they are copied.
  // With a LiveRowsReader and no `fill`, the live rows (values, optimizer
  // states, dense parameters) are read with the lock released (the pin
  // holds the rows still, and the training thread records meanwhile); the
  // read is then delivered if its consumer is as it was, else read again.
  absl::StatusOr<Delta> GetDeltaUnguarded(const DeltaRequest& request,
                                          StatesFill* fill)
      ABSL_LOCKS_EXCLUDED(mu_);
  // GetDeltaUnguarded's read with `fill`. A read that fails (or throws)
  // has moved nothing and leaves no shared read with unwritten rows.
  absl::StatusOr<Delta> FillingRead(const DeltaRequest& request,
                                    StatesFill* fill) ABSL_LOCKS_EXCLUDED(mu_);
  // A filling read that failed with copies deferred: drops every shared read
  // (some may be its own, whose rows were never written).
  void DropSharedReadsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At the end of a read's copy: the memory cap, auto-compaction and
  // consumer expiry that records and steps deferred meanwhile. The first
  // two's failure (out of memory) is logged, not the read's: the next record
  // and step apply them again. Returns the expiry's log lines, for after the
  // lock.
  std::vector<std::string> ApplyDeferredLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A read between its parts (GetDeltaUnguarded).
  struct PreparedRead;
  // The read's part under the lock: checks the consumer and tables, and takes
  // every table's changed IDs and recorded states (`defer` gets the state
  // copies a filling read defers) and what the delta says of the consumer.
  absl::Status PrepareReadLocked(
      const DeltaRequest& request, StatesFill* fill,
      const std::function<void(const std::string& fqn,
                               std::unique_ptr<RowGather> gather)>& defer,
      PreparedRead& read) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The read's live rows: every table's values (and what FinishTableDelta
  // derives from them) or, for all_rows, every row; the dense parameters.
  // Needs the rows pinned, not the lock.
  absl::Status ReadLiveRows(const DeltaRequest& request, PreparedRead& read);
  // Whether the read's consumer, the batch and the run are as the read
  // found them, so that delivering it is delivering a read made now.
  bool UnchangedLocked(const PreparedRead& read)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the consumers TrackerOptions::expire_consumers_after expires
  // now; returns a log line for each.
  std::vector<std::string> ExpireConsumersLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Delivers the read: a pending read (acknowledged mode), or the consumer's
  // cursors moved to its end.
  void DeliverLocked(const DeltaRequest& request, const PreparedRead& read)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every row of `fqn`, with its current value (DeltaRequest::all_rows).
  absl::Status ReadWholeTable(const std::string& fqn, TableDelta& table);
  // The unique rows of `fqn` recorded in batches [from, end): the read of
  // another consumer of the same closed batches when one is held (see
  // shared_reads_), else the store's, kept for the next. With `gather`, the
  // store's states may come unwritten, with `*gather` to write them before
  // the lock is released (DeltaStore::GetUniqueTableDeferred).
  absl::StatusOr<UniqueRows> ChangedRowsLocked(
      const std::string& fqn, int64_t from, int64_t end,
      std::unique_ptr<RowGather>* gather = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the shared reads no consumer can read again: none reads `fqn` from
  // their `from` (a cursor or a pending end) any more.
  void ReleaseSharedReadsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TrackerOptions options_;
  const FeatureMap feature_map_;
  // TrackerOptions::model_fqns that the feature map lacks: tables only other
  // processes hold, read as tables without rows.
  const absl::flat_hash_set<std::string> held_elsewhere_;
  const std::string run_id_;
  LiveRowsReader* const reader_;
  DeltaStore store_;

  mutable SharedMutex mu_;
  // A filling read copies its rows with mu_ released, so that the training
  // thread's records and steps do not wait for the copy. Meanwhile nothing
  // may change the rows it copies or the consumer it then delivers to: every
  // other change takes mu_ with a ChangeLock, which waits for the copy's end;
  // a record appends only (DeltaStore::Append moves no held row) and leaves
  // the memory cap to the copy's end, and auto-compaction waits there too.
  bool copying_ ABSL_GUARDED_BY(mu_) = false;
  bool cap_deferred_ ABSL_GUARDED_BY(mu_) = false;
  bool compaction_deferred_ ABSL_GUARDED_BY(mu_) = false;
  bool expiry_deferred_ ABSL_GUARDED_BY(mu_) = false;
  // Signalled when copying_ turns false.
  mutable std::condition_variable_any copy_ended_;
  // Holds mu_ exclusively once no filling read is copying: what every change
  // but a record, a step and auto-compaction locks with.
  class ABSL_SCOPED_LOCKABLE ChangeLock {
   public:
    explicit ChangeLock(Tracker* tracker)
        ABSL_EXCLUSIVE_LOCK_FUNCTION(tracker->mu_);
    ~ChangeLock() ABSL_UNLOCK_FUNCTION();
    ChangeLock(const ChangeLock&) = delete;
    ChangeLock& operator=(const ChangeLock&) = delete;

   private:
    Tracker* const tracker_;
  };
  int64_t curr_batch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t curr_compact_index_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t run_start_batch_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::unique_ptr<Consumer>, std::less<>> consumers_
      ABSL_GUARDED_BY(mu_);
  int64_t cap_compactions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cap_drops_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ids_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t consumers_expired_ ABSL_GUARDED_BY(mu_) = 0;
  // The newest read of each table's closed batches [from, end), which every
  // consumer whose cursor is at `from` reads alike when it reads up to `end`:
  // the consumers of a step share one gather of the rows instead of one each.
  // Batches before the open one change only by deletion, clearing, restoring
  // or a compaction across a cursor; those drop every shared read, and a
  // read no consumer can repeat is dropped when cursors move. Holds at most
  // one read's rows per table beyond the store's bytes.
  struct SharedRead {
    int64_t from = 0;
    int64_t end = 0;
    UniqueRows rows;
  };
  absl::flat_hash_map<std::string, SharedRead> shared_reads_
      ABSL_GUARDED_BY(mu_);
  // When each batch from the oldest any consumer has not read was opened;
  // at most kMaxOpenedBatches of them (ThinOpenedBatchesLocked): OpenedAt
  // gives a batch no longer kept the time of the next one kept.
  std::map<int64_t, Opened> batch_opened_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kMaxOpenedBatches = size_t{1} << 16;
  // Past kMaxOpenedBatches, drops every other entry of the older half, so
  // that a consumer that never reads (or never commits) holds the map at
  // about 5 MiB with times ever coarser for the oldest batches, never growing
  // with every step for good.
  void ThinOpenedBatchesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // WaitForBatchAfter's wake-ups: the current batch as Step() published it.
  // A SharedMutex and condition_variable_any (exclusive_lockable.h), not
  // absl::Mutex: ThreadSanitizer sees them.
  mutable SharedMutex step_mu_;
  mutable std::condition_variable_any step_cv_;
  int64_t published_batch_ ABSL_GUARDED_BY(step_mu_) = 0;

  // GetDeltaFilling's reads; last, so that its thread stops first.
  FillThread fill_thread_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_TRACKER_H_
