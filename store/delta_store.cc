#include "store/delta_store.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

// Auto-compaction merges device lookups this many at a time.
constexpr int64_t kDeviceMergeFanIn = 8;

}  // namespace

struct DeltaStore::Lookup {
  int64_t batch_idx = 0;
  // A lookup as recorded (duplicates allowed), or, on the device, compacted.
  at::Tensor ids;
  at::Tensor states;
  // Set instead of `ids`/`states` for a host-side compacted lookup.
  std::unique_ptr<RowIndex> rows;

  int64_t id_count() const { return rows ? rows->size() : ids.numel(); }
  int64_t bytes() const {
    if (rows) return rows->bytes();
    return static_cast<int64_t>(ids.nbytes() +
                                (states.defined() ? states.nbytes() : 0));
  }
};

struct DeltaStore::Table {
  std::vector<Lookup> lookups;  // batch_idx non-decreasing
  // Fixed by the table's first lookup.
  c10::Device device = c10::kCPU;
  at::ScalarType state_dtype = at::kFloat;
  int64_t state_dim = 0;
  int64_t bytes = 0;
  // The newest batch appended: a compacted lookup keeps only its window's
  // start, so the order of appends is checked against this.
  int64_t newest_batch = std::numeric_limits<int64_t>::min();

  int64_t row_bytes() const {
    return state_dim * static_cast<int64_t>(c10::elementSize(state_dtype));
  }
  std::vector<Lookup>::iterator LowerBound(int64_t batch_idx) {
    return std::partition_point(
        lookups.begin(), lookups.end(),
        [batch_idx](const Lookup& l) { return l.batch_idx < batch_idx; });
  }
  std::vector<Lookup>::const_iterator LowerBound(int64_t batch_idx) const {
    return std::partition_point(
        lookups.begin(), lookups.end(),
        [batch_idx](const Lookup& l) { return l.batch_idx < batch_idx; });
  }
};

namespace {

bool IsStateDtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16;
}

// Folds a recorded host lookup into `index`. The IDs and states folded stay
// referenced by `keep` when given (a borrowing index points into them).
void FoldRecorded(RowIndex& index, const at::Tensor& ids,
                  const at::Tensor& states,
                  std::vector<at::Tensor>* keep = nullptr) {
  at::Tensor contiguous_ids = ids.contiguous();
  at::Tensor contiguous_states =
      states.defined() ? states.contiguous() : at::Tensor();
  if (keep != nullptr) {
    keep->push_back(contiguous_ids);
    if (contiguous_states.defined()) keep->push_back(contiguous_states);
  }
  index.Fold(contiguous_ids, contiguous_states);
}

}  // namespace

DeltaStore::DeltaStore(UpdateMode mode) : mode_(mode) {}
DeltaStore::~DeltaStore() = default;

DeltaStore::Table* DeltaStore::FindTable(absl::string_view fqn) const {
  auto it = tables_.find(fqn);
  return it == tables_.end() ? nullptr : it->second.get();
}

