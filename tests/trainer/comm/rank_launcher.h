#ifndef DELTASTREAM_TESTS_TRAINER_COMM_RANK_LAUNCHER_H_
#define DELTASTREAM_TESTS_TRAINER_COMM_RANK_LAUNCHER_H_

#include <c10/core/Device.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace deltastream {

class ProcessGroup;  // trainer/comm/process_group.h

namespace testing {

// How one rank process ended.
struct RankResult {
  int exit_code = -1;      // -1 when killed by a signal or by the timeout
  int signal = 0;          // the signal that ended it before the deadline
  bool timed_out = false;  // still running at the deadline, then killed
  absl::Duration elapsed;  // from launch to exit (or to the deadline)
  std::string output;      // its stdout and stderr, interleaved; then a line
                           // naming `signal`, if one ended it
};

// Multi-process tests: the test binary re-executes itself (/proc/self/exe)
// once per rank, with the torchrun variables RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT (a free port),
// OMP_NUM_THREADS as torchrun sets it (RankOmpNumThreads,
// trainer/comm/local_launcher.h; `bind_cores`: the ranks bind themselves to
// cores of their own) and DELTASTREAM_TEST_SCENARIO=`scenario`
// plus `extra_env`, and waits for all of
// them up to `timeout`; ranks still running then are SIGKILLed and reported
// as timed out. The binary's main() calls ScenarioFromEnv() first and, when
// it returns one, runs that scenario instead of the tests.
std::vector<RankResult> RunRanks(
    const std::string& scenario, int world_size, absl::Duration timeout,
    const std::map<std::string, std::string>& extra_env = {},
    bool bind_cores = false);

// The scenario this process was started for, when it is a rank.
std::optional<std::string> ScenarioFromEnv();

// A TCP port that was free a moment ago on 127.0.0.1.
int FreePort();

// GoogleTest expectations that every rank exited 0 within its time (each
// failure shows the rank's output); prints rank 0's output.
void ExpectRanksPassed(const std::vector<RankResult>& results);

// In a rank: its process group from the variables RunRanks set, on `device`
// (Gloo on the CPU, NCCL on CUDA).
// A collective fails after $TEST_COLLECTIVE_TIMEOUT_S seconds when that is
// set (tests of a dead or hung rank shorten it through `extra_env`), else
// after `timeout`. The error of ProcessGroup::FromEnvironment otherwise.
absl::StatusOr<std::unique_ptr<ProcessGroup>> RankGroupFromEnv(
    absl::Duration timeout = absl::Seconds(30),
    c10::Device device = c10::Device(c10::kCPU));

// In a rank: a scenario of cases "a,b,c" (names the test gave RunRanks) run
// in order on one group, RankGroupFromEnv(timeout). Returns the first
// non-zero exit code of `run_case` (the later cases do not run), 3 with a
// "FAILED" line when the group cannot be formed, else 0.
int RunCasesOnGroup(absl::string_view scenario,
                    const std::function<int(ProcessGroup& group,
                                            const std::string& name)>& run_case,
                    absl::Duration timeout = absl::Seconds(30));

// A multi-process test's main(): runs `run_scenario` when this process was
// started as a rank (its return value is the rank's exit code), else the
// tests.
int RankTestMain(int argc, char** argv,
                 int (*run_scenario)(const std::string& scenario));

// The same for a test whose scenarios are cases: runs them with
// RunCasesOnGroup(scenario, run_case) when this process is a rank.
int RankTestMain(int argc, char** argv,
                 int (*run_case)(ProcessGroup& group, const std::string& name));

// The status of a Status or of a StatusOr (what RANK_OK checks).
inline absl::Status StatusOf(const absl::Status& status) { return status; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

}  // namespace testing
}  // namespace deltastream

// In a rank's scenario (which returns its exit code): return 2 with a
// "MISMATCH" line on stderr unless `cond`, or 3 with a "FAILED" line unless
// `expr` (an absl::Status or StatusOr) is ok.
#define RANK_EXPECT(cond, ...)                         \
  do {                                                 \
    if (!(cond)) {                                     \
      std::fprintf(stderr, "MISMATCH %s: %s\n", #cond, \
                   absl::StrCat(__VA_ARGS__).c_str()); \
      return 2;                                        \
    }                                                  \
  } while (false)
#define RANK_OK(expr)                                              \
  do {                                                             \
    absl::Status _s = ::deltastream::testing::StatusOf(expr);      \
    if (!_s.ok()) {                                                \
      std::fprintf(stderr, "FAILED: %s\n", _s.ToString().c_str()); \
      return 3;                                                    \
    }                                                              \
  } while (false)

#endif  // DELTASTREAM_TESTS_TRAINER_COMM_RANK_LAUNCHER_H_
