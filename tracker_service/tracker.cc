#include "tracker_service/tracker.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <random>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/torch_status.h"

namespace deltastream {

struct Tracker::Consumer {
  std::string name;
  // Cursor of every table without an entry in `table_cursors`.
  int64_t cursor = -1;
  // Tables read on their own (a DeltaRequest naming a subset of tables).
  absl::flat_hash_map<std::string, int64_t> table_cursors;
  // Acknowledged mode: reads delivered and not committed, oldest first.
  std::vector<PendingRead> pending;
  bool resync_required = false;
  int64_t lost_ids = 0;

  static bool Reads(const PendingRead& read, const std::string& fqn) {
    return read.fqns.empty() || std::find(read.fqns.begin(), read.fqns.end(),
                                          fqn) != read.fqns.end();
  }
  // The ends of the pending reads of `fqn`.
  std::vector<int64_t> PendingEnds(const std::string& fqn) const {
    std::vector<int64_t> ends;
    for (const PendingRead& read : pending) {
      if (Reads(read, fqn)) ends.push_back(read.end);
    }
    return ends;
  }
};

namespace {

absl::Status ValidateConsumerName(absl::string_view name) {
  if (name.empty() || name.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "consumer name must be 1 to 128 characters, got ", name.size()));
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("consumer name '", name,
                       "' may only hold letters, digits, '_', '-' and '.'"));
    }
  }
  return absl::OkStatus();
}

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

// 16 random hex digits: tells one run of a tracker from another.
std::string NewRunId() {
  std::random_device device;
  std::mt19937_64 generator(
      (static_cast<uint64_t>(device()) << 32) ^ device() ^
      static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())));
  return absl::StrFormat("%016x", generator());
}

