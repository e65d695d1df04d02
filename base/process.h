#ifndef DELTASTREAM_BASE_PROCESS_H_
#define DELTASTREAM_BASE_PROCESS_H_

#include <csignal>

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
// first in main(), before any thread exists, and take the signals with
// WaitForTerminationSignal (or sigtimedwait on the returned set) on a thread
// of your own. Returns the blocked set.
sigset_t BlockTerminationSignals();

// Waits until SIGTERM or SIGINT arrives (blocked by BlockTerminationSignals)
// and returns its number.
int WaitForTerminationSignal(const sigset_t& signals);

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_PROCESS_H_
