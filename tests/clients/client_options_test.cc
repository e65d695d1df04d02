// The client libraries' own pieces that need no server: option checks, the
// checkpoint job's retry window and its reading of a chain's end.
#include <ATen/core/Tensor.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "clients/checkpoint_chain.h"
#include "clients/checkpoint_job.h"
#include "clients/predictor.h"
#include "tests/testing/test_dirs.h"

namespace deltastream {
namespace {

using ::testing::HasSubstr;

TEST(PredictorOptionsTest, RefusesEmptyNamesAndNegativeIntervals) {
  PredictorOptions options;
  options.target = "127.0.0.1:1";
  EXPECT_TRUE(ValidatePredictorOptions(options).ok());
  PredictorOptions no_target = options;
  no_target.target.clear();
  EXPECT_THAT(std::string(ValidatePredictorOptions(no_target).message()),
              HasSubstr("--target"));
  PredictorOptions no_consumer = options;
  no_consumer.consumer.clear();
  EXPECT_THAT(std::string(ValidatePredictorOptions(no_consumer).message()),
              HasSubstr("--consumer"));
  for (int64_t PredictorOptions::*field :
       {&PredictorOptions::every_ms, &PredictorOptions::every_steps,
        &PredictorOptions::dense_every_steps,
        &PredictorOptions::dense_every_ms}) {
    PredictorOptions bad = options;
    bad.*field = -1;
    EXPECT_EQ(ValidatePredictorOptions(bad).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(CheckpointJobOptionsTest, RefusesEmptyNamesAndNegativeValues) {
  CheckpointJobOptions options;
  options.dir = "/tmp/chain";
  EXPECT_TRUE(ValidateCheckpointJobOptions(options).ok());
  EXPECT_EQ(options.retry_s, 60)
      << "a restarting trainer is retried by default";
  CheckpointJobOptions no_dir = options;
  no_dir.dir.clear();
  EXPECT_THAT(std::string(ValidateCheckpointJobOptions(no_dir).message()),
              HasSubstr("--dir"));
  for (int64_t CheckpointJobOptions::*field :
       {&CheckpointJobOptions::every_ms, &CheckpointJobOptions::count,
        &CheckpointJobOptions::compact_every, &CheckpointJobOptions::retry_s}) {
    CheckpointJobOptions bad = options;
    bad.*field = -1;
    EXPECT_EQ(ValidateCheckpointJobOptions(bad).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(UnreachableRetryTest, RetriesUnreachableAndSilentWithinTheWindow) {
  UnreachableRetry retry(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_TRUE(retry.ShouldRetry(absl::UnavailableError("refused"), t0));
  EXPECT_TRUE(retry.just_started());
  EXPECT_TRUE(retry.ShouldRetry(absl::CancelledError("shutdown"),
                                t0 + absl::Seconds(8)));
  EXPECT_FALSE(retry.just_started());
  EXPECT_TRUE(retry.ShouldRetry(absl::DeadlineExceededError("sent nothing"),
                                t0 + absl::Seconds(9)));
  EXPECT_FALSE(retry.ShouldRetry(absl::UnavailableError("refused"),
                                 t0 + absl::Seconds(10)));
  // A success starts a new window.
  retry.Succeeded();
  EXPECT_TRUE(retry.ShouldRetry(absl::UnavailableError("refused"),
                                t0 + absl::Seconds(60)));
}

TEST(UnreachableRetryTest, OtherErrorsAndAZeroWindowAreNotRetried) {
  UnreachableRetry retry(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(retry.ShouldRetry(absl::PermissionDeniedError("token"), t0));
  EXPECT_FALSE(retry.ShouldRetry(absl::InvalidArgumentError("bad"), t0));
  UnreachableRetry never(absl::ZeroDuration());
  EXPECT_FALSE(never.ShouldRetry(absl::UnavailableError("refused"), t0));
}

ReceivedDelta Read(int64_t start, int64_t end, bool all_rows,
                   const std::string& run_id) {
  ReceivedDelta delta;
  delta.header.set_start_batch(start);
  delta.header.set_end_batch(end);
  delta.header.set_all_rows(all_rows);
  delta.header.set_run_id(run_id);
  ReceivedTable& table = delta.tables["t"];
  table.ids = at::tensor({int64_t{1}, int64_t{2}}, at::kLong);
  table.values = at::ones({2, 3}, at::kFloat);
  return delta;
}

TEST(ReadChainEndTest, EndAndRunOfTheLastAppliedLink) {
  const std::string dir = FreshDir("chain_end");
  absl::StatusOr<HeldVersion> empty = ReadChainEnd(dir);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->end_batch, -1);

  ASSERT_TRUE(WriteChainLink(dir, Read(-1, 5, true, "run-a")).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(5, 8, false, "run-b")).ok());
  absl::StatusOr<HeldVersion> held = ReadChainEnd(dir);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->end_batch, 8);
  EXPECT_EQ(held->run_id, "run-b");
}

TEST(ReadChainEndTest, ABrokenChainIsRefused) {
  const std::string dir = FreshDir("chain_broken");
  ASSERT_TRUE(WriteChainLink(dir, Read(-1, 5, true, "run-a")).ok());
  ASSERT_TRUE(WriteChainLink(dir, Read(7, 8, false, "run-a")).ok());
  absl::StatusOr<HeldVersion> held = ReadChainEnd(dir);
  EXPECT_EQ(held.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(held.status().message()), HasSubstr("is broken"));
}

}  // namespace
}  // namespace deltastream