absl::Status DeltaStore::ValidateLookup(const Table* table, int64_t batch_idx,
                                        const TableLookup& lookup) const {
  const std::string& fqn = lookup.fqn;
  if (fqn.empty()) return absl::InvalidArgumentError("empty table FQN");
  if (!lookup.ids.defined() || lookup.ids.dim() != 1 ||
      lookup.ids.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", fqn, "': IDs must be a 1-D int64 tensor, got ",
        lookup.ids.defined() ? lookup.ids.toString() : "none",
        lookup.ids.defined() ? absl::StrCat(" of ", lookup.ids.dim(), " dims")
                             : ""));
  }
  if (table != nullptr && batch_idx < table->newest_batch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", fqn, "': batch index ", batch_idx,
        " is older than its newest lookup at ", table->newest_batch));
  }
  if (table != nullptr && lookup.ids.device() != table->device) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", fqn, "' holds lookups on ", table->device.str(),
                     ", got IDs on ", lookup.ids.device().str()));
  }
  if (mode_ == UpdateMode::kNone) return absl::OkStatus();

  const at::Tensor& states = lookup.states;
  if (!states.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", fqn, "': update mode ", UpdateModeName(mode_),
                     " needs states with the IDs"));
  }
  if (states.dim() != 2 || states.size(0) != lookup.ids.numel() ||
      states.size(1) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", fqn, "': states must be [", lookup.ids.numel(),
                     ", dim >= 1] to match ", lookup.ids.numel(), " IDs, got ",
                     c10::str(states.sizes())));
  }
  if (!IsStateDtype(states.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", fqn, "': states must be float32, float16 or bfloat16, got ",
        c10::toString(states.scalar_type())));
  }
  if (states.device() != lookup.ids.device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("table '", fqn, "': states on ", states.device().str(),
                     " but IDs on ", lookup.ids.device().str()));
  }
  if (table != nullptr && (states.size(1) != table->state_dim ||
                           states.scalar_type() != table->state_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", fqn, "' holds ", c10::toString(table->state_dtype),
        " states of dim ", table->state_dim, ", got ",
        c10::toString(states.scalar_type()), " of dim ", states.size(1)));
  }
  return absl::OkStatus();
}

absl::Status DeltaStore::Append(int64_t batch_idx,
                                std::vector<TableLookup> lookups) {
  WriterLock lock(&mu_);
  absl::flat_hash_set<absl::string_view> seen;
  size_t tables = tables_.size();
  for (const TableLookup& lookup : lookups) {
    if (!seen.insert(lookup.fqn).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", lookup.fqn, "' appears twice in one batch's lookups"));
    }
    const Table* table = FindTable(lookup.fqn);
    if (table == nullptr && ++tables > kMaxTables) {
      return absl::ResourceExhaustedError(
          absl::StrCat("table '", lookup.fqn, "' refused: the store holds ",
                       kMaxTables, " tables, the most it keeps"));
    }
    if (absl::Status status = ValidateLookup(table, batch_idx, lookup);
        !status.ok()) {
      return status;
    }
  }
  for (TableLookup& lookup : lookups) {
    std::unique_ptr<Table>& slot = tables_[lookup.fqn];
    if (slot == nullptr) {
      slot = std::make_unique<Table>();
      slot->device = lookup.ids.device();
      if (mode_ != UpdateMode::kNone) {
        slot->state_dtype = lookup.states.scalar_type();
        slot->state_dim = lookup.states.size(1);
      }
    }
    Lookup stored;
    stored.batch_idx = batch_idx;
    stored.ids = lookup.ids.detach();
    if (mode_ != UpdateMode::kNone) stored.states = lookup.states.detach();
    const int64_t added = stored.bytes();
    slot->lookups.push_back(std::move(stored));
    slot->newest_batch = std::max(slot->newest_batch, batch_idx);
    slot->bytes += added;
    bytes_ += added;
  }
  return absl::OkStatus();
}

void DeltaStore::RecountLocked(Table& table) {
  bytes_ -= table.bytes;
  table.bytes = 0;
  for (const Lookup& lookup : table.lookups) table.bytes += lookup.bytes();
  bytes_ += table.bytes;
}

void DeltaStore::DeleteLocked(Table& table, std::optional<int64_t> up_to_idx) {
  auto end = up_to_idx.has_value() ? table.LowerBound(*up_to_idx)
                                   : table.lookups.end();
  if (end == table.lookups.begin()) return;
  table.lookups.erase(table.lookups.begin(), end);
  RecountLocked(table);
}

void DeltaStore::Delete(std::optional<int64_t> up_to_idx) {
  WriterLock lock(&mu_);
  for (auto& [fqn, table] : tables_) DeleteLocked(*table, up_to_idx);
}

void DeltaStore::DeleteTable(absl::string_view fqn, int64_t up_to_idx) {
  WriterLock lock(&mu_);
  if (Table* table = FindTable(fqn)) DeleteLocked(*table, up_to_idx);
}

