// The predictor as a library, against a real tracker_server on loopback
// (which serves no live rows: a predictor must refuse to follow it), against
// a trainer that never answers a read (Stop() ends it at once), and against
// trainers' trackers served on loopback in process (one rank, and two ranks
// read through FanInClient) whose consumers expire after 2 s: a bootstrap
// from a checkpoint chain that takes longer keeps the predictor's consumer
// (its cursor unmoved) and follows on from the chain without a resync, and
// the consumer's keep-alive ends at Stop().
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/ones.h>
#include <gmock/gmock.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdio.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/grpc_server.h"
#include "clients/checkpoint_chain.h"
#include "clients/fan_in_client.h"
#include "clients/predictor.h"
#include "proto/tracker.pb.h"
#include "tests/integration/server_process.h"
#include "tests/testing/test_dirs.h"
#include "tests/tracker_service/tracker_test_util.h"
#include "tracker_service/service_host.h"
#include "tracker_service/tracker.h"

namespace deltastream {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Predictor> NewPredictor(const std::string& target) {
  PredictorOptions options;
  options.target = target;
  absl::StatusOr<std::unique_ptr<Replica>> replica = Replica::Open();
  EXPECT_TRUE(replica.ok()) << replica.status();
  return std::make_unique<Predictor>(options, DeltaClient::Create(target),
                                     *std::move(replica), nullptr);
}

TEST(PredictorLibraryTest, RefusesATrackerWithoutLiveRows) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0);
  std::unique_ptr<Predictor> predictor = NewPredictor(server.target());
  std::future<absl::Status> run =
      std::async(std::launch::async, [&predictor] { return predictor->Run(); });
  ASSERT_EQ(run.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const absl::Status status = run.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("serves no live rows"));
  const v1::PredictorStatus reported = predictor->Status();
  EXPECT_THAT(reported.last_error(), HasSubstr("serves no live rows"));
  EXPECT_EQ(reported.version(), -1);
  EXPECT_FALSE(reported.ready());
}

TEST(PredictorLibraryTest, StopEndsRunWhileItRetries) {
  // Nobody listens: Run() retries with backoff until stopped.
  std::unique_ptr<Predictor> predictor = NewPredictor("127.0.0.1:1");
  std::future<absl::Status> run =
      std::async(std::launch::async, [&predictor] { return predictor->Run(); });
  std::future<void> poll = std::async(
      std::launch::async, [&predictor] { predictor->PollTrainer(); });
  EXPECT_EQ(run.wait_for(std::chrono::milliseconds(500)),
            std::future_status::timeout);
  predictor->Stop();
  ASSERT_EQ(run.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(run.get().ok());
  ASSERT_EQ(poll.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_THAT(predictor->Status().last_error(), HasSubstr("127.0.0.1:1"));
}

// A trainer's tracker as a predictor first sees it (Status: live rows, the
// predictor's consumer) whose reads never send anything, as a trainer
// stalled in a long step, or a read of a huge model, would.
class StalledReadReactor : public grpc::ServerGenericBidiReactor {
 public:
  explicit StalledReadReactor(std::string method) : method_(std::move(method)) {
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok || !absl::EndsWith(method_, "/Status")) return;  // until cancelled
    v1::StatusResponse status;
    status.set_current_batch(5);
    status.set_serves_live_rows(true);
    status.add_consumers()->set_name("predictor");
    const std::string bytes = status.SerializeAsString();
    grpc::Slice slice(bytes);
    response_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&response_);
  }
  void OnWriteDone(bool) override { Finish(grpc::Status::OK); }
  void OnCancel() override {
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() override { delete this; }

 private:
  const std::string method_;
  grpc::ByteBuffer request_, response_;
};

class StalledReadService : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    return new StalledReadReactor(context->method());
  }
};

// Stop() ends the bootstrap's read, and the destructor cancels the
// keep-alive's touch, which this tracker never answers either (its deadline
// is 10 s).
TEST(PredictorLibraryTest, StopEndsAReadOfEveryRowInProgress) {
  StalledReadService stalled;
  grpc::ServerBuilder builder;
  builder.RegisterCallbackGenericService(&stalled);
  absl::StatusOr<StartedServer> started =
      StartServer(builder, "127.0.0.1:0", grpc::InsecureServerCredentials());
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<Predictor> predictor = NewPredictor(started->address);
  std::future<absl::Status> run =
      std::async(std::launch::async, [&predictor] { return predictor->Run(); });
  // The bootstrap's read of every row waits (for the idle timeout: 60 s).
  EXPECT_EQ(run.wait_for(std::chrono::milliseconds(1000)),
            std::future_status::timeout);
  const auto stop = std::chrono::steady_clock::now();
  predictor->Stop();
  ASSERT_EQ(run.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_LT(std::chrono::steady_clock::now() - stop, std::chrono::seconds(3));
  EXPECT_TRUE(run.get().ok());
  EXPECT_EQ(predictor->Status().version(), -1);
  // With the server still up: nothing but its cancel ends the touch.
  const auto destroy = std::chrono::steady_clock::now();
  predictor.reset();
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - destroy)
                .count(),
            2000);
  started->server->Shutdown(std::chrono::system_clock::now());
}

