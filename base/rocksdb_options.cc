#include "base/rocksdb_options.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"

namespace deltastream {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSignBit = uint64_t{1} << 63;

// Whether another process holds RocksDB's lock on the database (RocksDB takes
// an fcntl write lock on "LOCK"; probing takes and drops the same lock).
bool LockedByAnotherProcess(const std::string& path) {
  const std::string lock = (fs::path(path) / "LOCK").string();
  const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  struct flock probe;
  std::memset(&probe, 0, sizeof(probe));
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  const bool locked = ::fcntl(fd, F_GETLK, &probe) == 0 &&
                      probe.l_type != F_UNLCK && probe.l_pid != ::getpid();
  ::close(fd);
  return locked;
}

// Whether the MANIFEST that CURRENT names ends inside a record: its last
// write was torn (RocksDB's log format: 32 KiB blocks of records, each a
// 7-byte header, checksum, length (2 bytes, little endian), type, then the
// bytes; a block's last < 7 bytes are padding; a record split over blocks is
// FIRST, MIDDLE..., LAST). A file that ends after a FULL or LAST record was
// written whole; whatever it lacks was never written.
bool ManifestIsTorn(const std::string& path) {
  constexpr uint64_t kBlock = 32768;
  constexpr uint64_t kHeader = 7;
  std::ifstream current((fs::path(path) / "CURRENT").string());
  std::string name;
  std::getline(current, name);
  std::ifstream in((fs::path(path) / name).string(), std::ios::binary);
  if (name.empty() || !in) return false;  // RocksDB's open reports it
  const std::string bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  uint64_t at = 0;
  int last_type = 1;
  while (at < bytes.size()) {
    const uint64_t left_in_block = kBlock - at % kBlock;
    if (left_in_block < kHeader) {
      at += left_in_block;
      continue;
    }
    if (bytes.size() - at < kHeader) return true;
    const uint64_t length =
        static_cast<uint8_t>(bytes[at + 4]) |
        static_cast<uint64_t>(static_cast<uint8_t>(bytes[at + 5])) << 8;
    last_type = static_cast<uint8_t>(bytes[at + 6]);
    if (bytes.size() - at - kHeader < length) return true;
    at += kHeader + length;
  }
  return last_type != 1 && last_type != 4;
}

// Whether `path` holds only what RocksDB writes while it creates a
// database, before its CURRENT (a process killed then): its lock, info logs,
// IDENTITY, a first MANIFEST and CURRENT's temporary file, and no table or
// log of any data. Nothing there is a database to lose.
bool OnlyCreationFiles(const std::string& path) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(path, error)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file(error) ||
        !(name == "LOCK" || name == "LOG" || name == "IDENTITY" ||
          absl::StartsWith(name, "LOG.old.") ||
          absl::StartsWith(name, "MANIFEST-") ||
          absl::EndsWith(name, ".dbtmp"))) {
      return false;
    }
  }
  return !error;
}

}  // namespace

void AppendBigEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

void AppendOrderedId(std::string& out, int64_t id) {
  AppendBigEndian(out, static_cast<uint64_t>(id) ^ kSignBit, 8);
}

int64_t ReadOrderedId(absl::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = bytes.size() - 8; i < bytes.size(); ++i) {
    value = value << 8 | static_cast<uint8_t>(bytes[i]);
  }
  return static_cast<int64_t>(value ^ kSignBit);
}

rocksdb::Options DurableDbOptions() {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  options.compression = rocksdb::kNoCompression;
  options.info_log_level = rocksdb::WARN_LEVEL;
  options.keep_log_file_num = 2;
  return options;
}

absl::Status FromRocksStatus(const rocksdb::Status& status,
                             absl::string_view what, absl::string_view kind,
                             absl::string_view path) {
  std::string message = absl::StrCat(what, " ", kind, " database '", path,
                                     "': ", status.ToString());
  if (status.IsCorruption()) return absl::DataLossError(message);
  // RocksDB's words for a LOCK another process (or this one) holds; not any
  // I/O error that names the LOCK file (opening it with no file descriptors
  // left) or a path with "lock" in it.
  const std::string text = status.ToString();
  if (status.IsIOError() &&
      (absl::StrContains(text, "While lock file") ||
       absl::StrContains(text, "lock hold by current process"))) {
    return absl::FailedPreconditionError(
        absl::StrCat(message, " (is another process using it?)"));
  }
  if (status.IsIOError()) {
    // RocksDB's POSIX environment words its I/O errors with strerror's.
    for (const int error :
         {ENOENT, ENOTDIR, EACCES, EROFS, ENOSPC, EDQUOT, EIO}) {
      if (absl::StrContains(text, std::strerror(error))) {
        return absl::Status(absl::ErrnoToStatusCode(error), message);
      }
    }
  }
  return absl::InternalError(message);
}

