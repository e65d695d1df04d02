// The local launcher's thread environment (torchrun's OMP_NUM_THREADS rule):
// the rule itself, what RunLocalRanks gives real rank processes, and that
// LibTorch's intra-op pool in a rank started by the tests' launcher
// (RunRanks) follows it. And no rank outlives a launcher that is SIGKILLed.
#include "trainer/comm/local_launcher.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/testing/test_dirs.h"
#include "tests/trainer/comm/rank_launcher.h"

namespace deltastream {
namespace {

TEST(RankOmpNumThreadsTest, OneThreadPerRankWhenSeveralShareTheNode) {
  EXPECT_EQ(RankOmpNumThreads(2, nullptr), "1");
  EXPECT_EQ(RankOmpNumThreads(8, nullptr), "1");
}

TEST(RankOmpNumThreadsTest, OneRankOrTheUsersValueSetsNothing) {
  EXPECT_EQ(RankOmpNumThreads(1, nullptr), std::nullopt);
  EXPECT_EQ(RankOmpNumThreads(2, "4"), std::nullopt);
  EXPECT_EQ(RankOmpNumThreads(2, ""), std::nullopt);  // set, if empty
}

TEST(RankOmpNumThreadsTest, RanksThatBindSizeTheirOwnThreads) {
  EXPECT_EQ(RankOmpNumThreads(2, nullptr, /*bind_cores=*/true), std::nullopt);
  EXPECT_EQ(RankOmpNumThreads(8, nullptr, /*bind_cores=*/true), std::nullopt);
}

// Sets (or, with nullptr, unsets) OMP_NUM_THREADS for the test's scope.
class ScopedOmpNumThreads {
 public:
  explicit ScopedOmpNumThreads(const char* value) {
    if (const char* old = std::getenv("OMP_NUM_THREADS")) old_ = old;
    Set(value);
  }
  ~ScopedOmpNumThreads() { Set(old_.has_value() ? old_->c_str() : nullptr); }