// How long the trainers' trackers below keep a consumer added at run time
// that has gone silent.
constexpr absl::Duration kExpiry = absl::Seconds(2);
constexpr int64_t kRows = 64;
constexpr int64_t kDim = 4;

std::string TableOf(int rank) { return absl::StrCat("t", rank); }

// A trainer's tracker, served on loopback as a trainer serves it (ServiceHost,
// live rows, dense parameters), by `ranks` in-process ranks: table t<r>
// (kRows x kDim, table-wise) on rank r. Only consumer "checkpoint" is
// declared; any other expires after kExpiry. Step() records a few rows on
// every rank and steps every rank; Run() does so every 20 ms on a thread
// until Pause() or destruction.
class LoopbackTrainer {
 public:
  LoopbackTrainer(int ranks, bool acknowledged_reads) : wanted_ranks_(ranks) {
    for (int r = 0; r < ranks; ++r) {
      auto rank = std::make_unique<Rank>();
      rank->rows.SetTable(TableOf(r), at::arange(kRows * kDim, at::kFloat)
                                          .reshape({kRows, kDim})
                                          .add_(100 * r));
      rank->rows.SetDense({{"w", at::ones({3})}});
      TrackerOptions options;
      options.consumers = {"checkpoint"};
      options.acknowledged_reads = acknowledged_reads;
      options.expire_consumers_after = kExpiry;
      absl::StatusOr<std::unique_ptr<Tracker>> tracker =
          Tracker::Create(options, &rank->rows);
      EXPECT_TRUE(tracker.ok()) << tracker.status();
      if (!tracker.ok()) return;
      rank->tracker = *std::move(tracker);
      ServiceHostOptions host;
      host.listen = "127.0.0.1:0";
      host.topology_from_owner = ranks > 1;
      absl::StatusOr<std::unique_ptr<ServiceHost>> started =
          ServiceHost::Start(rank->tracker.get(), host);
      EXPECT_TRUE(started.ok()) << started.status();
      if (!started.ok()) return;
      rank->host = *std::move(started);
      ranks_.push_back(std::move(rank));
    }
    if (ranks > 1) {
      ServiceTopology topology;
      topology.world_size = ranks;
      for (int r = 0; r < ranks; ++r) {
        topology.endpoints.push_back(ranks_[r]->host->address());
        ServiceTopology::Shard shard;
        shard.fqn = TableOf(r);
        shard.sharding_type = "TABLE_WISE";
        shard.rank = r;
        shard.rows = shard.table_rows = kRows;
        shard.cols = shard.table_cols = kDim;
        topology.shards.push_back(shard);
      }
      for (int r = 0; r < ranks; ++r) {
        topology.rank = r;
        ranks_[r]->host->SetTopology(topology);
      }
    }
  }
  ~LoopbackTrainer() {
    Pause();
    for (auto& rank : ranks_) rank->host->Shutdown();
  }

  // Whether every rank serves.
  bool ok() const { return ranks() == wanted_ranks_; }
  // Rank 0's address: the trainer's, as its clients are given it.
  std::string target() const { return ranks_[0]->host->address(); }
  int ranks() const { return static_cast<int>(ranks_.size()); }
  // Rank r's own tracker.
  Tracker& rank(int r) { return *ranks_[r]->tracker; }

