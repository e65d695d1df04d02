#ifndef DELTASTREAM_BASE_FILE_IO_H_
#define DELTASTREAM_BASE_FILE_IO_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// Every file the system persists (checkpoints, checkpoint-chain links, .npz
// exports) is written through DurableFile or WriteFileDurably: to
// "<path>.tmp", fsync'd, renamed over `path`, and the directory fsync'd, so
// that after a crash `path` holds either its previous content or the new one,
// never a mix, and a finished write survives a power loss.
//
// Errors: the OS's (absl::ErrnoToStatus: EACCES PermissionDenied, ENOSPC
// ResourceExhausted, EIO Unknown) when the temporary cannot be created,
// Internal (with the OS reason) when a write, fsync or rename fails (disk
// full).

// A file being written durably. Not thread-safe. Destroying it without
// Commit() removes the temporary and leaves `path` as it was.
class DurableFile {
 public:
  static absl::StatusOr<DurableFile> Create(std::string path);
  DurableFile(DurableFile&& other) noexcept;
  DurableFile& operator=(DurableFile&& other) = delete;
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;
  ~DurableFile();

  // Appends bytes (any size; partial writes are retried).
  absl::Status Append(absl::string_view bytes);
  // Bytes appended so far.
  uint64_t size() const { return size_; }
  // fsync, rename over the final path, fsync the directory. The object is
  // finished afterwards, whatever the outcome.
  absl::Status Commit();

 private:
  DurableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  void Abandon();

  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Writes `contents` to `path` durably (see above).
absl::Status WriteFileDurably(const std::string& path,
                              absl::string_view contents);

// fsyncs a directory, so that renames and removals in it are durable.
absl::Status SyncDirectory(const std::string& dir);

// The whole content of a small file (tokens, certificates, configs).
// The OS's error when it cannot be opened or read (absl::ErrnoToStatus:
// ENOENT NotFound, EACCES PermissionDenied, EIO Unknown);
// FailedPrecondition when it is larger than `max_bytes`.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          uint64_t max_bytes = 64 << 20);

// The entries of directory `dir`, in no order; none when it does not exist.
// The OS's error, "cannot list <what> '<dir>': <reason>", when it cannot be
// listed (EIO Unknown, EACCES PermissionDenied, a file in its place
// FailedPrecondition), also part way: a directory read in part is never
// taken for one that holds less.
absl::StatusOr<std::vector<std::filesystem::directory_entry>> ListDirectory(
    const std::string& dir, absl::string_view what);

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_FILE_IO_H_
