#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "base/torch_status.h"
#include "tracker_service/table_scores.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracker_consumer.h"

// Tracker: cursors, pending reads (acknowledged mode), reads and commits.

namespace deltastream {
namespace {

UniqueRows EmptyRows() {
  UniqueRows rows;
  rows.ids = at::empty({0}, at::kLong);
  return rows;
}

// A read's table that other processes hold all of
// (TrackerOptions::model_fqns): no rows, and empty states and scores where
// the mode and the request give a table of this tracker's those.
TableDelta NoRowsHeldHere(TrackingMode mode, const DeltaRequest& request,
                          const std::string& fqn) {
  TableDelta table;
  table.ids = at::empty({0}, at::kLong);
  if (mode == TrackingMode::kIdOnly || request.all_rows) return table;
  table.states = at::empty({0, 1}, at::kFloat);
  if (request.include_scores || request.top_k.has_value() ||
      request.per_table_top_k.count(fqn) > 0) {
    table.scores = at::empty({0}, at::kFloat);
  }
  return table;
}

// A filling read copies states in pieces of about this many bytes, telling
// its StatesFill after each.
constexpr int64_t kCopyPieceBytes = 256 << 10;

// The deferred state copies of one read (Tracker::FillingRead), by table. A
// read that fails drops them uncopied (and the shared reads: see
// Tracker::DropSharedReadsLocked).
class PendingCopies {
 public:
  explicit PendingCopies(StatesFill* fill) : fill_(fill) {}
  PendingCopies(const PendingCopies&) = delete;
  PendingCopies& operator=(const PendingCopies&) = delete;

  bool empty() const { return gathers_.empty(); }

  void Add(const std::string& fqn, std::unique_ptr<RowGather> gather) {
    gathers_.emplace_back(fqn, std::move(gather));
    fill_->Expect(fqn);
  }

  // Copies every table's rows, piece by piece, telling the fill.
  void CopyAll() {
    for (auto& [fqn, gather] : gathers_) {
      const int64_t rows = gather->rows();
      const int64_t piece = std::max<int64_t>(
          1, kCopyPieceBytes / std::max<int64_t>(1, gather->row_bytes()));
      for (int64_t begin = 0; begin < rows; begin += piece) {
        const int64_t end = std::min(rows, begin + piece);
        gather->Copy(begin, end);
        fill_->Copied(fqn, end);
      }
    }
    gathers_.clear();
  }