  void Step() {
    for (int r = 0; r < ranks(); ++r) {
      const int64_t first = (batch_ * 3) % (kRows - 8);
      ASSERT_TRUE(ranks_[r]
                      ->tracker
                      ->RecordTables({{TableOf(r), at::arange(first, first + 8,
                                                              at::kLong)}})
                      .ok());
      ranks_[r]->tracker->Step();
    }
    ++batch_;
  }
  void Run() {
    stepping_ = true;
    stepper_ = std::thread([this] {
      while (stepping_) {
        Step();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  void Pause() {
    stepping_ = false;
    if (stepper_.joinable()) stepper_.join();
  }

 private:
  struct Rank {
    TensorRowsReader rows;
    std::unique_ptr<Tracker> tracker;
    std::unique_ptr<ServiceHost> host;
  };
  const int wanted_ranks_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  int64_t batch_ = 0;  // the stepping thread's, once it runs
  std::atomic<bool> stepping_{false};
  std::thread stepper_;
};

// The consumer `name` of a rank's tracker, if it has one.
std::optional<ConsumerStatus> FindConsumer(const Tracker& tracker,
                                           const std::string& name) {
  for (const ConsumerStatus& consumer : tracker.Status().consumers) {
    if (consumer.name == name) return consumer;
  }
  return std::nullopt;
}

// A predictor's apply log (a FILE* as the predictor writes it) that holds
// its first line, until Release(), in the write: the line of a bootstrap
// from the chain, written once the chain is in the replica and before the
// subscription, so that the bootstrap lasts as long as a long chain load.
class HeldApplyLog {
 public:
  HeldApplyLog() {
    cookie_io_functions_t io{};
    io.write = &HeldApplyLog::Write;
    file_ = fopencookie(this, "w", io);
    EXPECT_NE(file_, nullptr);
  }
  ~HeldApplyLog() {
    Release();
    std::fclose(file_);
  }
  FILE* file() const { return file_; }
  // Whether the first line came within `timeout` (and is held).
  bool WaitUntilHeld(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&held_), timeout);
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  // The lines written so far ("from to rows dense all_rows run").
  std::vector<std::vector<std::string>> Lines() const {
    absl::MutexLock lock(&mu_);
    std::vector<std::vector<std::string>> lines;
    for (absl::string_view line :
         absl::StrSplit(text_, '\n', absl::SkipEmpty())) {
      std::vector<std::string> fields = absl::StrSplit(line, ' ');
      lines.push_back(std::move(fields));
    }
    return lines;
  }

 private:
  static ssize_t Write(void* cookie, const char* data, size_t size) {
    auto* log = static_cast<HeldApplyLog*>(cookie);
    absl::MutexLock lock(&log->mu_);
    log->text_.append(data, size);
    log->held_ = true;
    log->mu_.Await(absl::Condition(&log->released_));
    return static_cast<ssize_t>(size);
  }

  mutable absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::string text_ ABSL_GUARDED_BY(mu_);
  FILE* file_ = nullptr;
};

// Makes `trainer` ready for a predictor's bootstrap from a chain: adds
// consumer "predictor" (its cursor, returned, at the trainer's batch then),
// steps on, and writes a chain of one full link in `chain` from consumer
// "checkpoint"'s read of every row, which ends at or after that cursor, as a
// checkpoint job would.
int64_t PrepareChain(LoopbackTrainer& trainer, const std::string& chain) {
  std::unique_ptr<FanInClient> client = FanInClient::Connect(trainer.target());
  for (int i = 0; i < 3; ++i) trainer.Step();
  EXPECT_TRUE(client->AddConsumer("predictor").ok());
  const int64_t cursor = trainer.rank(0).current_batch();
  for (int i = 0; i < 2; ++i) trainer.Step();
  v1::GetDeltaRequest read;
  read.set_consumer("checkpoint");
  read.set_all_rows(true);
  read.set_include_dense(true);
  absl::StatusOr<ReceivedDelta> rows = client->GetDelta(read);
  EXPECT_TRUE(rows.ok()) << rows.status();
  if (!rows.ok()) return cursor;
  EXPECT_EQ(rows->tables.size(), static_cast<size_t>(trainer.ranks()));
  std::filesystem::create_directories(chain);
  absl::StatusOr<ChainLink> link = WriteChainLink(chain, *rows);
  EXPECT_TRUE(link.ok()) << link.status();
  return cursor;
}

std::unique_ptr<Predictor> ChainPredictor(const std::string& target,
                                          const std::string& chain,
                                          FILE* apply_log) {
  PredictorOptions options;
  options.target = target;
  options.bootstrap_chain = chain;
  options.every_ms = 20;
  absl::StatusOr<std::unique_ptr<Replica>> replica = Replica::Open();
  EXPECT_TRUE(replica.ok()) << replica.status();
  // FanInClient, as the predictor binary: every rank of a sharded trainer.
  return std::make_unique<Predictor>(options, FanInClient::Connect(target),
                                     *std::move(replica), apply_log);
}

struct ChainBootstrapCase {
  int ranks;
  bool acknowledged_reads;
  friend void PrintTo(const ChainBootstrapCase& c, std::ostream* out) {
    *out << c.ranks << " ranks"
         << (c.acknowledged_reads ? ", acknowledged" : "");
  }
};

class ChainBootstrapTest : public ::testing::TestWithParam<ChainBootstrapCase> {
};

TEST_P(ChainBootstrapTest, OutlastsTheConsumerExpiryWithoutAResync) {
  LoopbackTrainer trainer(GetParam().ranks, GetParam().acknowledged_reads);
  ASSERT_TRUE(trainer.ok());
  const std::string chain = FreshDir("chain");
  const int64_t cursor = PrepareChain(trainer, chain);
  HeldApplyLog apply_log;
  std::unique_ptr<Predictor> predictor =
      ChainPredictor(trainer.target(), chain, apply_log.file());
  trainer.Run();
  std::future<absl::Status> run =
      std::async(std::launch::async, [&predictor] { return predictor->Run(); });
  // Before `run` waits for Run(), also when an assertion ends the test.
  absl::Cleanup end_run = [&] {
    apply_log.Release();
    predictor->Stop();
  };

  // The chain is in the replica; its bootstrap lasts past the expiry, the
  // trainer stepping on.
  ASSERT_TRUE(apply_log.WaitUntilHeld(absl::Seconds(30)));
  const std::vector<std::vector<std::string>> held = apply_log.Lines();
  ASSERT_EQ(held.size(), 1u);
  ASSERT_EQ(held[0].size(), 6u);
  EXPECT_EQ(held[0][0], absl::StrCat(cursor));
  EXPECT_EQ(held[0][1], absl::StrCat(cursor + 2));
  EXPECT_EQ(held[0][4], "1");  // all_rows
  absl::SleepFor(kExpiry + absl::Milliseconds(1500));
  for (int r = 0; r < trainer.ranks(); ++r) {
    const std::optional<ConsumerStatus> consumer =
        FindConsumer(trainer.rank(r), "predictor");
    EXPECT_TRUE(consumer.has_value()) << "rank " << r << " lost the consumer";
    if (consumer.has_value()) {
      EXPECT_EQ(consumer->cursor, cursor) << "rank " << r;
    }
  }
  EXPECT_GT(trainer.rank(0).current_batch(), cursor + 20);

  // The predictor follows on from the chain.
  apply_log.Release();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (predictor->Status().version() < trainer.rank(0).current_batch() - 1 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  trainer.Pause();
  const int64_t last = trainer.rank(0).current_batch();
  while (predictor->Status().version() < last &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  predictor->Stop();
  ASSERT_EQ(run.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(run.get().ok());
  const v1::PredictorStatus status = predictor->Status();
  EXPECT_EQ(status.version(), last);
  EXPECT_EQ(status.resyncs(), 0) << status.last_error();
  // The chain's line, then increments, each from where the last ended.
  const std::vector<std::vector<std::string>> lines = apply_log.Lines();
  ASSERT_GE(lines.size(), 2u);
  for (size_t i = 1; i < lines.size(); ++i) {
    ASSERT_EQ(lines[i].size(), 6u);
    EXPECT_EQ(lines[i][4], "0") << "line " << i << ": a read of every row";
    EXPECT_EQ(lines[i][0], lines[i - 1][1]) << "line " << i;
  }
  EXPECT_EQ(lines.back()[1], absl::StrCat(last));
  for (int r = 0; r < trainer.ranks(); ++r) {
    EXPECT_EQ(trainer.rank(r).Status().consumers_expired, 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    OneServerAndTwoRanks, ChainBootstrapTest,
    ::testing::Values(ChainBootstrapCase{1, false},
                      ChainBootstrapCase{2, true}),
    [](const ::testing::TestParamInfo<ChainBootstrapCase>& info) {
      return absl::StrCat(info.param.ranks, "Ranks",
                          info.param.acknowledged_reads ? "Acknowledged" : "");
    });

TEST(PredictorLibraryTest, StopEndsTheConsumersKeepAlive) {
  LoopbackTrainer trainer(1, false);
  ASSERT_TRUE(trainer.ok());
  const std::string chain = FreshDir("chain");
  PrepareChain(trainer, chain);
  HeldApplyLog apply_log;
  std::unique_ptr<Predictor> predictor =
      ChainPredictor(trainer.target(), chain, apply_log.file());
  trainer.Run();
  std::future<absl::Status> run =
      std::async(std::launch::async, [&predictor] { return predictor->Run(); });
  absl::Cleanup end_run = [&] {
    apply_log.Release();
    predictor->Stop();
  };
  ASSERT_TRUE(apply_log.WaitUntilHeld(absl::Seconds(30)));
  // Told to stop while its bootstrap is held: the consumer, no longer kept
  // in contact, expires.
  predictor->Stop();
  absl::SleepFor(kExpiry + absl::Milliseconds(1500));
  EXPECT_FALSE(FindConsumer(trainer.rank(0), "predictor").has_value());
  EXPECT_EQ(trainer.rank(0).Status().consumers_expired, 1);
  apply_log.Release();
  ASSERT_EQ(run.wait_for(std::chrono::seconds(3)), std::future_status::ready);
  EXPECT_TRUE(run.get().ok());
  EXPECT_EQ(predictor->Status().resyncs(), 0);
}

}  // namespace
}  // namespace deltastream
