#include "base/process.h"

#include <errno.h>
#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace deltastream {

int Fail(int exit_code, absl::string_view message) {
  std::string line(message);
  std::replace(line.begin(), line.end(), '\n', ' ');
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, line.c_str());
  return exit_code;
}

int Fail(int exit_code, const absl::Status& status) {
  return Fail(exit_code, status.message());
}

int FailStart(const absl::Status& status) {
  return Fail(StartFailureExitCode(status), status);
}

int StartFailureExitCode(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnauthenticated:
      return kExitUsage;
    default:
      return kExitFailure;
  }
}

sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int WaitForTerminationSignal(const sigset_t& signals) {
  int signal = 0;
  while (sigwait(&signals, &signal) != 0) {
  }
  return signal;
}

}  // namespace deltastream
