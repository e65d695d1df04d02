#include "tests/trainer/comm/rank_launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace deltastream {
namespace testing {

std::optional<std::string> ScenarioFromEnv() {
  const char* scenario = std::getenv("DELTASTREAM_TEST_SCENARIO");
  if (scenario == nullptr || *scenario == '\0') return std::nullopt;
  return std::string(scenario);
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

std::vector<RankResult> RunRanks(
    const std::string& scenario, int world_size, absl::Duration timeout,
    const std::map<std::string, std::string>& extra_env) {
  const int port = FreePort();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const absl::Time start = absl::Now();
  std::vector<pid_t> pids(world_size, -1);
  std::vector<std::string> logs(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    logs[rank] =
        absl::StrCat(dir, "/rank_", getpid(), "_", port, "_", rank, ".log");
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd =
          open(logs[rank].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      setenv("DELTASTREAM_TEST_SCENARIO", scenario.c_str(), 1);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world_size).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(world_size).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      for (const auto& [name, value] : extra_env) {
        setenv(name.c_str(), value.c_str(), 1);
      }
      char* argv[] = {const_cast<char*>("rank"), nullptr};
      execv("/proc/self/exe", argv);
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
    std::remove(logs[rank].c_str());
  }
  return results;
}

}  // namespace testing
}  // namespace deltastream
