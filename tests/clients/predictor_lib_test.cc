// The predictor as a library, against a real tracker_server on loopback
// (which serves no live rows: a predictor must refuse to follow it).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "clients/predictor.h"
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

}  // namespace
}  // namespace deltastream