void DeltaStore::CompactLocked(Table& table, int64_t start_idx,
                               int64_t end_idx) {
  if (start_idx >= end_idx) return;
  auto first = table.LowerBound(start_idx);
  auto last = table.LowerBound(end_idx);
  if (last - first <= 1) return;

  Lookup merged;
  merged.batch_idx = start_idx;
  if (table.device.is_cpu()) {
    if (first->rows) {
      merged.rows = std::move(first->rows);
    } else {
      merged.rows = std::make_unique<RowIndex>(mode_, table.row_bytes());
      FoldRecorded(*merged.rows, first->ids, first->states);
    }
    for (auto it = first + 1; it != last; ++it) {
      if (it->rows) {
        merged.rows->Fold(std::move(*it->rows));
      } else {
        FoldRecorded(*merged.rows, it->ids, it->states);
      }
    }
  } else {
    std::vector<at::Tensor> ids, states;
    for (auto it = first; it != last; ++it) {
      ids.push_back(it->ids);
      if (mode_ != UpdateMode::kNone) states.push_back(it->states);
    }
    UniqueRows rows = UniqueRowsOf(ids, states, mode_);
    merged.ids = std::move(rows.ids);
    merged.states = std::move(rows.states);
  }
  auto at = table.lookups.erase(first, last);
  table.lookups.insert(at, std::move(merged));
  RecountLocked(table);
}

void DeltaStore::Compact(int64_t start_idx, int64_t end_idx) {
  WriterLock lock(&mu_);
  for (auto& [fqn, table] : tables_) CompactLocked(*table, start_idx, end_idx);
}

void DeltaStore::CompactTable(absl::string_view fqn, int64_t start_idx,
                              int64_t end_idx) {
  CompactTableBetween(fqn, {start_idx, end_idx});
}

void DeltaStore::CompactTableBetween(absl::string_view fqn,
                                     absl::Span<const int64_t> bounds) {
  WriterLock lock(&mu_);
  Table* table = FindTable(fqn);
  if (table == nullptr) return;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    CompactLocked(*table, bounds[i], bounds[i + 1]);
  }
}

void DeltaStore::CompactTableTiered(absl::string_view fqn, int64_t start_idx,
                                    int64_t end_idx) {
  WriterLock lock(&mu_);
  Table* table = FindTable(fqn);
  if (table == nullptr) return;
  if (table->device.is_cpu()) {
    CompactLocked(*table, start_idx, end_idx);
    return;
  }
  if (start_idx >= end_idx) return;
  auto window = [&] {
    return std::make_pair(table->LowerBound(start_idx),
                          table->LowerBound(end_idx));
  };
  // Batches arrive one lookup each: merge them kDeviceMergeFanIn at a time
  // (one device `unique` per that many steps), then carry the result into
  // older runs while it is at least half their size.
  auto [first, last] = window();
  if (last - first <= kDeviceMergeFanIn) return;
  CompactLocked(*table, (last - kDeviceMergeFanIn)->batch_idx,
                (last - 1)->batch_idx + 1);
  while (true) {
    std::tie(first, last) = window();
    if (last - first < 2) return;
    const Lookup& older = *(last - 2);
    const Lookup& newer = *(last - 1);
    if (2 * newer.id_count() < older.id_count()) return;
    CompactLocked(*table, older.batch_idx, newer.batch_idx + 1);
  }
}

void DeltaStore::ReleaseRecorded() {
  WriterLock lock(&mu_);
  for (auto& [fqn, table] : tables_) {
    for (Lookup& lookup : table->lookups) {
      if (lookup.rows) lookup.rows->ReleaseHeld();
    }
    RecountLocked(*table);
  }
}

UniqueRows DeltaStore::UniqueRowsIn(const Table& table, int64_t from_idx,
                                    int64_t to_idx) const {
  DeferredRows deferred = DeferredRowsIn(table, from_idx, to_idx);
  if (deferred.gather != nullptr) {
    deferred.gather->Copy(0, deferred.gather->rows());
  }
  return std::move(deferred.rows);
}

