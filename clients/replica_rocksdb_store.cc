// The RocksDB backend of a Replica: a key per row, the table records and
// the version, run id and dense parameters under meta keys
// (clients/replica.h describes the layout).
#include <ATen/core/Tensor.h>
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/rocksdb_options.h"
#include "clients/replica_row_store.h"
#include "proto/predictor.pb.h"
#include "proto/tensor_codec.h"

namespace deltastream {
namespace {

namespace fs = std::filesystem;

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

// The dense parameters' record (kDenseKey), encoded: protobuf's limit.
constexpr uint64_t kMaxDenseRecordBytes = INT_MAX;

absl::Status TooMuchDense(uint64_t bytes, absl::string_view path) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the dense parameters take ", bytes,
      " bytes: a replica database holds at most ", kMaxDenseRecordBytes,
      " bytes of them (one record); the replica at ", path,
      " keeps the version it had"));
}

class RocksRowStore;

// The IDs each table holds, by table name.
using HeldIds =
    std::map<std::string, absl::flat_hash_set<int64_t>, std::less<>>;

class RocksStagedWrite : public ReplicaStagedWrite {
 public:
  explicit RocksStagedWrite(RocksRowStore* store) : store_(store) {}
  absl::Status Persist() override;
  void Publish() override;

  rocksdb::WriteBatch batch;
  ReplicaTableInfos infos_after;
  bool reset = false;
  HeldIds new_ids;  // by table: the IDs it did not hold before this write

 private:
  RocksRowStore* const store_;
};

class RocksRowStore : public Replica::RowStore {
 public:
  static absl::StatusOr<std::unique_ptr<RocksRowStore>> Open(
      const std::string& path, int64_t cache_bytes,
      ReplicaRestoredState* restored);

  ~RocksRowStore() override {
    if (snapshot_ != nullptr) db_->ReleaseSnapshot(snapshot_);
  }

  const ReplicaTableInfos& tables() const override { return infos_; }

  absl::StatusOr<std::unique_ptr<ReplicaStagedWrite>> Stage(
      const ReplicaApplyPlan& plan,
      const DenseParameters& dense_after) override {
    auto staged = std::make_unique<RocksStagedWrite>(this);
    staged->reset = plan.reset;
    ReplicaTableInfos& infos = staged->infos_after;
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
    for (const ReplicaTableWrite& write : plan.tables) {
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
      // One record holds them all: past protobuf's 2 GiB limit it would be
      // written empty, and the replica would come back without them. Looked
      // at before the tensors are copied into the record, and after.
      uint64_t payload = 0;
      for (const auto& [name, tensor] : dense_after) payload += tensor.nbytes();
      if (payload > kMaxDenseRecordBytes) return TooMuchDense(payload, path_);
      for (const auto& [name, tensor] : dense_after) {
        v1::NamedTensor* named = dense.add_dense();
        named->set_name(name);
        if (absl::Status s = EncodeTensor(tensor, named->mutable_tensor());
            !s.ok()) {
          return s;
        }
      }
      if (const size_t bytes = dense.ByteSizeLong();
          bytes > kMaxDenseRecordBytes) {
        return TooMuchDense(bytes, path_);
      }
      status = batch.Put(ToSlice(kDenseKey), dense.SerializeAsString());
    }
    if (!status.ok()) return FromRocks(status, "cannot stage", path_);
    return std::unique_ptr<ReplicaStagedWrite>(std::move(staged));
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
  void NewIds(const ReplicaTableWrite& write, bool reset,
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
  ReplicaTableInfos infos_;
  // Every row's ID, so that a write counts the rows it adds without reading
  // the database (a MultiGet of the written IDs took over half of an apply).
  // Only applies use it (Stage, and Persist once the write is durable), one
  // at a time under the replica's apply mutex; lookups never do.
  HeldIds held_ids_;
  // What lookups read: the database as of the last published write, so that
  // a write persisting meanwhile stays invisible until it is published.
  const rocksdb::Snapshot* snapshot_ = nullptr;
};

// ResourceExhausted when the disk under `path` has too little space for a
// write of `bytes` to its write-ahead log. Debian's RocksDB aborts the
// process (an assertion) when a WAL append fails and the same write then
// syncs, so a write the disk cannot take must never reach it.
absl::Status CheckRoomForWrite(const std::string& path, size_t bytes) {
  struct statvfs disk;
  if (statvfs(path.c_str(), &disk) != 0) return absl::OkStatus();
  const uint64_t free_bytes =
      static_cast<uint64_t>(disk.f_bavail) * disk.f_frsize;
  const uint64_t needed = 2 * static_cast<uint64_t>(bytes) + (1 << 20);
  if (free_bytes >= needed) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("cannot write replica database '", path, "': ", free_bytes,
                   " bytes free on its disk, a write of ", bytes,
                   " bytes needs ", needed, " (No space left on device)"));
}

absl::Status RocksStagedWrite::Persist() {
  if (absl::Status room = CheckRoomForWrite(store_->path_, batch.GetDataSize());
      !room.ok()) {
    return room;
  }
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
    const std::string& path, int64_t cache_bytes,
    ReplicaRestoredState* restored) {
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
        record.dim() > kMaxTensorElements || record.rows() < 0) {
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

absl::StatusOr<std::unique_ptr<Replica::RowStore>> OpenRocksRowStore(
    const std::string& path, int64_t cache_bytes,
    ReplicaRestoredState* restored) {
  absl::StatusOr<std::unique_ptr<RocksRowStore>> store =
      RocksRowStore::Open(path, cache_bytes, restored);
  if (!store.ok()) return store.status();
  return std::unique_ptr<Replica::RowStore>(*std::move(store));
}

}  // namespace deltastream
