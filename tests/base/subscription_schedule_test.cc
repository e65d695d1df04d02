// The subscription schedule on its own: when pushes are due, what each reads,
// when to wake, and the periods it refuses (issue 21, defect 4: periods near
// 2^63 overflowed and pushed empty deltas in a hot loop).
#include "base/subscription_schedule.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace deltastream {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

using Push = SubscriptionSchedule::Push;

SubscriptionSchedule Make(SubscriptionPeriods periods) {
  absl::StatusOr<SubscriptionSchedule> schedule =
      SubscriptionSchedule::Create(periods, kStart);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return *std::move(schedule);
}

TEST(SubscriptionScheduleTest, FirstPushAtOnceThenEveryNSteps) {
  SubscriptionSchedule schedule = Make({/*every_steps=*/3});
  EXPECT_TRUE(schedule.Due(0, kStart));
  Push first = schedule.NextPush(/*all_rows=*/true, false, 0, kStart);
  EXPECT_TRUE(first.all_rows);
  EXPECT_FALSE(first.continue_from.has_value());
  schedule.Pushed(first, /*end_batch=*/0, kStart);

  EXPECT_FALSE(schedule.Due(2, kStart + absl::Hours(1)));  // no timer
  EXPECT_TRUE(schedule.Due(3, kStart));
  Push second = schedule.NextPush(true, false, 3, kStart);
  EXPECT_FALSE(second.all_rows);  // only the first push
  ASSERT_TRUE(second.continue_from.has_value());
  EXPECT_EQ(*second.continue_from, 0);
  schedule.Pushed(second, 3, kStart);
  EXPECT_EQ(*schedule.NextPush(true, false, 6, kStart).continue_from, 3);
  // Waiting: for batch 5 (the one that makes it 3 past 3), at most `check`.
  const SubscriptionSchedule::Wake wake =
      schedule.NextWake(kStart, absl::Milliseconds(100));
  EXPECT_EQ(wake.after_batch, 5);
  EXPECT_EQ(wake.deadline, kStart + absl::Milliseconds(100));
}

TEST(SubscriptionScheduleTest, FirstPushStartsAtTheRequestsContinueFrom) {
  absl::StatusOr<SubscriptionSchedule> schedule =
      SubscriptionSchedule::Create({}, kStart, /*continue_from=*/7);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  // A read of every row is whole: it starts nowhere in particular.
  EXPECT_FALSE(schedule->NextPush(/*all_rows=*/true, false, 9, kStart)
                   .continue_from.has_value());
  Push first = schedule->NextPush(false, false, 9, kStart);
  ASSERT_TRUE(first.continue_from.has_value());
  EXPECT_EQ(*first.continue_from, 7);
  schedule->Pushed(first, 9, kStart);
  EXPECT_EQ(*schedule->NextPush(false, false, 10, kStart).continue_from, 9);
}

TEST(SubscriptionScheduleTest, TimerPushesOnlyWhenABatchClosed) {
  SubscriptionSchedule schedule = Make({/*every_steps=*/100, /*every_ms=*/50});
  schedule.Pushed(schedule.NextPush(false, false, 0, kStart), 0, kStart);
  const absl::Time later = kStart + absl::Milliseconds(60);
  EXPECT_FALSE(schedule.Due(0, later));  // nothing closed since
  EXPECT_TRUE(schedule.Due(1, later));
  EXPECT_FALSE(schedule.Due(1, kStart + absl::Milliseconds(10)));
  // Before the timer: wake at it; after: on any step.
  EXPECT_EQ(
      schedule
          .NextWake(kStart + absl::Milliseconds(10), absl::Milliseconds(100))
          .deadline,
      kStart + absl::Milliseconds(50));
  EXPECT_EQ(schedule.NextWake(later, absl::Milliseconds(100)).after_batch, 0);
}

TEST(SubscriptionScheduleTest, DenseByItsOwnPeriods) {
  SubscriptionSchedule every_push = Make({});
  for (int64_t b = 0; b < 3; ++b) {
    Push read = every_push.NextPush(false, /*include_dense=*/true, b, kStart);
    EXPECT_TRUE(read.include_dense);
    every_push.Pushed(read, b, kStart);
  }
  SubscriptionSchedule by_steps = Make({1, 0, /*dense_every_steps=*/4});
  Push read = by_steps.NextPush(false, true, 0, kStart);
  EXPECT_TRUE(read.include_dense);  // the first push carries them
  by_steps.Pushed(read, 0, kStart);
  EXPECT_FALSE(by_steps.NextPush(false, true, 3, kStart).include_dense);
  EXPECT_TRUE(by_steps.NextPush(false, true, 4, kStart).include_dense);
  SubscriptionSchedule by_time = Make({1, 0, 0, /*dense_every_ms=*/1000});
  by_time.Pushed(by_time.NextPush(false, true, 0, kStart), 0, kStart);
  EXPECT_FALSE(by_time.NextPush(false, true, 1, kStart + absl::Seconds(0.5))
                   .include_dense);
  EXPECT_TRUE(by_time.NextPush(false, true, 1, kStart + absl::Seconds(1))
                  .include_dense);
  // Not asked for: never.
  EXPECT_FALSE(Make({}).NextPush(false, false, 0, kStart).include_dense);
}

TEST(SubscriptionScheduleTest, PeriodsOutOfRangeAreRefusedByName) {
  constexpr int64_t kHuge = std::numeric_limits<int64_t>::max() - 1;
  for (const auto& [periods, field] :
       std::vector<std::pair<SubscriptionPeriods, std::string>>{
           {{kHuge}, "every_steps"},
           {{-1}, "every_steps"},
           {{0, kHuge}, "every_ms"},
           {{0, std::numeric_limits<int64_t>::min()}, "every_ms"},
           {{0, 0, kHuge}, "dense_every_steps"},
           {{0, 0, 0, kHuge}, "dense_every_ms"},
           {{SubscriptionSchedule::kMaxEverySteps + 1}, "every_steps"}}) {
    absl::StatusOr<SubscriptionSchedule> schedule =
        SubscriptionSchedule::Create(periods, kStart);
    ASSERT_FALSE(schedule.ok()) << field;
    EXPECT_EQ(schedule.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(schedule.status().message().rfind(field + " must be", 0), 0)
        << schedule.status();
  }
}

TEST(SubscriptionScheduleTest, LargestPeriodsNeverOverflow) {
  SubscriptionSchedule schedule = Make({SubscriptionSchedule::kMaxEverySteps,
                                        SubscriptionSchedule::kMaxEveryMs,
                                        SubscriptionSchedule::kMaxEverySteps,
                                        SubscriptionSchedule::kMaxEveryMs});
  schedule.Pushed(schedule.NextPush(false, false, 0, kStart), 0, kStart);
  // Far in the future, with a huge batch: nothing wraps into "due".
  EXPECT_FALSE(schedule.Due(0, absl::InfiniteFuture()));
  EXPECT_FALSE(schedule.Due(SubscriptionSchedule::kMaxEverySteps - 1, kStart));
  EXPECT_TRUE(schedule.Due(SubscriptionSchedule::kMaxEverySteps, kStart));
  const SubscriptionSchedule::Wake wake =
      schedule.NextWake(kStart, absl::Milliseconds(100));
  EXPECT_EQ(wake.after_batch, SubscriptionSchedule::kMaxEverySteps - 1);
  EXPECT_EQ(wake.deadline, kStart + absl::Milliseconds(100));
}

}  // namespace
}  // namespace deltastream
