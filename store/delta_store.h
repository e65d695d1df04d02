#ifndef DELTASTREAM_STORE_DELTA_STORE_H_
#define DELTASTREAM_STORE_DELTA_STORE_H_

#include <ATen/core/Tensor.h>

#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/shared_mutex.h"
#include "store/row_gather.h"
#include "store/row_index.h"
#include "store/unique_rows.h"
#include "store/update_mode.h"

namespace deltastream {

// One table's part of a recorded batch, as handed to DeltaStore::Append.
struct TableLookup {
  // The table's fully qualified name, for example
  // "sparse.ebc.embedding_bags.t1".
  std::string fqn;
  // int64 [n] row IDs, in lookup order, duplicates allowed. Any device.
  at::Tensor ids;
  // [n, dim] float32, float16 or bfloat16 rows, on the device of `ids`.
  // Required unless the store's mode is UpdateMode::kNone, where it is ignored.
  at::Tensor states;
};

// Memory held for one table, or for the whole store.
struct TableUsage {
  int64_t lookups = 0;  // indexed lookups held
  int64_t ids = 0;    // IDs held, counting repeats in not-yet-compacted lookups
  int64_t bytes = 0;  // bytes of IDs, states and indexes held
};

// One lookup as a store holds it, for snapshots (DeltaStore::Export/Import).
struct StoredLookup {
  int64_t batch_idx = 0;
  // int64 [n]; each ID once when the lookup is a compaction.
  at::Tensor ids;
  // [n, dim] in the table's state dtype; undefined in UpdateMode::kNone.
  at::Tensor states;
};

// One table's lookups and layout, for snapshots.
struct StoredTable {
  std::string fqn;
  c10::Device device = c10::kCPU;
  at::ScalarType state_dtype = at::kFloat;
  int64_t state_dim = 0;
  std::vector<StoredLookup> lookups;  // batch indices non-decreasing
};

struct StoreUsage {
  TableUsage total;
  std::map<std::string, TableUsage> tables;
};

// DeltaStore holds, per table FQN, an ordered list of *indexed lookups*: the
// IDs (and, by UpdateMode, states) recorded at one batch index, or the
// compaction of several batches into one lookup that holds each ID once. It
// answers "which rows changed since batch B, and with which state" with each ID
// once, sorted.
//
// Semantics (those of TorchRec's DeltaStore):
//  - Append adds a lookup at `batch_idx` to each table named; batch indices of
//  a
//    table never decrease.
//  - Compact(start, end): in each table, the lookups with batch index in
//    [start, end), when there are more than one, become one lookup at index
//    `start` holding their unique IDs. In kFirst the state of an ID is the one
//    of its first occurrence in batch order, in kLast its last.
//  - GetUnique(from, to): per table, the unique rows of all lookups with batch
//    index in [from, to), IDs ascending; states chosen by the same rule.
//  - Delete(up_to): drops every lookup with batch index < up_to.
// Compaction never changes what GetUnique returns for any `from` that is not
// strictly inside a compacted window.
//
// Cost: Append keeps references to the given tensors: no copy, no device
// synchronisation (tensors are detached from autograd). Host-resident lookups
// are compacted into a row index that later compactions extend in place, so
// time grows with the IDs recorded, not with steps x rows held: a bit test per
// ID while IDs are small row numbers (store/row_index.h). The index points at
// each kept state where it was recorded and holds those tensors: kFirst each
// states tensor while at least 1/8 of its rows are kept
// (RowIndex::kHeldFraction; the kept rows of a sparser one are copied and the
// tensor released), kLast every folded lookup until they hold 8 times the
// kept rows' bytes (then each ID's latest row is copied once and they are
// released). So compaction copies no state on DESIGN.md's workload, and a
// read copies each row it returns once, into its result: the floor of
// hashing the IDs and copying the unique rows once. Memory: a compacted window
// holds at most about 8.5 times its kept rows' bytes of states (on DESIGN.md's
// workload, the 4.5 times its recorded states take); ReleaseRecorded() brings
// it down to the kept rows.
// Device-resident (CUDA) lookups are compacted with tensor operations on their
// device.
//
// Callers must not modify appended tensors in place afterwards.
//
// Thread safety: all methods may be called concurrently from any thread; each
// call is atomic with respect to the others. Append never waits for more than
// one in-flight Compact or GetUnique.
class DeltaStore {
 public:
  explicit DeltaStore(UpdateMode mode);

  DeltaStore(const DeltaStore&) = delete;
  DeltaStore& operator=(const DeltaStore&) = delete;
  ~DeltaStore();

  UpdateMode mode() const { return mode_; }