 private:
  StatesFill* const fill_;
  std::vector<std::pair<std::string, std::unique_ptr<RowGather>>> gathers_;
};

}  // namespace

struct Tracker::PreparedRead {
  Delta delta;
  // The tables read, in order, each with its top-k (or null).
  std::vector<std::pair<std::string, const TopK*>> tables;
  // The consumer, and (a read that unlocks) a copy of it as the read found
  // it.
  const Consumer* consumer = nullptr;
  std::unique_ptr<Consumer> seen;
  int64_t batch = 0;  // curr_batch_ then
};

Tracker::Consumer* Tracker::FindConsumer(absl::string_view name) {
  auto it = consumers_.find(name);
  return it == consumers_.end() ? nullptr : it->second.get();
}

int64_t Tracker::CursorOf(const Consumer& consumer,
                          const std::string& fqn) const {
  // Most consumers read every table: no per-table cursor to look up.
  if (consumer.table_cursors.empty()) return consumer.cursor;
  auto it = consumer.table_cursors.find(fqn);
  return it == consumer.table_cursors.end() ? consumer.cursor : it->second;
}

int64_t Tracker::ReadFrom(const Consumer& consumer, const std::string& fqn,
                          const DeltaRequest& request, int64_t end) const {
  const int64_t cursor = CursorOf(consumer, fqn);
  if (!request.continue_from.has_value() || request.all_rows) return cursor;
  const int64_t from = *request.continue_from;
  if (from <= cursor || from > end) return cursor;
  // Pending ends are compaction bounds (CompactBetweenCursorsLocked): the
  // batches from there on are still apart from those before.
  const std::vector<int64_t> ends = consumer.PendingEnds(fqn);
  return std::find(ends.begin(), ends.end(), from) != ends.end() ? from
                                                                 : cursor;
}

int64_t Tracker::MaxCursor(const std::string& fqn) const {
  // A pending read's end counts: compacting across it would hide rows from the
  // consumer once it commits.
  int64_t result = INT64_MIN;
  for (const auto& [name, consumer] : consumers_) {
    result = std::max(result, CursorOf(*consumer, fqn));
    for (int64_t end : consumer->PendingEnds(fqn)) {
      result = std::max(result, end);
    }
  }
  return result;
}

int64_t Tracker::MinCursor(const std::string& fqn) const {
  int64_t result = INT64_MAX;
  for (const auto& [name, consumer] : consumers_) {
    result = std::min(result, CursorOf(*consumer, fqn));
  }
  return result;
}

void Tracker::SetCursor(Consumer& consumer, const std::string& fqn,
                        int64_t cursor) {
  consumer.table_cursors[fqn] = std::max(CursorOf(consumer, fqn), cursor);
}

absl::Status Tracker::ReadWholeTable(const std::string& fqn,
                                     TableDelta& table) {
  absl::StatusOr<int64_t> rows = reader_->NumRows(fqn);
  if (!rows.ok()) return rows.status();
  const int64_t first = reader_->FirstRow(fqn);
  table.ids = at::arange(first, first + *rows, at::kLong);
  absl::StatusOr<at::Tensor> values = reader_->ReadEmbeddings(fqn, table.ids);
  if (!values.ok()) return values.status();
  table.values = values->cpu();
  return absl::OkStatus();
}

absl::StatusOr<UniqueRows> Tracker::ChangedRowsLocked(
    const std::string& fqn, int64_t from, int64_t end,
    std::unique_ptr<RowGather>* gather) {
  // Records go into the open batch only: batches before it hold still.
  const bool closed = end <= curr_batch_;
  if (closed) {
    auto it = shared_reads_.find(fqn);
    if (it != shared_reads_.end() && it->second.from == from &&
        it->second.end == end) {
      return it->second.rows;  // tensor handles: no copy
    }
  }
  absl::StatusOr<UniqueRows> rows;
  if (gather == nullptr) {
    rows = store_.GetUniqueTable(fqn, from, end);
  } else {
    absl::StatusOr<DeltaStore::DeferredRows> deferred =
        store_.GetUniqueTableDeferred(fqn, from, end);
    if (deferred.ok()) {
      *gather = std::move(deferred->gather);
      rows = std::move(deferred->rows);
    } else {
      rows = deferred.status();
    }
  }
  if (rows.ok() && closed) shared_reads_[fqn] = SharedRead{from, end, *rows};
  return rows;
}

void Tracker::ReleaseSharedReadsLocked() {
  for (auto it = shared_reads_.begin(); it != shared_reads_.end();) {
    const std::string& fqn = it->first;
    const int64_t from = it->second.from;
    bool readable = false;  // some consumer may read `fqn` from `from`
    for (const auto& [name, consumer] : consumers_) {
      const std::vector<int64_t> ends = consumer->PendingEnds(fqn);
      readable = readable || CursorOf(*consumer, fqn) == from ||
                 std::find(ends.begin(), ends.end(), from) != ends.end();
    }
    if (readable) {
      ++it;
    } else {
      shared_reads_.erase(it++);
    }
  }
}

absl::StatusOr<Delta> Tracker::GetDelta(const DeltaRequest& request) {
  const TopK* every_table =
      request.top_k.has_value() ? &*request.top_k : nullptr;
  if (!DefersStates(request, every_table)) {
    // No exception leaves a read; one that fails has moved nothing.
    return CatchTorchErrors(
        [&] { return GetDeltaUnguarded(request, nullptr); });
  }
  // A filling read on this thread: the rows are copied with the lock
  // released, and the delta returned once they are all there.
  StatesFill fill;
  absl::StatusOr<Delta> delta =
      CatchTorchErrors([&] { return GetDeltaUnguarded(request, &fill); });
  fill.Finish();
  return delta;
}

bool Tracker::DefersStates(const DeltaRequest& request,
                           const TopK* spec) const {
  // id_only keeps no states; the diff modes and scores work with them.
  const TrackingMode mode = options_.mode;
  return !request.all_rows && spec == nullptr && !request.include_scores &&
         mode != TrackingMode::kIdOnly && mode != TrackingMode::kMomentumDiff &&
         mode != TrackingMode::kRowwiseAdagrad;
}

absl::StatusOr<Delta> Tracker::GetDeltaFilling(
    const DeltaRequest& request, std::unique_ptr<StatesFill>* fill) {
  auto state = std::make_unique<StatesFill>();
  StatesFill* const raw = state.get();
  *fill = std::move(state);
  // Tables with a top-k of their own may defer; with request.top_k none do.
  const TopK* every_table =
      request.top_k.has_value() ? &*request.top_k : nullptr;
  if (!DefersStates(request, every_table)) {
    // Nothing to copy after the hand-out: no thread to hand over to.
    absl::StatusOr<Delta> delta = GetDelta(request);
    raw->Finish();
    return delta;
  }
  fill_thread_.Run([this, request, raw] {
    absl::StatusOr<Delta> delta =
        CatchTorchErrors([&] { return GetDeltaUnguarded(request, raw); });
    const absl::Status status = delta.status();
    // A read that fails before the hand-out hands out its status; after it,
    // its sender learns it from AwaitRows.
    raw->HandOut(std::move(delta));
    raw->Finish(status);
  });
  return raw->AwaitDelta();
}

absl::StatusOr<Delta> Tracker::GetDeltaUnguarded(const DeltaRequest& request,
                                                 StatesFill* fill) {
  // Everything that can be refused is checked before any cursor moves.
  std::vector<const TopK*> specs;
  if (request.top_k.has_value()) specs.push_back(&*request.top_k);
  for (const auto& [fqn, spec] : request.per_table_top_k)
    specs.push_back(&spec);
  for (const TopK* spec : specs) {
    if (absl::Status status = spec->Validate(); !status.ok()) return status;
  }
  if (request.all_rows && !specs.empty()) {
    return absl::InvalidArgumentError(
        "top-k selects changed rows; a read of all rows takes every row");
  }
  if (!specs.empty() || request.include_scores) {
    const TrackingMode mode = options_.mode;
    if (mode == TrackingMode::kIdOnly) {
      return absl::FailedPreconditionError(
          "id_only mode has no scores: top-k needs embedding or an "
          "optimizer-state mode");
    }
    if (reader_ == nullptr && mode != TrackingMode::kMomentumLast) {
      return absl::FailedPreconditionError(absl::StrCat(
          "scores in ", TrackingModeName(mode),
          " mode compare with the trainer's current rows, which this tracker "
          "cannot read (no LiveRowsReader: not running inside a trainer)"));
    }
  }

  if ((request.all_rows || request.include_dense) && reader_ == nullptr) {
    return absl::FailedPreconditionError(
        "reads of whole tables and dense parameters need the trainer's live "
        "model, which this tracker cannot read (no LiveRowsReader: not running "
        "inside a trainer)");
  }

  if (fill != nullptr) return FillingRead(request, fill);

  // Rows stay still from here to the end of the read (see LiveRowsReader).
  LiveRowsReader::Pin pin(reader_);
  // Live rows are read with the lock released, when there are any, unless
  //  - the read goes through the open batch (the training thread's own read,
  //    between its lookups and Step(): a record meanwhile would land in a
  //    batch the read has passed),
  //  - or it is the last attempt: a read whose consumer keeps changing under
  //    it reads all under the lock.
  constexpr int kUnlockedAttempts = 2;
  const auto no_deferred_copies = [](const std::string&,
                                     std::unique_ptr<RowGather>) {};
  for (int attempt = 0;; ++attempt) {
    const bool unlocked = reader_ != nullptr &&
                          !request.through_current_batch &&
                          attempt < kUnlockedAttempts;
    PreparedRead read;
    {
      ChangeLock lock(this);
      if (absl::Status s = PrepareReadLocked(request, /*fill=*/nullptr,
                                             no_deferred_copies, read);
          !s.ok()) {
        return s;
      }
      if (!unlocked) {
        if (absl::Status s = ReadLiveRows(request, read); !s.ok()) return s;
        DeliverLocked(request, read);
        return std::move(read.delta);
      }
      read.seen = std::make_unique<Consumer>(*read.consumer);
    }
    // A failed read has moved nothing.
    if (absl::Status s = ReadLiveRows(request, read); !s.ok()) return s;
    ChangeLock lock(this);
    if (!UnchangedLocked(read)) continue;
    DeliverLocked(request, read);
    return std::move(read.delta);
  }
}

absl::StatusOr<Delta> Tracker::FillingRead(const DeltaRequest& request,
                                           StatesFill* fill) {
  // Rows stay still until the live rows are read (see LiveRowsReader); the
  // deferred copies read recorded states, not live rows.
  std::optional<LiveRowsReader::Pin> pin;
  pin.emplace(reader_);
  PreparedRead read;
  PendingCopies copies(fill);
  {
    ChangeLock lock(this);
    try {
      absl::Status s = PrepareReadLocked(
          request, fill,
          [&copies](const std::string& fqn, std::unique_ptr<RowGather> gather) {
            copies.Add(fqn, std::move(gather));
          },
          read);
      if (!s.ok()) {
        DropSharedReadsLocked();
        return s;
      }
      // A read through the open batch reads and copies under the lock: a
      // record meanwhile would land in a batch the read has passed. So does
      // one with nothing to copy or read from the trainer's model.
      if (request.through_current_batch ||
          (copies.empty() && !request.include_dense)) {
        if (absl::Status s = ReadLiveRows(request, read); !s.ok()) {
          DropSharedReadsLocked();
          return s;
        }
        fill->HandOut(read.delta);  // tensor handles: no copy
        copies.CopyAll();  // before the cursors move: a delete may drop rows
        DeliverLocked(request, read);
        return std::move(read.delta);
      }
    } catch (...) {
      DropSharedReadsLocked();
      throw;
    }
    copying_ = true;
  }
  // From here to end_copy, records and steps go on; every other change
  // waits.
  const auto end_copy = [&](bool copied) {
    std::vector<std::string> expired;
    {
      // Waiters in ChangeLock wake whatever happens below.
      absl::Cleanup wake = [this] { copy_ended_.notify_all(); };
      WriterLock lock(&mu_);
      copying_ = false;
      if (copied) {
        DeliverLocked(request, read);
      } else {
        DropSharedReadsLocked();
      }
      expired = ApplyDeferredLocked();
    }
    if (options_.log) {
      for (const std::string& line : expired) options_.log(line);
    }
  };
  try {
    if (absl::Status s = ReadLiveRows(request, read); !s.ok()) {
      end_copy(false);
      return s;
    }
    fill->HandOut(read.delta);  // tensor handles: no copy
    pin.reset();
    copies.CopyAll();
  } catch (...) {
    end_copy(false);
    throw;
  }
  end_copy(true);
  return std::move(read.delta);
}

void Tracker::DropSharedReadsLocked() { shared_reads_.clear(); }

std::vector<std::string> Tracker::ApplyDeferredLocked() {
  const bool cap = std::exchange(cap_deferred_, false);
  const bool compaction = std::exchange(compaction_deferred_, false);
  const absl::Status status =
      CatchTorchErrors([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (cap) EnforceMemoryCapLocked();
        if (compaction) CompactOpenWindowLocked();
        return absl::OkStatus();
      });
  if (!status.ok()) {
    LogWarning(absl::StrCat(
        "tracker: the memory cap or compaction deferred to the end of a "
        "read's copy failed (",
        status.ToString(), "); the next record and step apply them"));
  }
  if (!std::exchange(expiry_deferred_, false)) return {};
  return ExpireConsumersLocked();
}

absl::Status Tracker::PrepareReadLocked(
    const DeltaRequest& request, StatesFill* fill,
    const std::function<void(const std::string& fqn,
                             std::unique_ptr<RowGather> gather)>& defer,
    PreparedRead& read) {
  Consumer* consumer = FindConsumer(request.consumer);
  if (consumer == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("unknown consumer '", request.consumer, "'"));
  }
  std::vector<std::string> fqns = store_.Fqns();
  if (request.all_rows && !feature_map_.fqns.empty()) fqns = feature_map_.fqns;
  if (!request.fqns.empty()) {
    for (const std::string& fqn : request.fqns) {
      const bool known =
          std::find(fqns.begin(), fqns.end(), fqn) != fqns.end() ||
          std::find(feature_map_.fqns.begin(), feature_map_.fqns.end(), fqn) !=
              feature_map_.fqns.end() ||
          held_elsewhere_.contains(fqn);
      if (!known) {
        // Every table of the model, whichever rank answers.
        std::vector<std::string> elsewhere(held_elsewhere_.begin(),
                                           held_elsewhere_.end());
        std::sort(elsewhere.begin(), elsewhere.end());
        std::vector<std::string> listed = fqns;
        listed.insert(listed.end(), elsewhere.begin(), elsewhere.end());
        return absl::NotFoundError(
            absl::StrCat("unknown table '", fqn,
                         "' (known: ", absl::StrJoin(listed, ", "), ")"));
      }
    }
    // A table named twice is read once (twice, its top-k and the diff of
    // the optimizer-state modes would apply twice to one table).
    fqns.clear();
    for (const std::string& fqn : request.fqns) {
      if (std::find(fqns.begin(), fqns.end(), fqn) == fqns.end()) {
        fqns.push_back(fqn);
      }
    }
  }
  for (const auto& [fqn, spec] : request.per_table_top_k) {
    if (std::find(fqns.begin(), fqns.end(), fqn) == fqns.end()) {
      return absl::NotFoundError(
          absl::StrCat("top-k names table '", fqn, "', which is not read"));
    }
  }