DeltaStore::DeferredRows DeltaStore::DeferredRowsIn(const Table& table,
                                                    int64_t from_idx,
                                                    int64_t to_idx) const {
  DeferredRows result;
  auto first = table.LowerBound(from_idx);
  auto last = std::max(first, table.LowerBound(to_idx));
  if (first == last) {
    UniqueRows& empty = result.rows;
    empty.ids =
        at::empty({0}, at::TensorOptions(at::kLong).device(table.device));
    if (mode_ != UpdateMode::kNone) {
      empty.states =
          at::empty({0, table.state_dim},
                    at::TensorOptions(table.state_dtype).device(table.device));
    }
    return result;
  }
  if (!table.device.is_cpu()) {
    std::vector<at::Tensor> ids, states;
    for (auto it = first; it != last; ++it) {
      ids.push_back(it->ids);
      if (mode_ != UpdateMode::kNone) states.push_back(it->states);
    }
    result.rows = UniqueRowsOf(ids, states, mode_);
    return result;
  }
  // The index's rows in ID order, their states left to `result.gather`.
  auto sorted = [&](const RowIndex& index, std::vector<at::Tensor> keep) {
    std::vector<const uint8_t*> rows_at;
    result.rows = index.SortedRows(table.state_dtype, &rows_at);
    if (result.rows.states.defined()) {
      result.gather =
          std::make_unique<RowGather>(result.rows.states, std::move(rows_at),
                                      index.row_bytes(), std::move(keep));
    }
    return std::move(result);
  };
  if (last - first == 1 && first->rows) return sorted(*first->rows, {});
  // The lookups outlive this read (the reader lock is held; a deferred copy
  // comes before any change but an Append): index their rows where they are
  // and copy each kept one once, into the result.
  RowIndex index(mode_, table.row_bytes(), RowIndex::Rows::kBorrowed);
  std::vector<at::Tensor> borrowed;
  for (auto it = first; it != last; ++it) {
    if (it->rows) {
      index.Fold(*it->rows);
    } else {
      FoldRecorded(index, it->ids, it->states, &borrowed);
    }
  }
  return sorted(index, std::move(borrowed));
}

std::map<std::string, UniqueRows> DeltaStore::GetUnique(int64_t from_idx,
                                                        int64_t to_idx) const {
  ReaderLock lock(&mu_);
  std::map<std::string, UniqueRows> result;
  for (const auto& [fqn, table] : tables_) {
    result.emplace(fqn, UniqueRowsIn(*table, from_idx, to_idx));
  }
  return result;
}

absl::StatusOr<UniqueRows> DeltaStore::GetUniqueTable(absl::string_view fqn,
                                                      int64_t from_idx,
                                                      int64_t to_idx) const {
  ReaderLock lock(&mu_);
  const Table* table = FindTable(fqn);
  if (table == nullptr) {
    return absl::NotFoundError(absl::StrCat("no table '", fqn, "' in store"));
  }
  return UniqueRowsIn(*table, from_idx, to_idx);
}

absl::StatusOr<DeltaStore::DeferredRows> DeltaStore::GetUniqueTableDeferred(
    absl::string_view fqn, int64_t from_idx, int64_t to_idx) const {
  ReaderLock lock(&mu_);
  const Table* table = FindTable(fqn);
  if (table == nullptr) {
    return absl::NotFoundError(absl::StrCat("no table '", fqn, "' in store"));
  }
  return DeferredRowsIn(*table, from_idx, to_idx);
}

std::vector<std::string> DeltaStore::Fqns() const {
  ReaderLock lock(&mu_);
  std::vector<std::string> fqns;
  for (const auto& [fqn, table] : tables_) fqns.push_back(fqn);
  return fqns;
}

std::vector<int64_t> DeltaStore::BatchIndices(absl::string_view fqn) const {
  ReaderLock lock(&mu_);
  std::vector<int64_t> indices;
  if (const Table* table = FindTable(fqn)) {
    for (const Lookup& lookup : table->lookups) {
      indices.push_back(lookup.batch_idx);
    }
  }
  return indices;
}