UniqueRows EmptyRows() {
  UniqueRows rows;
  rows.ids = at::empty({0}, at::kLong);
  return rows;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tracker>> Tracker::Create(
    TrackerOptions options, LiveRowsReader* reader) {
  if (options.consumers.empty()) {
    options.consumers.emplace_back(kDefaultConsumer);
  }
  absl::flat_hash_set<std::string> seen;
  for (const std::string& name : options.consumers) {
    if (absl::Status status = ValidateConsumerName(name); !status.ok()) {
      return status;
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("consumer '", name, "' is listed twice"));
    }
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
      run_id_(NewRunId()),
      reader_(reader),
      store_(UpdateModeFor(options_.mode)) {
  batch_opened_[0] = absl::Now();
  for (const std::string& name : options_.consumers) {
    auto consumer = std::make_unique<Consumer>();
    consumer->name = name;
    consumers_.emplace(name, std::move(consumer));
  }
}

Tracker::~Tracker() = default;

Tracker::Consumer* Tracker::FindConsumer(absl::string_view name) {
  auto it = consumers_.find(name);
  return it == consumers_.end() ? nullptr : it->second.get();
}

int64_t Tracker::CursorOf(const Consumer& consumer,
                          const std::string& fqn) const {
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

absl::Status Tracker::RecordLookup(absl::Span<const FeatureIds> features,
                                   const at::Tensor& states) {
  return CatchTorchErrors([&]() -> absl::Status {
    int64_t total = 0;
    for (const FeatureIds& f : features) {
      if (absl::Status status =
              ValidateIds(absl::StrCat("feature '", f.feature, "'"), f.ids);
          !status.ok()) {
        return status;
      }
      total += f.ids.numel();
    }
    at::Tensor rows;
    if (options_.mode == TrackingMode::kEmbedding) {
      if (!states.defined() || (total > 0 && states.numel() % total != 0) ||
          (total > 0 && states.numel() == 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("embeddings must hold ", total, " * dim elements for ",
                         total, " IDs, got ",
                         states.defined() ? c10::str(states.sizes()) : "none"));
      }
      rows = total > 0 ? states.reshape({total, -1}) : states;
    }

    // Group features by table, in first-appearance order.
    std::vector<TableLookup> tables;
    std::vector<std::vector<at::Tensor>> ids_of, rows_of;
    absl::flat_hash_map<std::string, size_t> position;
    int64_t offset = 0;
    for (const FeatureIds& f : features) {
      const int64_t n = f.ids.numel();
      const std::string feature(f.feature);
      auto owner = feature_map_.fqn_of_feature.find(feature);
      if (owner == feature_map_.fqn_of_feature.end()) {
        if (!feature_map_.skipped_features.contains(feature)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "feature '", feature, "' is not looked up by any tracked table"));
        }
        offset += n;
        continue;
      }
      auto [it, inserted] = position.emplace(owner->second, tables.size());
      if (inserted) {
        tables.push_back({owner->second, {}, {}});
        ids_of.emplace_back();
        rows_of.emplace_back();
      }
      ids_of[it->second].push_back(f.ids);
      if (rows.defined() && total > 0) {
        rows_of[it->second].push_back(rows.narrow(0, offset, n));
      }
      offset += n;
    }
    for (size_t t = 0; t < tables.size(); ++t) {
      tables[t].ids = ids_of[t].size() == 1 ? ids_of[t][0] : at::cat(ids_of[t]);
      if (!rows_of[t].empty()) {
        tables[t].states =
            rows_of[t].size() == 1 ? rows_of[t][0] : at::cat(rows_of[t]);
      } else if (rows.defined()) {
        tables[t].states =
            rows.new_empty({0, rows.dim() == 2 ? rows.size(1) : 0});
      }
    }
    LiveRowsReader::Pin pin(TracksOptimizerState(options_.mode) ? reader_
                                                                : nullptr);
    WriterLock lock(&mu_);
    return RecordTablesLocked(std::move(tables));
  });
}

absl::Status Tracker::RecordTables(std::vector<TableLookup> tables) {
  return CatchTorchErrors([&]() -> absl::Status {
    LiveRowsReader::Pin pin(TracksOptimizerState(options_.mode) ? reader_
                                                                : nullptr);
    WriterLock lock(&mu_);
    return RecordTablesLocked(std::move(tables));
  });
}

absl::Status Tracker::RecordTablesLocked(std::vector<TableLookup> tables) {
  std::vector<TableLookup> kept;
  for (TableLookup& table : tables) {
    if (table.fqn.empty()) return absl::InvalidArgumentError("empty table FQN");
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
    kept.push_back(std::move(table));
  }
  if (kept.empty()) return absl::OkStatus();
  if (absl::Status status = store_.Append(curr_batch_, std::move(kept));
      !status.ok()) {
    return status;
  }
  EnforceMemoryCapLocked();
  return absl::OkStatus();
}

int64_t Tracker::Step() {
  int64_t batch;
  {
    WriterLock lock(&mu_);
    batch = ++curr_batch_;
    batch_opened_[batch] = absl::Now();
    int64_t oldest_unread = curr_batch_;
    for (const auto& [name, consumer] : consumers_) {
      oldest_unread = std::min(oldest_unread, consumer->cursor);
      for (const auto& [fqn, cursor] : consumer->table_cursors) {
        oldest_unread = std::min(oldest_unread, cursor);
      }
    }
    batch_opened_.erase(batch_opened_.begin(),
                        batch_opened_.lower_bound(oldest_unread));
  }
  PublishBatch(batch);
  return batch;
}

void Tracker::PublishBatch(int64_t batch) {
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    published_batch_ = batch;
  }
  step_cv_.notify_all();
}

int64_t Tracker::WaitForBatchAfter(int64_t batch, absl::Time deadline) const {
  std::unique_lock<std::mutex> lock(step_mu_);
  // Bounded so that an infinite deadline does not overflow the clock.
  step_cv_.wait_until(
      lock,
      absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Hours(24))),
      [&] { return published_batch_ > batch; });
  return published_batch_;
}