  const int64_t end =
      request.through_current_batch ? curr_batch_ + 1 : curr_batch_;
  Delta& delta = read.delta;
  delta.consumer = consumer->name;
  delta.end_batch = end;
  delta.start_batch = end;
  for (const std::string& fqn : fqns) {
    const int64_t from = ReadFrom(*consumer, fqn, request, end);
    delta.start_batch = std::min(delta.start_batch, from);
    if (held_elsewhere_.contains(fqn)) {
      delta.tables[fqn] = NoRowsHeldHere(options_.mode, request, fqn);
      continue;  // nothing to read (read.tables)
    }
    // Compacting between every pair of cursors, not only from the largest
    // as TorchRec does, means the consumers that read later find one
    // merged lookup instead of re-uniquing the same batches each.
    CompactBetweenCursorsLocked(fqn);
    TableDelta& table = delta.tables[fqn];
    auto top_k = request.per_table_top_k.find(fqn);
    const TopK* spec = top_k != request.per_table_top_k.end() ? &top_k->second
                       : request.top_k.has_value()            ? &*request.top_k
                                                              : nullptr;
    read.tables.emplace_back(fqn, spec);
    if (request.all_rows) continue;  // every row: ReadLiveRows
    // A filling read defers the copy of states that this read leaves alone.
    const bool deferred = fill != nullptr && DefersStates(request, spec);
    std::unique_ptr<RowGather> gather;
    absl::StatusOr<UniqueRows> rows =
        from < end
            ? ChangedRowsLocked(fqn, from, end, deferred ? &gather : nullptr)
            : EmptyRows();
    if (gather != nullptr) defer(fqn, std::move(gather));
    if (!rows.ok()) rows = EmptyRows();  // declared, nothing recorded yet
    table.ids = std::move(rows->ids);
    table.states = std::move(rows->states);
  }
  delta.all_rows = request.all_rows;
  const int64_t oldest = std::max<int64_t>(delta.start_batch, 0);
  if (oldest < end) {
    // Batch b was closed when batch b + 1 was opened.
    delta.oldest_change = OpenedAt(oldest + 1).wall;
    delta.newest_change = OpenedAt(end).wall;
  }
  delta.run_id = run_id_;
  delta.run_start_batch = run_start_batch_;
  delta.resync_required = consumer->resync_required;
  delta.lost_rows = consumer->lost_ids;
  read.consumer = consumer;
  read.batch = curr_batch_;
  return absl::OkStatus();
}

