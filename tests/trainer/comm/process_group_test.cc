// ProcessGroup over real processes: Gloo on loopback, 2 and 4 ranks.
#include "trainer/comm/process_group.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/trainer/comm/rank_launcher.h"
#include "trainer/comm/gradient_averaging.h"
#include "trainer/comm/torchrun_env.h"

namespace deltastream {
namespace {

using ::deltastream::testing::ExpectRanksPassed;
using ::deltastream::testing::RankResult;
using ::deltastream::testing::RunRanks;

// Scenario exit codes.
constexpr int kMismatch = 2;
constexpr int kCollectiveFailed = 3;  // RANK_OK's

#define RANK_CHECK(cond)                                               \
  do {                                                                 \
    if (!(cond)) {                                                     \
      std::fprintf(stderr, "rank check failed: %s (line %d)\n", #cond, \
                   __LINE__);                                          \
      return kMismatch;                                                \
    }                                                                  \
  } while (0)

// Every collective against values each rank can predict.
int CollectivesScenario(ProcessGroup& group) {
  const int rank = group.rank();
  const int size = group.world_size();
  // All-to-all with uneven splits: rank r sends r + p + 1 rows of 2 to rank
  // p, each row {r, p}.
  std::vector<int64_t> in_splits, out_splits;
  std::vector<at::Tensor> rows;
  for (int p = 0; p < size; ++p) {
    in_splits.push_back(rank + p + 1);
    out_splits.push_back(p + rank + 1);
    rows.push_back(at::tensor({static_cast<float>(rank), static_cast<float>(p)})
                       .repeat({rank + p + 1, 1}));
  }
  at::Tensor input = at::cat(rows);
  int64_t out_rows = 0;
  for (int64_t s : out_splits) out_rows += s;
  at::Tensor output = at::empty({out_rows, 2});
  RANK_OK(group.AllToAll(input, in_splits, output, out_splits, "test.a2a"));
  int64_t row = 0;
  for (int q = 0; q < size; ++q) {
    for (int64_t i = 0; i < out_splits[q]; ++i, ++row) {
      RANK_CHECK(output[row][0].item<float>() == q);
      RANK_CHECK(output[row][1].item<float>() == rank);
    }
  }
  // All-reduce: the sum of ranks.
  at::Tensor sum = at::full({3}, static_cast<double>(rank + 1));
  RANK_OK(group.AllReduceSum(sum, "test.allreduce"));
  RANK_CHECK(sum[2].item<float>() == size * (size + 1) / 2);
  // All-gather.
  at::Tensor mine = at::full({2, 3}, static_cast<double>(rank));
  at::Tensor all = at::empty({2 * size, 3});
  RANK_OK(group.AllGather(mine, all, "test.allgather"));
  for (int q = 0; q < size; ++q) RANK_CHECK(all[2 * q][1].item<float>() == q);
  // Reduce-scatter: block b of rank r holds r * 10 + b.
  at::Tensor blocks = at::arange(size).to(at::kFloat).repeat_interleave(2);
  blocks = (blocks + 10 * rank).view({2 * size, 1});
  at::Tensor reduced = at::empty({2, 1});
  RANK_OK(group.ReduceScatterSum(blocks, reduced, "test.reduce_scatter"));
  RANK_CHECK(reduced[0][0].item<float>() ==
             size * rank + 10 * size * (size - 1) / 2);
  absl::StatusOr<int64_t> min = group.AllReduceMin(10 + rank, "test.min");
  RANK_OK(min.status());
  RANK_CHECK(*min == 10);
  RANK_OK(group.StoreSet(absl::StrCat("endpoint/", rank), "here"));
  absl::StatusOr<std::string> other =
      group.StoreGet(absl::StrCat("endpoint/", (rank + 1) % size));
  RANK_OK(other.status());
  RANK_CHECK(*other == "here");
  RANK_OK(group.Barrier("test.barrier"));
  // Dense gradients averaged; a parameter without one gets the mean too.
  at::Tensor weight = at::zeros({2, 2}).requires_grad_(true);
  at::Tensor bias = at::zeros({3}, at::kDouble).requires_grad_(true);
  (weight * (rank + 1)).sum().backward();
  if (rank == 0) (bias * 4).sum().backward();
  RANK_OK(AverageGradients(group, {weight, bias}));
  RANK_CHECK(weight.grad()[1][1].item<float>() == (size + 1) / 2.0f);
  RANK_CHECK(bias.grad()[0].item<double>() == 4.0 / size);
  // Stats: the all-to-all sent its rows for other ranks, 8 bytes each.
  const CollectiveStats a2a = group.Stats()["test.a2a"];
  int64_t expected_sent = 0;
  for (int p = 0; p < size; ++p) {
    if (p != rank) expected_sent += (rank + p + 1) * 8;
  }
  RANK_CHECK(a2a.calls == 1);
  RANK_CHECK(a2a.bytes_sent == expected_sent);
  return 0;
}

// Rank 1 dies (SIGKILL) or hangs after the first collective; the others keep
// calling all-reduce and must fail with a Status naming rank 1.
int FailingRankScenario(ProcessGroup& group, bool hang) {
  at::Tensor t = at::ones({4});
  RANK_OK(group.AllReduceSum(t, "test.first"));
  // From here on (start-up excluded): how long the survivors take to stop.
  const absl::Time start = absl::Now();
  const char* dying = std::getenv("TEST_DYING_RANK");
  if (group.rank() == (dying != nullptr ? std::atoi(dying) : 1)) {
    // Long enough for the others to give up (2 x the 2 s timeout), short
    // enough not to hold the test up.
    if (hang) std::this_thread::sleep_for(std::chrono::seconds(7));
    kill(getpid(), SIGKILL);
  }
  for (int i = 0; i < 1000; ++i) {
    if (absl::Status s = group.AllReduceSum(t, "test.after_failure"); !s.ok()) {
      std::fprintf(stderr, "FAILED after %lld ms: %s\n",
                   static_cast<long long>(
                       absl::ToInt64Milliseconds(absl::Now() - start)),
                   s.ToString().c_str());
      // The fault is the dying rank's.
      RANK_CHECK(group.failed_elsewhere());
      return kCollectiveFailed;
    }
  }
  return 0;
}

// Rank 1 fails on its own after the first collective (say its checkpoint
// file is damaged) and tells the group why (Leave), then stays alive for 8 s
// (as a trainer serving its consumers' last reads); the others' next
// collective fails at once with its reason, long before that exit and
// their collective timeout.
int LeavingRankScenario(ProcessGroup& group) {
  at::Tensor t = at::ones({4});
  RANK_OK(group.AllReduceSum(t, "test.first"));
  const absl::Time start = absl::Now();
  if (group.rank() == 1) {
    // Let the others enter their collective first.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    group.Leave(absl::DataLossError("rank-00001-of-00003.pt is damaged"));
    RANK_CHECK(!group.AllReduceSum(t, "test.after_leaving").ok());
    RANK_CHECK(!group.failed_elsewhere());  // its own failure
    std::this_thread::sleep_for(std::chrono::seconds(8));
    return 0;
  }
  RANK_CHECK(!group.failed_elsewhere());
  absl::Status s = group.AllReduceSum(t, "test.after_failure");
  std::fprintf(
      stderr, "FAILED after %lld ms: %s\n",
      static_cast<long long>(absl::ToInt64Milliseconds(absl::Now() - start)),
      s.ToString().c_str());
  if (s.ok()) return 0;
  RANK_CHECK(group.failed_elsewhere());  // rank 1's
  return kCollectiveFailed;
}

// Rank 1 comes to a collective 3 timeouts late (say a checkpoint write
// stalled): rank 0 gives up on it and exits, blaming it; rank 1, whose
// collective then fails too (its peer and the store gone), blames no one
// else: its failure must count.
int LateRankScenario(ProcessGroup& group) {
  at::Tensor t = at::ones({4});
  RANK_OK(group.AllReduceSum(t, "test.first"));
  if (group.rank() == 1) {
    std::this_thread::sleep_for(3 * absl::ToChronoSeconds(group.timeout()));
  }
  absl::Status s = group.AllReduceSum(t, "test.after_failure");
  RANK_CHECK(!s.ok());
  std::fprintf(stderr, "rank %d failed: %s\n", group.rank(),
               s.ToString().c_str());
  RANK_CHECK(group.failed_elsewhere() == (group.rank() == 0));
  return kCollectiveFailed;
}

int RunScenario(const std::string& scenario) {
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      testing::RankGroupFromEnv(absl::Seconds(20));
  if (!group.ok()) {
    std::fprintf(stderr, "FAILED: %s\n", group.status().ToString().c_str());
    return kCollectiveFailed;
  }
  if (scenario == "collectives") return CollectivesScenario(**group);
  if (scenario == "dead") return FailingRankScenario(**group, false);
  if (scenario == "hang") return FailingRankScenario(**group, true);
  if (scenario == "leave") return LeavingRankScenario(**group);
  if (scenario == "late") return LateRankScenario(**group);
  std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
  return 1;
}

TEST(ProcessGroupTest, CollectivesOnTwoRanks) {
  ExpectRanksPassed(RunRanks("collectives", 2, absl::Seconds(60)));
}

TEST(ProcessGroupTest, CollectivesOnFourRanks) {
  ExpectRanksPassed(RunRanks("collectives", 4, absl::Seconds(60)));
}

// A TCPStore server of this test process, standing for torchrun's agent:
// a one-process group on a free port (its port, or 0 after a failure).
int HostAgentStore(std::unique_ptr<ProcessGroup>& host) {
  ProcessGroupOptions agent;
  agent.env.master_port = testing::FreePort();  // rank 0 of 1: the server
  absl::StatusOr<std::unique_ptr<ProcessGroup>> made =
      ProcessGroup::Create(agent);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return 0;
  host = *std::move(made);
  return agent.env.master_port;
}

TEST(ProcessGroupTest, CollectivesUnderTorchrunAgentStore) {
  // torchrun's agent hosts the store, and every rank is a client under
  // /worker/attempt_3.
  std::unique_ptr<ProcessGroup> host;
  const int port = HostAgentStore(host);
  ASSERT_NE(port, 0);
  // The launcher picks its own port: point it at ours.
  ExpectRanksPassed(RunRanks("collectives", 2, absl::Seconds(60),
                             {{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                              {"TORCHELASTIC_RESTART_COUNT", "3"},
                              {"MASTER_PORT", std::to_string(port)}}));
}

// A dead or hung rank: every other rank exits within 2 x timeout (plus
// start-up) with a message naming the collective and rank 1.
void ExpectFailureNamesRankOne(const std::string& scenario, int world_size) {
  const int timeout_s = 2;
  std::vector<RankResult> results =
      RunRanks(scenario, world_size, absl::Seconds(30),
               {{"TEST_COLLECTIVE_TIMEOUT_S", std::to_string(timeout_s)}});
  for (int r = 0; r < world_size; ++r) {
    if (r == 1) continue;
    const RankResult& result = results[r];
    EXPECT_FALSE(result.timed_out) << "rank " << r << " hung";
    EXPECT_EQ(result.exit_code, kCollectiveFailed) << result.output;
    EXPECT_TRUE(absl::StrContains(result.output, "test.after_failure"))
        << result.output;
    EXPECT_TRUE(absl::StrContains(result.output, "rank 1 did not report"))
        << result.output;
    // Within 2 x timeout of the failure (plus 1 s of scheduling slack on a
    // loaded machine).
    const size_t at = result.output.find("FAILED after ");
    ASSERT_NE(at, std::string::npos) << result.output;
    const long long ms = std::atoll(result.output.c_str() + at + 13);
    EXPECT_LT(ms, 2 * timeout_s * 1000 + 1000) << result.output;
    if (r == 0) std::printf("rank 0 reported: %s", result.output.c_str());
  }
}

TEST(ProcessGroupTest, DeadRankFailsTheOthersWithItsName) {
  ExpectFailureNamesRankOne("dead", 3);
}

TEST(ProcessGroupTest, HungRankFailsTheOthersWithItsName) {
  ExpectFailureNamesRankOne("hang", 2);
}

// A rank that leaves (a failure of its own) is named with its reason by
// every other rank at once, not after the timeout as a dead or hung one,
// though it is still alive.
TEST(ProcessGroupTest, ARankThatLeavesIsNamedWithItsReasonAtOnce) {
  const int timeout_s = 20;
  std::vector<RankResult> results =
      RunRanks("leave", 3, absl::Seconds(60),
               {{"TEST_COLLECTIVE_TIMEOUT_S", std::to_string(timeout_s)}});
  EXPECT_EQ(results[1].exit_code, 0) << results[1].output;
  for (int r : {0, 2}) {
    const RankResult& result = results[r];
    EXPECT_FALSE(result.timed_out) << "rank " << r << " hung";
    EXPECT_EQ(result.exit_code, kCollectiveFailed) << result.output;
    EXPECT_TRUE(absl::StrContains(
        result.output,
        "rank 1 left the group: rank-00001-of-00003.pt is damaged"))
        << result.output;
    EXPECT_FALSE(absl::StrContains(result.output, "did not report"))
        << result.output;
    const size_t at = result.output.find("FAILED after ");
    ASSERT_NE(at, std::string::npos) << result.output;
    EXPECT_LT(std::atoll(result.output.c_str() + at + 13), 5000)
        << result.output;
    if (r == 0) std::printf("rank 0 reported: %s", result.output.c_str());
  }
}

TEST(ProcessGroupTest, ALateRankIsBlamedByTheOthersAndNotByItself) {
  std::vector<RankResult> results = RunRanks(
      "late", 2, absl::Seconds(30), {{"TEST_COLLECTIVE_TIMEOUT_S", "2"}});
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung";
    EXPECT_EQ(results[r].exit_code, kCollectiveFailed) << results[r].output;
  }
}

// Gloo writes to a peer with writev(2): once the peer is gone that raises
// SIGPIPE, which by default ends the rank silently (before this, a survivor
// of DeadRankFailsTheOthersWithItsName sometimes died so under load). A
// group's creation makes such a write fail with EPIPE instead, and keeps a
// handler the program installed.
TEST(ProcessGroupTest, AWriteToAGonePeerFailsInsteadOfEndingTheRank) {
  signal(SIGPIPE, SIG_DFL);
  ProcessGroupOptions options;  // rank 0 of 1: hosts its TCPStore
  options.env.master_port = testing::FreePort();
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      ProcessGroup::Create(options);
  ASSERT_TRUE(group.ok()) << group.status();
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);

  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  close(fds[1]);  // the peer is gone
  char byte = 1;
  struct iovec iov = {&byte, 1};
  errno = 0;
  EXPECT_EQ(writev(fds[0], &iov, 1), -1);  // this process is still here
  EXPECT_EQ(errno, EPIPE);
  close(fds[0]);