absl::Time Tracker::OpenedAt(int64_t batch) const {
  auto it = batch_opened_.lower_bound(batch);
  return it == batch_opened_.end() ? absl::Now() : it->second;
}

int64_t Tracker::current_batch() const {
  ReaderLock lock(&mu_);
  return curr_batch_;
}

void Tracker::TriggerCompaction() {
  if (!options_.auto_compact) return;
  WriterLock lock(&mu_);
  if (curr_compact_index_ >= curr_batch_) return;  // once per step
  for (const std::string& fqn : store_.Fqns()) {
    store_.CompactTableTiered(fqn, MaxCursor(fqn), curr_batch_);
  }
  curr_compact_index_ = curr_batch_;
}

void Tracker::Compact(int64_t start, int64_t end) {
  WriterLock lock(&mu_);
  store_.Compact(start, end);
}

void Tracker::CompactAll() {
  WriterLock lock(&mu_);
  CompactAllLocked();
}

void Tracker::CompactAllLocked() {
  for (const std::string& fqn : store_.Fqns()) CompactBetweenCursorsLocked(fqn);
}

void Tracker::CompactBetweenCursorsLocked(const std::string& fqn) {
  std::set<int64_t> bounds = {curr_batch_};
  for (const auto& [name, consumer] : consumers_) {
    bounds.insert(std::min(CursorOf(*consumer, fqn), curr_batch_));
    for (int64_t end : consumer->PendingEnds(fqn)) {
      bounds.insert(std::min(end, curr_batch_));
    }
  }
  for (auto it = bounds.begin(); std::next(it) != bounds.end(); ++it) {
    store_.CompactTable(fqn, *it, *std::next(it));
  }
}

void Tracker::DeleteUnneededLocked() {
  for (const std::string& fqn : store_.Fqns()) {
    store_.DeleteTable(fqn, MinCursor(fqn));
  }
}

void Tracker::EnforceMemoryCapLocked() {
  const int64_t cap = options_.memory_cap_bytes;
  if (cap == 0 || store_.bytes() <= cap) return;
  DeleteUnneededLocked();
  if (store_.bytes() <= cap) return;
  CompactAllLocked();
  ++cap_compactions_;
  while (store_.bytes() > cap) {
    std::optional<int64_t> oldest = store_.OldestBatchIndex();
    if (!oldest.has_value()) break;
    const StoreUsage before = store_.Usage();
    store_.Delete(*oldest + 1);
    const StoreUsage after = store_.Usage();
    for (const auto& [fqn, usage] : before.tables) {
      const int64_t lost = usage.ids - after.tables.at(fqn).ids;
      if (lost == 0) continue;
      for (auto& [name, consumer] : consumers_) {
        if (CursorOf(*consumer, fqn) <= *oldest) {
          MarkLostLocked(*consumer, *oldest);
          consumer->lost_ids += lost;
        }
      }
    }
    ++cap_drops_;
    dropped_ids_ += before.total.ids - after.total.ids;
    dropped_bytes_ += before.total.bytes - after.total.bytes;
  }
}

