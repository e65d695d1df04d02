#ifndef DELTASTREAM_BASE_ROCKSDB_OPTIONS_H_
#define DELTASTREAM_BASE_ROCKSDB_OPTIONS_H_

// What the system's RocksDB databases (store/snapshot_db, the predictor's
// replica in clients/) share: options, key encodings, the status mapping, and
// the check that runs before a database is opened for writing.

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/status.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

inline rocksdb::Slice ToSlice(absl::string_view s) {
  return rocksdb::Slice(s.data(), s.size());
}

// Appends the low `bytes` bytes of `value`, most significant first, so that
// keys sort as the numbers do.
void AppendBigEndian(std::string& out, uint64_t value, int bytes);

// Appends `id` as 8 bytes that sort as signed 64-bit numbers do (big endian,
// sign bit flipped: negative IDs sort before positive ones).
void AppendOrderedId(std::string& out, int64_t id);

// The ID of the 8 bytes AppendOrderedId wrote (`bytes` holds at least 8; the
// last 8 are read).
int64_t ReadOrderedId(absl::string_view bytes);

// Options every database of the system starts from: created when missing,
// paranoid checks, no compression (rows are floats: it costs time and saves
// little), warnings-only info log, two old info logs kept.
rocksdb::Options DurableDbOptions();

// `status` as an absl::Status whose message names what failed, the kind of
// database ("snapshot", "replica") and its path: DataLoss for corruption,
// FailedPrecondition (with a hint) for a lock held by another process; for
// an I/O error, the code of its errno as absl::ErrnoToStatus gives it
// (a missing parent directory: NotFound, permission: PermissionDenied, a
// full disk: ResourceExhausted), so that start-ups exit 2 for what a
// restart would meet again (base/process.h); Internal otherwise.
absl::Status FromRocksStatus(const rocksdb::Status& status,
                             absl::string_view what, absl::string_view kind,
                             absl::string_view path);

// Checks the database at `path` before it is opened for writing, changing
// nothing on disk, and returns it opened read-only for the caller's own
// checks (its format marker), or nullptr when `path` does not exist or is an
// empty directory, or one that holds only the files of a creation cut short
// before RocksDB wrote its CURRENT (a new database may be created there).
// Refuses:
//  - FailedPrecondition: `path` is not a directory; a non-empty directory
//    without a RocksDB database (no CURRENT file); a database locked by
//    another process;
//  - DataLoss: RocksDB reports corruption when opening it or (with
//    `verify_checksums`, which reads every file) verifying the checksums of
//    its files; a MANIFEST that ends inside a record (a torn write) while
//    the directory holds table files it does not reference: opening it for
//    writing would delete those files, and their rows with them. (Such files
//    beside a MANIFEST that ends cleanly are a write the process was killed
//    in; RocksDB removes them and the database opens as it was before.)
//  - Internal: any other failure to read it.
// Messages name `kind` and `path`. The returned handle must be closed before
// the database is opened for writing.
absl::StatusOr<std::unique_ptr<rocksdb::DB>> OpenForCheck(
    const std::string& path, const rocksdb::Options& options,
    absl::string_view kind, bool verify_checksums);

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_ROCKSDB_OPTIONS_H_
