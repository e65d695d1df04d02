#include "clients/delta_continuity.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace deltastream {
namespace {

using ::testing::HasSubstr;

v1::DeltaHeader Header(int64_t start, int64_t end,
                       const std::string& run_id = "run-a",
                       int64_t run_start = 0) {
  v1::DeltaHeader header;
  header.set_start_batch(start);
  header.set_end_batch(end);
  header.set_run_id(run_id);
  header.set_run_start_batch(run_start);
  return header;
}

const HeldVersion kHeld{10, "run-a"};

TEST(DeltaContinuityTest, ADeltaFromWhereTheHolderEndsContinues) {
  const DeltaVerdict verdict = ClassifyDelta(kHeld, 10, Header(10, 12));
  EXPECT_EQ(verdict.fit, DeltaFit::kContinues);
  EXPECT_FALSE(verdict.must_resync());
  EXPECT_TRUE(verdict.reason.empty());
}

TEST(DeltaContinuityTest, ARedeliveryOverlappingTheHeldBatchesContinues) {
  EXPECT_EQ(ClassifyDelta(kHeld, 10, Header(7, 12)).fit, DeltaFit::kContinues);
  // A consumer's first read starts at -1 (before batch 0).
  EXPECT_EQ(ClassifyDelta({0, "run-a"}, 0, Header(-1, 3)).fit,
            DeltaFit::kContinues);
}

TEST(DeltaContinuityTest, NothingNewIsHeldAlready) {
  EXPECT_EQ(ClassifyDelta(kHeld, 10, Header(7, 10)).fit,
            DeltaFit::kHeldAlready);
  EXPECT_EQ(ClassifyDelta(kHeld, 10, Header(10, 10)).fit,
            DeltaFit::kHeldAlready);
  // Pending deltas count: what is staged up to 14 covers a push to 13.
  EXPECT_EQ(ClassifyDelta(kHeld, 14, Header(12, 13)).fit,
            DeltaFit::kHeldAlready);
}

TEST(DeltaContinuityTest, ADeltaStartingAfterWhatIsCoveredIsAGap) {
  const DeltaVerdict verdict = ClassifyDelta(kHeld, 10, Header(11, 12));
  EXPECT_EQ(verdict.fit, DeltaFit::kGap);
  EXPECT_TRUE(verdict.must_resync());
  EXPECT_THAT(verdict.reason, HasSubstr("starts at batch 11"));
  // Staged deltas extend what is covered.
  EXPECT_EQ(ClassifyDelta(kHeld, 11, Header(11, 12)).fit, DeltaFit::kContinues);
}

TEST(DeltaContinuityTest, HoldingNothingIsAGap) {
  const DeltaVerdict verdict = ClassifyDelta(HeldVersion{}, -1, Header(0, 3));
  EXPECT_EQ(verdict.fit, DeltaFit::kGap);
  EXPECT_THAT(verdict.reason, HasSubstr("nothing is held"));
}

TEST(DeltaContinuityTest, DroppedRowsNeedAResync) {
  v1::DeltaHeader header = Header(10, 12);
  header.set_resync_required(true);
  header.set_lost_rows(7);
  const DeltaVerdict verdict = ClassifyDelta(kHeld, 10, header);
  EXPECT_EQ(verdict.fit, DeltaFit::kRowsDropped);
  EXPECT_THAT(verdict.reason, HasSubstr("dropped 7 IDs"));
}

TEST(DeltaContinuityTest, ARunRestartedBehindTheHolderComesFirst) {
  v1::DeltaHeader header = Header(11, 12, "run-b", /*run_start=*/6);
  header.set_resync_required(true);
  const DeltaVerdict verdict = ClassifyDelta(kHeld, 10, header);
  EXPECT_EQ(verdict.fit, DeltaFit::kRunRestarted);
  EXPECT_THAT(verdict.reason, HasSubstr("run run-b from batch 6"));
}

TEST(DeltaContinuityTest, ARunRestartedAtOrAfterTheHeldEndContinues) {
  EXPECT_EQ(ClassifyDelta(kHeld, 10, Header(10, 12, "run-b", 10)).fit,
            DeltaFit::kContinues);
  EXPECT_FALSE(RunLostHeldBatches(kHeld, "run-b", 10));
  EXPECT_TRUE(RunLostHeldBatches(kHeld, "run-b", 9));
}

TEST(DeltaContinuityTest, RunIdsThatAreNotKnown) {
  // The holder's run unknown: another run.
  EXPECT_TRUE(RunLostHeldBatches({10, ""}, "run-b", 9));
  // The delta says no run: no restart can be told.
  EXPECT_FALSE(RunLostHeldBatches(kHeld, "", 0));
  // Holding nothing, nothing is lost.
  EXPECT_FALSE(RunLostHeldBatches(HeldVersion{}, "run-b", 0));
  // The same run never lost what it sent.
  EXPECT_FALSE(RunLostHeldBatches(kHeld, "run-a", 0));
}

}  // namespace
}  // namespace deltastream
