// The tracker refuses misuse and changes nothing; the memory cap.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "tests/tracker_service/tracker_fixture.h"

namespace deltastream {
namespace {

TEST(TrackerTest, MisuseIsRefusedAndChangesNothing) {
  auto tracker = MakeTracker(EmbeddingOptions());
  ASSERT_TRUE(
      tracker->RecordTables({{kT1, Ids({1, 2}), at::ones({2, 4})}}).ok());
  const int64_t bytes = tracker->Status().usage.total.bytes;

  // IDs and states of different lengths.
  EXPECT_EQ(
      tracker->RecordTables({{kT1, Ids({1, 2, 3}), at::ones({2, 4})}}).code(),
      absl::StatusCode::kInvalidArgument);
  // A state dim that changes.
  EXPECT_EQ(tracker->RecordTables({{kT1, Ids({1}), at::ones({1, 8})}}).code(),
            absl::StatusCode::kInvalidArgument);
  // A name that breaks the name rule; a good table before it is not
  // recorded either.
  auto status = tracker->RecordTables({{kT2, Ids({1}), at::ones({1, 4})},
                                       {"no pe", Ids({1}), at::ones({1, 4})}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'no pe'"), std::string::npos);
  // States of width 0 (a poison record: kept, it broke every later read).
  EXPECT_EQ(
      tracker->RecordTables({{kT2, Ids({1, 2}), at::ones({2, 0})}}).code(),
      absl::StatusCode::kInvalidArgument);
  // Float IDs.
  EXPECT_EQ(
      tracker->RecordTables({{kT1, at::ones({1}), at::ones({1, 4})}}).code(),
      absl::StatusCode::kInvalidArgument);
  // Missing embeddings.
  EXPECT_EQ(tracker->RecordTables({{kT1, Ids({1})}}).code(),
            absl::StatusCode::kInvalidArgument);
  // A table that is not tracked, and one that is skipped (ignored).
  EXPECT_EQ(tracker->RecordTables({{"other.table", Ids({1}), at::ones({1, 4})}})
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(tracker->RecordTables({{kT3, Ids({1}), at::ones({1, 4})}}).ok());
  // Skipped tables are ignored; the others of the record are kept.
  ASSERT_TRUE(tracker
                  ->RecordTables({{kT3, Ids({8}), at::zeros({1, 4})},
                                  {kT1, Ids({9}), at::ones({1, 4})}})
                  .ok());
  DeltaRequest unknown;
  unknown.consumer = "nobody";
  EXPECT_EQ(tracker->GetDelta(unknown).status().code(),
            absl::StatusCode::kNotFound);

  Delta delta = Read(*tracker);
  EXPECT_EQ(IdsOf(delta, kT1), (std::vector<int64_t>{1, 2, 9}));
  EXPECT_EQ(ToFloats(delta.tables[kT1].states[2]),
            (std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(delta.tables.count(kT3), 0u);
  EXPECT_GT(bytes, 0);
}

TEST(TrackerTest, MemoryCapCompactsFirst) {
  TrackerOptions options;
  options.consumers = {"a"};
  // Far below 10 raw lookups, above their compaction: compaction suffices.
  options.memory_cap_bytes = 4096;
  auto tracker = MakeTracker(options);
  for (int b = 0; b < 10; ++b) {
    ASSERT_TRUE(tracker->RecordTables({{kT1, at::arange(64, at::kLong)}}).ok());
    tracker->Step();
  }
  TrackerStatus status = tracker->Status();
  EXPECT_LE(status.usage.total.bytes, 4096);
  EXPECT_GT(status.cap_compactions, 0);
  EXPECT_EQ(status.cap_drops, 0);
  Delta delta = Read(*tracker, "a");
  EXPECT_FALSE(delta.resync_required);
  EXPECT_EQ(IdsOf(delta, kT1).size(), 64u);
}

TEST(TrackerTest, MemoryCapDropsOldestAndTellsLaggingConsumers) {
  TrackerOptions options;
  options.consumers = {"fast", "slow"};
  options.memory_cap_bytes = 3 * 64 * 8 + 1;  // about three batches of IDs
  auto tracker = MakeTracker(options);
  for (int64_t b = 0; b < 10; ++b) {
    // Disjoint IDs far apart, so compaction cannot shrink them.
    ASSERT_TRUE(
        tracker
            ->RecordTables(
                {{kT1, at::arange(b * 64, (b + 1) * 64, at::kLong) * 1000003}})
            .ok());
    Read(*tracker, "fast");
    tracker->Step();
  }
  TrackerStatus status = tracker->Status();
  EXPECT_LE(status.usage.total.bytes, options.memory_cap_bytes);
  EXPECT_GT(status.cap_drops, 0);
  EXPECT_GT(status.dropped_ids, 0);
  EXPECT_TRUE(std::find_if(status.consumers.begin(), status.consumers.end(),
                           [](const ConsumerStatus& c) {
                             return c.name == "slow" && c.resync_required;
                           }) != status.consumers.end());
  Delta slow = Read(*tracker, "slow");
  EXPECT_TRUE(slow.resync_required);
  EXPECT_GT(slow.lost_rows, 0);
  EXPECT_FALSE(IdsOf(slow, kT1).empty());  // what is left is still delivered
  EXPECT_FALSE(Read(*tracker, "slow").resync_required);  // told once
  EXPECT_FALSE(Read(*tracker, "fast").resync_required);
}

// Memory cap with acknowledged reads: a commit ends a resync only when no
// row the consumer lacks was dropped after the committed read was delivered.
struct CappedAcknowledgedTracker {
  std::unique_ptr<Tracker> tracker;
  int64_t next_batch = 0;

  CappedAcknowledgedTracker() {
    TrackerOptions options;
    options.acknowledged_reads = true;
    options.memory_cap_bytes = 3 * 64 * 8 + 1;  // about three batches of IDs
    tracker = MakeTracker(options);
  }
  // One batch of 64 IDs compaction cannot shrink.
  void RecordBatch() {
    const int64_t b = next_batch++;
    ASSERT_TRUE(
        tracker
            ->RecordTables(
                {{kT1, at::arange(b * 64, (b + 1) * 64, at::kLong) * 1000003}})
            .ok());
    tracker->Step();
  }
  ConsumerStatus Consumer() { return tracker->Status().consumers.at(0); }
};

TEST(TrackerTest, CommitKeepsResyncForRowsDroppedAfterTheRead) {
  CappedAcknowledgedTracker t;
  t.RecordBatch();
  Delta read = Read(*t.tracker);
  EXPECT_FALSE(read.resync_required);
  // Ten more batches push the read's own range and later ones out.
  for (int i = 0; i < 10; ++i) t.RecordBatch();
  ASSERT_GT(t.tracker->Status().cap_drops, 0);
  ASSERT_TRUE(t.tracker->Commit("default", read.end_batch).ok());
  EXPECT_TRUE(t.Consumer().resync_required);  // rows after its end are gone
  Delta next = Read(*t.tracker);
  EXPECT_TRUE(next.resync_required);
  EXPECT_GT(next.lost_rows, 0);
  ASSERT_TRUE(t.tracker->Commit("default", next.end_batch).ok());
  EXPECT_FALSE(t.Consumer().resync_required);  // told, and committed
}

TEST(TrackerTest, CommitEndsResyncWhenOnlyRowsTheReadHeldWereDropped) {
  CappedAcknowledgedTracker t;
  t.RecordBatch();
  t.RecordBatch();
  Delta read = Read(*t.tracker);
  ASSERT_EQ(t.tracker->Status().cap_drops, 0);
  // Over the cap: the oldest batches go, which the read delivered.
  while (t.tracker->Status().cap_drops == 0) t.RecordBatch();
  ASSERT_LE(t.next_batch, 4);
  EXPECT_TRUE(t.Consumer().resync_required);
  ASSERT_TRUE(t.tracker->Commit("default", read.end_batch).ok());
  EXPECT_FALSE(t.Consumer().resync_required);
  EXPECT_FALSE(Read(*t.tracker).resync_required);
}

// A read of the closed batches of `fqns` (empty: every table).
Delta ReadClosed(Tracker& tracker, std::vector<std::string> fqns = {}) {
  DeltaRequest request;
  request.fqns = std::move(fqns);
  request.through_current_batch = false;
  absl::StatusOr<Delta> delta = tracker.GetDelta(request);
  EXPECT_TRUE(delta.ok()) << delta.status();
  return delta.ok() ? *std::move(delta) : Delta();
}

// A read of one table did not hold the rows of another: rows of t2 dropped
// after a read of t1 alone was delivered keep the resync when that read is
// committed (before, the commit ended it and t2's rows were lost silently).
TEST(TrackerTest, CommitOfAReadOfOneTableKeepsResyncForAnothersRows) {
  TrackerOptions options;
  options.acknowledged_reads = true;
  options.memory_cap_bytes = 3 * 64 * 8;  // three lookups of 64 IDs
  auto tracker = MakeTracker(options);
  const auto ids = [](int64_t from) {
    return at::arange(from, from + 64, at::kLong);
  };
  ASSERT_TRUE(tracker->RecordTables({{kT1, ids(0)}, {kT2, ids(0)}}).ok());
  tracker->Step();
  const Delta read = ReadClosed(*tracker, {kT1});
  EXPECT_FALSE(read.resync_required);
  // Over the cap: batch 0 goes, t2's rows of it never read.
  ASSERT_TRUE(
      tracker->RecordTables({{kT2, at::arange(64, 192, at::kLong)}}).ok());
  ASSERT_GT(tracker->Status().cap_drops, 0);
  ASSERT_TRUE(tracker->Commit("default", read.end_batch).ok());
  EXPECT_TRUE(tracker->Status().consumers.at(0).resync_required);
  const Delta next = ReadClosed(*tracker, {kT2});
  EXPECT_TRUE(next.resync_required);
  EXPECT_GT(next.lost_rows, 0);
}

// The same for a loss of every table before a batch (a restart whose tracker
// is behind its model): a read of one table did not hold the others.
TEST(TrackerTest, ResyncBeforeABatchOutlivesACommitOfOneTable) {
  TrackerOptions options;
  options.acknowledged_reads = true;
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}, {kT2, Ids({2})}}).ok());
  tracker->Step();
  tracker->Step();
  const Delta read = ReadClosed(*tracker, {kT1});
  ASSERT_EQ(read.end_batch, 2);
  tracker->RequireResyncBefore(1);
  ASSERT_TRUE(tracker->Commit("default", read.end_batch).ok());
  EXPECT_TRUE(tracker->Status().consumers.at(0).resync_required);
  // A read of every table ending after the loss ends it.
  const Delta whole = ReadClosed(*tracker);
  EXPECT_TRUE(whole.resync_required);
  ASSERT_TRUE(tracker->Commit("default", whole.end_batch).ok());
  EXPECT_FALSE(tracker->Status().consumers.at(0).resync_required);
}

// A table named twice in a read is read once: its top-k applies once.
TEST(TrackerTest, ATableNamedTwiceIsReadOnce) {
  TensorRowsReader reader;
  // Momentum norms 1..4 for IDs 0..3.
  reader.SetTable(kT1, at::zeros({4, 2}),
                  at::stack({at::arange(1, 5, at::kFloat), at::zeros({4})}, 1));
  TrackerOptions options;
  options.mode = TrackingMode::kMomentumLast;
  auto tracker = MakeTracker(options, &reader);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({0, 1, 2, 3})}}).ok());
  tracker->Step();
  DeltaRequest request;
  request.fqns = {kT1, kT1};
  request.top_k = TopK::Percentage(50);
  request.through_current_batch = false;
  absl::StatusOr<Delta> delta = tracker->GetDelta(request);
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(IdsOf(*delta, kT1), (std::vector<int64_t>{2, 3}));
}

