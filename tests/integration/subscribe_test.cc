// Subscribe against the real tracker_server: pushes every N steps or T ms,
// each delta whole, nothing twice, cancellation and server shutdown; in
// acknowledged mode each push on from the last, and a first push on from
// the request's continue_from; an idle subscription kept by keepalive pings,
// and a stopped server found by them; Touch keeps a consumer from expiring.

#include <ATen/core/Tensor.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "base/grpc_server.h"
#include "clients/delta_client.h"
#include "tests/integration/server_process.h"

namespace deltastream {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

struct Pushed {
  int64_t start_batch;
  int64_t end_batch;
  std::vector<int64_t> ids;
};

// Collects a subscription's deltas on a thread of its own.
class Subscriber {
 public:
  Subscriber(const std::string& target, v1::SubscribeRequest request,
             ClientOptions options = {})
      : client_(DeltaClient::Create(target, options)) {
    thread_ = std::thread([this, request] {
      status_ = client_->Subscribe(
          request,
          [this](ReceivedDelta&& delta) {
            Pushed pushed{
                delta.header.start_batch(), delta.header.end_batch(), {}};
            auto it = delta.tables.find("t");
            if (it != delta.tables.end()) {
              at::Tensor ids = it->second.ids.contiguous();
              pushed.ids.assign(ids.data_ptr<int64_t>(),
                                ids.data_ptr<int64_t>() + ids.numel());
            }
            std::lock_guard<std::mutex> lock(mu_);
            pushed_.push_back(std::move(pushed));
            return true;
          },
          &subscription_);
      ended_ = true;
    });
  }
  ~Subscriber() { Stop().IgnoreError(); }

  absl::Status Stop() {
    subscription_.Cancel();
    if (thread_.joinable()) thread_.join();
    return status_;
  }

  // Waits until a delta ending at `end_batch` arrived (up to 10 s).
  bool WaitForEnd(int64_t end_batch) {
    const auto deadline = steady_clock::now() + std::chrono::seconds(10);
    while (steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const Pushed& p : pushed_) {
          if (p.end_batch == end_batch) return true;
        }
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    return false;
  }