std::optional<int64_t> DeltaStore::OldestBatchIndex() const {
  ReaderLock lock(&mu_);
  std::optional<int64_t> oldest;
  for (const auto& [fqn, table] : tables_) {
    if (table->lookups.empty()) continue;
    int64_t idx = table->lookups.front().batch_idx;
    if (!oldest.has_value() || idx < *oldest) oldest = idx;
  }
  return oldest;
}

std::vector<StoredTable> DeltaStore::Export() const {
  ReaderLock lock(&mu_);
  std::vector<StoredTable> tables;
  tables.reserve(tables_.size());
  for (const auto& [fqn, table] : tables_) {
    StoredTable& stored = tables.emplace_back();
    stored.fqn = fqn;
    stored.device = table->device;
    stored.state_dtype = table->state_dtype;
    stored.state_dim = table->state_dim;
    stored.lookups.reserve(table->lookups.size());
    for (const Lookup& lookup : table->lookups) {
      StoredLookup& out = stored.lookups.emplace_back();
      out.batch_idx = lookup.batch_idx;
      if (lookup.rows) {
        UniqueRows rows = lookup.rows->ToUniqueRows(table->state_dtype);
        out.ids = std::move(rows.ids);
        out.states = std::move(rows.states);
      } else {
        out.ids = lookup.ids.cpu();
        if (lookup.states.defined()) out.states = lookup.states.cpu();
      }
    }
  }
  return tables;
}

absl::Status DeltaStore::Import(std::vector<StoredTable> tables) {
  WriterLock lock(&mu_);
  std::map<std::string, std::unique_ptr<Table>, std::less<>> imported;
  for (StoredTable& stored : tables) {
    if (stored.fqn.empty())
      return absl::InvalidArgumentError("empty table FQN");
    if (imported.count(stored.fqn) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", stored.fqn, "' appears twice"));
    }
    if (mode_ != UpdateMode::kNone &&
        (!IsStateDtype(stored.state_dtype) || stored.state_dim < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", stored.fqn, "': bad state layout ",
          c10::toString(stored.state_dtype), " of dim ", stored.state_dim));
    }
    auto table = std::make_unique<Table>();
    table->device = stored.device;
    table->state_dtype = stored.state_dtype;
    table->state_dim = stored.state_dim;
    for (StoredLookup& lookup : stored.lookups) {
      TableLookup placed{stored.fqn, lookup.ids, lookup.states};
      try {
        if (placed.ids.defined()) placed.ids = placed.ids.to(stored.device);
        if (placed.states.defined()) {
          placed.states = placed.states.to(stored.device);
        }
      } catch (const c10::Error& e) {
        return absl::FailedPreconditionError(absl::StrCat(
            "table '", stored.fqn, "' cannot be placed on ",
            stored.device.str(), ": ", e.what_without_backtrace()));
      }
      if (absl::Status status =
              ValidateLookup(table.get(), lookup.batch_idx, placed);
          !status.ok()) {
        return status;
      }
      Lookup held;
      held.batch_idx = lookup.batch_idx;
      held.ids = std::move(placed.ids);
      if (mode_ != UpdateMode::kNone) held.states = std::move(placed.states);
      table->lookups.push_back(std::move(held));
      table->newest_batch = std::max(table->newest_batch, lookup.batch_idx);
    }
    imported.emplace(stored.fqn, std::move(table));
  }
  tables_ = std::move(imported);
  bytes_ = 0;
  for (auto& [fqn, table] : tables_) {
    table->bytes = 0;
    RecountLocked(*table);
  }
  return absl::OkStatus();
}

StoreUsage DeltaStore::Usage() const {
  ReaderLock lock(&mu_);
  StoreUsage usage;
  for (const auto& [fqn, table] : tables_) {
    TableUsage& t = usage.tables[fqn];
    t.lookups = static_cast<int64_t>(table->lookups.size());
    for (const Lookup& lookup : table->lookups) t.ids += lookup.id_count();
    t.bytes = table->bytes;
    usage.total.lookups += t.lookups;
    usage.total.ids += t.ids;
    usage.total.bytes += t.bytes;
  }
  return usage;
}

int64_t DeltaStore::bytes() const {
  ReaderLock lock(&mu_);
  return bytes_;
}

}  // namespace deltastream
