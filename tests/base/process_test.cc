// The exit code of a failed start-up (base/process.h): 2 for what would be
// refused again, 1 for what a restart may not meet; and the file helpers'
// errors (base/file_io.h), which carry the OS's reason in their code so that
// an I/O error is never read as a refusal.
#include "base/process.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

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

// In a child process, as a binary's main() would: the first signal asks for
// a stop (here one that never finishes), a second ends the process at once
// with 128 + the signal, after on_second's line.
TEST(TerminationWatchTest, TheFirstSignalAsksForAStopASecondEndsTheProcess) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    const sigset_t signals = BlockTerminationSignals();
    std::atomic<int> first{0};
    TerminationWatch watch(
        signals,
        [&](int signal) {
          first.store(signal);
          const char stop = 's';
          (void)!write(ready[1], &stop, 1);
        },
        [&](int signal) {
          const char again = signal == first.load() ? 'a' : 'x';
          (void)!write(ready[1], &again, 1);
        });
    EXPECT_FALSE(watch.signalled());
    const char up = 'u';
    (void)!write(ready[1], &up, 1);
    // A stop that never finishes (a final snapshot the user will not wait
    // for): only the second signal ends it.
    for (int i = 0; i < 600; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    _exit(0);
  }
  close(ready[1]);
  char seen[3] = {};
  ASSERT_EQ(read(ready[0], &seen[0], 1), 1);
  EXPECT_EQ(seen[0], 'u');
  ASSERT_EQ(kill(child, SIGTERM), 0);
  ASSERT_EQ(read(ready[0], &seen[1], 1), 1);
  EXPECT_EQ(seen[1], 's');
  ASSERT_EQ(kill(child, SIGTERM), 0);
  ASSERT_EQ(read(ready[0], &seen[2], 1), 1);
  EXPECT_EQ(seen[2], 'a');
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  close(ready[0]);
}

// Destroyed, it stops watching: a main() that returns is not held up.
TEST(TerminationWatchTest, DestructionEndsTheWatch) {
  sigset_t old;
  pthread_sigmask(SIG_SETMASK, nullptr, &old);
  const sigset_t signals = BlockTerminationSignals();
  const auto start = std::chrono::steady_clock::now();
  {
    TerminationWatch watch(
        signals, [](int) {}, [](int) {});
    EXPECT_FALSE(watch.signalled());
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

}  // namespace
}  // namespace deltastream