  // A program's own handler stays.
  auto handler = [](int) {};
  signal(SIGPIPE, handler);
  options.env.master_port = testing::FreePort();
  group = ProcessGroup::Create(options);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, +handler);
  signal(SIGPIPE, SIG_IGN);
}

TEST(ProcessGroupTest, DeadStoreHostFailsTheOthers) {
  std::vector<RankResult> results =
      RunRanks("dead", 3, absl::Seconds(30),
               {{"TEST_COLLECTIVE_TIMEOUT_S", "2"}, {"TEST_DYING_RANK", "0"}});
  for (int r = 1; r < 3; ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung";
    EXPECT_EQ(results[r].exit_code, kCollectiveFailed) << results[r].output;
    EXPECT_TRUE(absl::StrContains(results[r].output, "test.after_failure"))
        << results[r].output;
    EXPECT_TRUE(
        absl::StrContains(results[r].output, "rank 0 (the store's host"))
        << results[r].output;
  }
}

// Rank 0 of two whose rank 1 never starts (a pod left pending): the
// rendezvous ends within its timeout, naming rank 1 (the store's blocking
// wait outlived its timeout on the store's host).
TEST(ProcessGroupTest, ARankThatNeverJoinsIsNamedWithinTheRendezvousTimeout) {
  ProcessGroupOptions options;
  options.env.rank = 0;
  options.env.world_size = 2;
  options.env.local_rank = 0;
  options.env.local_world_size = 2;
  options.env.master_port = ::deltastream::testing::FreePort();
  options.timeout = absl::Seconds(2);
  options.rendezvous_timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      ProcessGroup::Create(options);
  ASSERT_FALSE(group.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_TRUE(absl::StrContains(group.status().message(),
                                "rank 1 did not join through"))
      << group.status();
}

// Two processes given one RANK, or ranks given different WORLD_SIZEs: the
// rank that finds it, and every other through the store, fails at once
// naming the fault (not after the rendezvous timeout, nor with Gloo's
// connect error). Both "processes" are threads here, clients of a store
// this test hosts as torchrun's agent would.
TEST(ProcessGroupTest, ALaunchThatCannotFormAGroupIsRefusedAtOnce) {
  std::unique_ptr<ProcessGroup> host;
  const int port = HostAgentStore(host);
  ASSERT_NE(port, 0);
  struct Case {
    int ranks[2], world_sizes[2];
    std::string fault;
  };
  const Case cases[] = {
      {{0, 0}, {2, 2}, "two processes were given RANK 0"},
      {{0, 1},
       {2, 3},
       " for the ranks before it: every rank must be given "
       "the same WORLD_SIZE"},
  };
  int attempt = 0;
  for (const Case& c : cases) {
    absl::Status status[2];
    const absl::Time start = absl::Now();
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
      threads.emplace_back([&, i] {
        ProcessGroupOptions options;
        options.env.rank = c.ranks[i];
        options.env.world_size = c.world_sizes[i];
        options.env.local_world_size = c.world_sizes[i];
        options.env.master_port = port;
        options.env.use_agent_store = true;
        options.env.restart_count = attempt;  // fresh keys per case
        options.rendezvous_timeout = absl::Seconds(60);
        status[i] = ProcessGroup::Create(options).status();
      });
    }
    for (std::thread& thread : threads) thread.join();
    ++attempt;
    EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << c.fault;
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(status[i].code(), absl::StatusCode::kFailedPrecondition)
          << status[i];
      EXPECT_TRUE(absl::StrContains(status[i].message(), c.fault)) << status[i];
    }
  }
}

