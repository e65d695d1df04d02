#include "clients/replica.h"

#include <ATen/ATen.h>
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/rocksdb_options.h"
#include "proto/predictor.pb.h"
#include "proto/tensor_codec.h"

namespace deltastream {
namespace {

namespace fs = std::filesystem;

using DenseParameters = std::vector<std::pair<std::string, at::Tensor>>;
using TableInfos = std::map<std::string, ReplicaTableInfo, std::less<>>;

// One table's rows of an apply, validated: host, contiguous, in delta order.
struct TableWrite {
  std::string fqn;
  ReplicaTableInfo info;  // dtype and dim (rows: unused)
  int64_t row_bytes = 0;
  // (ids int64 [n], values [n, dim]) per delta that has rows for the table.
  std::vector<std::pair<at::Tensor, at::Tensor>> parts;
};

// What one Apply or Reset writes.
struct ApplyPlan {
  bool reset = false;
  std::vector<TableWrite> tables;
  bool replaces_dense = false;
  DenseParameters dense;  // when replaces_dense
  int64_t version = -1;
  std::string run_id;
};

int64_t RowBytes(const ReplicaTableInfo& info) {
  return info.dim * static_cast<int64_t>(c10::elementSize(info.dtype));
}

absl::Status CheckTableName(absl::string_view fqn) {
  if (fqn.empty()) return absl::InvalidArgumentError("a table has no name");
  if (fqn.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("table name '", fqn, "' holds a 0 byte"));
  }
  return absl::OkStatus();
}

// Checks `deltas` against the tables held (`held`, unless resetting) and
// against each other; builds the plan.
absl::StatusOr<ApplyPlan> PlanApply(absl::Span<const ReceivedDelta> deltas,
                                    const TableInfos& held, bool reset) {
  ApplyPlan plan;
  plan.reset = reset;
  std::map<std::string, size_t> table_index;
  for (const ReceivedDelta& delta : deltas) {
    for (const auto& [fqn, table] : delta.tables) {
      if (absl::Status s = CheckTableName(fqn); !s.ok()) return s;
      if (!table.ids.defined() || table.ids.numel() == 0) continue;
      auto invalid = [&fqn = fqn](absl::string_view what) {
        return absl::InvalidArgumentError(
            absl::StrCat("table '", fqn, "': ", what));
      };
      if (table.ids.scalar_type() != at::kLong || table.ids.dim() != 1) {
        return invalid("IDs must be int64 [n]");
      }
      const int64_t n = table.ids.size(0);
      if (!table.values.defined()) {
        return invalid(
            "rows without values (only a tracker inside the trainer sends "
            "the rows' current values)");
      }
      if (table.values.dim() != 2 || table.values.size(0) != n ||
          table.values.size(1) < 1) {
        return invalid(absl::StrCat("values must be [", n, ", dim >= 1], not ",
                                    table.values.sizes().vec().size(), "-D of ",
                                    table.values.numel(), " elements"));
      }
      if (absl::StatusOr<v1::Tensor::DType> wire =
              WireDType(table.values.scalar_type());
          !wire.ok()) {
        return invalid(wire.status().message());
      }
      ReplicaTableInfo info;
      info.dtype = table.values.scalar_type();
      info.dim = table.values.size(1);
      auto [it, added] = table_index.try_emplace(fqn, plan.tables.size());
      if (added) {
        TableWrite write;
        write.fqn = fqn;
        write.info = info;
        write.row_bytes = RowBytes(info);
        plan.tables.push_back(std::move(write));
      }
      const ReplicaTableInfo& expected = !reset && held.count(fqn) > 0
                                             ? held.find(fqn)->second
                                             : plan.tables[it->second].info;
      if (info.dtype != expected.dtype || info.dim != expected.dim) {
        return invalid(
            absl::StrCat("rows of ", c10::toString(info.dtype), " x ", info.dim,
                         " do not match the table's ",
                         c10::toString(expected.dtype), " x ", expected.dim));
      }
      plan.tables[it->second].parts.emplace_back(
          table.ids.cpu().contiguous(), table.values.cpu().contiguous());
    }
    if (delta.dense.empty()) continue;
    absl::flat_hash_set<std::string> names;
    for (const auto& [name, tensor] : delta.dense) {
      if (name.empty() || !names.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "dense parameter names must be unique and non-empty: '", name,
            "'"));
      }
      if (!tensor.defined() || !WireDType(tensor.scalar_type()).ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("dense parameter '", name,
                         "' is undefined or not of a wire dtype"));
      }
    }
    plan.replaces_dense = true;
    plan.dense.clear();
    for (const auto& [name, tensor] : delta.dense) {
      plan.dense.emplace_back(name, tensor.cpu().contiguous());
    }
  }
  return plan;
}

}  // namespace

