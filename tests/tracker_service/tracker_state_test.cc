// The tracker's save and restore (snapshots), and waiting for batches.
#include <ATen/core/Tensor.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <set>
#include <thread>

#include "absl/time/clock.h"
#include "proto/snapshot.pb.h"
#include "tests/tracker_service/tracker_fixture.h"
#include "tracker_service/tracker_snapshots.h"

namespace deltastream {
namespace {

TEST(TrackerStateTest, RestoreRefusesAnotherModeOrUntrackedTables) {
  TrackerOptions options = EmbeddingOptions();
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(
      tracker->RecordTables({{kT1, Ids({1, 2}), at::ones({2, 3})}}).ok());
  tracker->Step();
  TrackerState state = tracker->SaveState();
  EXPECT_EQ(state.current_batch, 1);
  ASSERT_EQ(state.tables.size(), 1u);

  options.mode = TrackingMode::kIdOnly;
  auto id_only = MakeTracker(options);
  absl::Status status = id_only->RestoreState(state);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("taken in embedding mode"), std::string::npos)
      << status;

  options.mode = TrackingMode::kEmbedding;
  options.modules = {{"sparse.ec", false, {{"other", {"f9"}}}}};
  options.fqns_to_skip.clear();  // no "ebc" among these modules
  auto other_tables = MakeTracker(options);
  status = other_tables->RestoreState(state);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(other_tables->current_batch(), 0);  // unchanged
}

TEST(TrackerStateTest, PendingReadsSurviveSnapshots) {
  TrackerOptions options;
  options.acknowledged_reads = true;
  options.fqns_to_skip = {"ebc"};
  auto tracker = MakeTracker(options);
  std::vector<int64_t> ends;
  for (int64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({id})}}).ok());
    ends.push_back(Read(*tracker).end_batch);
    tracker->Step();
  }
  DeltaRequest only_t1;
  only_t1.fqns = {kT1};
  ASSERT_TRUE(tracker->GetDelta(only_t1).ok());
  tracker->RequireResync();
  TrackerState saved = tracker->SaveState();
  ASSERT_EQ(saved.consumers.at(0).pending_reads.size(), 4u);

  TrackerState decoded;
  ASSERT_TRUE(
      DecodeTrackerState(EncodeTrackerState(saved, options), &decoded).ok());
  const std::vector<PendingRead>& reads = decoded.consumers.at(0).pending_reads;
  ASSERT_EQ(reads.size(), 4u);
  EXPECT_EQ(reads[3].fqns, std::vector<std::string>{kT1});
  for (const PendingRead& read : reads) {
    EXPECT_EQ(read.lost_through, INT64_MAX);
  }

  decoded.tables = std::move(saved.tables);  // stored beside the state
  auto restored = MakeTracker(options);
  ASSERT_TRUE(restored->RestoreState(std::move(decoded)).ok());
  ASSERT_TRUE(restored->Commit("default", ends[1]).ok());
  EXPECT_TRUE(restored->Status().consumers[0].resync_required);
  Delta next = Read(*restored);
  EXPECT_TRUE(next.resync_required);
  EXPECT_EQ(IdsOf(next, kT1), std::vector<int64_t>{3});
}

// A trainer whose tracker was restored from an older step than its model
// (a rank killed between its checkpoint and its snapshot) tells only the
// consumers that had not read through the unrecorded steps to resync.
TEST(TrackerStateTest, ResyncBeforeABatchTellsOnlyConsumersBehindIt) {
  TrackerOptions options;
  options.acknowledged_reads = true;
  options.fqns_to_skip = {"ebc"};
  auto tracker = MakeTracker(options);
  for (const char* name : {"through", "behind", "pending"}) {
    ASSERT_TRUE(tracker->AddConsumer(name).ok());
  }
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
  tracker->Step();
  const int64_t early = Read(*tracker, "behind").end_batch;
  ASSERT_TRUE(tracker->Commit("behind", early).ok());
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
  tracker->Step();
  const int64_t end = Read(*tracker, "through").end_batch;
  ASSERT_TRUE(tracker->Commit("through", end).ok());
  ASSERT_EQ(Read(*tracker, "pending").end_batch, end);  // not committed
  ASSERT_LT(early, end);

  tracker->RequireResyncBefore(end);
  auto resync = [&](const std::string& name) {
    for (const ConsumerStatus& c : tracker->Status().consumers) {
      if (c.name == name) return c.resync_required;
    }
    ADD_FAILURE() << "no consumer " << name;
    return false;
  };
  EXPECT_FALSE(resync("through"));
  EXPECT_TRUE(resync("behind"));
  EXPECT_TRUE(resync("default"));  // never read
  // A read delivered before, ending at the batch, held the missing steps.
  EXPECT_TRUE(resync("pending"));
  ASSERT_TRUE(tracker->Commit("pending", end).ok());
  EXPECT_FALSE(resync("pending"));
}

