#include "base/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

std::string TemporaryPath(const std::string& path) { return path + ".tmp"; }

std::string OsError() { return std::strerror(errno); }

}  // namespace

absl::StatusOr<DurableFile> DurableFile::Create(std::string path) {
  const std::string temporary = TemporaryPath(path);
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;  // before the message's allocations
    return absl::ErrnoToStatus(error,
                               absl::StrCat("cannot write '", temporary, "'"));
  }
  return DurableFile(std::move(path), fd);
}

DurableFile::DurableFile(DurableFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_) {}

DurableFile::~DurableFile() { Abandon(); }

void DurableFile::Abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(TemporaryPath(path_).c_str());
}

absl::Status DurableFile::Append(absl::string_view bytes) {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path_, "' is already finished"));
  }
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n =
        ::write(fd_, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string reason = n < 0 ? OsError() : "no progress";
      Abandon();
      return absl::InternalError(absl::StrCat("writing '", TemporaryPath(path_),
                                              "' failed: ", reason));
    }
    written += static_cast<size_t>(n);
  }
  size_ += bytes.size();
  return absl::OkStatus();
}

absl::Status DurableFile::Commit() {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", path_, "' is already finished"));
  }
  const std::string temporary = TemporaryPath(path_);
  if (::fsync(fd_) != 0) {
    const std::string reason = OsError();
    Abandon();
    return absl::InternalError(
        absl::StrCat("cannot sync '", temporary, "': ", reason));
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0 || std::rename(temporary.c_str(), path_.c_str()) != 0) {
    const std::string reason = OsError();
    ::unlink(temporary.c_str());
    return absl::InternalError(
        absl::StrCat("cannot finish '", path_, "': ", reason));
  }
  std::string dir = std::filesystem::path(path_).parent_path().string();
  return SyncDirectory(dir.empty() ? "." : dir);
}

absl::Status WriteFileDurably(const std::string& path,
                              absl::string_view contents) {
  absl::StatusOr<DurableFile> file = DurableFile::Create(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = file->Append(contents); !s.ok()) return s;
  return file->Commit();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open directory '", dir, "': ", OsError()));
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string reason = synced ? "" : OsError();
  ::close(fd);
  if (!synced) {
    return absl::InternalError(
        absl::StrCat("cannot sync directory '", dir, "': ", reason));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;  // before the message's allocations
    return absl::ErrnoToStatus(error, absl::StrCat("cannot read '", path, "'"));
  }
  std::string contents;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return absl::ErrnoToStatus(error,
                                 absl::StrCat("reading '", path, "' failed"));
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
    if (contents.size() > max_bytes) {
      ::close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("'", path, "' is larger than ", max_bytes, " bytes"));
    }
  }
  ::close(fd);
  return contents;
}

absl::StatusOr<std::vector<std::filesystem::directory_entry>> ListDirectory(
    const std::string& dir, absl::string_view what) {
  std::vector<std::filesystem::directory_entry> entries;
  std::error_code error;
  auto unreadable = [&] {
    return absl::ErrnoToStatus(
        error.value(), absl::StrCat("cannot list ", what, " '", dir, "'"));
  };
  std::filesystem::directory_iterator it(dir, error);
  if (error) {
    if (error == std::errc::no_such_file_or_directory) return entries;
    return unreadable();
  }
  for (; it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (error) return unreadable();
    entries.push_back(*it);
  }
  if (error) return unreadable();
  return entries;
}

}  // namespace deltastream