// A prepared write, in two steps so that lookups wait only for the second.
class StagedWrite {
 public:
  virtual ~StagedWrite() = default;
  // Makes the write durable, if the backend is, without making it visible to
  // lookups; runs without the replica's locks (but under its apply mutex).
  // On error nothing changed.
  virtual absl::Status Persist() { return absl::OkStatus(); }
  // Makes the write visible; runs under the replica's writer lock, after
  // Persist succeeded. Cannot fail.
  virtual void Publish() = 0;
};

// Where rows live. Stage and Lookup run under the replica's reader lock (and
// Stage under its apply mutex: no other write runs meanwhile); Publish under
// its writer lock.
class Replica::RowStore {
 public:
  virtual ~RowStore() = default;
  // Tables held now (rows included).
  virtual const TableInfos& tables() const = 0;
  // Prepares `plan` (which holds version, run id and the dense parameters
  // after it) without changing what lookups see.
  virtual absl::StatusOr<std::unique_ptr<StagedWrite>> Stage(
      const ApplyPlan& plan, const DenseParameters& dense_after) = 0;
  // Fills `rows` (n rows of `info`'s size, zeroed) and `found` for `ids`.
  virtual absl::Status Lookup(absl::string_view fqn,
                              const ReplicaTableInfo& info, const int64_t* ids,
                              int64_t n, char* rows, bool* found) const = 0;
};

namespace {

// ---------------------------------------------------------------- in memory

// Rows live in blocks of this many slots: a table grows without moving rows.
constexpr int64_t kSlotsPerBlock = 1 << 14;

struct MemoryTable {
  ReplicaTableInfo info;
  int64_t row_bytes = 0;
  absl::flat_hash_map<int64_t, int64_t> slot_of_id;
  std::vector<std::unique_ptr<char[]>> blocks;

  char* Row(int64_t slot) const {
    return blocks[slot / kSlotsPerBlock].get() +
           (slot % kSlotsPerBlock) * row_bytes;
  }
};
using MemoryTables = std::map<std::string, MemoryTable, std::less<>>;

// Writes `write`'s rows into `table` (created from `write` when new), later
// rows over earlier ones.
void WriteRows(const TableWrite& write, MemoryTable& table) {
  if (table.row_bytes == 0) {
    table.info = write.info;
    table.row_bytes = write.row_bytes;
  }
  for (const auto& [ids, values] : write.parts) {
    const int64_t n = ids.size(0);
    if (table.slot_of_id.empty()) table.slot_of_id.reserve(n);
    const int64_t* id = ids.data_ptr<int64_t>();
    const char* row = static_cast<const char*>(values.data_ptr());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t next = static_cast<int64_t>(table.slot_of_id.size());
      auto [it, added] = table.slot_of_id.try_emplace(id[i], next);
      if (added && next % kSlotsPerBlock == 0) {
        table.blocks.emplace_back(new char[kSlotsPerBlock * table.row_bytes]);
      }
      std::memcpy(table.Row(it->second), row + i * table.row_bytes,
                  table.row_bytes);
    }
  }
  table.info.rows = static_cast<int64_t>(table.slot_of_id.size());
}

class MemoryRowStore;

// An increment writes in place when published (nothing can fail); a reset
// swaps in tables built while staging, and the old ones are freed with the
// staged write, after the writer lock.
class MemoryStagedWrite : public StagedWrite {
 public:
  MemoryStagedWrite(MemoryRowStore* store, const ApplyPlan* plan,
                    std::optional<MemoryTables> replacement)
      : store_(store), plan_(plan), replacement_(std::move(replacement)) {}
  void Publish() override;