// A rank restarted while the previous run's rank 0 still hosts the store,
// reporting that run's failure (a Kubernetes pod recreated before its peers
// exited): it waits for that store to go and joins the new run's, instead
// of joining the old group's keys (refused there, as a second RANK or
// another WORLD_SIZE, or failing with its host).
TEST(ProcessGroupTest, ARestartedRankWaitsOutAFailedGroupsStore) {
  const int port = testing::FreePort();
  ProcessGroupOptions old_host;  // the old run's store, as rank 0 of 1
  old_host.env.master_port = port;
  absl::StatusOr<std::unique_ptr<ProcessGroup>> stale =
      ProcessGroup::Create(old_host);
  ASSERT_TRUE(stale.ok()) << stale.status();
  ASSERT_TRUE((*stale)->StoreSet("failed/0", "1").ok());  // it failed

  auto options = [port](int rank) {
    ProcessGroupOptions o;
    o.env.rank = rank;
    o.env.world_size = 2;
    o.env.local_rank = rank;
    o.env.local_world_size = 2;
    o.env.master_port = port;
    o.rendezvous_timeout = absl::Seconds(30);
    return o;
  };
  absl::StatusOr<std::unique_ptr<ProcessGroup>> rank1 =
      absl::UnknownError("not run");
  std::thread restarted([&] { rank1 = ProcessGroup::Create(options(1)); });
  absl::SleepFor(absl::Seconds(2));  // rank 1 finds the old store meanwhile
  stale->reset();                    // the old rank 0 exits
  absl::StatusOr<std::unique_ptr<ProcessGroup>> rank0 =
      absl::UnknownError("not run");
  std::thread new_host([&] { rank0 = ProcessGroup::Create(options(0)); });
  restarted.join();
  new_host.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  at::Tensor t0 = at::ones({2}), t1 = at::ones({2});
  std::thread sum([&] { EXPECT_TRUE((*rank1)->AllReduceSum(t1, "t").ok()); });
  EXPECT_TRUE((*rank0)->AllReduceSum(t0, "t").ok());
  sum.join();
  EXPECT_EQ(t0[0].item<float>(), 2.0f);
}