absl::StatusOr<std::unique_ptr<rocksdb::DB>> OpenForCheck(
    const std::string& path, const rocksdb::Options& options,
    absl::string_view kind, bool verify_checksums) {
  // A file system's error is not an absent, foreign or new database: that
  // would refuse a sound one (exit 2), or skip the checks below.
  std::error_code error;
  const auto failed = [&](absl::string_view what) {
    return absl::ErrnoToStatus(
        error.value(), absl::StrCat("cannot look at ", kind, " database '",
                                    path, "' (", what, ")"));
  };
  const bool exists = fs::exists(path, error);
  if (error) return failed("exists");
  if (!exists) return std::unique_ptr<rocksdb::DB>();
  const bool directory = fs::is_directory(path, error);
  if (error) return failed("is a directory");
  if (!directory) {
    return absl::FailedPreconditionError(
        absl::StrCat(kind, " database '", path, "' is not a directory"));
  }
  const bool empty = fs::is_empty(path, error);
  if (error) return failed("is empty");
  if (empty) return std::unique_ptr<rocksdb::DB>();
  const bool has_current = fs::exists(fs::path(path) / "CURRENT", error);
  if (error) return failed("has CURRENT");
  if (!has_current) {
    // A creation cut short is created again.
    if (OnlyCreationFiles(path)) return std::unique_ptr<rocksdb::DB>();
    return absl::FailedPreconditionError(
        absl::StrCat("'", path,
                     "' is not empty and holds no RocksDB database (no CURRENT "
                     "file); refusing to create a ",
                     kind, " database over its files"));
  }
  if (LockedByAnotherProcess(path)) {
    return absl::FailedPreconditionError(
        absl::StrCat(kind, " database '", path,
                     "' is in use by another process (its LOCK is held)"));
  }
  rocksdb::Options read_only = options;
  read_only.create_if_missing = false;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status status = rocksdb::DB::OpenForReadOnly(read_only, path, &raw);
  if (!status.ok()) return FromRocksStatus(status, "cannot open", kind, path);
  std::unique_ptr<rocksdb::DB> db(raw);

  std::vector<rocksdb::LiveFileMetaData> live;
  db->GetLiveFilesMetaData(&live);
  std::set<std::string> referenced;
  for (const rocksdb::LiveFileMetaData& file : live) {
    referenced.insert(fs::path(file.name).filename().string());
  }
  absl::StatusOr<std::vector<fs::directory_entry>> entries =
      ListDirectory(path, absl::StrCat("the ", kind, " database"));
  if (!entries.ok()) return entries.status();
  std::vector<std::string> orphans;
  for (const fs::directory_entry& entry : *entries) {
    const std::string name = entry.path().filename().string();
    if (absl::EndsWith(name, ".sst") && referenced.count(name) == 0) {
      orphans.push_back(name);
    }
  }
  // Table files the MANIFEST does not name are either a write the process
  // was killed in (a file linked in before its MANIFEST record was written:
  // RocksDB removes it, and the database is the previous state) or the
  // loss of the MANIFEST's last bytes (a torn write: opening would delete
  // files of the current state). Only the second is refused.
  if (!orphans.empty() && ManifestIsTorn(path)) {
    return absl::DataLossError(absl::StrCat(
        kind, " database '", path, "' is damaged: its MANIFEST ends in a torn ",
        "record and does not reference ", absl::StrJoin(orphans, ", "),
        "; opening it would delete ",
        orphans.size() == 1 ? "that file" : "those files",
        ", so it is left as it is: restore the directory from a copy or move "
        "it aside"));
  }
  if (verify_checksums) {
    // Sequential reads of whole files, kept out of the block cache.
    rocksdb::ReadOptions sweep;
    sweep.fill_cache = false;
    sweep.readahead_size = 8 << 20;
    status = db->VerifyChecksum(sweep);
  }
  if (!status.ok()) {
    return FromRocksStatus(status, "cannot verify", kind, path);
  }
  return db;
}

}  // namespace deltastream