absl::Status Tracker::ReadLiveRows(const DeltaRequest& request,
                                   PreparedRead& read) {
  for (const auto& [fqn, spec] : read.tables) {
    TableDelta& table = read.delta.tables[fqn];
    absl::Status status =
        request.all_rows ? ReadWholeTable(fqn, table)
                         : FinishTableDelta(options_.mode, reader_, fqn, spec,
                                            request.include_scores, table);
    if (!status.ok()) return status;
  }
  if (request.include_dense) {
    absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> dense =
        reader_->ReadDense();
    if (!dense.ok()) return dense.status();
    read.delta.dense = *std::move(dense);
  }
  return absl::OkStatus();
}

bool Tracker::UnchangedLocked(const PreparedRead& read) {
  const Consumer* consumer = FindConsumer(read.delta.consumer);
  if (consumer != read.consumer || curr_batch_ != read.batch ||
      run_id_ != read.delta.run_id) {
    return false;
  }
  const Consumer& seen = *read.seen;
  const auto same_pending = [](const PendingRead& a, const PendingRead& b) {
    return a.end == b.end && a.fqns == b.fqns &&
           a.lost_through == b.lost_through;
  };
  return consumer->cursor == seen.cursor &&
         consumer->table_cursors == seen.table_cursors &&
         consumer->resync_required == seen.resync_required &&
         consumer->lost_ids == seen.lost_ids &&
         std::equal(consumer->pending.begin(), consumer->pending.end(),
                    seen.pending.begin(), seen.pending.end(), same_pending);
}