class ScopedEnv {
 public:
  explicit ScopedEnv(std::map<std::string, std::string> vars) {
    for (const char* name :
         {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
          "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
          "TORCHELASTIC_RESTART_COUNT"}) {
      unsetenv(name);
    }
    for (const auto& [name, value] : vars)
      setenv(name.c_str(), value.c_str(), 1);
  }
};

TEST(TorchrunEnvironmentTest, DefaultsToOneProcess) {
  ScopedEnv env({});
  absl::StatusOr<TorchrunEnvironment> parsed = TorchrunEnvironmentFromEnv();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->world_size, 1);
  EXPECT_EQ(parsed->rank, 0);
}

TEST(TorchrunEnvironmentTest, ReadsTorchrunVariables) {
  ScopedEnv env({{"RANK", "5"},
                 {"WORLD_SIZE", "8"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "4"},
                 {"MASTER_ADDR", "10.0.0.1"},
                 {"MASTER_PORT", "29500"},
                 {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                 {"TORCHELASTIC_RESTART_COUNT", "2"}});
  absl::StatusOr<TorchrunEnvironment> parsed = TorchrunEnvironmentFromEnv();
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rank, 5);
  EXPECT_EQ(parsed->world_size, 8);
  EXPECT_EQ(parsed->local_rank, 1);
  EXPECT_EQ(parsed->local_world_size, 4);
  EXPECT_EQ(parsed->master_addr, "10.0.0.1");
  EXPECT_EQ(parsed->master_port, 29500);
  EXPECT_TRUE(parsed->use_agent_store);
  EXPECT_EQ(parsed->restart_count, 2);
}