  // Appends one lookup per element of `lookups`, all at `batch_idx`. All or
  // nothing: InvalidArgument, with the store unchanged, when any FQN is empty
  // or repeated, `batch_idx` is older than a table's newest lookup, IDs are not
  // int64 [n], or (unless kNone) states are missing, not [n, dim], not of a
  // floating dtype, on another device than the IDs, or of another dim, dtype or
  // device than the table's earlier lookups. ResourceExhausted, the store
  // unchanged, when new FQNs would make it hold more than kMaxTables tables
  // (a table, once recorded, is kept for good, empty or not: a producer
  // naming tables without end, such as a standalone server's, is bounded).
  static constexpr size_t kMaxTables = size_t{1} << 16;
  absl::Status Append(int64_t batch_idx, std::vector<TableLookup> lookups)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Drops, in every table, the lookups with batch index < `up_to_idx`; with
  // nullopt, every lookup. Tables stay known (GetUnique reports them empty).
  void Delete(std::optional<int64_t> up_to_idx = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Same, for one table; a no-op for an unknown FQN.
  void DeleteTable(absl::string_view fqn, int64_t up_to_idx)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Compacts the window [start_idx, end_idx) of every table (see above). A
  // no-op when start_idx >= end_idx.
  void Compact(int64_t start_idx, int64_t end_idx) ABSL_LOCKS_EXCLUDED(mu_);
  // Same, for one table; a no-op for an unknown FQN.
  void CompactTable(absl::string_view fqn, int64_t start_idx, int64_t end_idx)
      ABSL_LOCKS_EXCLUDED(mu_);
  // CompactTable over each window between consecutive `bounds` (ascending):
  // [bounds[0], bounds[1]), [bounds[1], bounds[2]), ... under one lock.
  void CompactTableBetween(absl::string_view fqn,
                           absl::Span<const int64_t> bounds)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Auto-compaction's form of CompactTable, for a window compacted at every
  // step: host tables compact fully (their row index makes that cost the new
  // IDs only); device tables, which re-unique what they merge (a
  // synchronising `unique` on the device), merge their newest lookups 8 at a
  // time and then carry the result into older runs while it holds at least
  // half as many IDs: the window keeps O(8 + log n) lookups and each ID is
  // merged O(log n) times, not once per step. Reads answer the same either
  // way.
  void CompactTableTiered(absl::string_view fqn, int64_t start_idx,
                          int64_t end_idx) ABSL_LOCKS_EXCLUDED(mu_);

  // Copies, in every compacted host lookup, the kept rows that still lie in
  // recorded states tensors into the store's own memory and releases those
  // tensors: the least memory the lookups can be held in. Reads answer the
  // same. Cost: a copy of those rows (for a memory cap, before dropping data).
  void ReleaseRecorded() ABSL_LOCKS_EXCLUDED(mu_);

  static constexpr int64_t kNoEnd = INT64_MAX;

  // Unique rows of the lookups with batch index in [from_idx, to_idx) of every
  // known table (possibly empty), by FQN. Results are fresh tensors on the
  // tables' device, owned by the caller.
  std::map<std::string, UniqueRows> GetUnique(int64_t from_idx,
                                              int64_t to_idx = kNoEnd) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Same, for one table; NotFound for an unknown FQN.
  absl::StatusOr<UniqueRows> GetUniqueTable(absl::string_view fqn,
                                            int64_t from_idx,
                                            int64_t to_idx = kNoEnd) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // GetUniqueTable's rows with their states still to be copied: `rows.ids`
  // complete and `rows.states` allocated, which `gather` fills (null when
  // `rows` is complete already: no states, no rows, a device table). The
  // gather reads the table's memory without the store's lock: the caller
  // finishes it (RowGather::Copy of every row) before anything but Append
  // changes that table (Compact*, Delete*, Clear, ReleaseRecorded, Import),
  // and then the rows equal GetUniqueTable's. Append may run meanwhile: it
  // adds lookups and moves or frees no row held.
  struct DeferredRows {
    UniqueRows rows;
    std::unique_ptr<RowGather> gather;
  };
  absl::StatusOr<DeferredRows> GetUniqueTableDeferred(
      absl::string_view fqn, int64_t from_idx, int64_t to_idx = kNoEnd) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Known table FQNs, sorted.
  std::vector<std::string> Fqns() const ABSL_LOCKS_EXCLUDED(mu_);
  // Batch indices of a table's lookups, in order (empty for an unknown FQN).
  std::vector<int64_t> BatchIndices(absl::string_view fqn) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The smallest batch index held in any table; nullopt when nothing is held.
  std::optional<int64_t> OldestBatchIndex() const ABSL_LOCKS_EXCLUDED(mu_);

  // Every table and its lookups, with host tensors: a recorded lookup as
  // recorded (duplicates kept, in order), a compacted one as its unique rows.
  // Import(Export()) gives a store whose every read equals this one's. Cost: a
  // device-to-host copy of device lookups and a gather of compacted host ones;
  // recorded host lookups are shared, not copied.
  std::vector<StoredTable> Export() const ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces everything held with `tables`, placing each table's lookups on
  // its `device`. All or nothing: InvalidArgument, with the store unchanged,
  // for an empty or repeated FQN, decreasing batch indices, or a lookup whose
  // IDs or states do not fit the table (as Append checks them).
  absl::Status Import(std::vector<StoredTable> tables) ABSL_LOCKS_EXCLUDED(mu_);

  StoreUsage Usage() const ABSL_LOCKS_EXCLUDED(mu_);
  // Total bytes held: Usage().total.bytes, without the per-table breakdown.
  int64_t bytes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Lookup;
  struct Table;

  absl::Status ValidateLookup(const Table* table, int64_t batch_idx,
                              const TableLookup& lookup) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void CompactLocked(Table& table, int64_t start_idx, int64_t end_idx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeleteLocked(Table& table, std::optional<int64_t> up_to_idx)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-adds the table's bytes to bytes_ after a change to its lookups.
  void RecountLocked(Table& table) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  UniqueRows UniqueRowsIn(const Table& table, int64_t from_idx,
                          int64_t to_idx) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  DeferredRows DeferredRowsIn(const Table& table, int64_t from_idx,
                              int64_t to_idx) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  Table* FindTable(absl::string_view fqn) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const UpdateMode mode_;
  mutable SharedMutex mu_;
  std::map<std::string, std::unique_ptr<Table>, std::less<>> tables_
      ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace deltastream

#endif  // DELTASTREAM_STORE_DELTA_STORE_H_