void Tracker::DeliverLocked(const DeltaRequest& request,
                            const PreparedRead& read) {
  Consumer* consumer = FindConsumer(read.delta.consumer);
  const int64_t end = read.delta.end_batch;
  consumer->last_contact = MonotonicNow();
  if (options_.acknowledged_reads) {
    std::vector<PendingRead>& pending = consumer->pending;
    // The same read again (a poll with nothing new) replaces the first.
    if (!pending.empty() && pending.back().end == end &&
        pending.back().fqns == request.fqns) {
      pending.pop_back();
    }
    pending.push_back(PendingRead{end, request.fqns, INT64_MIN});
    if (pending.size() > kMaxPendingReads) pending.erase(pending.begin());
  } else {
    consumer->resync_required = false;  // told
    consumer->lost_ids = 0;
    AdvanceLocked(*consumer, request.fqns, end);
  }
}

void Tracker::AdvanceLocked(Consumer& consumer,
                            const std::vector<std::string>& only_fqns,
                            int64_t end) {
  if (only_fqns.empty()) {
    consumer.cursor = std::max(consumer.cursor, end);
    consumer.DropTableCursorsBehind();
  } else {
    for (const std::string& fqn : only_fqns) SetCursor(consumer, fqn, end);
  }
  const auto covered = [&](const PendingRead& read) {
    if (read.end > end) return false;
    if (only_fqns.empty()) return true;
    if (read.fqns.empty()) return false;
    return std::all_of(
        read.fqns.begin(), read.fqns.end(), [&](const std::string& fqn) {
          return std::find(only_fqns.begin(), only_fqns.end(), fqn) !=
                 only_fqns.end();
        });
  };
  consumer.pending.erase(
      std::remove_if(consumer.pending.begin(), consumer.pending.end(), covered),
      consumer.pending.end());
  if (options_.delete_on_read) {
    DeleteUnneededLocked();  // releases shared reads too
  } else {
    ReleaseSharedReadsLocked();
  }
}

