#include "store/snapshot_db.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/sst_file_writer.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/log.h"
#include "base/rocksdb_options.h"
#include "proto/snapshot.pb.h"
#include "proto/tensor_codec.h"

namespace deltastream {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kFormatKey = "format";
constexpr absl::string_view kGenerationsBegin = "g/";
constexpr absl::string_view kGenerationsEnd = "g0";  // '0' follows '/'
constexpr absl::string_view kManifestSuffix = "/manifest";
// Each generation carries the format marker too, inside its own key range (so
// that deleting an old generation's files stays a range deletion).
constexpr absl::string_view kGenerationFormatSuffix = "/format";
// A data value holds about this many bytes of rows.
constexpr int64_t kChunkBytes = 4 << 20;

std::string GenerationPrefix(uint64_t generation) {
  std::string key(kGenerationsBegin);
  AppendBigEndian(key, generation, 8);
  return key;
}

// Deletes every generation before `generation` (a snapshot's, or leftovers of
// an interrupted write or a cleanup that failed): their files, then their
// keys.
rocksdb::Status DeleteGenerationsBefore(rocksdb::DB& db, uint64_t generation) {
  const std::string begin(kGenerationsBegin);
  const std::string end = GenerationPrefix(generation);
  rocksdb::Slice begin_slice(begin), end_slice(end);
  rocksdb::DeleteFilesInRange(&db, db.DefaultColumnFamily(), &begin_slice,
                              &end_slice);
  return db.DeleteRange(rocksdb::WriteOptions(), db.DefaultColumnFamily(),
                        begin_slice, end_slice);
}

std::string ManifestKey(uint64_t generation) {
  return absl::StrCat(GenerationPrefix(generation), kManifestSuffix);
}

std::string ChunkKey(uint64_t generation, uint32_t table, uint32_t lookup,
                     uint32_t chunk, char kind) {
  std::string key = absl::StrCat(GenerationPrefix(generation), "/d/");
  AppendBigEndian(key, table, 4);
  AppendBigEndian(key, lookup, 4);
  AppendBigEndian(key, chunk, 4);
  key.push_back(kind);
  return key;
}

absl::Status FromRocks(const rocksdb::Status& status, absl::string_view what,
                       absl::string_view path) {
  return FromRocksStatus(status, what, "snapshot", path);
}

// Bytes of one row of `t` ([n, ...]).
int64_t RowBytes(const at::Tensor& t) {
  return t.size(0) == 0 ? 0 : static_cast<int64_t>(t.nbytes()) / t.size(0);
}

// The newest generation's manifest key, or "" when there is none.
absl::StatusOr<std::string> NewestManifestKey(rocksdb::DB& db,
                                              absl::string_view path) {
  std::unique_ptr<rocksdb::Iterator> it(db.NewIterator(rocksdb::ReadOptions()));
  it->SeekToLast();
  if (!it->status().ok()) return FromRocks(it->status(), "cannot read", path);
  if (!it->Valid()) return std::string();
  absl::string_view key(it->key().data(), it->key().size());
  if (!absl::StartsWith(key, kGenerationsBegin)) return std::string();
  if (key.size() != kGenerationsBegin.size() + 8 + kManifestSuffix.size() ||
      !absl::EndsWith(key, kManifestSuffix)) {
    return absl::DataLossError(absl::StrCat(
        "snapshot database '", path,
        "' is inconsistent: its newest generation has no manifest"));
  }
  return std::string(key);
}

// Checks what a database holds before it is opened for writing: its format
// marker, and that its newest generation has a manifest that parses. `db` is
// the read-only handle of OpenForCheck. Sets `*write_marker` when the
// database lacks the "format" key but may have it written: it holds no key
// at all (a new database), or its newest generation carries the marker (the
// "format" key of a database written by an older build was lost with its
// WAL).
absl::Status CheckContents(rocksdb::DB& db, const std::string& path,
                           bool* write_marker) {
  std::string format;
  rocksdb::Status status =
      db.Get(rocksdb::ReadOptions(), ToSlice(kFormatKey), &format);
  if (!status.ok() && !status.IsNotFound()) {
    return FromRocks(status, "cannot read", path);
  }
  absl::StatusOr<std::string> newest = NewestManifestKey(db, path);
  if (!newest.ok()) return newest.status();
  if (status.IsNotFound()) {
    std::unique_ptr<rocksdb::Iterator> it(
        db.NewIterator(rocksdb::ReadOptions()));
    it->SeekToFirst();
    if (!it->status().ok()) return FromRocks(it->status(), "cannot read", path);
    if (it->Valid() && !newest->empty()) {
      const std::string key = absl::StrCat(
          newest->substr(0, newest->size() - kManifestSuffix.size()),
          kGenerationFormatSuffix);
      status = db.Get(rocksdb::ReadOptions(), key, &format);
      if (!status.ok() && !status.IsNotFound()) {
        return FromRocks(status, "cannot read", path);
      }
    }
    if (it->Valid() && format.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", path,
                       "' holds a RocksDB database that is not a deltastream "
                       "snapshot database (no \"format\" key)"));
    }
    *write_marker = true;
    if (format.empty()) return absl::OkStatus();  // a new database
  }
  if (format != SnapshotDb::kFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot database '", path, "' has format '", format,
                     "'; this build reads '", SnapshotDb::kFormat, "' only"));
  }
  if (newest->empty()) return absl::OkStatus();
  std::string bytes;
  status = db.Get(rocksdb::ReadOptions(), *newest, &bytes);
  if (!status.ok()) return FromRocks(status, "cannot read", path);
  v1::SnapshotManifest manifest;
  if (!manifest.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat(
        "snapshot database '", path, "': the newest manifest is corrupt"));
  }
  return absl::OkStatus();
}

}  // namespace