 private:
  MemoryRowStore* const store_;
  const ApplyPlan* const plan_;
  std::optional<MemoryTables> replacement_;
};

class MemoryRowStore : public Replica::RowStore {
 public:
  const TableInfos& tables() const override { return infos_; }

  absl::StatusOr<std::unique_ptr<StagedWrite>> Stage(
      const ApplyPlan& plan, const DenseParameters&) override {
    std::optional<MemoryTables> replacement;
    if (plan.reset) {
      replacement.emplace();
      for (const TableWrite& write : plan.tables) {
        WriteRows(write, (*replacement)[write.fqn]);
      }
    }
    return std::unique_ptr<StagedWrite>(
        new MemoryStagedWrite(this, &plan, std::move(replacement)));
  }

  absl::Status Lookup(absl::string_view fqn, const ReplicaTableInfo& info,
                      const int64_t* ids, int64_t n, char* rows,
                      bool* found) const override {
    const MemoryTable& table = tables_.find(fqn)->second;
    for (int64_t i = 0; i < n; ++i) {
      auto it = table.slot_of_id.find(ids[i]);
      found[i] = it != table.slot_of_id.end();
      if (found[i]) {
        std::memcpy(rows + i * table.row_bytes, table.Row(it->second),
                    table.row_bytes);
      }
    }
    return absl::OkStatus();
  }

 private:
  friend class MemoryStagedWrite;

  void Publish(const ApplyPlan& plan,
               std::optional<MemoryTables>& replacement) {
    if (replacement.has_value()) {
      std::swap(tables_, *replacement);
    } else {
      for (const TableWrite& write : plan.tables) {
        WriteRows(write, tables_[write.fqn]);
      }
    }
    infos_.clear();
    for (const auto& [fqn, table] : tables_) infos_[fqn] = table.info;
  }

  MemoryTables tables_;
  TableInfos infos_;
};

void MemoryStagedWrite::Publish() { store_->Publish(*plan_, replacement_); }

// ---------------------------------------------------------------- RocksDB

constexpr absl::string_view kFormatKey = "m/format";
constexpr absl::string_view kFormat = "deltastream-replica-1";
constexpr absl::string_view kStateKey = "m/state";
constexpr absl::string_view kDenseKey = "m/dense";
// Rows: "r" + fqn + "\0" + ID; tables: "t" + fqn. 's' follows 'r', 'u' 't'.
constexpr absl::string_view kRowsBegin = "r";
constexpr absl::string_view kRowsEnd = "s";
constexpr absl::string_view kTablesBegin = "t";
constexpr absl::string_view kTablesEnd = "u";

constexpr size_t kIdBytes = 8;

bool IsRowKey(const rocksdb::Slice& key) {
  return key.size() >= kRowsBegin.size() + 2 + kIdBytes &&
         key.starts_with(ToSlice(kRowsBegin)) &&
         key[key.size() - kIdBytes - 1] == '\0';
}

std::string RowKey(absl::string_view fqn, int64_t id) {
  std::string key = absl::StrCat(kRowsBegin, fqn);
  key.push_back('\0');
  AppendOrderedId(key, id);
  return key;
}

// The ID of a row key (IsRowKey).
int64_t RowKeyId(const rocksdb::Slice& key) {
  return ReadOrderedId(absl::string_view(key.data(), key.size()));
}

std::string TableKey(absl::string_view fqn) {
  return absl::StrCat(kTablesBegin, fqn);
}

absl::Status FromRocks(const rocksdb::Status& status, absl::string_view what,
                       absl::string_view path) {
  return FromRocksStatus(status, what, "replica", path);
}

class RocksRowStore;

// The IDs each table holds, by table name.
using HeldIds =
    std::map<std::string, absl::flat_hash_set<int64_t>, std::less<>>;

class RocksStagedWrite : public StagedWrite {
 public:
  explicit RocksStagedWrite(RocksRowStore* store) : store_(store) {}
  absl::Status Persist() override;
  void Publish() override;

