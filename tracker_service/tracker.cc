#include "tracker_service/tracker.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/exclusive_lockable.h"
#include "base/torch_status.h"
#include "tracker_service/names.h"
#include "tracker_service/tracker_consumer.h"

namespace deltastream {
namespace {

absl::Status ValidateIds(absl::string_view what, const at::Tensor& ids) {
  if (!ids.defined() || ids.dim() != 1 || ids.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": IDs must be a 1-D int64 tensor, got ",
        ids.defined() ? absl::StrCat(c10::toString(ids.scalar_type()), " of ",
                                     ids.dim(), " dims")
                      : "none"));
  }
  return absl::OkStatus();
}

// The states of one record, once converted to what the store keeps: [n, d]
// with n the IDs' count and d >= 1 (a record of width 0 would be kept and
// then break every read of the table).
absl::Status ValidateStates(const TableLookup& table) {
  const at::Tensor& states = table.states;
  if (!states.defined()) return absl::OkStatus();  // the store's to refuse
  if (states.dim() != 2 || states.size(0) != table.ids.numel() ||
      states.size(1) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", table.fqn, "': states must be [", table.ids.numel(),
        ", dim] with dim >= 1 to match ", table.ids.numel(), " IDs, got ",
        c10::str(states.sizes())));
  }
  return absl::OkStatus();
}

// The checks of RecordTables(check_values): IDs are row indices of the table
// (0 .. rows - 1, `rows` when known) and states are finite numbers.
absl::Status ValidateValues(const TableLookup& table,
                            std::optional<int64_t> rows) {
  if (table.ids.numel() > 0) {
    const int64_t lowest = table.ids.min().item<int64_t>();
    const int64_t highest = table.ids.max().item<int64_t>();
    if (lowest < 0 || (rows.has_value() && highest >= *rows)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", table.fqn, "': IDs must be row indices in [0, ",
          rows.has_value() ? absl::StrCat(*rows) : "2^63", "), got IDs from ",
          lowest, " to ", highest));
    }
  }
  if (table.states.defined() && table.states.numel() > 0 &&
      table.states.is_floating_point() &&
      !table.states.isfinite().all().item<bool>()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", table.fqn,
                     "': states must be finite numbers (got NaN or "
                     "infinity)"));
  }
  return absl::OkStatus();
}

// 16 random hex digits: tells one run of a tracker from another.
std::string NewRunId() {
  std::random_device device;
  std::mt19937_64 generator(
      (static_cast<uint64_t>(device()) << 32) ^ device() ^
      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  return absl::StrFormat("%016x", generator());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tracker>> Tracker::Create(
    TrackerOptions options, LiveRowsReader* reader) {
  if (options.consumers.empty()) {
    options.consumers.emplace_back(kDefaultConsumer);
  }
  absl::flat_hash_set<std::string> seen;
  for (const std::string& name : options.consumers) {
    if (absl::Status status = ValidateName("consumer name", name);
        !status.ok()) {
      return status;
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("consumer '", name, "' is listed twice"));
    }
  }
  if (options.expire_consumers_after < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "expire_consumers_after must be >= 0 (0: never)");
  }
  if (options.memory_cap_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory cap must be >= 0 bytes, got ", options.memory_cap_bytes));
  }
  absl::StatusOr<FeatureMap> feature_map =
      BuildFeatureMap(options.modules, options.fqns_to_skip);
  if (!feature_map.ok()) return feature_map.status();
  if (options.mode == TrackingMode::kEmbedding) {
    for (const auto& [path, pooled] : feature_map->modules) {
      if (pooled) {
        return absl::FailedPreconditionError(absl::StrCat(
            "embedding mode records one embedding per looked-up ID, but '",
            path,
            "' is a pooled collection (EmbeddingBagCollection) whose lookup "
            "returns sums per bag: use id_only or an optimizer-state mode, or "
            "skip it with fqns_to_skip"));
      }
    }
  }
  return std::unique_ptr<Tracker>(
      new Tracker(std::move(options), *std::move(feature_map), reader));
}