SnapshotDb::SnapshotDb(std::string path, std::unique_ptr<rocksdb::DB> db)
    : path_(std::move(path)), db_(std::move(db)) {}

SnapshotDb::~SnapshotDb() = default;

absl::StatusOr<std::unique_ptr<SnapshotDb>> SnapshotDb::Open(
    const std::string& path) {
  // Everything that can refuse the database is checked read-only first: a
  // refused database is left exactly as it was.
  bool write_marker = true;
  {
    absl::StatusOr<std::unique_ptr<rocksdb::DB>> check =
        OpenForCheck(path, DurableDbOptions(), "snapshot",
                     /*verify_checksums=*/true);
    if (!check.ok()) return check.status();
    if (*check != nullptr) {
      write_marker = false;
      if (absl::Status s = CheckContents(**check, path, &write_marker);
          !s.ok()) {
        return s;
      }
    }
  }
  rocksdb::DB* raw = nullptr;
  rocksdb::Status status = rocksdb::DB::Open(DurableDbOptions(), path, &raw);
  if (!status.ok()) return FromRocks(status, "cannot open", path);
  std::unique_ptr<rocksdb::DB> db(raw);
  if (write_marker) {
    // The marker goes to a table file, not only the WAL: a database whose WAL
    // is lost still says what it is.
    rocksdb::WriteOptions sync;
    sync.sync = true;
    status = db->Put(sync, ToSlice(kFormatKey), ToSlice(kFormat));
    if (status.ok()) status = db->Flush(rocksdb::FlushOptions());
    if (!status.ok()) return FromRocks(status, "cannot initialise", path);
  }

  auto snapshots =
      std::unique_ptr<SnapshotDb>(new SnapshotDb(path, std::move(db)));
  absl::StatusOr<std::string> newest = NewestManifestKey(*snapshots->db_, path);
  if (!newest.ok()) return newest.status();
  if (!newest->empty()) {
    std::string bytes;
    status = snapshots->db_->Get(rocksdb::ReadOptions(), *newest, &bytes);
    if (!status.ok()) return FromRocks(status, "cannot read", path);
    v1::SnapshotManifest manifest;
    if (!manifest.ParseFromString(bytes)) {
      return absl::DataLossError(absl::StrCat(
          "snapshot database '", path, "': the newest manifest is corrupt"));
    }
    SnapshotInfo info;
    info.generation = manifest.generation();
    info.written_at = absl::FromUnixMicros(manifest.written_unix_micros());
    info.payload_bytes = manifest.payload_bytes();
    info.owner_batch = manifest.owner_batch();
    snapshots->latest_ = info;
    // A process killed between a snapshot's ingestion and the deletion of the
    // previous one leaves older generations behind.
    status = DeleteGenerationsBefore(*snapshots->db_, info.generation);
    if (!status.ok()) return FromRocks(status, "cannot clean", path);
  }
  std::error_code error;
  fs::remove_all(fs::path(path) / "staging", error);
  return snapshots;
}