  rocksdb::WriteBatch batch;
  TableInfos infos_after;
  bool reset = false;
  HeldIds new_ids;  // by table: the IDs it did not hold before this write

 private:
  RocksRowStore* const store_;
};

// What a reopened database holds besides rows.
struct RestoredState {
  int64_t version = -1;
  std::string run_id;
  int64_t dense_version = -1;
  DenseParameters dense;
};

class RocksRowStore : public Replica::RowStore {
 public:
  static absl::StatusOr<std::unique_ptr<RocksRowStore>> Open(
      const std::string& path, int64_t cache_bytes, RestoredState* restored);

  ~RocksRowStore() override {
    if (snapshot_ != nullptr) db_->ReleaseSnapshot(snapshot_);
  }

  const TableInfos& tables() const override { return infos_; }

  absl::StatusOr<std::unique_ptr<StagedWrite>> Stage(
      const ApplyPlan& plan, const DenseParameters& dense_after) override {
    auto staged = std::make_unique<RocksStagedWrite>(this);
    staged->reset = plan.reset;
    TableInfos& infos = staged->infos_after;
    if (!plan.reset) infos = infos_;
    rocksdb::WriteBatch& batch = staged->batch;
    rocksdb::Status status;
    if (plan.reset) {
      status = batch.DeleteRange(ToSlice(kRowsBegin), ToSlice(kRowsEnd));
      if (status.ok()) {
        status = batch.DeleteRange(ToSlice(kTablesBegin), ToSlice(kTablesEnd));
      }
      if (!status.ok())
        return FromRocks(status, "cannot stage a reset of", path_);
    }
    for (const TableWrite& write : plan.tables) {
      auto [it, added] = infos.try_emplace(write.fqn, write.info);
      if (added) it->second.rows = 0;
      absl::flat_hash_set<int64_t>& new_ids = staged->new_ids[write.fqn];
      NewIds(write, plan.reset, new_ids);
      it->second.rows += static_cast<int64_t>(new_ids.size());
      for (const auto& [ids, values] : write.parts) {
        const int64_t* id = ids.data_ptr<int64_t>();
        const char* row = static_cast<const char*>(values.data_ptr());
        for (int64_t i = 0; i < ids.size(0); ++i) {
          status = batch.Put(
              RowKey(write.fqn, id[i]),
              rocksdb::Slice(row + i * write.row_bytes, write.row_bytes));
          if (!status.ok()) return FromRocks(status, "cannot stage", path_);
        }
      }
      v1::ReplicaTableRecord record;
      record.set_fqn(write.fqn);
      record.set_dtype(*WireDType(it->second.dtype));
      record.set_dim(it->second.dim);
      record.set_rows(it->second.rows);
      status = batch.Put(TableKey(write.fqn), record.SerializeAsString());
      if (!status.ok()) return FromRocks(status, "cannot stage", path_);
    }
    v1::ReplicaStateRecord state;
    state.set_version(plan.version);
    state.set_run_id(plan.run_id);
    status = batch.Put(ToSlice(kStateKey), state.SerializeAsString());
    if (status.ok() && (plan.replaces_dense || plan.reset)) {
      v1::ReplicaStateRecord dense;
      dense.set_version(plan.replaces_dense ? plan.version : -1);
      dense.set_has_dense(!dense_after.empty());
      for (const auto& [name, tensor] : dense_after) {
        v1::NamedTensor* named = dense.add_dense();
        named->set_name(name);
        if (absl::Status s = EncodeTensor(tensor, named->mutable_tensor());
            !s.ok()) {
          return s;
        }
      }
      status = batch.Put(ToSlice(kDenseKey), dense.SerializeAsString());
    }
    if (!status.ok()) return FromRocks(status, "cannot stage", path_);
    return std::unique_ptr<StagedWrite>(std::move(staged));
  }