Tracker::Tracker(TrackerOptions options, FeatureMap feature_map,
                 LiveRowsReader* reader)
    : options_(std::move(options)),
      feature_map_(std::move(feature_map)),
      held_elsewhere_([this] {
        absl::flat_hash_set<std::string> elsewhere(options_.model_fqns.begin(),
                                                   options_.model_fqns.end());
        for (const std::string& fqn : feature_map_.fqns) elsewhere.erase(fqn);
        return elsewhere;
      }()),
      run_id_(NewRunId()),
      reader_(reader),
      store_(UpdateModeFor(options_.mode)) {
  batch_opened_[0] = Opened::Now();
  for (const std::string& name : options_.consumers) {
    auto consumer = std::make_unique<Consumer>();
    consumer->name = name;
    consumers_.emplace(name, std::move(consumer));
  }
}

Tracker::~Tracker() = default;

absl::StatusOr<at::Tensor> Tracker::TrackedStates(const std::string& fqn,
                                                  const at::Tensor& ids,
                                                  const at::Tensor& states) {
  if (!TracksOptimizerState(options_.mode)) return states;
  at::Tensor row_states = states;
  if (!row_states.defined()) {
    if (reader_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table '", fqn, "': ", TrackingModeName(options_.mode),
          " mode needs the optimizer's row states: pass them with the IDs or "
          "attach a LiveRowsReader"));
    }
    absl::StatusOr<at::Tensor> read = reader_->ReadOptimizerStates(fqn, ids);
    if (!read.ok()) return read.status();
    row_states = *read;
  }
  // Row-wise optimizers keep one value per row.
  if (row_states.dim() == 1) row_states = row_states.unsqueeze(1);
  if (row_states.dim() != 2 || row_states.size(0) != ids.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", fqn, "': optimizer states must be [", ids.numel(),
        ", k] to match the IDs, got ", c10::str(row_states.sizes())));
  }
  if (options_.mode == TrackingMode::kMomentumLast) {
    return row_states.to(at::kFloat).norm(2, {1}, /*keepdim=*/true);
  }
  return row_states;
}

absl::Status Tracker::RecordTables(std::vector<TableLookup> tables,
                                   bool check_values) {
  return CatchTorchErrors([&]() -> absl::Status {
    LiveRowsReader::Pin pin(TracksOptimizerState(options_.mode) || check_values
                                ? reader_
                                : nullptr);
    WriterLock lock(&mu_);
    return RecordTablesLocked(std::move(tables), check_values);
  });
}

absl::Status Tracker::RecordTablesLocked(std::vector<TableLookup> tables,
                                         bool check_values) {
  std::vector<TableLookup> kept;
  for (TableLookup& table : tables) {
    if (absl::Status status = ValidateName("table FQN", table.fqn);
        !status.ok()) {
      return status;
    }
    if (IsSkipped(table.fqn, options_.fqns_to_skip)) continue;
    if (!feature_map_.fqns.empty() &&
        std::find(feature_map_.fqns.begin(), feature_map_.fqns.end(),
                  table.fqn) == feature_map_.fqns.end()) {
      return absl::NotFoundError(
          absl::StrCat("table '", table.fqn, "' is not tracked (tracked: ",
                       absl::StrJoin(feature_map_.fqns, ", "), ")"));
    }
    if (absl::Status status =
            ValidateIds(absl::StrCat("table '", table.fqn, "'"), table.ids);
        !status.ok()) {
      return status;
    }
    if (options_.mode == TrackingMode::kIdOnly) table.states = at::Tensor();
    if (TracksOptimizerState(options_.mode)) {
      absl::StatusOr<at::Tensor> states =
          TrackedStates(table.fqn, table.ids, table.states);
      if (!states.ok()) return states.status();
      table.states = *std::move(states);
    }
    // The store keeps float32, float16 or bfloat16 states: those of a
    // float64 table (its rows, or its optimizer's) are kept as float32.
    if (table.states.defined() && table.states.scalar_type() == at::kDouble) {
      table.states = table.states.to(at::kFloat);
    }
    if (absl::Status status = ValidateStates(table); !status.ok()) {
      return status;
    }
    if (check_values) {
      std::optional<int64_t> rows;
      if (reader_ != nullptr) {
        absl::StatusOr<int64_t> known = reader_->NumRows(table.fqn);
        if (!known.ok()) return known.status();
        rows = *known;
      }
      if (absl::Status status = ValidateValues(table, rows); !status.ok()) {
        return status;
      }
    }
    kept.push_back(std::move(table));
  }
  if (kept.empty()) return absl::OkStatus();
  if (absl::Status status = store_.Append(curr_batch_, std::move(kept));
      !status.ok()) {
    return status;
  }
  if (copying_) {
    cap_deferred_ = true;  // the cap may drop rows a read is copying
  } else {
    EnforceMemoryCapLocked();
  }
  return absl::OkStatus();
}