// An embedding-mode tracker of t1 alone, over a live 10 x 2 table of zeros.
std::unique_ptr<Tracker> EmbeddingTrackerOfT1(TensorRowsReader& reader) {
  reader.SetTable(kT1, at::zeros({10, 2}));
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.fqns_to_skip = {"ebc", "t2"};
  return MakeTracker(options, &reader);
}

// Records from the network (check_values): IDs are row indices and states are
// finite; a refused record changes nothing, and the consumers' reads are
// those they would have been without it (issue 21, defects 3 and 9).
TEST(TrackerTest, CheckedRecordsRefuseWhatWouldPoisonReads) {
  TensorRowsReader reader;
  auto tracker = EmbeddingTrackerOfT1(reader);
  ASSERT_TRUE(tracker
                  ->RecordTables({{kT1, Ids({1, 2}), at::ones({2, 2})}},
                                 /*check_values=*/true)
                  .ok());
  const int64_t bytes = tracker->Status().usage.total.bytes;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const TableLookup& bad : std::vector<TableLookup>{
           {kT1, Ids({-1}), at::ones({1, 2})},      // negative ID
           {kT1, Ids({10}), at::ones({1, 2})},      // past the table
           {kT1, Ids({3}), at::full({1, 2}, nan)},  // NaN
           {kT1, Ids({3}), at::full({1, 2}, inf)},  // infinity
           {kT1, Ids({3, 4}), at::ones({2, 0})},    // width 0
           {kT1, Ids({3}), at::ones({1, 2, 1})},    // 3-D
       }) {
    const absl::Status status =
        tracker->RecordTables({bad}, /*check_values=*/true);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << c10::str(bad.ids) << c10::str(bad.states.sizes()) << status;
  }
  EXPECT_EQ(tracker->Status().usage.total.bytes, bytes);
  const Delta delta = Read(*tracker);
  EXPECT_EQ(IdsOf(delta, kT1), (std::vector<int64_t>{1, 2}));
  // In process (the modules' hook) values are not checked: no device sync.
  EXPECT_TRUE(
      tracker->RecordTables({{kT1, Ids({3}), at::full({1, 2}, nan)}}).ok());
}

// A read that fails moves nothing: no cursor, no delete-on-read; the same
// rows come with the next read that succeeds.
TEST(TrackerTest, AFailedReadMovesNothing) {
  TensorRowsReader reader;
  auto tracker = EmbeddingTrackerOfT1(reader);
  ASSERT_TRUE(
      tracker->RecordTables({{kT1, Ids({4, 5}), at::ones({2, 2})}}).ok());
  tracker->Step();
  const TrackerStatus before = tracker->Status();
  // The live table cannot be read (LibTorch throws inside the read).
  reader.SetTable(kT1, at::tensor(1.0f));
  auto failed = tracker->GetDelta({});
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument)
      << failed.status();
  const TrackerStatus after = tracker->Status();
  EXPECT_EQ(after.consumers.at(0).cursor, before.consumers.at(0).cursor);
  EXPECT_EQ(after.usage.total.ids, before.usage.total.ids);
  reader.SetTable(kT1, at::zeros({10, 2}));
  EXPECT_EQ(IdsOf(Read(*tracker), kT1), (std::vector<int64_t>{4, 5}));
}

}  // namespace
}  // namespace deltastream