absl::Status Tracker::FinishTable(const std::string& fqn,
                                  const DeltaRequest& request,
                                  TableDelta& table) {
  table.ids = table.ids.cpu();
  if (table.states.defined()) table.states = table.states.cpu();
  if (reader_ != nullptr) {
    absl::StatusOr<at::Tensor> values = reader_->ReadEmbeddings(fqn, table.ids);
    if (!values.ok()) return values.status();
    table.values = values->cpu();
  }
  const TrackingMode mode = options_.mode;
  if (mode != TrackingMode::kIdOnly && !table.states.defined()) {
    // A table with nothing recorded since the cursor: no rows, and states
    // shaped like the values (or [0, 1]) so that scores and diffs compute.
    table.states = at::empty(
        {0, table.values.defined() ? table.values.size(1) : 1}, at::kFloat);
  }
  if ((mode == TrackingMode::kMomentumDiff ||
       mode == TrackingMode::kRowwiseAdagrad) &&
      reader_ != nullptr) {
    absl::StatusOr<at::Tensor> latest =
        reader_->ReadOptimizerStates(fqn, table.ids);
    if (!latest.ok()) return latest.status();
    at::Tensor now = latest->cpu().to(at::kFloat);
    if (table.ids.numel() == 0) {
      now = now.reshape({0, now.dim() > 1 ? now.size(1) : 1});
      table.states = table.states.reshape({0, now.size(1)});
    }
    now = now.reshape_as(table.states);
    table.states = now - table.states.to(at::kFloat);
  }

  auto top_k = request.per_table_top_k.find(fqn);
  const TopK* spec = top_k != request.per_table_top_k.end() ? &top_k->second
                     : request.top_k.has_value()            ? &*request.top_k
                                                            : nullptr;
  if (spec == nullptr && !request.include_scores) return absl::OkStatus();
  switch (mode) {
    case TrackingMode::kIdOnly:
      break;  // rejected before reading
    case TrackingMode::kEmbedding:
      table.scores = (table.values.to(at::kFloat) - table.states.to(at::kFloat))
                         .norm(2, {1});
      break;
    case TrackingMode::kMomentumLast:
      table.scores = table.states.to(at::kFloat).reshape({-1});
      break;
    case TrackingMode::kMomentumDiff:
    case TrackingMode::kRowwiseAdagrad:
      table.scores = table.states.to(at::kFloat).norm(2, {1});
      break;
  }
  if (spec == nullptr) return absl::OkStatus();
  at::Tensor keep = TopKPositions(table.scores, *spec);
  for (at::Tensor* t :
       {&table.ids, &table.states, &table.values, &table.scores}) {
    if (t->defined()) *t = t->index_select(0, keep);
  }
  return absl::OkStatus();
}

absl::Status Tracker::ReadWholeTable(const std::string& fqn,
                                     TableDelta& table) {
  absl::StatusOr<int64_t> rows = reader_->NumRows(fqn);
  if (!rows.ok()) return rows.status();
  table.ids = at::arange(*rows, at::kLong);
  absl::StatusOr<at::Tensor> values = reader_->ReadEmbeddings(fqn, table.ids);
  if (!values.ok()) return values.status();
  table.values = values->cpu();
  return absl::OkStatus();
}

absl::StatusOr<Delta> Tracker::GetDelta(const DeltaRequest& request) {
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

  // Rows stay still from here to the end of the read (see LiveRowsReader).
  LiveRowsReader::Pin pin(reader_);
  WriterLock lock(&mu_);
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
              feature_map_.fqns.end();
      if (!known) {
        return absl::NotFoundError(
            absl::StrCat("unknown table '", fqn,
                         "' (known: ", absl::StrJoin(fqns, ", "), ")"));
      }
    }
    fqns = request.fqns;
  }
  for (const auto& [fqn, spec] : request.per_table_top_k) {
    if (std::find(fqns.begin(), fqns.end(), fqn) == fqns.end()) {
      return absl::NotFoundError(
          absl::StrCat("top-k names table '", fqn, "', which is not read"));
    }
  }

  const int64_t end =
      request.through_current_batch ? curr_batch_ + 1 : curr_batch_;
  Delta delta;
  delta.consumer = consumer->name;
  delta.end_batch = end;
  delta.start_batch = end;
  try {
    for (const std::string& fqn : fqns) {
      const int64_t from = ReadFrom(*consumer, fqn, request, end);
      delta.start_batch = std::min(delta.start_batch, from);
      // Compacting between every pair of cursors, not only from the largest
      // as TorchRec does, means the consumers that read later find one
      // merged lookup instead of re-uniquing the same batches each.
      CompactBetweenCursorsLocked(fqn);
      TableDelta& table = delta.tables[fqn];
      if (request.all_rows) {
        absl::Status status = ReadWholeTable(fqn, table);
        if (!status.ok()) return status;
        continue;
      }
      absl::StatusOr<UniqueRows> rows =
          from < end ? store_.GetUniqueTable(fqn, from, end) : EmptyRows();
      if (!rows.ok()) rows = EmptyRows();  // declared, nothing recorded yet
      table.ids = std::move(rows->ids);
      table.states = std::move(rows->states);
      if (absl::Status s = FinishTable(fqn, request, table); !s.ok()) return s;
    }
    if (request.include_dense) {
      absl::StatusOr<std::vector<std::pair<std::string, at::Tensor>>> dense =
          reader_->ReadDense();
      if (!dense.ok()) return dense.status();
      delta.dense = *std::move(dense);
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(e.what_without_backtrace());
  }
  delta.all_rows = request.all_rows;
  const int64_t oldest = std::max<int64_t>(delta.start_batch, 0);
  if (oldest < end) {
    // Batch b was closed when batch b + 1 was opened.
    delta.oldest_change = OpenedAt(oldest + 1);
    delta.newest_change = OpenedAt(end);
  }
  delta.run_id = run_id_;
  delta.run_start_batch = run_start_batch_;

  delta.resync_required = consumer->resync_required;
  delta.lost_rows = consumer->lost_ids;
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
  return delta;
}