int64_t Tracker::Step() {
  int64_t batch;
  std::vector<std::string> expired;
  {
    WriterLock lock(&mu_);
    batch = ++curr_batch_;
    batch_opened_[batch] = Opened::Now();
    // A filling read's copy holds on to its consumer: expire at its end.
    if (options_.expire_consumers_after > absl::ZeroDuration()) {
      if (copying_) {
        expiry_deferred_ = true;
      } else {
        expired = ExpireConsumersLocked();
      }
    }
    int64_t oldest_unread = curr_batch_;
    for (const auto& [name, consumer] : consumers_) {
      oldest_unread = std::min(oldest_unread, consumer->SmallestCursor());
    }
    batch_opened_.erase(batch_opened_.begin(),
                        batch_opened_.lower_bound(oldest_unread));
    ThinOpenedBatchesLocked();
  }
  PublishBatch(batch);
  if (options_.log) {
    for (const std::string& line : expired) options_.log(line);
  }
  return batch;
}

std::vector<std::string> Tracker::ExpireConsumersLocked() {
  const absl::Duration after = options_.expire_consumers_after;
  const absl::Duration now = MonotonicNow();
  std::vector<std::string> lines;
  for (auto it = consumers_.begin(); it != consumers_.end();) {
    const Consumer& consumer = *it->second;
    const int64_t first_unread =
        std::max<int64_t>(0, consumer.SmallestCursor());
    // Gone, not merely waiting: silent, and a batch it has not read was
    // closed (the next one opened) that long ago. A subscription waiting
    // through a pause in training is not silent for long once the batches
    // after the pause close.
    const bool gone = first_unread < curr_batch_ &&
                      now - consumer.last_contact >= after &&
                      now - OpenedAt(first_unread + 1).monotonic >= after;
    const bool declared =
        std::find(options_.consumers.begin(), options_.consumers.end(),
                  consumer.name) != options_.consumers.end();
    if (!gone || declared || consumers_.size() == 1) {
      ++it;
      continue;
    }
    lines.push_back(absl::StrFormat(
        "consumer '%s' removed: no read or commit for %.0f s, batches from %d "
        "unread (expire_consumers_after)",
        consumer.name, absl::ToDoubleSeconds(now - consumer.last_contact),
        first_unread));
    it = consumers_.erase(it);
    ++consumers_expired_;
  }
  if (!lines.empty() && options_.delete_on_read) DeleteUnneededLocked();
  return lines;
}

void Tracker::PublishBatch(int64_t batch) {
  {
    WriterLock lock(&step_mu_);
    published_batch_ = batch;
  }
  step_cv_.notify_all();
}

int64_t Tracker::WaitForBatchAfter(int64_t batch, absl::Time deadline) const {
  WriterLock lock(&step_mu_);
  ExclusiveLockable held(step_mu_);
  // Bounded so that an infinite deadline does not overflow the clock.
  step_cv_.wait_until(
      held,
      absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Hours(24))),
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_) {
        return published_batch_ > batch;
      });
  return published_batch_;
}

void Tracker::ThinOpenedBatchesLocked() {
  if (batch_opened_.size() <= kMaxOpenedBatches) return;
  // Every other one of the older half: amortized, one erase per step.
  const size_t older_half = batch_opened_.size() / 2;
  auto it = batch_opened_.begin();
  for (size_t i = 0; i < older_half; ++i) {
    it = i % 2 == 1 ? batch_opened_.erase(it) : std::next(it);
  }
}

Tracker::Opened Tracker::OpenedAt(int64_t batch) const {
  auto it = batch_opened_.lower_bound(batch);
  return it == batch_opened_.end() ? Opened::Now() : it->second;
}