TEST(TorchrunEnvironmentTest, RejectsBadValuesByName) {
  {
    ScopedEnv env({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
    absl::StatusOr<TorchrunEnvironment> parsed = TorchrunEnvironmentFromEnv();
    ASSERT_FALSE(parsed.ok());
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), "RANK=2"));
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "x"}});
    EXPECT_TRUE(absl::StrContains(
        TorchrunEnvironmentFromEnv().status().message(), "WORLD_SIZE='x'"));
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
    EXPECT_TRUE(absl::StrContains(
        TorchrunEnvironmentFromEnv().status().message(), "MASTER_PORT"));
  }
  {
    ScopedEnv env(std::map<std::string, std::string>{{"RANK", "0"}});
    EXPECT_FALSE(TorchrunEnvironmentFromEnv().ok());
  }
}

TEST(ProcessGroupTest, RejectsBadSplits) {
  ProcessGroupOptions options;  // one process, any free port
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      ProcessGroup::Create(options);
  ASSERT_TRUE(group.ok()) << group.status();
  at::Tensor input = at::ones({3});
  at::Tensor output = at::empty({3});
  absl::Status status = (*group)->AllToAll(input, {2}, output, {3}, "bad");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), "sum to 2")) << status;
  EXPECT_TRUE((*group)->AllToAll(input, {3}, output, {3}, "ok").ok());
  EXPECT_TRUE(at::equal(input, output));
}