void Tracker::AdvanceLocked(Consumer& consumer,
                            const std::vector<std::string>& only_fqns,
                            int64_t end) {
  if (only_fqns.empty()) {
    consumer.cursor = std::max(consumer.cursor, end);
    for (auto it = consumer.table_cursors.begin();
         it != consumer.table_cursors.end();) {
      if (it->second <= consumer.cursor) {
        consumer.table_cursors.erase(it++);
      } else {
        ++it;
      }
    }
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
  if (options_.delete_on_read) DeleteUnneededLocked();
}

void Tracker::MarkLostLocked(Consumer& consumer, int64_t batch) {
  consumer.resync_required = true;
  for (PendingRead& read : consumer.pending) {
    read.lost_through = std::max(read.lost_through, batch);
  }
}

void Tracker::MoveToPresentLocked(Consumer& consumer) {
  consumer.cursor = curr_batch_ + 1;
  consumer.table_cursors.clear();
  consumer.pending.clear();
}

absl::Status Tracker::Commit(absl::string_view name, int64_t end_batch) {
  WriterLock lock(&mu_);
  Consumer* consumer = FindConsumer(name);
  if (consumer == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown consumer '", name, "'"));
  }
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

absl::Status Tracker::AddConsumer(absl::string_view name) {
  if (absl::Status status = ValidateConsumerName(name); !status.ok()) {
    return status;
  }
  WriterLock lock(&mu_);
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
  WriterLock lock(&mu_);
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
  WriterLock lock(&mu_);
  Consumer* consumer = FindConsumer(name);
  if (consumer == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown consumer '", name, "'"));
  }
  MoveToPresentLocked(*consumer);
  DeleteUnneededLocked();
  return absl::OkStatus();
}

void Tracker::ClearAll() {
  WriterLock lock(&mu_);
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
  status.dropped_ids = dropped_ids_;
  status.dropped_bytes = dropped_bytes_;
  status.warnings = feature_map_.warnings;
  status.run_id = run_id_;
  status.run_start_batch = run_start_batch_;
  status.serves_live_rows = reader_ != nullptr;
  const std::vector<std::string> fqns = store_.Fqns();
  const absl::Time now = absl::Now();
  for (const auto& [name, consumer] : consumers_) {
    ConsumerStatus c;
    c.name = name;
    c.cursor = consumer->cursor;
    for (const std::string& fqn : fqns) {
      c.cursor = std::min(c.cursor, CursorOf(*consumer, fqn));
    }
    c.lag_steps =
        std::max<int64_t>(0, curr_batch_ - std::max<int64_t>(0, c.cursor));
    c.lag = c.lag_steps > 0 ? now - OpenedAt(std::max<int64_t>(0, c.cursor))
                            : absl::ZeroDuration();
    if (!consumer->pending.empty())
      c.pending_end = consumer->pending.back().end;
    c.pending_reads = static_cast<int>(consumer->pending.size());
    c.resync_required = consumer->resync_required;
    status.consumers.push_back(std::move(c));
  }
  return status;
}

TrackerState Tracker::SaveState() const {
  ReaderLock lock(&mu_);
  TrackerState state;
  state.mode = options_.mode;
  state.current_batch = curr_batch_;
  state.compact_index = curr_compact_index_;
  for (const auto& [name, consumer] : consumers_) {
    ConsumerState& c = state.consumers.emplace_back();
    c.name = name;
    c.cursor = consumer->cursor;
    c.table_cursors.insert(consumer->table_cursors.begin(),
                           consumer->table_cursors.end());
    c.pending_reads = consumer->pending;
    c.resync_required = consumer->resync_required;
    c.lost_ids = consumer->lost_ids;
  }
  state.cap_compactions = cap_compactions_;
  state.cap_drops = cap_drops_;
  state.dropped_ids = dropped_ids_;
  state.dropped_bytes = dropped_bytes_;
  state.tables = store_.Export();
  return state;
}

absl::Status Tracker::RestoreState(TrackerState state) {
  if (state.mode != options_.mode) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the snapshot was taken in ", TrackingModeName(state.mode),
        " mode; this tracker runs in ", TrackingModeName(options_.mode)));
  }
  if (!feature_map_.fqns.empty()) {
    for (const StoredTable& table : state.tables) {
      if (std::find(feature_map_.fqns.begin(), feature_map_.fqns.end(),
                    table.fqn) == feature_map_.fqns.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("the snapshot holds table '", table.fqn,
                         "', which this tracker does not track"));
      }
    }
  }
  std::map<std::string, std::unique_ptr<Consumer>, std::less<>> consumers;
  for (ConsumerState& c : state.consumers) {
    if (absl::Status status = ValidateConsumerName(c.name); !status.ok()) {
      return status;
    }
    auto consumer = std::make_unique<Consumer>();
    consumer->name = c.name;
    consumer->cursor = c.cursor;
    consumer->table_cursors.insert(c.table_cursors.begin(),
                                   c.table_cursors.end());
    consumer->pending = std::move(c.pending_reads);
    consumer->resync_required = c.resync_required;
    consumer->lost_ids = c.lost_ids;
    if (!consumers.emplace(c.name, std::move(consumer)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("consumer '", c.name, "' appears twice"));
    }
  }
  for (const std::string& name : options_.consumers) {
    if (consumers.count(name) > 0) continue;
    auto consumer = std::make_unique<Consumer>();
    consumer->name = name;
    consumer->cursor = state.current_batch;
    consumers.emplace(name, std::move(consumer));
  }
  {
    WriterLock lock(&mu_);
    if (absl::Status status = store_.Import(std::move(state.tables));
        !status.ok()) {
      return status;
    }
    curr_batch_ = state.current_batch;
    curr_compact_index_ = state.compact_index;
    consumers_ = std::move(consumers);
    cap_compactions_ = state.cap_compactions;
    cap_drops_ = state.cap_drops;
    dropped_ids_ = state.dropped_ids;
    dropped_bytes_ = state.dropped_bytes;
    batch_opened_.clear();
    batch_opened_[curr_batch_] = absl::Now();
    run_start_batch_ = curr_batch_;
  }
  PublishBatch(state.current_batch);
  return absl::OkStatus();
}

void Tracker::MarkRunStart(int64_t batch) {
  WriterLock lock(&mu_);
  run_start_batch_ = batch;
}

void Tracker::RequireResync() {
  WriterLock lock(&mu_);
  for (auto& [name, consumer] : consumers_) {
    MarkLostLocked(*consumer, INT64_MAX);
  }
}

}  // namespace deltastream
