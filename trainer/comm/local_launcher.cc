#include "trainer/comm/local_launcher.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/process.h"

namespace deltastream {

int FreeTcpPort(const std::string& address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  int port = 0;
  socklen_t length = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::optional<std::string> RankOmpNumThreads(int nproc_per_node,
                                             const char* inherited,
                                             bool bind_cores) {
  if (nproc_per_node <= 1 || inherited != nullptr || bind_cores)
    return std::nullopt;
  return "1";
}

namespace {

std::string Describe(int status) {
  if (WIFEXITED(status))
    return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "ended";
}

bool Succeeded(int status) {
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

bool Stopped(const LocalLaunchOptions& options, int status) {
  return options.stopped_exit_code != 0 && WIFEXITED(status) &&
         WEXITSTATUS(status) == options.stopped_exit_code;
}

// Forks one rank: in a process group of its own, its environment set, the
// signal mask cleared, then exec.
pid_t StartRank(const LocalLaunchOptions& options, int rank, int port,
                int attempt, const std::optional<std::string>& omp_threads) {
  std::vector<char*> argv;
  for (const std::string& arg : options.argv) {
    argv.push_back(const_cast<char*>(arg.c_str()));
  }
  argv.push_back(nullptr);
  std::map<std::string, std::string> env = {
      {"RANK", absl::StrCat(rank)},
      {"LOCAL_RANK", absl::StrCat(rank)},
      {"WORLD_SIZE", absl::StrCat(options.nproc_per_node)},
      {"LOCAL_WORLD_SIZE", absl::StrCat(options.nproc_per_node)},
      {"GROUP_RANK", "0"},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", absl::StrCat(port)},
      {"TORCHELASTIC_RESTART_COUNT", absl::StrCat(attempt)},
      {"TORCHELASTIC_MAX_RESTARTS", absl::StrCat(options.max_restarts)},
  };
  if (omp_threads.has_value()) env["OMP_NUM_THREADS"] = *omp_threads;
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid;  // the parent (or -1)
  // A launcher that dies without forwarding a stop (SIGKILL, a crash) takes
  // its ranks with it, as it would stop them itself: none trains on alone.
  // The launcher may have died before the request took effect.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) {
    _exit(127);
  }
  // A process group of its own, as torchrun's workers: a signal to the
  // launcher's group (a terminal's Ctrl-C) reaches the rank once, forwarded
  // by the launcher, not twice (a second signal stops a rank at once).
  if (setpgid(0, 0) != 0) _exit(127);
  for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execv(options.executable.empty() ? argv[0] : options.executable.c_str(),
        argv.data());
  _exit(127);
}

}  // namespace

int RunLocalRanks(const LocalLaunchOptions& options, const sigset_t& signals) {
  auto log = [&](const std::string& line) {
    if (options.log) options.log(line);
  };
  const std::optional<std::string> omp_threads =
      RankOmpNumThreads(options.nproc_per_node, std::getenv("OMP_NUM_THREADS"),
                        options.bind_cores);
  if (omp_threads.has_value()) {
    log(absl::StrCat("setting OMP_NUM_THREADS=", *omp_threads, " for each of ",
                     options.nproc_per_node,
                     " ranks (torchrun's default, so that they do not "
                     "oversubscribe the cores): set OMP_NUM_THREADS to "
                     "choose another value"));
  }
  bool stop_requested = false;
  for (int attempt = 0;; ++attempt) {
    const int port = options.master_port != 0
                         ? options.master_port
                         : FreeTcpPort(options.master_addr);
    std::map<pid_t, int> running;  // pid -> rank
    for (int rank = 0; rank < options.nproc_per_node; ++rank) {
      const pid_t pid = StartRank(options, rank, port, attempt, omp_threads);
      if (pid < 0) {
        log(absl::StrCat("cannot start rank ", rank, ": ", strerror(errno)));
        for (const auto& [other, r] : running) kill(other, SIGKILL);
        for (const auto& [other, r] : running) waitpid(other, nullptr, 0);
        return 1;
      }
      running[pid] = rank;
    }
    log(absl::StrCat("started ", options.nproc_per_node, " ranks (store on ",
                     options.master_addr, ":", port, ", attempt ", attempt,
                     ")"));
    bool failed = false;
    // The first failed rank's exit code (1 for a signal), ranks that exited
    // peer_failure_exit_code passed over.
    std::optional<int> failure_code;
    bool refused = false;  // a rank exited kExitUsage
    bool stopped = false;  // a rank exited stopped_exit_code
    absl::Time kill_at = absl::InfiniteFuture();
    int signals_seen = 0;
    while (!running.empty()) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid > 0 && running.count(pid) > 0) {
        const int rank = running[pid];
        running.erase(pid);
        stopped = stopped || Stopped(options, status);
        if (!Succeeded(status) && !Stopped(options, status)) {
          const bool followed =
              options.peer_failure_exit_code != 0 && WIFEXITED(status) &&
              WEXITSTATUS(status) == options.peer_failure_exit_code;
          log(absl::StrCat("rank ", rank, " ", Describe(status),
                           followed ? " (another rank's failure)" : ""));
          if (!followed && !failure_code.has_value()) {
            failure_code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
          }
          refused = refused ||
                    (WIFEXITED(status) && WEXITSTATUS(status) == kExitUsage);
          if (!failed && !running.empty()) {
            log("stopping the other ranks");
            for (const auto& [other, r] : running) kill(other, SIGTERM);
            kill_at = absl::Now() + options.grace;
          }
          failed = true;
        }
        continue;
      }
      if (absl::Now() >= kill_at) {
        for (const auto& [other, r] : running) {
          log(absl::StrCat("rank ", r,
                           " did not exit within the grace period: "
                           "SIGKILL"));
          kill(other, SIGKILL);
        }
        kill_at = absl::InfiniteFuture();
      }
      const timespec tick{0, 50 * 1000 * 1000};
      const int signal = sigtimedwait(&signals, nullptr, &tick);
      if (signal > 0) {
        stop_requested = true;
        ++signals_seen;
        for (const auto& [other, r] : running) {
          kill(other, signals_seen == 1 ? signal : SIGKILL);
        }
      }
    }
    if (!failed) return stopped ? options.stopped_exit_code : 0;
    if (refused) {
      // The same command line, config and files would be refused again.
      if (attempt < options.max_restarts) {
        log("not restarting: a rank refused its input (exit 2)");
      }
      return kExitUsage;
    }
    if (stop_requested || attempt >= options.max_restarts) {
      // Every failed rank followed another's: the fault lies outside this
      // launcher's ranks (another node's).
      return failure_code.value_or(options.peer_failure_exit_code);
    }
    log(absl::StrCat("restarting the group (restart ", attempt + 1, " of ",
                     options.max_restarts, ")"));
  }
}

}  // namespace deltastream