  absl::Status Lookup(absl::string_view fqn, const ReplicaTableInfo& info,
                      const int64_t* ids, int64_t n, char* rows,
                      bool* found) const override {
    const int64_t row_bytes = RowBytes(info);
    std::vector<std::string> keys(n);
    std::vector<rocksdb::Slice> slices(n);
    for (int64_t i = 0; i < n; ++i) {
      keys[i] = RowKey(fqn, ids[i]);
      slices[i] = keys[i];
    }
    std::vector<rocksdb::PinnableSlice> values(n);
    std::vector<rocksdb::Status> statuses(n);
    rocksdb::ReadOptions options;
    options.snapshot = snapshot_;
    db_->MultiGet(options, db_->DefaultColumnFamily(), n, slices.data(),
                  values.data(), statuses.data());
    for (int64_t i = 0; i < n; ++i) {
      found[i] = statuses[i].ok();
      if (statuses[i].IsNotFound()) continue;
      if (!statuses[i].ok())
        return FromRocks(statuses[i], "cannot read", path_);
      if (static_cast<int64_t>(values[i].size()) != row_bytes) {
        return absl::DataLossError(absl::StrCat(
            "replica database '", path_, "': row ", ids[i], " of table '", fqn,
            "' has ", values[i].size(), " bytes, not ", row_bytes));
      }
      std::memcpy(rows + i * row_bytes, values[i].data(), row_bytes);
    }
    return absl::OkStatus();
  }

 private:
  friend class RocksStagedWrite;

  RocksRowStore(std::string path, std::unique_ptr<rocksdb::DB> db)
      : path_(std::move(path)), db_(std::move(db)) {}

  // Reads every row's ID into held_ids_ (once, when opening), checking each
  // row against its table's record: DataLoss for a row of a table without a
  // record, a row of the wrong size, or a count that differs from the record.
  absl::Status LoadHeldIds() {
    auto corrupt = [this](absl::string_view what) {
      return absl::DataLossError(
          absl::StrCat("replica database '", path_, "': ", what));
    };
    rocksdb::ReadOptions options;
    options.fill_cache = false;  // one pass over every row: keep the cache
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(options));
    absl::string_view fqn;  // the table of the rows read last
    absl::flat_hash_set<int64_t>* held = nullptr;
    size_t row_bytes = 0;
    for (it->Seek(ToSlice(kRowsBegin));
         it->Valid() && it->key().compare(ToSlice(kRowsEnd)) < 0; it->Next()) {
      const rocksdb::Slice key = it->key();
      if (!IsRowKey(key)) {
        return corrupt(absl::StrCat(
            "row key '", absl::CHexEscape(key.ToString()), "' is malformed"));
      }
      const absl::string_view key_fqn(
          key.data() + kRowsBegin.size(),
          key.size() - kRowsBegin.size() - kIdBytes - 1);
      if (held == nullptr || key_fqn != fqn) {
        auto info = infos_.find(key_fqn);
        if (info == infos_.end()) {
          return corrupt(absl::StrCat("rows of table '", key_fqn,
                                      "', which has no table record"));
        }
        fqn = info->first;
        held = &held_ids_[info->first];
        row_bytes = static_cast<size_t>(RowBytes(info->second));
      }
      const int64_t id = RowKeyId(key);
      if (it->value().size() != row_bytes) {
        return corrupt(absl::StrCat("row ", id, " of table '", fqn, "' has ",
                                    it->value().size(), " bytes, not ",
                                    row_bytes));
      }
      held->insert(id);
    }
    if (!it->status().ok())
      return FromRocks(it->status(), "cannot read", path_);
    for (const auto& [name, info] : infos_) {
      auto found = held_ids_.find(name);
      const int64_t rows = found == held_ids_.end()
                               ? 0
                               : static_cast<int64_t>(found->second.size());
      if (rows != info.rows) {
        return corrupt(absl::StrCat("table '", name, "' records ", info.rows,
                                    " rows but holds ", rows));
      }
    }
    return absl::OkStatus();
  }

  // Lookups read the database as it is now: what a write persisted becomes
  // visible (called under the replica's writer lock).
  void ReadAtLatest() {
    const rocksdb::Snapshot* previous = snapshot_;
    snapshot_ = db_->GetSnapshot();
    if (previous != nullptr) db_->ReleaseSnapshot(previous);
  }

  // Adds to `new_ids` the IDs of `write` that its table does not hold (all
  // of them when the write is a `reset`).
  void NewIds(const TableWrite& write, bool reset,
              absl::flat_hash_set<int64_t>& new_ids) const {
    static const absl::flat_hash_set<int64_t> kNone;
    auto found = held_ids_.find(write.fqn);
    const absl::flat_hash_set<int64_t>& held =
        reset || found == held_ids_.end() ? kNone : found->second;
    for (const auto& [ids, values] : write.parts) {
      const int64_t* id = ids.data_ptr<int64_t>();
      for (int64_t i = 0; i < ids.size(0); ++i) {
        if (!held.contains(id[i])) new_ids.insert(id[i]);
      }
    }
  }

  const std::string path_;
  const std::unique_ptr<rocksdb::DB> db_;
  TableInfos infos_;
  // Every row's ID, so that a write counts the rows it adds without reading
  // the database (a MultiGet of the written IDs took over half of an apply).
  // Only applies use it (Stage, and Persist once the write is durable), one
  // at a time under the replica's apply mutex; lookups never do.
  HeldIds held_ids_;
  // What lookups read: the database as of the last published write, so that
  // a write persisting meanwhile stays invisible until it is published.
  const rocksdb::Snapshot* snapshot_ = nullptr;
};