std::optional<SnapshotInfo> SnapshotDb::latest() const {
  std::lock_guard<std::mutex> lock(latest_mu_);
  return latest_;
}

absl::StatusOr<SnapshotInfo> SnapshotDb::Write(const Snapshot& snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time start = absl::Now();
  const uint64_t generation = latest_.has_value() ? latest_->generation + 1 : 1;

  v1::SnapshotManifest manifest;
  manifest.set_generation(generation);
  manifest.set_written_unix_micros(absl::ToUnixMicros(start));
  manifest.set_owner_state(snapshot.owner_state);
  manifest.set_owner_batch(snapshot.owner_batch);

  std::error_code error;
  const fs::path staging = fs::path(path_) / "staging";
  fs::create_directories(staging, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create '", staging.string(),
                                            "': ", error.message()));
  }
  const std::string file =
      (staging / absl::StrCat("generation-", generation, ".sst")).string();
  rocksdb::SstFileWriter writer(rocksdb::EnvOptions(), DurableDbOptions());
  rocksdb::Status status = writer.Open(file);
  if (!status.ok()) return FromRocks(status, "cannot write", path_);
  // A write that fails leaves no staging file behind (ingestion moves it).
  absl::Cleanup remove_staging = [&file] {
    std::error_code ignored;
    fs::remove(file, ignored);
  };

  int64_t payload = 0;
  try {
    for (size_t t = 0; t < snapshot.tables.size(); ++t) {
      const StoredTable& table = snapshot.tables[t];
      v1::TableManifest* table_manifest = manifest.add_tables();
      table_manifest->set_fqn(table.fqn);
      table_manifest->set_device(table.device.str());
      absl::StatusOr<v1::Tensor::DType> dtype = WireDType(table.state_dtype);
      if (!dtype.ok()) return dtype.status();
      table_manifest->set_state_dtype(*dtype);
      table_manifest->set_state_dim(table.state_dim);
      const int64_t row_bytes =
          8 + table.state_dim *
                  static_cast<int64_t>(c10::elementSize(table.state_dtype));
      const int64_t chunk_rows = std::max<int64_t>(1, kChunkBytes / row_bytes);
      table_manifest->set_chunk_rows(chunk_rows);
      for (size_t l = 0; l < table.lookups.size(); ++l) {
        const StoredLookup& lookup = table.lookups[l];
        at::Tensor ids = lookup.ids.cpu().contiguous();
        at::Tensor states = lookup.states.defined()
                                ? lookup.states.cpu().contiguous()
                                : at::Tensor();
        const int64_t rows = ids.numel();
        if (states.defined() && (states.dim() != 2 || states.size(0) != rows ||
                                 states.size(1) != table.state_dim ||
                                 states.scalar_type() != table.state_dtype)) {
          return absl::InvalidArgumentError(
              absl::StrCat("table '", table.fqn, "' lookup ", l, ": states ",
                           c10::str(states.sizes()), " do not fit ", rows,
                           " rows of dim ", table.state_dim));
        }
        v1::LookupManifest* lookup_manifest = table_manifest->add_lookups();
        lookup_manifest->set_batch_idx(lookup.batch_idx);
        lookup_manifest->set_rows(rows);
        lookup_manifest->set_has_states(states.defined());
        const char* id_bytes = static_cast<const char*>(ids.data_ptr());
        const char* state_bytes =
            states.defined() ? static_cast<const char*>(states.data_ptr())
                             : nullptr;
        const int64_t state_row_bytes = states.defined() ? RowBytes(states) : 0;
        for (int64_t first = 0, chunk = 0; first < rows;
             first += chunk_rows, ++chunk) {
          const int64_t n = std::min(chunk_rows, rows - first);
          status = writer.Put(ChunkKey(generation, t, l, chunk, 'i'),
                              rocksdb::Slice(id_bytes + first * 8, n * 8));
          if (status.ok() && state_bytes != nullptr) {
            status =
                writer.Put(ChunkKey(generation, t, l, chunk, 's'),
                           rocksdb::Slice(state_bytes + first * state_row_bytes,
                                          n * state_row_bytes));
          }
          if (!status.ok()) return FromRocks(status, "cannot write", path_);
          payload += n * (8 + state_row_bytes);
        }
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot gather rows to snapshot: ", e.what()));
  }
  manifest.set_payload_bytes(payload);
  // "/format" sorts after the rows ("/d/") and before "/manifest".
  status = writer.Put(
      absl::StrCat(GenerationPrefix(generation), kGenerationFormatSuffix),
      ToSlice(kFormat));
  if (status.ok()) {
    status = writer.Put(ManifestKey(generation), manifest.SerializeAsString());
  }
  if (status.ok()) status = writer.Finish();
  if (!status.ok()) return FromRocks(status, "cannot write", path_);

  rocksdb::IngestExternalFileOptions ingest;
  ingest.move_files = true;
  status = db_->IngestExternalFile({file}, ingest);
  if (!status.ok()) return FromRocks(status, "cannot ingest into", path_);

  // The new generation is durable and the newest: the next write must not
  // reuse its number, whatever the cleanup below does.
  SnapshotInfo info;
  info.generation = generation;
  info.written_at = start;
  info.payload_bytes = payload;
  info.owner_batch = snapshot.owner_batch;
  {
    std::lock_guard<std::mutex> latest_lock(latest_mu_);
    latest_ = info;
  }
  // A cleanup that fails leaves older generations for the next write's or
  // Open's: never read (the newest manifest wins), only space.
  status = DeleteGenerationsBefore(*db_, generation);
  if (!status.ok()) {
    LogWarning(absl::StrCat("snapshot database '", path_,
                            "': older generations stay until the next "
                            "snapshot: ",
                            status.ToString()));
  }
  info.elapsed = absl::Now() - start;
  {
    std::lock_guard<std::mutex> latest_lock(latest_mu_);
    latest_->elapsed = info.elapsed;
  }
  return info;
}

absl::StatusOr<std::optional<Snapshot>> SnapshotDb::Read(SnapshotInfo* info) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time start = absl::Now();
  if (!latest_.has_value()) return std::optional<Snapshot>();
  const uint64_t generation = latest_->generation;
  auto corrupt = [&](auto&&... what) {
    return absl::DataLossError(absl::StrCat("snapshot database '", path_,
                                            "', generation ", generation, ": ",
                                            what...));
  };

  rocksdb::ReadOptions options;
  options.verify_checksums = true;
  options.fill_cache = false;
  std::string bytes;
  rocksdb::Status status = db_->Get(options, ManifestKey(generation), &bytes);
  if (!status.ok()) return FromRocks(status, "cannot read", path_);
  v1::SnapshotManifest manifest;
  if (!manifest.ParseFromString(bytes)) return corrupt("manifest unreadable");

  Snapshot snapshot;
  snapshot.owner_state = manifest.owner_state();
  snapshot.owner_batch = manifest.owner_batch();
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(options));
  it->Seek(absl::StrCat(GenerationPrefix(generation), "/d/"));
  // Copies the next data value, which must be `key`, into `dst`.
  auto read_chunk = [&](const std::string& key, char* dst,
                        int64_t size) -> absl::Status {
    if (!it->Valid()) {
      if (!it->status().ok())
        return FromRocks(it->status(), "cannot read", path_);
      return corrupt("rows missing");
    }
    if (it->key() != rocksdb::Slice(key)) return corrupt("unexpected rows key");
    if (static_cast<int64_t>(it->value().size()) != size) {
      return corrupt("a chunk holds ", it->value().size(), " bytes, expected ",
                     size);
    }
    std::memcpy(dst, it->value().data(), size);
    it->Next();
    return absl::OkStatus();
  };
  int64_t payload = 0;
  try {
    for (int t = 0; t < manifest.tables_size(); ++t) {
      const v1::TableManifest& table_manifest = manifest.tables(t);
      StoredTable& table = snapshot.tables.emplace_back();
      table.fqn = table_manifest.fqn();
      try {
        table.device = c10::Device(table_manifest.device());
      } catch (const c10::Error&) {
        return corrupt("table '", table.fqn, "' has a bad device '",
                       table_manifest.device(), "'");
      }
      absl::StatusOr<at::ScalarType> dtype =
          HostDType(table_manifest.state_dtype());
      if (!dtype.ok()) return corrupt(dtype.status().message());
      table.state_dtype = *dtype;
      table.state_dim = table_manifest.state_dim();
      const int64_t chunk_rows = table_manifest.chunk_rows();
      if (table.state_dim < 0 || chunk_rows < 1) {
        return corrupt("table '", table.fqn, "' has a bad layout");
      }
      for (int l = 0; l < table_manifest.lookups_size(); ++l) {
        const v1::LookupManifest& lookup_manifest = table_manifest.lookups(l);
        const int64_t rows = lookup_manifest.rows();
        if (rows < 0) return corrupt("a negative row count");
        StoredLookup& lookup = table.lookups.emplace_back();
        lookup.batch_idx = lookup_manifest.batch_idx();
        lookup.ids = at::empty({rows}, at::kLong);
        if (lookup_manifest.has_states()) {
          lookup.states =
              at::empty({rows, table.state_dim}, at::TensorOptions(*dtype));
        }
        const int64_t state_row_bytes =
            lookup.states.defined()
                ? table.state_dim * lookup.states.element_size()
                : 0;
        char* ids = static_cast<char*>(lookup.ids.data_ptr());
        char* states = lookup.states.defined()
                           ? static_cast<char*>(lookup.states.data_ptr())
                           : nullptr;
        for (int64_t first = 0, chunk = 0; first < rows;
             first += chunk_rows, ++chunk) {
          const int64_t n = std::min(chunk_rows, rows - first);
          if (absl::Status s =
                  read_chunk(ChunkKey(generation, t, l, chunk, 'i'),
                             ids + first * 8, n * 8);
              !s.ok()) {
            return s;
          }
          if (states != nullptr) {
            if (absl::Status s = read_chunk(
                    ChunkKey(generation, t, l, chunk, 's'),
                    states + first * state_row_bytes, n * state_row_bytes);
                !s.ok()) {
              return s;
            }
          }
          payload += n * (8 + state_row_bytes);
        }
      }
    }
  } catch (const std::exception& e) {  // a manifest's absurd sizes
    return corrupt(e.what());
  }
  if (!it->status().ok()) return FromRocks(it->status(), "cannot read", path_);
  if (payload != manifest.payload_bytes()) {
    return corrupt("rows hold ", payload, " bytes, the manifest says ",
                   manifest.payload_bytes());
  }
  {
    // The latest generation's description says how long it took to read
    // (a restart's restore), not the 0 its reopening left.
    std::lock_guard<std::mutex> latest_lock(latest_mu_);
    latest_->elapsed = absl::Now() - start;
    if (info != nullptr) *info = *latest_;
  }
  return std::optional<Snapshot>(std::move(snapshot));
}

}  // namespace deltastream
