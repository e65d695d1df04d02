// StepCuts (tracker_service/step_cuts.h) on its own, with real threads: a
// read waits for the trainer's boundary, the trainer holds until the read is
// finished, a cut nobody agrees on times out and is withdrawn, and a trainer
// that does not step lets reads through at once.
#include "tracker_service/step_cuts.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace deltastream {
namespace {

// Polls until `condition` or 10 s (a failing test never hangs).
template <typename Condition>
bool Eventually(Condition condition) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(StepCutsTest, ReadWaitsForTheBoundaryAndTheBoundaryForTheRead) {
  StepCuts cuts(/*stepping=*/true);
  std::atomic<int> phase{0};  // 1: opened, 2: read finished
  std::thread reader([&] {
    ASSERT_TRUE(cuts.Await(7, absl::Now() + absl::Seconds(10)).ok());
    phase = 1;
    absl::SleepFor(absl::Milliseconds(50));  // the read
    phase = 2;
    cuts.Finish(7);
  });
  ASSERT_TRUE(Eventually([&] { return cuts.Waiting().size() == 1; }));
  EXPECT_EQ(phase.load(), 0);  // not before the boundary
  EXPECT_EQ(cuts.Waiting(), std::vector<int64_t>{7});
  EXPECT_EQ(cuts.Serve({7}, absl::Now() + absl::Seconds(10)), 1);
  EXPECT_EQ(phase.load(), 2);  // the boundary held until the read ended
  reader.join();
  EXPECT_TRUE(cuts.Waiting().empty());
}

TEST(StepCutsTest, CutsNotAgreedStayWaitingAndTimeOut) {
  StepCuts cuts(/*stepping=*/true);
  absl::Status status;
  std::thread reader(
      [&] { status = cuts.Await(5, absl::Now() + absl::Milliseconds(200)); });
  ASSERT_TRUE(Eventually([&] { return !cuts.Waiting().empty(); }));
  // Another rank lacks 5: this boundary serves another cut only.
  EXPECT_EQ(cuts.Serve({6}, absl::Now() + absl::Seconds(1)), 0);
  reader.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_TRUE(cuts.Waiting().empty());  // withdrawn
  // The withdrawn cut, agreed later, opens nothing and holds nothing.
  EXPECT_EQ(cuts.Serve({5}, absl::Now() + absl::Seconds(10)), 0);
}

TEST(StepCutsTest, ACancelledReadIsWithdrawnAtOnce) {
  StepCuts cuts(/*stepping=*/true);
  std::atomic<bool> cancel{false};
  absl::Status status;
  absl::Time returned;
  std::thread reader([&] {
    status = cuts.Await(5, absl::Now() + absl::Seconds(30),
                        [&] { return cancel.load(); });
    returned = absl::Now();
  });
  ASSERT_TRUE(Eventually([&] { return !cuts.Waiting().empty(); }));
  const absl::Time cancelled_at = absl::Now();
  cancel.store(true);
  reader.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_LT(returned - cancelled_at, absl::Seconds(5));
  EXPECT_TRUE(cuts.Waiting().empty());  // withdrawn
  EXPECT_EQ(cuts.Serve({5}, absl::Now() + absl::Seconds(1)), 0);
}

TEST(StepCutsTest, NotSteppingReadsAtOnceAndReleasesWaiters) {
  StepCuts cuts(/*stepping=*/true);
  absl::Status status = absl::UnknownError("not yet");
  std::thread reader([&] {
    status = cuts.Await(3, absl::Now() + absl::Seconds(10));
    cuts.Finish(3);
  });
  ASSERT_TRUE(Eventually([&] { return !cuts.Waiting().empty(); }));
  cuts.SetStepping(false);  // the ranks stopped together
  reader.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_TRUE(cuts.Await(4, absl::InfinitePast()).ok());  // no wait at all
  cuts.Finish(4);
  EXPECT_TRUE(cuts.Waiting().empty());
}

TEST(StepCutsTest, RefusesCutZeroAndADuplicate) {
  StepCuts cuts(/*stepping=*/true);
  EXPECT_EQ(cuts.Await(0, absl::Now()).code(),
            absl::StatusCode::kInvalidArgument);
  std::thread reader(
      [&] { (void)cuts.Await(9, absl::Now() + absl::Milliseconds(300)); });
  ASSERT_TRUE(Eventually([&] { return !cuts.Waiting().empty(); }));
  EXPECT_EQ(cuts.Await(9, absl::Now() + absl::Seconds(1)).code(),
            absl::StatusCode::kAlreadyExists);
  reader.join();
}

// A cut read while the trainer does not step is refused twice at once, like
// any other; once finished, its id is free again, also when the trainer
// began to step before it finished.
TEST(StepCutsTest, ACutReadWithoutStepsIsOneReadAndLetsItsIdGo) {
  StepCuts cuts(/*stepping=*/false);
  ASSERT_TRUE(cuts.Await(6, absl::InfinitePast()).ok());
  EXPECT_EQ(cuts.Await(6, absl::InfinitePast()).code(),
            absl::StatusCode::kAlreadyExists);
  cuts.SetStepping(true);
  cuts.Finish(6);
  std::thread reader([&] {
    EXPECT_TRUE(cuts.Await(6, absl::Now() + absl::Seconds(10)).ok());
    cuts.Finish(6);
  });
  ASSERT_TRUE(
      Eventually([&] { return cuts.Waiting() == std::vector<int64_t>{6}; }));
  EXPECT_EQ(cuts.Serve({6}, absl::Now() + absl::Seconds(10)), 1);
  reader.join();
}

TEST(StepCutsTest, ABoundaryServesAtMostItsShareAndLetsGoAtItsDeadline) {
  StepCuts cuts(/*stepping=*/true);
  std::vector<std::thread> readers;
  std::atomic<int> finished{0};
  std::atomic<int64_t> slow_cut{-1};
  for (int64_t cut = 1; cut <= StepCuts::kMaxPerBoundary + 2; ++cut) {
    readers.emplace_back([&, cut] {
      if (cuts.Await(cut, absl::Now() + absl::Seconds(10)).ok()) {
        if (cut == slow_cut) absl::SleepFor(absl::Milliseconds(300));
        cuts.Finish(cut);
        ++finished;
      }
    });
  }
  ASSERT_TRUE(Eventually(
      [&] { return cuts.Waiting().size() == StepCuts::kMaxPerBoundary; }));
  std::vector<int64_t> first = cuts.Waiting();
  slow_cut = first[0];  // its read takes longer than the boundary holds
  // The trainer goes on at the hold's deadline.
  EXPECT_EQ(cuts.Serve(first, absl::Now() + absl::Milliseconds(100)),
            StepCuts::kMaxPerBoundary - 1);
  std::vector<int64_t> second = cuts.Waiting();
  EXPECT_EQ(second.size(), 2u);
  EXPECT_EQ(cuts.Serve(second, absl::Now() + absl::Seconds(10)), 2);
  for (std::thread& reader : readers) reader.join();
  EXPECT_EQ(finished.load(), StepCuts::kMaxPerBoundary + 2);
  EXPECT_TRUE(cuts.Waiting().empty());
}

}  // namespace
}  // namespace deltastream