// Tensors off the group's device are refused by every collective, also in
// a one-process group (where nothing is sent): a trainer that handed a host
// tensor to NCCL failed first on several GPUs, at its first progress line.
TEST(ProcessGroupTest, RejectsTensorsOffTheGroupsDevice) {
  ProcessGroupOptions options;  // one process on the CPU
  absl::StatusOr<std::unique_ptr<ProcessGroup>> group =
      ProcessGroup::Create(options);
  ASSERT_TRUE(group.ok()) << group.status();
  at::Tensor host = at::ones({2});
  at::Tensor elsewhere = at::empty({2}, at::TensorOptions().device(at::kMeta));
  const absl::Status refusals[] = {
      (*group)->AllReduceSum(elsewhere, "sum"),
      (*group)->AllGather(elsewhere, host, "gather in"),
      (*group)->AllGather(host, elsewhere, "gather out"),
      (*group)->ReduceScatterSum(host, elsewhere, "scatter"),
      (*group)->AllToAll(elsewhere, {2}, host, {2}, "all-to-all"),
  };
  for (const absl::Status& status : refusals) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_TRUE(
        absl::StrContains(status.message(), "the group's device is cpu"))
        << status;
  }
  EXPECT_TRUE((*group)->AllReduceSum(host, "sum").ok());
}

}  // namespace
}  // namespace deltastream

int main(int argc, char** argv) {
  return deltastream::testing::RankTestMain(argc, argv,
                                            deltastream::RunScenario);
}