absl::Status RocksStagedWrite::Persist() {
  rocksdb::WriteOptions options;
  options.sync = true;  // durable when Apply returns
  rocksdb::Status status = store_->db_->Write(options, &batch);
  if (!status.ok()) return FromRocks(status, "cannot write", store_->path_);
  // The IDs the database now holds (lookups never read them: no need to
  // wait for the writer lock).
  HeldIds& held_ids = store_->held_ids_;
  if (reset) held_ids.clear();
  for (auto& [fqn, ids] : new_ids) {
    absl::flat_hash_set<int64_t>& held = held_ids[fqn];
    if (held.empty()) {
      held = std::move(ids);
    } else {
      held.insert(ids.begin(), ids.end());
    }
  }
  return absl::OkStatus();
}

void RocksStagedWrite::Publish() {
  store_->infos_ = std::move(infos_after);
  store_->ReadAtLatest();
}

// The table part of a row key (RowKey without the ID); other keys have none.
class RowKeyTable : public rocksdb::SliceTransform {
 public:
  const char* Name() const override { return "deltastream.RowKeyTable"; }
  rocksdb::Slice Transform(const rocksdb::Slice& key) const override {
    return rocksdb::Slice(key.data(), key.size() - kIdBytes);
  }
  bool InDomain(const rocksdb::Slice& key) const override {
    return IsRowKey(key);
  }
};

rocksdb::Options DbOptions(int64_t cache_bytes) {
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(static_cast<size_t>(cache_bytes));
  // Lookups probe single keys: a Bloom filter skips the files
  // that cannot hold them.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  rocksdb::Options options = DurableDbOptions();
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // A write's rows of one table come in ID order: each insert into the
  // memtable starts where the previous one of that table ended (apply 0.48
  // to 0.65 M rows/s in freshness_bench).
  options.memtable_insert_with_hint_prefix_extractor =
      std::make_shared<RowKeyTable>();
  return options;
}

