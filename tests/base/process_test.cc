// The exit code of a failed start-up (base/process.h): 2 for what would be
// refused again, 1 for what a restart may not meet; and the file helpers'
// errors (base/file_io.h), which carry the OS's reason in their code so that
// an I/O error is never read as a refusal.
#include "base/process.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "base/file_io.h"
#include "tests/testing/test_dirs.h"

namespace deltastream {
namespace {

TEST(StartFailureExitCodeTest, RefusalsExit2AndFailuresExit1) {
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument,
        absl::StatusCode::kFailedPrecondition, absl::StatusCode::kNotFound,
        absl::StatusCode::kAlreadyExists, absl::StatusCode::kPermissionDenied,
        absl::StatusCode::kUnauthenticated, absl::StatusCode::kOutOfRange,
        absl::StatusCode::kUnimplemented, absl::StatusCode::kDataLoss}) {
    EXPECT_EQ(StartFailureExitCode(absl::Status(code, "x")), kExitUsage)
        << absl::StatusCodeToString(code);
  }
  for (absl::StatusCode code :
       {absl::StatusCode::kInternal, absl::StatusCode::kUnknown,
        absl::StatusCode::kUnavailable, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kAborted,
        absl::StatusCode::kCancelled}) {
    EXPECT_EQ(StartFailureExitCode(absl::Status(code, "x")), kExitFailure)
        << absl::StatusCodeToString(code);
  }
}

TEST(StartFailureExitCodeTest, TheOsErrorsThatARestartMayNotMeetExit1) {
  for (int error : {EIO, ENOSPC, ENOMEM, ETIMEDOUT, ESTALE, EAGAIN}) {
    EXPECT_EQ(StartFailureExitCode(absl::ErrnoToStatus(error, "x")),
              kExitFailure)
        << error;
  }
  for (int error : {ENOENT, EACCES, EROFS, ENOTDIR, EISDIR, EEXIST}) {
    EXPECT_EQ(StartFailureExitCode(absl::ErrnoToStatus(error, "x")), kExitUsage)
        << error;
  }
}

// /proc/self/mem opens, and reading its first page (never mapped) fails
// with EIO: a disk's read error, not a file that is not there.
TEST(FileIoErrorsTest, AReadErrorIsNotAMissingFile) {
  absl::StatusOr<std::string> read = ReadSmallFile("/proc/self/mem");
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kUnknown) << read.status();
  EXPECT_NE(read.status().message().find("Input/output error"),
            std::string::npos)
      << read.status();
  EXPECT_EQ(StartFailureExitCode(read.status()), kExitFailure);

  const std::string dir = FreshDir("absent");
  absl::StatusOr<std::string> absent = ReadSmallFile(dir + "/config");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound)
      << absent.status();
  EXPECT_NE(absent.status().message().find("No such file"), std::string::npos)
      << absent.status();
  absl::StatusOr<DurableFile> unwritable = DurableFile::Create(dir + "/out");
  EXPECT_EQ(unwritable.status().code(), absl::StatusCode::kNotFound)
      << unwritable.status();
  EXPECT_EQ(StartFailureExitCode(unwritable.status()), kExitUsage);
}

// /dev/full takes every open and fails every write with ENOSPC: a full disk,
// which a restart after some cleaning may not meet.
TEST(FileIoErrorsTest, AFullDiskIsAFailure) {
  const std::string dir = FreshDir("full");
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink("/dev/full", dir + "/out.tmp");
  absl::Status written = WriteFileDurably(dir + "/out", "bytes");
  EXPECT_EQ(StartFailureExitCode(written), kExitFailure) << written;
  EXPECT_NE(written.message().find("No space left"), std::string::npos)
      << written;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deltastream