 private:
  static void Set(const char* value) {
    if (value == nullptr) {
      unsetenv("OMP_NUM_THREADS");
    } else {
      setenv("OMP_NUM_THREADS", value, 1);
    }
  }
  std::optional<std::string> old_;
};

// What each of `ranks` real processes launched by RunLocalRanks saw as
// OMP_NUM_THREADS ("unset" when it had none), by rank.
std::vector<std::string> OmpNumThreadsOfRanks(int ranks) {
  const std::string dir = absl::StrCat(TestTempDir(), "/omp_", ranks);
  LocalLaunchOptions options;
  options.nproc_per_node = ranks;
  options.argv = {"/bin/sh", "-c",
                  absl::StrCat("mkdir -p ", dir,
                               " && printf %s \"${OMP_NUM_THREADS-unset}\" > ",
                               dir, "/rank_$RANK")};
  options.grace = absl::Seconds(5);
  sigset_t none;
  sigemptyset(&none);
  EXPECT_EQ(RunLocalRanks(options, none), 0);
  std::vector<std::string> seen;
  for (int rank = 0; rank < ranks; ++rank) {
    std::ifstream in(absl::StrCat(dir, "/rank_", rank));
    std::stringstream text;
    text << in.rdbuf();
    seen.push_back(text.str());
  }
  return seen;
}

TEST(RunLocalRanksTest, RanksOfANodeGetOneIntraOpThreadEach) {
  ScopedOmpNumThreads unset(nullptr);
  EXPECT_EQ(OmpNumThreadsOfRanks(2), (std::vector<std::string>{"1", "1"}));
}

TEST(RunLocalRanksTest, TheUsersValueIsInherited) {
  ScopedOmpNumThreads user("3");
  EXPECT_EQ(OmpNumThreadsOfRanks(2), (std::vector<std::string>{"3", "3"}));
}

TEST(RunLocalRanksTest, ASingleRankKeepsLibTorchsDefault) {
  ScopedOmpNumThreads unset(nullptr);
  EXPECT_EQ(OmpNumThreadsOfRanks(1), (std::vector<std::string>{"unset"}));
}

// Ranks of `script` (/bin/sh, with $RANK and $DIR set) under two restarts:
// the launcher's exit code and how many attempts started (each rank 0
// appends a line to $DIR/attempts).
std::pair<int, int> ExitCodeAndAttempts(const std::string& name,
                                        const std::string& script,
                                        int stopped_exit_code = 0,
                                        int peer_failure_exit_code = 0) {
  const std::string dir = absl::StrCat(TestTempDir(), "/", name);
  LocalLaunchOptions options;
  options.nproc_per_node = 2;
  options.max_restarts = 2;
  options.stopped_exit_code = stopped_exit_code;
  options.peer_failure_exit_code = peer_failure_exit_code;
  options.argv = {
      "/bin/sh", "-c",
      absl::StrCat("DIR=", dir, "; mkdir -p $DIR; [ $RANK = 0 ] && ",
                   "echo started >> $DIR/attempts; ", script)};
  options.grace = absl::Seconds(5);
  sigset_t none;
  sigemptyset(&none);
  const int code = RunLocalRanks(options, none);
  std::ifstream in(absl::StrCat(dir, "/attempts"));
  int attempts = 0;
  for (std::string line; std::getline(in, line);) ++attempts;
  return {code, attempts};
}

TEST(RunLocalRanksTest, ARefusingRankEndsTheLaunchWithItsCode) {
  // Rank 1 refuses (exit 2) after rank 0, failing for want of it, exited 1
  // (rank 1 ignores the launcher's SIGTERM meanwhile, as a rank busy
  // leaving would not see it). The launch exits 2 and is not restarted: it
  // would be refused again.
  // (Rank 0 exits once rank 1 ignores SIGTERM: before its trap, the
  // launcher's SIGTERM would end it, a failure of another kind.)
  EXPECT_EQ(ExitCodeAndAttempts("refused",
                                "if [ $RANK = 1 ]; then trap '' TERM; "
                                "touch $DIR/trapped; sleep 0.3; exit 2; fi; "
                                "until [ -e $DIR/trapped ]; do sleep 0.01; "
                                "done; exit 1"),
            std::make_pair(2, 1));
  // A failure that may pass (exit 1) is restarted, and ends with its code.
  EXPECT_EQ(ExitCodeAndAttempts("failed", "[ $RANK = 1 ] && exit 1; sleep 30"),
            std::make_pair(1, 3));
}

TEST(RunLocalRanksTest, RanksThatStoppedEndTheLaunchWithTheStoppedCode) {
  // Every rank stopped (the trainer's --stopped_exit_code): no failure, no
  // restart, and the launch ends with that code, for its scheduler.
  EXPECT_EQ(ExitCodeAndAttempts("stopped", "exit 3", /*stopped_exit_code=*/3),
            std::make_pair(3, 1));
  // One rank stopped while the other exits 0 (its budget's end at the same
  // step): still a stop.
  EXPECT_EQ(
      ExitCodeAndAttempts("one_stopped", "[ $RANK = 1 ] && exit 3; exit 0",
                          /*stopped_exit_code=*/3),
      std::make_pair(3, 1));
  // Without a stopped code, 3 is a failure like any other.
  EXPECT_EQ(ExitCodeAndAttempts("three_failed", "exit 3"),
            std::make_pair(3, 3));
}

TEST(RunLocalRanksTest, RanksThatFollowedAnothersFailureAreNotBlamed) {
  // Rank 0 exits first with the code of a rank that failed because another
  // did (the trainer's --peer_failure_exit_code); rank 1, the one at fault,
  // exits 1 after it (ignoring the launcher's SIGTERM, as a rank busy
  // failing would not see it). The launch is restarted as after any
  // failure, and ends with rank 1's code.
  EXPECT_EQ(ExitCodeAndAttempts("peer_then_own",
                                "if [ $RANK = 1 ]; then trap '' TERM; "
                                "sleep 0.3; exit 1; fi; exit 4",
                                /*stopped_exit_code=*/3,
                                /*peer_failure_exit_code=*/4),
            std::make_pair(1, 3));
  // A rank at fault killed by a signal (its own, not the launcher's): 1.
  EXPECT_EQ(ExitCodeAndAttempts("peer_then_killed",
                                "if [ $RANK = 1 ]; then trap '' TERM; "
                                "sleep 0.3; kill -KILL $$; fi; exit 4",
                                /*stopped_exit_code=*/3,
                                /*peer_failure_exit_code=*/4),
            std::make_pair(1, 3));
  // Every rank followed another's failure (the rank at fault runs under
  // another launcher, on another node): the launch ends with that code.
  // (Each rank exits once both ignore the launcher's SIGTERM, which would
  // end the other before its trap: a failure of another kind.)
  EXPECT_EQ(ExitCodeAndAttempts("all_peer",
                                "A=$TORCHELASTIC_RESTART_COUNT; trap '' TERM; "
                                "touch $DIR/trapped.$A.$RANK; "
                                "until [ -e $DIR/trapped.$A.0 ] && "
                                "[ -e $DIR/trapped.$A.1 ]; do sleep 0.01; "
                                "done; exit 4",
                                /*stopped_exit_code=*/3,
                                /*peer_failure_exit_code=*/4),
            std::make_pair(4, 3));
}

// Whether process `pid` is gone: no such process, or a zombie left for
// whoever reaps orphans here.
bool ProcessGone(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t state = line.rfind(')') + 2;
  return state >= line.size() || line[state] == 'Z';
}

TEST(RunLocalRanksTest, RanksDieWithAKilledLauncher) {
  const std::string dir = absl::StrCat(TestTempDir(), "/orphans");
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", dir).c_str()), 0);
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    LocalLaunchOptions options;
    options.nproc_per_node = 2;
    options.argv = {
        "/bin/sh", "-c",
        absl::StrCat("echo $$ > ", dir, "/pid_$RANK.tmp && mv ", dir,
                     "/pid_$RANK.tmp ", dir, "/pid_$RANK && exec sleep 120")};
    sigset_t none;
    sigemptyset(&none);
    _exit(RunLocalRanks(options, none));
  }
  std::vector<pid_t> ranks;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (int rank = 0; rank < 2 && absl::Now() < deadline;) {
    std::ifstream in(absl::StrCat(dir, "/pid_", rank));
    pid_t pid = 0;
    if (in >> pid) {
      ranks.push_back(pid);
      ++rank;
    } else {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  kill(launcher, SIGKILL);
  waitpid(launcher, nullptr, 0);
  ASSERT_EQ(ranks.size(), 2u) << "the ranks did not start within 30 s";
  for (pid_t rank : ranks) {
    const absl::Time gone_by = absl::Now() + absl::Seconds(10);
    while (!ProcessGone(rank) && absl::Now() < gone_by) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_TRUE(ProcessGone(rank))
        << "rank process " << rank << " outlived its launcher";
    if (!ProcessGone(rank)) kill(rank, SIGKILL);
  }
}

// Rank scenario "threads=N": LibTorch's intra-op pool has N threads.
int RunScenario(const std::string& scenario) {
  const int want = std::atoi(scenario.substr(scenario.find('=') + 1).c_str());
  RANK_EXPECT(at::get_num_threads() == want, "at::get_num_threads() is ",
              at::get_num_threads(), ", want ", want, " (OMP_NUM_THREADS=",
              std::getenv("OMP_NUM_THREADS") == nullptr
                  ? "unset"
                  : std::getenv("OMP_NUM_THREADS"),
              ")");
  return 0;
}

TEST(RunRanksTest, LibTorchsIntraOpPoolFollowsTheRule) {
  {
    ScopedOmpNumThreads unset(nullptr);
    testing::ExpectRanksPassed(
        testing::RunRanks("threads=1", 2, absl::Seconds(60)));
  }
  ScopedOmpNumThreads user("2");
  testing::ExpectRanksPassed(
      testing::RunRanks("threads=2", 2, absl::Seconds(60)));
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  return deltastream::testing::RankTestMain(argc, argv,
                                            deltastream::RunScenario);
}