  // Waits up to `limit` for the subscription to end by itself; its status
  // then (Stop's), or nullopt when it did not end.
  std::optional<absl::Status> WaitForEnded(std::chrono::seconds limit) {
    const auto deadline = steady_clock::now() + limit;
    while (!ended_ && steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    if (!ended_) return std::nullopt;
    return Stop();
  }

  std::vector<Pushed> pushed() {
    std::lock_guard<std::mutex> lock(mu_);
    return pushed_;
  }

 private:
  std::unique_ptr<DeltaClient> client_;
  CallCanceller subscription_;
  std::thread thread_;
  std::atomic<bool> ended_{false};
  absl::Status status_;
  std::mutex mu_;
  std::vector<Pushed> pushed_;
};

v1::SubscribeRequest Every(const std::string& consumer, int64_t steps,
                           int64_t ms) {
  v1::SubscribeRequest request;
  request.mutable_read()->set_consumer(consumer);
  request.set_every_steps(steps);
  request.set_every_ms(ms);
  return request;
}

void RecordAndStep(DeltaClient& client, int64_t id) {
  ASSERT_TRUE(client.Record({{{"t", at::tensor({id}, at::kLong), {}}}}).ok());
  ASSERT_TRUE(client.Step().ok());
}

TEST(SubscribeTest, PushesEveryNStepsEachBatchOnce) {
  ServerProcess server({"--consumers=s"});
  ASSERT_GT(server.port(), 0);
  auto producer = DeltaClient::Create(server.target());
  Subscriber subscriber(server.target(), Every("s", 2, 0));
  ASSERT_TRUE(subscriber.WaitForEnd(0));  // the first push: what is unread
  for (int64_t batch = 0; batch < 6; ++batch) {
    RecordAndStep(*producer, 100 + batch);
    if (batch % 2 == 1) {
      ASSERT_TRUE(subscriber.WaitForEnd(batch + 1));
    }
  }
  EXPECT_TRUE(subscriber.Stop().ok());
  std::vector<Pushed> pushed = subscriber.pushed();
  ASSERT_EQ(pushed.size(), 4u);
  for (size_t i = 0; i < pushed.size(); ++i) {
    EXPECT_EQ(pushed[i].end_batch, static_cast<int64_t>(2 * i));
  }
  EXPECT_EQ(pushed[1].ids, (std::vector<int64_t>{100, 101}));
  EXPECT_EQ(pushed[2].ids, (std::vector<int64_t>{102, 103}));
  EXPECT_EQ(pushed[3].ids, (std::vector<int64_t>{104, 105}));
}

// An idle subscription (nothing to push) stays open while the client pings
// the server (the server accepts its pings: gRPC's default would close the
// connection after the fourth); once the server stops answering (SIGSTOP,
// as a dead host or a cut link would), the pings find it and the
// subscription fails as Unavailable instead of waiting forever.
TEST(SubscribeTest, KeepalivePingsKeepAnIdleSubscriptionAndFindAStoppedServer) {
  ServerProcess server({"--consumers=s"});
  ASSERT_GT(server.port(), 0);
  auto producer = DeltaClient::Create(server.target());
  ClientOptions options;
  options.keepalive_time = milliseconds(kMinPingIntervalMs);
  options.keepalive_timeout = milliseconds(1000);
  Subscriber subscriber(server.target(), Every("s", 1, 0), options);
  ASSERT_TRUE(subscriber.WaitForEnd(0));
  std::this_thread::sleep_for(milliseconds(4 * kMinPingIntervalMs + 2000));
  RecordAndStep(*producer, 7);
  ASSERT_TRUE(subscriber.WaitForEnd(1)) << "the idle subscription was closed";

  server.Signal(SIGSTOP);
  const auto stopped = steady_clock::now();
  const std::optional<absl::Status> ended =
      subscriber.WaitForEnded(std::chrono::seconds(30));
  server.Signal(SIGCONT);
  ASSERT_TRUE(ended.has_value()) << "still waiting on a stopped server";
  EXPECT_EQ(ended->code(), absl::StatusCode::kUnavailable) << *ended;
  EXPECT_LT(steady_clock::now() - stopped, std::chrono::seconds(15));
}

TEST(SubscribeTest, PushesAfterTMillisecondsWhenABatchClosed) {
  ServerProcess server({"--consumers=s"});
  ASSERT_GT(server.port(), 0);
  auto producer = DeltaClient::Create(server.target());
  Subscriber subscriber(server.target(), Every("s", 1000, 150));
  ASSERT_TRUE(subscriber.WaitForEnd(0));
  // No step: no push however long we wait.
  std::this_thread::sleep_for(milliseconds(400));
  EXPECT_EQ(subscriber.pushed().size(), 1u);
  const auto stepped = steady_clock::now();
  RecordAndStep(*producer, 7);
  ASSERT_TRUE(subscriber.WaitForEnd(1));
  EXPECT_LT(steady_clock::now() - stepped, std::chrono::seconds(2));
  EXPECT_EQ(subscriber.pushed().back().ids, std::vector<int64_t>{7});
}

TEST(SubscribeTest, AcknowledgedPushesFollowEachOtherAndComeAgainAfterABreak) {
  ServerProcess server({"--consumers=s", "--acknowledged_reads"});
  ASSERT_GT(server.port(), 0);
  auto producer = DeltaClient::Create(server.target());
  {
    // No commits: each push still brings only the batches after the last.
    Subscriber subscriber(server.target(), Every("s", 1, 0));
    ASSERT_TRUE(subscriber.WaitForEnd(0));
    for (int64_t batch = 0; batch < 3; ++batch) {
      RecordAndStep(*producer, 100 + batch);
      ASSERT_TRUE(subscriber.WaitForEnd(batch + 1));
    }
    EXPECT_TRUE(subscriber.Stop().ok());
    std::vector<Pushed> pushed = subscriber.pushed();
    ASSERT_EQ(pushed.size(), 4u);
    for (size_t i = 1; i < pushed.size(); ++i) {
      EXPECT_EQ(pushed[i].start_batch, pushed[i - 1].end_batch);
      EXPECT_EQ(pushed[i].ids, std::vector<int64_t>{99 + int64_t(i)});
    }
    // One commit in the middle: what follows it stays uncommitted.
    ASSERT_TRUE(producer->Commit("s", pushed[1].end_batch).ok());
  }
  // A new stream: from the committed batch, every uncommitted row again.
  Subscriber again(server.target(), Every("s", 1, 0));
  ASSERT_TRUE(again.WaitForEnd(3));
  EXPECT_TRUE(again.Stop().ok());
  ASSERT_FALSE(again.pushed().empty());
  EXPECT_EQ(again.pushed()[0].start_batch, 1);
  EXPECT_EQ(again.pushed()[0].ids, (std::vector<int64_t>{101, 102}));
  // A consumer that holds batch 2 (the end of an uncommitted push) resumes
  // there: its first push brings only what it lacks.
  v1::SubscribeRequest resume = Every("s", 1, 0);
  resume.mutable_read()->set_continue_from(2);
  Subscriber resumed(server.target(), resume);
  ASSERT_TRUE(resumed.WaitForEnd(3));
  EXPECT_TRUE(resumed.Stop().ok());
  ASSERT_FALSE(resumed.pushed().empty());
  EXPECT_EQ(resumed.pushed()[0].start_batch, 2);
  EXPECT_EQ(resumed.pushed()[0].ids, std::vector<int64_t>{102});
}

TEST(SubscribeTest, UnknownConsumerOrBadRequestIsAnError) {
  ServerProcess server({"--consumers=s"});
  ASSERT_GT(server.port(), 0);
  auto client = DeltaClient::Create(server.target());
  auto never = [](ReceivedDelta&&) { return true; };
  EXPECT_EQ(client->Subscribe(Every("nobody", 1, 0), never).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client->Subscribe(Every("s", -1, 0), never).code(),
            absl::StatusCode::kInvalidArgument);
}

// A consumer removed while its subscription waits for a push due much
// later ends the subscription within about a second, NOT_FOUND (it stayed
// open until that push, an hour here).
TEST(SubscribeTest, ARemovedConsumersSubscriptionEnds) {
  ServerProcess server({"--consumers=s,other"});
  ASSERT_GT(server.port(), 0);
  auto admin = DeltaClient::Create(server.target());
  Subscriber subscriber(server.target(), Every("s", 1 << 30, 3600 * 1000));
  ASSERT_TRUE(subscriber.WaitForEnd(0));
  ASSERT_TRUE(admin->RemoveConsumer("s").ok());
  const std::optional<absl::Status> ended =
      subscriber.WaitForEnded(std::chrono::seconds(10));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->code(), absl::StatusCode::kNotFound) << *ended;
}

// Touch keeps a consumer that reads nothing (busy elsewhere: a predictor
// loading a chain) from the expiry, moving nothing; one not touched
// expires meanwhile; an unknown one is NOT_FOUND.
TEST(SubscribeTest, TouchKeepsAConsumerThatReadsNothing) {
  ServerProcess server(
      {"--consumers=declared", "--expire_consumers_after_s=1"});
  ASSERT_GT(server.port(), 0);
  auto client = DeltaClient::Create(server.target());
  ASSERT_TRUE(client->AddConsumer("touched").ok());
  ASSERT_TRUE(client->AddConsumer("silent").ok());
  EXPECT_EQ(client->Touch("nobody").code(), absl::StatusCode::kNotFound);
  const auto until = steady_clock::now() + std::chrono::milliseconds(3500);
  int64_t id = 0;
  while (steady_clock::now() < until) {
    ASSERT_TRUE(client->Touch("touched").ok());
    RecordAndStep(*client, id++);
    std::this_thread::sleep_for(milliseconds(250));
  }
  absl::StatusOr<std::vector<std::string>> consumers = client->ListConsumers();
  ASSERT_TRUE(consumers.ok()) << consumers.status();
  EXPECT_EQ(*consumers, (std::vector<std::string>{"declared", "touched"}));
  EXPECT_EQ(client->Touch("silent").code(), absl::StatusCode::kNotFound);
  // Nothing moved: the touched consumer reads every batch recorded.
  v1::GetDeltaRequest read;
  read.set_consumer("touched");
  absl::StatusOr<ReceivedDelta> delta = client->GetDelta(read);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(delta->tables["t"].ids.numel(), id);
}

TEST(SubscribeTest, DeltactlSubscribeAndServerShutdown) {
  ServerProcess server({"--consumers=s,t"});
  ASSERT_GT(server.port(), 0);
  auto producer = DeltaClient::Create(server.target());
  CommandResult cli;
  std::atomic<bool> cli_done{false};
  std::thread cli_thread([&] {
    cli = RunCommand(RunfilePath("clients/deltactl") +
                     " --target=" + server.target() +
                     " subscribe --json --consumer=s --count=2");
    cli_done = true;
  });
  // Steps until the CLI's second delta arrived and it exited.
  for (int64_t i = 0; i < 100 && !cli_done; ++i) {
    RecordAndStep(*producer, i);
    std::this_thread::sleep_for(milliseconds(100));
  }
  cli_thread.join();
  EXPECT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_EQ(std::count(cli.out.begin(), cli.out.end(), '\n'), 2) << cli.out;
  EXPECT_NE(cli.out.find("\"end_batch\""), std::string::npos) << cli.out;

  // A running subscription does not hold the server up at shutdown.
  Subscriber subscriber(server.target(), Every("t", 1, 0));
  ASSERT_TRUE(subscriber.WaitForEnd(producer->Status()->current_batch()));
  const auto stopping = steady_clock::now();
  EXPECT_EQ(server.Stop(SIGTERM), 0);
  EXPECT_LT(steady_clock::now() - stopping, std::chrono::seconds(3));
  absl::Status ended = subscriber.Stop();
  EXPECT_EQ(ended.code(), absl::StatusCode::kUnavailable) << ended;
}

}  // namespace
}  // namespace deltastream
