#include "tests/trainer/comm/rank_launcher.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "tests/testing/test_dirs.h"
#include "trainer/comm/local_launcher.h"
#include "trainer/comm/process_group.h"

namespace deltastream {
namespace testing {

std::optional<std::string> ScenarioFromEnv() {
  const char* scenario = std::getenv("DELTASTREAM_TEST_SCENARIO");
  if (scenario == nullptr || *scenario == '\0') return std::nullopt;
  return std::string(scenario);
}

int FreePort() { return FreeTcpPort("127.0.0.1"); }

std::vector<RankResult> RunRanks(
    const std::string& scenario, int world_size, absl::Duration timeout,
    const std::map<std::string, std::string>& extra_env, bool bind_cores) {
  const int port = FreePort();
  const std::string dir = TestTempDir();
  const absl::Time start = absl::Now();
  std::vector<pid_t> pids(world_size, -1);
  std::vector<std::string> logs(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    logs[rank] =
        absl::StrCat(dir, "/rank_", getpid(), "_", port, "_", rank, ".log");
    // The child's environment, built before fork: between fork and exec a
    // child of a multi-threaded process may only make async-signal-safe
    // calls (no malloc, no setenv).
    std::map<std::string, std::string> vars;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const size_t eq = entry.find('=');
      if (eq != std::string::npos)
        vars[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
    vars["DELTASTREAM_TEST_SCENARIO"] = scenario;
    vars["RANK"] = std::to_string(rank);
    vars["WORLD_SIZE"] = std::to_string(world_size);
    vars["LOCAL_RANK"] = std::to_string(rank);
    vars["LOCAL_WORLD_SIZE"] = std::to_string(world_size);
    vars["MASTER_ADDR"] = "127.0.0.1";
    vars["MASTER_PORT"] = std::to_string(port);
    // What torchrun (and RunLocalRanks) gives each rank.
    if (std::optional<std::string> threads = RankOmpNumThreads(
            world_size, std::getenv("OMP_NUM_THREADS"), bind_cores)) {
      vars["OMP_NUM_THREADS"] = *threads;
    }
    for (const auto& [name, value] : extra_env) vars[name] = value;
    std::vector<std::string> entries;
    for (const auto& [name, value] : vars) {
      entries.push_back(absl::StrCat(name, "=", value));
    }
    std::vector<char*> envp;
    for (std::string& entry : entries) envp.push_back(entry.data());
    envp.push_back(nullptr);
    char* argv[] = {const_cast<char*>("rank"), nullptr};
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd =
          open(logs[rank].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execve("/proc/self/exe", argv, envp.data());
      _exit(127);
    }
    pids[rank] = pid;
  }
  std::vector<RankResult> results(world_size);
  int running = world_size;
  const absl::Time deadline = start + timeout;
  while (running > 0 && absl::Now() < deadline) {
    for (int rank = 0; rank < world_size; ++rank) {
      if (pids[rank] < 0) continue;
      int status = 0;
      if (waitpid(pids[rank], &status, WNOHANG) == pids[rank]) {
        results[rank].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (WIFSIGNALED(status)) results[rank].signal = WTERMSIG(status);
        results[rank].elapsed = absl::Now() - start;
        pids[rank] = -1;
        --running;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int rank = 0; rank < world_size; ++rank) {
    if (pids[rank] >= 0) {
      kill(pids[rank], SIGKILL);
      waitpid(pids[rank], nullptr, 0);
      results[rank].timed_out = true;
      results[rank].elapsed = absl::Now() - start;
    }
    std::ifstream in(logs[rank]);
    std::stringstream text;
    text << in.rdbuf();
    results[rank].output = text.str();
    if (results[rank].signal != 0) {
      results[rank].output += absl::StrCat(
          "[rank_launcher: rank ", rank, " ended by signal ",
          results[rank].signal, " (", strsignal(results[rank].signal), ")]\n");
    }
    std::remove(logs[rank].c_str());
  }
  return results;
}

void ExpectRanksPassed(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n"
                                       << results[r].output;
  }
  if (!results.empty()) std::printf("%s", results[0].output.c_str());
}

absl::StatusOr<std::unique_ptr<ProcessGroup>> RankGroupFromEnv(
    absl::Duration timeout, c10::Device device) {
  if (const char* seconds = std::getenv("TEST_COLLECTIVE_TIMEOUT_S")) {
    int value = 0;
    if (!absl::SimpleAtoi(seconds, &value) || value <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TEST_COLLECTIVE_TIMEOUT_S=", seconds, " is not a positive number"));
    }
    timeout = absl::Seconds(value);
  }
  return ProcessGroup::FromEnvironment(device, timeout);
}

int RunCasesOnGroup(absl::string_view scenario,
                    const std::function<int(ProcessGroup& group,
                                            const std::string& name)>& run_case,
                    absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      RankGroupFromEnv(timeout);
  RANK_OK(group);
  for (absl::string_view name : absl::StrSplit(scenario, ',')) {
    if (int rc = run_case(**group, std::string(name)); rc != 0) return rc;
  }
  return 0;
}

namespace {

// `run_scenario` when this process is a rank, else the tests.
int RankOrTests(int argc, char** argv,
                const std::function<int(const std::string&)>& run_scenario) {
  if (std::optional<std::string> scenario = ScenarioFromEnv()) {
    return run_scenario(*scenario);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace

int RankTestMain(int argc, char** argv,
                 int (*run_scenario)(const std::string& scenario)) {
  return RankOrTests(argc, argv, run_scenario);
}

int RankTestMain(int argc, char** argv,
                 int (*run_case)(ProcessGroup& group,
                                 const std::string& name)) {
  return RankOrTests(argc, argv, [run_case](const std::string& scenario) {
    return RunCasesOnGroup(scenario, run_case);
  });
}

}  // namespace testing
}  // namespace deltastream