void Tracker::MarkLostLocked(Consumer& consumer, int64_t batch,
                             const std::string* fqn) {
  if (!consumer.resync_required) ++consumer.resyncs;
  consumer.resync_required = true;
  for (PendingRead& read : consumer.pending) {
    const bool held = fqn != nullptr ? read.Reads(*fqn) : read.fqns.empty();
    read.lost_through = held ? std::max(read.lost_through, batch) : INT64_MAX;
  }
}

void Tracker::MoveToPresentLocked(Consumer& consumer) {
  // The open batch stays ahead, as after a read of the closed batches: rows
  // recorded into it after the clear must reach the consumer (a cursor past
  // it would skip them with no resync); rows it already holds may reach the
  // consumer again, which loses nothing.
  consumer.cursor = curr_batch_;
  consumer.table_cursors.clear();
  consumer.pending.clear();
}

absl::Status Tracker::Touch(absl::string_view name) {
  // Not a ChangeLock: a filling read's copy needs its consumer to stay, and
  // this neither removes it nor changes what the copy reads.
  WriterLock lock(&mu_);
  Consumer* consumer = FindConsumer(name);
  if (consumer == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown consumer '", name, "'"));
  }
  consumer->last_contact = MonotonicNow();
  return absl::OkStatus();
}

absl::Status Tracker::Commit(absl::string_view name, int64_t end_batch) {
  ChangeLock lock(this);
  Consumer* consumer = FindConsumer(name);
  if (consumer == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown consumer '", name, "'"));
  }
  consumer->last_contact = MonotonicNow();
  if (!options_.acknowledged_reads) {
    return absl::FailedPreconditionError(
        "commit needs acknowledged reads, which this tracker does not use");
  }
  // The newest read ending there (a later read of other tables may end at the
  // same batch).
  auto read =
      std::find_if(consumer->pending.rbegin(), consumer->pending.rend(),
                   [&](const PendingRead& r) { return r.end == end_batch; });
  if (read == consumer->pending.rend()) {
    std::vector<int64_t> ends;
    for (const PendingRead& r : consumer->pending) ends.push_back(r.end);
    return absl::FailedPreconditionError(absl::StrCat(
        "consumer '", name, "' has no uncommitted read ending at batch ",
        end_batch,
        ends.empty() ? " (no read is pending)"
                     : absl::StrCat(" (uncommitted reads end at ",
                                    absl::StrJoin(ends, ", "), ")")));
  }
  const PendingRead committed = *read;
  if (committed.lost_through < committed.end) {
    // Everything dropped before its delivery, the read said; everything
    // dropped since lay below its end, so the read held it.
    consumer->resync_required = false;
    consumer->lost_ids = 0;
  }
  AdvanceLocked(*consumer, committed.fqns, committed.end);
  return absl::OkStatus();
}

}  // namespace deltastream
