#ifndef DELTASTREAM_CLIENTS_REPLICA_H_
#define DELTASTREAM_CLIENTS_REPLICA_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/shared_mutex.h"
#include "clients/delta_client.h"

namespace deltastream {

// A replica of a trainer's model at one version: its embedding tables (rows
// by int64 ID) and its dense parameters, as a predictor serves them.
//
// A version is a trainer batch: version v holds the trainer's rows after v
// steps (a delta's end_batch). -1 means the replica holds nothing yet. Row
// values in a delta are the rows' current values at its end_batch, so
// applying a delta overwrites rows, and applying one again is harmless.
//
// Tables are created by the first delta that brings rows for them; a table's
// dtype (float32, float16, bfloat16, float64 or int64) and row width (dim) are
// fixed from then on, until Reset.
//
// Backends (ReplicaOptions::db_path): in memory (per table a hash map from ID
// to a slot of one contiguous row buffer), or RocksDB for tables larger than
// memory (a key per row: table name, a 0 byte, the ID big-endian with its
// sign bit flipped; the raw row bytes as value; the version, run id and dense
// parameters under meta keys). A RocksDB apply is one synced WriteBatch:
// atomic and durable when Apply returns. Opening an existing database
// restores its version, run id, rows and dense parameters bit for bit. The
// RocksDB backend keeps every row's ID in memory (a hash set per table, about
// 16 bytes a row, against the row's own dim * dtype bytes on disk) so that an
// apply counts the rows it adds without reading the database; opening reads
// every row once to rebuild it, and refuses (DataLoss) a database whose rows
// disagree with their table's record (a count, a row size, a table missing).
//
// Thread safety: a Replica is safe for concurrent use without external
// locking. Lookups never see half an apply, nor a new version's rows with the
// previous version's dense parameters: applies are published under a writer
// lock (base/shared_mutex.h, which ThreadSanitizer understands) that lookups
// share. Applies run one at a time; their preparation (validation, building
// a Reset's tables, staging and writing a RocksDB batch, which lookups do not
// see until it is published: they read a RocksDB snapshot) happens before
// the writer lock, so lookups keep answering from the previous version
// meanwhile and wait only for the publication (an in-memory increment's row
// copies, or a pointer swap).
struct ReplicaOptions {
  // RocksDB directory (created when missing); empty: in memory.
  std::string db_path;
  // RocksDB's block cache: rows read recently by lookups stay in
  // memory up to this many bytes.
  int64_t cache_bytes = int64_t{256} << 20;
};

// The most one Lookup returns: rows of at most this many bytes (the largest
// message the predictor's lookup API takes). It caps the memory one call can
// make the replica allocate.
inline constexpr int64_t kMaxLookupBytes = int64_t{64} << 20;

// Rows of one table found by Lookup.
struct ReplicaRows {
  int64_t version = -1;  // the version they belong to
  std::string run_id;    // the trainer run of that version
  at::Tensor rows;       // [n, dim] in the table's dtype; zeros where missing
  at::Tensor found;      // bool [n]: whether ids[i] is in the table
};

// The dense parameters the replica holds, in the model's order. The tensors
// are the replica's own (shared, not copied): treat them as read-only.
struct ReplicaDense {
  // The version of the apply that brought them: the replica's version when
  // every apply carries dense parameters (a predictor makes sure they do);
  // -1 when none were brought.
  int64_t version = -1;
  // Empty before an apply brought any (or when the model has none).
  std::vector<std::pair<std::string, at::Tensor>> parameters;
};

struct ReplicaTableInfo {
  at::ScalarType dtype = at::kFloat;
  int64_t dim = 0;
  int64_t rows = 0;
};

class Replica {
 public:
  // Opens a replica. In memory: empty. RocksDB: what the directory holds
  // (empty for a new one). FailedPrecondition for a directory that holds
  // another database (e.g. a tracker's snapshots) or is in use by another
  // process; DataLoss for unreadable records; errors naming the path when
  // RocksDB cannot open it.
  static absl::StatusOr<std::unique_ptr<Replica>> Open(
      ReplicaOptions options = {});

  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // Writes the rows of `deltas` (each table's ids and values; states and
  // scores are ignored), in order, a later delta's row replacing an earlier
  // one's, and moves the replica to `version` of run `run_id`. The dense
  // parameters of the last delta that carries any replace the replica's;
  // without any they stay. All or nothing, and atomic for lookups.
  //
  // Errors, with nothing changed: FailedPrecondition when `version` is below
  // Version() (only Reset goes back); InvalidArgument, naming the table, when
  // rows lack values, values are not [n, dim] for int64 IDs [n], a dtype is
  // not a wire dtype, or dtype or dim differ from the table's (or between
  // deltas); InvalidArgument for an empty or unnamed table, a 0 byte in a
  // table name, or an undefined dense tensor; the backend's write errors.
  absl::Status Apply(absl::Span<const ReceivedDelta> deltas, int64_t version,
                     absl::string_view run_id) ABSL_LOCKS_EXCLUDED(apply_mu_);

  // Drops every table and the dense parameters, then applies `deltas` as
  // Apply does, at any `version` (a full read, a resync, a trainer restart).
  // Atomic as Apply: on error the previous contents stay; lookups see the
  // old contents until the new ones are installed. Errors as Apply (no
  // version check; tables may change dtype or dim).
  absl::Status Reset(absl::Span<const ReceivedDelta> deltas, int64_t version,
                     absl::string_view run_id) ABSL_LOCKS_EXCLUDED(apply_mu_);

  // Rows of `ids` (int64 [n], any device) in table `fqn`. NotFound for a
  // table the replica does not hold; InvalidArgument for IDs that are not
  // int64 [n] and for more rows than kMaxLookupBytes hold (before anything
  // is allocated); the backend's read errors.
  absl::StatusOr<ReplicaRows> Lookup(absl::string_view fqn,
                                     const at::Tensor& ids) const
      ABSL_LOCKS_EXCLUDED(mu_);

  ReplicaDense Dense() const ABSL_LOCKS_EXCLUDED(mu_);
  // -1 when nothing was ever applied.
  int64_t Version() const ABSL_LOCKS_EXCLUDED(mu_);
  // The run of the version's last apply; empty before the first.
  std::string RunId() const ABSL_LOCKS_EXCLUDED(mu_);
  // Tables by name with their dtype, dim and rows.
  std::map<std::string, ReplicaTableInfo> Tables() const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Rows of table `fqn`; 0 for a table it does not hold.
  int64_t RowCount(absl::string_view fqn) const ABSL_LOCKS_EXCLUDED(mu_);
  // Where it lives: "memory" or the RocksDB path.
  const std::string& where() const { return where_; }

  // The backend's storage of rows (clients/replica_row_store.h).
  class RowStore;

 private:
  Replica(std::string where, std::unique_ptr<RowStore> store);
  absl::Status Write(absl::Span<const ReceivedDelta> deltas, int64_t version,
                     absl::string_view run_id, bool reset)
      ABSL_LOCKS_EXCLUDED(apply_mu_);

  const std::string where_;
  // One apply at a time; held (exclusively) while one prepares and installs.
  SharedMutex apply_mu_;
  mutable SharedMutex mu_;
  std::unique_ptr<RowStore> store_ ABSL_PT_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = -1;
  std::string run_id_ ABSL_GUARDED_BY(mu_);
  ReplicaDense dense_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_REPLICA_H_
