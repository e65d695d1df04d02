// The predictor as a library, against a real tracker_server on loopback
// (which serves no live rows: a predictor must refuse to follow it), and
// against a trainer that never answers a read (Stop() ends it at once).
#include <gmock/gmock.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "base/grpc_server.h"
#include "clients/predictor.h"
#include "proto/tracker.pb.h"
#include "tests/integration/server_process.h"

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
  started->server->Shutdown();
}

}  // namespace
}  // namespace deltastream