TEST(TrackerStateTest, OlderSnapshotsPendingReadIsRestored) {
  // Snapshots written before pending_reads held the newest read only.
  TrackerOptions options;
  options.acknowledged_reads = true;
  v1::TrackerState old;
  old.set_mode("id_only");
  old.set_current_batch(5);
  v1::ConsumerState* consumer = old.add_consumers();
  consumer->set_name("default");
  consumer->set_cursor(2);
  consumer->set_has_pending_read(true);
  consumer->set_pending_end(4);
  TrackerState decoded;
  ASSERT_TRUE(DecodeTrackerState(old.SerializeAsString(), &decoded).ok());
  auto restored = MakeTracker(options);
  ASSERT_TRUE(restored->RestoreState(std::move(decoded)).ok());
  EXPECT_EQ(restored->Status().consumers[0].pending_end, 4);
  ASSERT_TRUE(restored->Commit("default", 4).ok());
  EXPECT_EQ(restored->Status().consumers[0].cursor, 4);
}

TEST(TrackerStateTest, RestoreAddsConfiguredConsumersAtTheRestoredBatch) {
  TrackerOptions options;
  options.consumers = {"a"};
  options.fqns_to_skip = {"ebc"};
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({4})}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker->AddConsumer("runtime").ok());
  TrackerState state = tracker->SaveState();

  options.consumers = {"a", "new"};
  auto restored = MakeTracker(options);
  ASSERT_TRUE(restored->RestoreState(std::move(state)).ok());
  EXPECT_EQ(restored->Consumers(),
            (std::vector<std::string>{"a", "new", "runtime"}));
  EXPECT_EQ(IdsOf(Read(*restored, "a"), kT1), std::vector<int64_t>{4});
  EXPECT_EQ(IdsOf(Read(*restored, "new"), kT1), std::vector<int64_t>{});
}

TEST(TrackerStateTest, WaitForBatchAfterWakesOnStepOrDeadline) {
  auto tracker = MakeTracker({});
  const absl::Time start = absl::Now();
  EXPECT_EQ(tracker->WaitForBatchAfter(0, start + absl::Milliseconds(50)), 0);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  std::thread stepper([&] {
    absl::SleepFor(absl::Milliseconds(20));
    tracker->Step();
  });
  EXPECT_EQ(tracker->WaitForBatchAfter(0, absl::InfiniteFuture()), 1);
  stepper.join();
}

// A snapshot holding what RecordTables refuses (states of width 0, taken
// before the rule) is refused at restore, and the tracker is unchanged
// (issue 21, defect 3: the poison survived a snapshot and restart).
TEST(TrackerStateTest, RestoreRefusesPoisonedTablesAndChangesNothing) {
  auto tracker = MakeTracker(EmbeddingOptions());
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1}), at::ones({1, 2})}}).ok());
  TrackerState poisoned = tracker->SaveState();
  StoredTable bad;
  bad.fqn = kT2;
  bad.state_dim = 0;
  bad.lookups.push_back({0, Ids({3, 4}), at::ones({2, 0})});
  poisoned.tables.push_back(bad);
  const absl::Status status = tracker->RestoreState(poisoned);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(kT2), std::string::npos) << status;
  EXPECT_EQ(IdsOf(Read(*tracker), kT1), (std::vector<int64_t>{1}));
}

}  // namespace
}  // namespace deltastream