absl::StatusOr<std::unique_ptr<RocksRowStore>> RocksRowStore::Open(
    const std::string& path, int64_t cache_bytes, RestoredState* restored) {
  // A database refused for damage is left as it was: checked read-only
  // first, every file's checksums included (opening reads every row anyway).
  if (absl::StatusOr<std::unique_ptr<rocksdb::DB>> check = OpenForCheck(
          path, DbOptions(cache_bytes), "replica", /*verify_checksums=*/true);
      !check.ok()) {
    return check.status();
  }
  rocksdb::DB* raw = nullptr;
  rocksdb::Status status =
      rocksdb::DB::Open(DbOptions(cache_bytes), path, &raw);
  if (!status.ok()) return FromRocks(status, "cannot open", path);
  std::unique_ptr<RocksRowStore> store(
      new RocksRowStore(path, std::unique_ptr<rocksdb::DB>(raw)));
  rocksdb::DB& db = *store->db_;

  std::string bytes;
  status = db.Get(rocksdb::ReadOptions(), ToSlice(kFormatKey), &bytes);
  if (status.IsNotFound()) {
    std::unique_ptr<rocksdb::Iterator> it(
        db.NewIterator(rocksdb::ReadOptions()));
    it->SeekToFirst();
    if (it->Valid()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", path, "' holds a RocksDB database that is not a replica (no \"",
          kFormatKey, "\" key)"));
    }
    rocksdb::WriteOptions sync;
    sync.sync = true;
    status = db.Put(sync, ToSlice(kFormatKey), ToSlice(kFormat));
    if (!status.ok()) return FromRocks(status, "cannot initialise", path);
    store->ReadAtLatest();
    return store;
  }
  if (!status.ok()) return FromRocks(status, "cannot read", path);
  if (bytes != kFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat("replica database '", path, "' has format '", bytes,
                     "'; this build reads '", kFormat, "' only"));
  }
  auto corrupt = [&path](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("replica database '", path, "': ", what, " is corrupt"));
  };
  status = db.Get(rocksdb::ReadOptions(), ToSlice(kStateKey), &bytes);
  if (status.ok()) {
    v1::ReplicaStateRecord state;
    if (!state.ParseFromString(bytes)) return corrupt("the version record");
    restored->version = state.version();
    restored->run_id = state.run_id();
  } else if (!status.IsNotFound()) {
    return FromRocks(status, "cannot read", path);
  }
  status = db.Get(rocksdb::ReadOptions(), ToSlice(kDenseKey), &bytes);
  if (status.ok()) {
    v1::ReplicaStateRecord dense;
    if (!dense.ParseFromString(bytes)) return corrupt("the dense record");
    restored->dense_version = dense.version();
    for (const v1::NamedTensor& named : dense.dense()) {
      absl::StatusOr<at::Tensor> tensor = DecodeTensor(named.tensor());
      if (!tensor.ok()) {
        return corrupt(absl::StrCat("dense parameter '", named.name(), "'"));
      }
      restored->dense.emplace_back(named.name(), *std::move(tensor));
    }
  } else if (!status.IsNotFound()) {
    return FromRocks(status, "cannot read", path);
  }
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(ToSlice(kTablesBegin));
       it->Valid() && it->key().compare(ToSlice(kTablesEnd)) < 0; it->Next()) {
    v1::ReplicaTableRecord record;
    absl::StatusOr<at::ScalarType> dtype;
    if (!record.ParseFromArray(it->value().data(),
                               static_cast<int>(it->value().size())) ||
        record.fqn() != it->key().ToString().substr(kTablesBegin.size()) ||
        !(dtype = HostDType(record.dtype())).ok() || record.dim() < 1 ||
        record.rows() < 0) {
      return corrupt(
          absl::StrCat("the record of table '", it->key().ToString(), "'"));
    }
    ReplicaTableInfo& info = store->infos_[record.fqn()];
    info.dtype = *dtype;
    info.dim = record.dim();
    info.rows = record.rows();
  }
  if (!it->status().ok()) return FromRocks(it->status(), "cannot read", path);
  if (absl::Status s = store->LoadHeldIds(); !s.ok()) return s;
  store->ReadAtLatest();
  return store;
}

}  // namespace

// ---------------------------------------------------------------- Replica

absl::StatusOr<std::unique_ptr<Replica>> Replica::Open(ReplicaOptions options) {
  if (options.db_path.empty()) {
    return std::unique_ptr<Replica>(
        new Replica("memory", std::make_unique<MemoryRowStore>()));
  }
  RestoredState restored;
  absl::StatusOr<std::unique_ptr<RocksRowStore>> store =
      RocksRowStore::Open(options.db_path, options.cache_bytes, &restored);
  if (!store.ok()) return store.status();
  std::unique_ptr<Replica> replica(
      new Replica(options.db_path, *std::move(store)));
  WriterLock lock(&replica->mu_);
  replica->version_ = restored.version;
  replica->run_id_ = std::move(restored.run_id);
  replica->dense_.version = restored.dense_version;
  replica->dense_.parameters = std::move(restored.dense);
  return replica;
}

Replica::Replica(std::string where, std::unique_ptr<RowStore> store)
    : where_(std::move(where)), store_(std::move(store)) {}

