#ifndef DELTASTREAM_STORE_SNAPSHOT_DB_H_
#define DELTASTREAM_STORE_SNAPSHOT_DB_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/delta_store.h"

namespace rocksdb {
class DB;
}

namespace deltastream {

// What one snapshot holds: a store's tables and its owner's state.
struct Snapshot {
  // Opaque bytes of the snapshot's owner (a serialized v1::TrackerState for a
  // tracker), kept with the tables.
  std::string owner_state;
  // The owner's position (a tracker's current batch), for operators.
  int64_t owner_batch = 0;
  std::vector<StoredTable> tables;
};

struct SnapshotInfo {
  uint64_t generation = 0;  // 1, 2, ... within one database
  absl::Time written_at = absl::InfinitePast();
  int64_t payload_bytes = 0;  // bytes of IDs and states
  int64_t owner_batch = 0;    // Snapshot::owner_batch
  // How long the Write, or the Read since, of this generation took (0 for
  // one an Open found and nothing read yet).
  absl::Duration elapsed;
};

// Snapshots in a RocksDB database at a path; the layout is in
// proto/snapshot.proto.
//
// Atomicity: Write builds the whole new generation as one SST file beside
// the database and ingests it with one IngestExternalFile call, which RocksDB
// applies atomically and durably; the newest generation is the current one. A
// reader, or a process restarted after being killed at any point, finds either
// the previous snapshot or the new one, never a mix. The previous generation
// is then deleted and its files removed. No write-ahead log and no memtable
// are involved: rows are written once, sequentially.
//
// Thread safety: all methods may be called from any thread; writes and reads
// are serialised.
class SnapshotDb {
 public:
  static constexpr absl::string_view kFormat = "deltastream-snapshots/1";

  // Opens the database at `path`, creating it when `path` does not exist or
  // is an empty directory. FailedPrecondition, with the path and the reason,
  // when `path` is not a directory, is a non-empty directory without a RocksDB
  // database, holds a RocksDB database that is not a snapshot database or
  // whose format is another version, or is in use by another process;
  // DataLoss when RocksDB reports corruption.
  static absl::StatusOr<std::unique_ptr<SnapshotDb>> Open(
      const std::string& path);

  SnapshotDb(const SnapshotDb&) = delete;
  SnapshotDb& operator=(const SnapshotDb&) = delete;
  ~SnapshotDb();

  // Writes `snapshot` as the new current generation (see above). Host or
  // device tensors; states must be float32, float16 or bfloat16.
  absl::StatusOr<SnapshotInfo> Write(const Snapshot& snapshot);

  // The current snapshot with host tensors, or nullopt when none was written
  // yet. DataLoss, naming what is wrong, when the database is corrupt
  // (checksums are verified) or inconsistent with its manifest.
  absl::StatusOr<std::optional<Snapshot>> Read(SnapshotInfo* info = nullptr);

  // The current generation's description; nullopt before the first snapshot.
  // Never waits for a Write in progress.
  std::optional<SnapshotInfo> latest() const;

  const std::string& path() const { return path_; }

 private:
  SnapshotDb(std::string path, std::unique_ptr<rocksdb::DB> db);

  const std::string path_;
  // Held by Write and Read for their whole I/O: one at a time.
  mutable std::mutex mu_;
  std::unique_ptr<rocksdb::DB> db_;
  // Guards latest_ for latest(), which must not wait for a write in
  // progress (Status calls and metrics scrapes ask for it). Changed only
  // with mu_ held as well, so Write and Read read it under mu_ alone.
  mutable std::mutex latest_mu_;
  std::optional<SnapshotInfo> latest_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_STORE_SNAPSHOT_DB_H_