int64_t Tracker::current_batch() const {
  ReaderLock lock(&mu_);
  return curr_batch_;
}

void Tracker::TriggerCompaction() {
  if (!options_.auto_compact) return;
  WriterLock lock(&mu_);
  if (copying_) {
    compaction_deferred_ = true;  // the copy's end compacts
    return;
  }
  CompactOpenWindowLocked();
}

void Tracker::CompactOpenWindowLocked() {
  if (curr_compact_index_ >= curr_batch_) return;  // once per step
  for (const std::string& fqn : store_.Fqns()) {
    store_.CompactTableTiered(fqn, MaxCursor(fqn), curr_batch_);
  }
  curr_compact_index_ = curr_batch_;
}

Tracker::ChangeLock::ChangeLock(Tracker* tracker) : tracker_(tracker) {
  tracker_->mu_.Lock();
  ExclusiveLockable held(tracker_->mu_);
  tracker_->copy_ended_.wait(held, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !tracker_->copying_;
  });
}

Tracker::ChangeLock::~ChangeLock() { tracker_->mu_.Unlock(); }

void Tracker::Compact(int64_t start, int64_t end) {
  ChangeLock lock(this);
  shared_reads_.clear();  // the window may cross a cursor
  store_.Compact(start, end);
}

void Tracker::CompactAll() {
  ChangeLock lock(this);
  CompactAllLocked();
}

void Tracker::CompactAllLocked() {
  for (const std::string& fqn : store_.Fqns()) CompactBetweenCursorsLocked(fqn);
}

void Tracker::CompactBetweenCursorsLocked(const std::string& fqn) {
  std::vector<int64_t> bounds = {curr_batch_};
  bounds.reserve(consumers_.size() + 1);
  for (const auto& [name, consumer] : consumers_) {
    bounds.push_back(std::min(CursorOf(*consumer, fqn), curr_batch_));
    for (int64_t end : consumer->PendingEnds(fqn)) {
      bounds.push_back(std::min(end, curr_batch_));
    }
  }
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  store_.CompactTableBetween(fqn, bounds);
}

void Tracker::DeleteUnneededLocked() {
  for (const std::string& fqn : store_.Fqns()) {
    store_.DeleteTable(fqn, MinCursor(fqn));
  }
  // What was deleted lay below every cursor: only reads no consumer can
  // repeat read it.
  ReleaseSharedReadsLocked();
}

void Tracker::EnforceMemoryCapLocked() {
  const int64_t cap = options_.memory_cap_bytes;
  if (cap == 0 || store_.bytes() <= cap) return;
  DeleteUnneededLocked();
  if (store_.bytes() <= cap) return;
  CompactAllLocked();
  ++cap_compactions_;
  // The compacted windows may hold whole recorded state tensors for a few
  // kept rows (the store's no-copy compaction): copy the kept rows out
  // before dropping any batch.
  store_.ReleaseRecorded();
  while (store_.bytes() > cap) {
    std::optional<int64_t> oldest = store_.OldestBatchIndex();
    if (!oldest.has_value()) break;
    const StoreUsage before = store_.Usage();
    shared_reads_.clear();
    store_.Delete(*oldest + 1);
    const StoreUsage after = store_.Usage();
    for (const auto& [fqn, usage] : before.tables) {
      const int64_t lost = usage.ids - after.tables.at(fqn).ids;
      if (lost == 0) continue;
      for (auto& [name, consumer] : consumers_) {
        if (CursorOf(*consumer, fqn) <= *oldest) {
          MarkLostLocked(*consumer, *oldest, &fqn);
          consumer->lost_ids += lost;
          consumer->dropped_ids += lost;
        }
      }
    }
    ++cap_drops_;
    dropped_ids_ += before.total.ids - after.total.ids;
    dropped_bytes_ += before.total.bytes - after.total.bytes;
  }
}

absl::Status Tracker::AddConsumer(absl::string_view name) {
  if (absl::Status status = ValidateName("consumer name", name); !status.ok()) {
    return status;
  }
  ChangeLock lock(this);
  if (FindConsumer(name) != nullptr) {
    return absl::AlreadyExistsError(
        absl::StrCat("consumer '", name, "' already exists"));
  }
  auto consumer = std::make_unique<Consumer>();
  consumer->name = std::string(name);
  consumer->cursor = curr_batch_;
  consumers_.emplace(consumer->name, std::move(consumer));
  return absl::OkStatus();
}