Replica::~Replica() = default;

absl::Status Replica::Apply(absl::Span<const ReceivedDelta> deltas,
                            int64_t version, absl::string_view run_id) {
  return Write(deltas, version, run_id, /*reset=*/false);
}

absl::Status Replica::Reset(absl::Span<const ReceivedDelta> deltas,
                            int64_t version, absl::string_view run_id) {
  return Write(deltas, version, run_id, /*reset=*/true);
}

absl::Status Replica::Write(absl::Span<const ReceivedDelta> deltas,
                            int64_t version, absl::string_view run_id,
                            bool reset) {
  WriterLock apply_lock(&apply_mu_);
  std::unique_ptr<StagedWrite> staged;
  ApplyPlan plan;
  {
    // Only this thread writes (apply_mu_): what it stages stays valid until
    // it installs.
    ReaderLock lock(&mu_);
    if (!reset && version < version_) {
      return absl::FailedPreconditionError(
          absl::StrCat("the replica is at version ", version_,
                       ": an apply cannot move it back to ", version,
                       " (only a reset can)"));
    }
    absl::StatusOr<ApplyPlan> planned =
        PlanApply(deltas, store_->tables(), reset);
    if (!planned.ok()) return planned.status();
    plan = *std::move(planned);
    plan.version = version;
    plan.run_id = std::string(run_id);
    const DenseParameters& dense_after =
        plan.replaces_dense ? plan.dense
                            : (reset ? DenseParameters() : dense_.parameters);
    absl::StatusOr<std::unique_ptr<StagedWrite>> prepared =
        store_->Stage(plan, dense_after);
    if (!prepared.ok()) return prepared.status();
    staged = *std::move(prepared);
  }
  if (absl::Status s = staged->Persist(); !s.ok()) return s;
  WriterLock lock(&mu_);
  staged->Publish();
  version_ = version;
  run_id_ = std::string(run_id);
  if (plan.replaces_dense) {
    dense_.parameters = std::move(plan.dense);
    dense_.version = version;
  } else if (reset) {
    dense_.parameters.clear();
    dense_.version = -1;
  }
  return absl::OkStatus();
}

absl::StatusOr<ReplicaRows> Replica::Lookup(absl::string_view fqn,
                                            const at::Tensor& ids) const {
  if (!ids.defined() || ids.scalar_type() != at::kLong || ids.dim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("IDs for table '", fqn, "' must be int64 [n]"));
  }
  const at::Tensor host_ids = ids.cpu().contiguous();
  const int64_t n = host_ids.size(0);
  ReaderLock lock(&mu_);
  auto it = store_->tables().find(fqn);
  if (it == store_->tables().end()) {
    return absl::NotFoundError(
        absl::StrCat("the replica holds no table '", fqn, "'"));
  }
  const ReplicaTableInfo& info = it->second;
  ReplicaRows result;
  result.version = version_;
  result.rows = at::zeros({n, info.dim}, at::TensorOptions(info.dtype));
  result.found = at::zeros({n}, at::TensorOptions(at::kBool));
  if (absl::Status s =
          store_->Lookup(fqn, info, host_ids.data_ptr<int64_t>(), n,
                         static_cast<char*>(result.rows.data_ptr()),
                         result.found.data_ptr<bool>());
      !s.ok()) {
    return s;
  }
  return result;
}

ReplicaDense Replica::Dense() const {
  ReaderLock lock(&mu_);
  return dense_;
}

int64_t Replica::Version() const {
  ReaderLock lock(&mu_);
  return version_;
}

std::string Replica::RunId() const {
  ReaderLock lock(&mu_);
  return run_id_;
}

std::map<std::string, ReplicaTableInfo> Replica::Tables() const {
  ReaderLock lock(&mu_);
  return std::map<std::string, ReplicaTableInfo>(store_->tables().begin(),
                                                 store_->tables().end());
}

int64_t Replica::RowCount(absl::string_view fqn) const {
  ReaderLock lock(&mu_);
  auto it = store_->tables().find(fqn);
  return it == store_->tables().end() ? 0 : it->second.rows;
}

}  // namespace deltastream
