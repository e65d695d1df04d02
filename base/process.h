#ifndef DELTASTREAM_BASE_PROCESS_H_
#define DELTASTREAM_BASE_PROCESS_H_

#include <atomic>
#include <csignal>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// What every binary of the project does first and last.
//
// Exit codes, the same in every binary: 0 success, 1 a failed operation (a
// refused request, an unreachable server, a failed run), 2 bad usage (a bad
// flag or config, an address in use, a database or checkpoint refused at
// start).
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// The exit code of a start-up that failed with `status` (a server's or a
// trainer's database, checkpoint, address): kExitUsage when the status says
// that what the binary was given is wrong, so that a restart would be refused
// the same way (InvalidArgument, FailedPrecondition, NotFound, AlreadyExists,
// PermissionDenied, Unauthenticated, OutOfRange, Unimplemented, DataLoss);
// kExitFailure when a restart may well succeed (an I/O error, memory, a
// timeout, a peer out of reach: Internal, Unknown, Unavailable,
// ResourceExhausted, DeadlineExceeded, Aborted, Cancelled). Schedulers
// restart on 1 and not on 2 (deploy/k8s/trainer.yaml, deploy/systemd/), so an
// error read as a refusal would end a job that one retry would have saved.
// Errors from the OS take their code from errno (absl::ErrnoToStatus): EIO is
// Unknown, ENOSPC ResourceExhausted, EACCES PermissionDenied, ENOENT NotFound.
int StartFailureExitCode(const absl::Status& status);

// Prints "<program>: <message>" as one line on stderr and returns
// `exit_code`, for `return Fail(kExitUsage, "...")` in main().
int Fail(int exit_code, absl::string_view message);
// The same with the status's message.
int Fail(int exit_code, const absl::Status& status);
// Fail for a start-up that failed with `status`, with StartFailureExitCode's
// code.
int FailStart(const absl::Status& status);

// Blocks SIGTERM and SIGINT in the calling thread, and so in every thread it
// starts later (gRPC's, RocksDB's, LibTorch's inherit the mask): call it
// first in main(), before any thread exists, and take the signals with a
// TerminationWatch (or sigtimedwait on the returned set) on a thread of your
// own. Returns the blocked set.
sigset_t BlockTerminationSignals();

// Takes SIGTERM and SIGINT (blocked by BlockTerminationSignals) on a thread
// of its own, from construction to destruction. The first signal calls
// `on_first(signal)` on that thread (it asks the process to stop; a second
// signal is taken once it returns). A second one means the user will not
// wait for the stop to finish (a final snapshot, a drain, a read in
// progress): `on_second(signal)` says so (a log line), then the process
// ends at once with 128 + the signal, as the signal's default action would.
// The destructor stops watching (within 100 ms); a signal that arrives
// after it stays pending.
class TerminationWatch {
 public:
  TerminationWatch(const sigset_t& signals, std::function<void(int)> on_first,
                   std::function<void(int)> on_second);
  ~TerminationWatch();
  TerminationWatch(const TerminationWatch&) = delete;
  TerminationWatch& operator=(const TerminationWatch&) = delete;

  // Whether a signal has arrived.
  bool signalled() const { return signalled_.load(); }

 private:
  void Watch(sigset_t signals);

  const std::function<void(int)> on_first_;
  const std::function<void(int)> on_second_;
  std::atomic<bool> done_{false};
  std::atomic<bool> signalled_{false};
  std::thread thread_;
};

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_PROCESS_H_
