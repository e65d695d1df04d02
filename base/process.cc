#include "base/process.h"

#include <errno.h>
#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <utility>

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

TerminationWatch::TerminationWatch(const sigset_t& signals,
                                   std::function<void(int)> on_first,
                                   std::function<void(int)> on_second)
    : on_first_(std::move(on_first)),
      on_second_(std::move(on_second)),
      thread_([this, signals] { Watch(signals); }) {}

TerminationWatch::~TerminationWatch() {
  done_.store(true);
  thread_.join();
}

void TerminationWatch::Watch(sigset_t signals) {
  const timespec tick{0, 100 * 1000 * 1000};
  while (!done_.load()) {
    const int signal = sigtimedwait(&signals, nullptr, &tick);
    if (signal <= 0) continue;
    if (signalled_.exchange(true)) {
      on_second_(signal);
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(128 + signal);
    }
    on_first_(signal);
  }
}

}  // namespace deltastream