absl::Status Tracker::RemoveConsumer(absl::string_view name) {
  ChangeLock lock(this);
  auto it = consumers_.find(name);
  if (it == consumers_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown consumer '", name, "'"));
  }
  if (consumers_.size() == 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", name, "' is the last consumer; add another before removing it"));
  }
  consumers_.erase(it);
  if (options_.delete_on_read) DeleteUnneededLocked();
  return absl::OkStatus();
}

std::vector<std::string> Tracker::Consumers() const {
  ReaderLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, consumer] : consumers_) names.push_back(name);
  return names;
}

absl::Status Tracker::Clear(absl::string_view name) {
  ChangeLock lock(this);
  Consumer* consumer = FindConsumer(name);
  if (consumer == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown consumer '", name, "'"));
  }
  MoveToPresentLocked(*consumer);
  DeleteUnneededLocked();
  return absl::OkStatus();
}

void Tracker::ClearAll() {
  ChangeLock lock(this);
  shared_reads_.clear();
  store_.Delete();
  for (auto& [name, consumer] : consumers_) MoveToPresentLocked(*consumer);
}

TrackerStatus Tracker::Status() const {
  ReaderLock lock(&mu_);
  TrackerStatus status;
  status.mode = options_.mode;
  status.current_batch = curr_batch_;
  status.delete_on_read = options_.delete_on_read;
  status.auto_compact = options_.auto_compact;
  status.acknowledged_reads = options_.acknowledged_reads;
  status.usage = store_.Usage();
  status.memory_cap_bytes = options_.memory_cap_bytes;
  status.cap_compactions = cap_compactions_;
  status.cap_drops = cap_drops_;
  status.consumers_expired = consumers_expired_;
  status.opened_batches = static_cast<int64_t>(batch_opened_.size());
  status.dropped_ids = dropped_ids_;
  status.dropped_bytes = dropped_bytes_;
  status.warnings = feature_map_.warnings;
  status.run_id = run_id_;
  status.run_start_batch = run_start_batch_;
  status.serves_live_rows = reader_ != nullptr;
  const std::vector<std::string> fqns = store_.Fqns();
  const absl::Duration now = MonotonicNow();
  for (const auto& [name, consumer] : consumers_) {
    ConsumerStatus c;
    c.name = name;
    c.cursor = consumer->cursor;
    for (const std::string& fqn : fqns) {
      c.cursor = std::min(c.cursor, CursorOf(*consumer, fqn));
    }
    c.lag_steps =
        std::max<int64_t>(0, curr_batch_ - std::max<int64_t>(0, c.cursor));
    c.lag = c.lag_steps > 0
                ? now - OpenedAt(std::max<int64_t>(0, c.cursor)).monotonic
                : absl::ZeroDuration();
    if (!consumer->pending.empty())
      c.pending_end = consumer->pending.back().end;
    c.pending_reads = static_cast<int>(consumer->pending.size());
    c.resync_required = consumer->resync_required;
    c.resyncs = consumer->resyncs;
    c.dropped_ids = consumer->dropped_ids;
    status.consumers.push_back(std::move(c));
  }
  return status;
}

void Tracker::MarkRunStart(int64_t batch) {
  ChangeLock lock(this);
  run_start_batch_ = batch;
}

void Tracker::RequireResync() {
  ChangeLock lock(this);
  for (auto& [name, consumer] : consumers_) {
    MarkLostLocked(*consumer, INT64_MAX);
  }
}

void Tracker::RequireResyncOf(absl::string_view consumer) {
  ChangeLock lock(this);
  if (Consumer* found = FindConsumer(consumer)) {
    MarkLostLocked(*found, INT64_MAX);
  }
}

void Tracker::RequireResyncBefore(int64_t batch) {
  ChangeLock lock(this);
  for (auto& [name, consumer] : consumers_) {
    // Table cursors stand ahead of the consumer's own: it is the lowest.
    if (consumer->cursor < batch) MarkLostLocked(*consumer, batch - 1);
  }
}

}  // namespace deltastream
