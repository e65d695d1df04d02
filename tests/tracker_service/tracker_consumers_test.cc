// The tracker's consumers: cursors, clear, add and remove, acknowledged reads
// and commits.
#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/tracker_service/tracker_fixture.h"

namespace deltastream {
namespace {

// A read of closed batches only, as the service makes them.
Delta ReadClosed(Tracker& tracker, const std::string& consumer) {
  DeltaRequest request;
  request.consumer = consumer;
  request.through_current_batch = false;
  auto delta = tracker.GetDelta(request);
  EXPECT_TRUE(delta.ok()) << delta.status();
  return *std::move(delta);
}

TEST(TrackerTest, ClearOneConsumerMovesItToThePresent) {
  TrackerOptions options;
  options.consumers = {"a", "b"};
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker->Clear("a").ok());
  EXPECT_EQ(tracker->Status().usage.total.lookups, 1);  // b needs it
  // Recorded after a's clear, into the batch that was open: a's to read.
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker->Clear("b").ok());
  EXPECT_EQ(tracker->Status().usage.total.lookups, 1);  // a needs it
  EXPECT_EQ(IdsOf(Read(*tracker, "a"), kT1), std::vector<int64_t>{2});
  EXPECT_EQ(tracker->Clear("zz").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({3})}}).ok());
  tracker->ClearAll();
  EXPECT_TRUE(IdsOf(Read(*tracker, "b"), kT1).empty());
  EXPECT_EQ(tracker->Status().usage.total.lookups, 0);
}

// A clear in the middle of a batch: what is recorded into that batch after
// it reaches the cleared consumers, which read closed batches (the cursor
// used to pass the open batch, and such rows were lost to them with no
// resync).
TEST(TrackerTest, RowsRecordedAfterAClearInTheOpenBatchAreRead) {
  TrackerOptions options;
  options.consumers = {"a", "b"};
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
  ASSERT_TRUE(tracker->Clear("a").ok());
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({3})}}).ok());
  tracker->Step();
  // a: the batch that was open when it cleared, 2 included (b still holds
  // it); b: everything.
  EXPECT_EQ(IdsOf(ReadClosed(*tracker, "a"), kT1),
            (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(IdsOf(ReadClosed(*tracker, "b"), kT1),
            (std::vector<int64_t>{1, 2, 3}));

  // Clear of every consumer: what was recorded is gone, what follows in the
  // same batch is read.
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({4})}}).ok());
  tracker->ClearAll();
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({5})}}).ok());
  tracker->Step();
  for (const char* consumer : {"a", "b"}) {
    const Delta delta = ReadClosed(*tracker, consumer);
    EXPECT_EQ(IdsOf(delta, kT1), std::vector<int64_t>{5}) << consumer;
    EXPECT_FALSE(delta.resync_required) << consumer;
  }
}

TEST(TrackerTest, ConsumersAddedAndRemovedAtRunTime) {
  auto tracker = MakeTracker({});
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
  tracker->Step();
  ASSERT_TRUE(tracker->AddConsumer("late").ok());
  EXPECT_EQ(tracker->AddConsumer("late").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(tracker->AddConsumer("").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker->AddConsumer(std::string(257, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
  // The late consumer sees only what came after it joined.
  EXPECT_EQ(IdsOf(Read(*tracker, "late"), kT1), std::vector<int64_t>{2});
  EXPECT_EQ(tracker->Consumers(),
            (std::vector<std::string>{"default", "late"}));
  // Removing "default" frees what only it needed.
  EXPECT_EQ(tracker->Status().usage.total.lookups, 2);
  ASSERT_TRUE(tracker->RemoveConsumer("default").ok());
  EXPECT_EQ(tracker->Status().usage.total.lookups, 0);
  EXPECT_EQ(tracker->RemoveConsumer("default").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(tracker->RemoveConsumer("late").code(),
            absl::StatusCode::kFailedPrecondition);
  DeltaRequest gone;
  gone.consumer = "default";
  EXPECT_EQ(tracker->GetDelta(gone).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TrackerTest, AcknowledgedReadIsRepeatedUntilCommitted) {
  TrackerOptions options;
  options.acknowledged_reads = true;
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
  Delta first = Read(*tracker);
  EXPECT_EQ(IdsOf(first, kT1), std::vector<int64_t>{1});
  tracker->Step();
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
  // The consumer crashed before committing: it gets batch 0 again, plus 1.
  Delta again = Read(*tracker);
  EXPECT_EQ(IdsOf(again, kT1), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(tracker->Status().usage.total.ids, 2);  // nothing deleted yet
  ASSERT_TRUE(tracker->Commit("default", again.end_batch).ok());
  EXPECT_EQ(tracker->Status().usage.total.ids, 0);
  // The later commit made the first read final too.
  EXPECT_EQ(tracker->Commit("default", first.end_batch).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tracker->Commit("default", again.end_batch).code(),
            absl::StatusCode::kFailedPrecondition);  // nothing pending
  EXPECT_EQ(tracker->Commit("nobody", 1).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IdsOf(Read(*tracker), kT1).empty());
}

TEST(TrackerTest, ReadsAheadOfCommitsAreCommittedInTurn) {
  // A subscriber applies one push while the next is in flight: each of its
  // commits lands after the tracker delivered a newer read.
  TrackerOptions options;
  options.acknowledged_reads = true;
  auto tracker = MakeTracker(options);
  std::vector<Delta> reads;
  for (int64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({id})}}).ok());
    reads.push_back(Read(*tracker));
    tracker->Step();
  }
  // Each read repeats the uncommitted ones: at least once, never lost.
  EXPECT_EQ(IdsOf(reads[2], kT1), (std::vector<int64_t>{1, 2, 3}));
  ASSERT_EQ(tracker->Status().consumers.size(), 1u);
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads, 3);
  EXPECT_EQ(tracker->Status().consumers[0].pending_end, reads[2].end_batch);

  ASSERT_TRUE(tracker->Commit("default", reads[0].end_batch).ok());
  EXPECT_EQ(tracker->Status().consumers[0].cursor, reads[0].end_batch);
  EXPECT_EQ(tracker->Status().usage.total.ids, 2);  // batch 0 deleted
  ASSERT_TRUE(tracker->Commit("default", reads[1].end_batch).ok());
  EXPECT_EQ(tracker->Status().usage.total.ids, 1);
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads, 1);
  // A read after a commit starts at the committed end.
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({4})}}).ok());
  Delta next = Read(*tracker);
  EXPECT_EQ(next.start_batch, reads[1].end_batch);
  EXPECT_EQ(IdsOf(next, kT1), (std::vector<int64_t>{3, 4}));
  // Committing the newest makes the older one final: it is gone.
  ASSERT_TRUE(tracker->Commit("default", next.end_batch).ok());
  absl::Status stale = tracker->Commit("default", reads[2].end_batch);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("no read is pending"), std::string::npos)
      << stale;
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads, 0);
  EXPECT_EQ(tracker->Status().usage.total.ids, 0);
}

TEST(TrackerTest, ContinueFromReadsWhatFollowsAPendingRead) {
  // A subscription's pushes: each from the previous push's end, while the
  // consumer's commits lag behind; a new stream starts at the cursor again.
  TrackerOptions options;
  options.acknowledged_reads = true;
  options.consumers = {"a", "b"};
  options.auto_compact = true;
  auto tracker = MakeTracker(options);
  DeltaRequest push;
  push.consumer = "a";
  push.through_current_batch = false;
  std::vector<Delta> pushes;
  for (int64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({id, 10})}}).ok());
    tracker->TriggerCompaction();
    tracker->Step();
    if (!pushes.empty()) push.continue_from = pushes.back().end_batch;
    auto delta = tracker->GetDelta(push);
    ASSERT_TRUE(delta.ok()) << delta.status();
    pushes.push_back(*std::move(delta));
    Read(*tracker, "b");  // compacts and reads past a's pending ends
  }
  EXPECT_EQ(IdsOf(pushes[0], kT1), (std::vector<int64_t>{1, 10}));
  EXPECT_EQ(pushes[1].start_batch, pushes[0].end_batch);
  EXPECT_EQ(IdsOf(pushes[1], kT1), (std::vector<int64_t>{2, 10}));
  EXPECT_EQ(IdsOf(pushes[2], kT1), (std::vector<int64_t>{3, 10}));

  // A stream that broke before any commit: everything again, from the cursor.
  DeltaRequest again = push;
  again.continue_from.reset();
  auto redelivered = tracker->GetDelta(again);
  ASSERT_TRUE(redelivered.ok());
  EXPECT_EQ(IdsOf(*redelivered, kT1), (std::vector<int64_t>{1, 2, 3, 10}));

  // continue_from that is no pending end reads from the cursor.
  ASSERT_TRUE(tracker->Commit("a", pushes[0].end_batch).ok());
  again.continue_from = pushes[0].end_batch - 1;
  auto from_cursor = tracker->GetDelta(again);
  ASSERT_TRUE(from_cursor.ok());
  EXPECT_EQ(from_cursor->start_batch, pushes[0].end_batch);
  EXPECT_EQ(IdsOf(*from_cursor, kT1), (std::vector<int64_t>{2, 3, 10}));
  // The newest commit makes every earlier push final.
  ASSERT_TRUE(tracker->Commit("a", pushes[2].end_batch).ok());
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads, 0);
}

TEST(TrackerTest, PendingReadsAreBounded) {
  TrackerOptions options;
  options.acknowledged_reads = true;
  auto tracker = MakeTracker(options);
  std::vector<int64_t> ends;
  for (int i = 0; i < Tracker::kMaxPendingReads + 2; ++i) {
    ends.push_back(Read(*tracker).end_batch);
    tracker->Step();
  }
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads,
            Tracker::kMaxPendingReads);
  // The oldest two are forgotten: their rows come again in any later read.
  EXPECT_EQ(tracker->Commit("default", ends[1]).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(tracker->Commit("default", ends[10]).ok());
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads,
            Tracker::kMaxPendingReads - 9);
  // Reading again with nothing new replaces the newest read, not adds one.
  Read(*tracker);
  Read(*tracker);
  EXPECT_EQ(tracker->Status().consumers[0].pending_reads,
            Tracker::kMaxPendingReads - 8);
}

TEST(TrackerTest, PendingReadsOfTableSubsetsAreCommittedPerTable) {
  TrackerOptions options;
  options.acknowledged_reads = true;
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}, {kT2, Ids({2})}}).ok());
  DeltaRequest only_t1;
  only_t1.fqns = {kT1};
  auto t1 = tracker->GetDelta(only_t1);
  ASSERT_TRUE(t1.ok());
  tracker->Step();
  ASSERT_TRUE(tracker->RecordTables({{kT2, Ids({3})}}).ok());
  DeltaRequest only_t2;
  only_t2.fqns = {kT2};
  auto t2 = tracker->GetDelta(only_t2);
  ASSERT_TRUE(t2.ok());
  // Committing t2's later read leaves t1's pending: it covers other tables.
  ASSERT_TRUE(tracker->Commit("default", t2->end_batch).ok());
  ASSERT_TRUE(tracker->Commit("default", t1->end_batch).ok());
  Delta all = Read(*tracker);
  EXPECT_TRUE(IdsOf(all, kT1).empty());
  EXPECT_TRUE(IdsOf(all, kT2).empty());
}

TEST(TrackerTest, AcknowledgedReadSurvivesCompactionByOthers) {
  // a reads (pending), b reads and compacts; a's commit must not hide rows.
  TrackerOptions options;
  options.acknowledged_reads = true;
  options.consumers = {"a", "b"};
  options.auto_compact = true;
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1})}}).ok());
  tracker->Step();
  DeltaRequest closed_batches;
  closed_batches.consumer = "a";
  closed_batches.through_current_batch = false;
  auto a1 = tracker->GetDelta(closed_batches);  // pending end 1
  ASSERT_TRUE(a1.ok());
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
  tracker->TriggerCompaction();
  tracker->Step();
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({3})}}).ok());
  tracker->TriggerCompaction();
  tracker->Step();
  tracker->CompactAll();
  ASSERT_TRUE(tracker->Commit("a", a1->end_batch).ok());
  EXPECT_EQ(IdsOf(Read(*tracker, "a"), kT1), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(IdsOf(Read(*tracker, "b"), kT1), (std::vector<int64_t>{1, 2, 3}));
}

TEST(TrackerTest, ConsumersReadingTheSameBatchesShareOneGather) {
  TrackerOptions options = EmbeddingOptions();
  options.consumers = {"a", "b", "c"};
  auto tracker = MakeTracker(options);
  const at::Tensor first = at::randn({3, 4});
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({3, 1, 3}), first}}).ok());
  tracker->Step();
  ASSERT_TRUE(
      tracker->RecordTables({{kT1, Ids({2, 1}), at::randn({2, 4})}}).ok());
  tracker->Step();
  const Delta a = ReadClosed(*tracker, "a");
  const Delta b = ReadClosed(*tracker, "b");
  const TableDelta& rows = a.tables.at(kT1);
  EXPECT_EQ(ToIds(rows.ids), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(rows.states[0].equal(first[1]));  // ID 1's first state
  EXPECT_TRUE(rows.states[2].equal(first[0]));  // ID 3's first state
  // b's rows are a's: gathered once.
  EXPECT_EQ(b.tables.at(kT1).ids.data_ptr(), rows.ids.data_ptr());
  EXPECT_EQ(b.tables.at(kT1).states.data_ptr(), rows.states.data_ptr());

  // A read through the open batch is c's own: the open batch still grows.
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({7}), at::randn({1, 4})}}).ok());
  const Delta c = Read(*tracker, "c");
  EXPECT_EQ(IdsOf(c, kT1), (std::vector<int64_t>{1, 2, 3, 7}));
  EXPECT_NE(c.tables.at(kT1).ids.data_ptr(), rows.ids.data_ptr());
}

TEST(TrackerTest, SharedReadsNeverOutliveAChangeOfTheirBatches) {
  TrackerOptions options;
  options.consumers = {"a", "b"};
  options.delete_on_read = false;
  auto tracker = MakeTracker(options);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1, 2})}}).ok());
  tracker->Step();
  const TrackerState before = tracker->SaveState();

  // Cleared after a's read: b reads nothing.
  EXPECT_EQ(IdsOf(ReadClosed(*tracker, "a"), kT1),
            (std::vector<int64_t>{1, 2}));
  tracker->ClearAll();
  EXPECT_TRUE(IdsOf(ReadClosed(*tracker, "b"), kT1).empty());

  // Restored to other rows at the same batches: b reads those, not what a
  // read before the restore.
  ASSERT_TRUE(tracker->RestoreState(before).ok());
  EXPECT_EQ(IdsOf(ReadClosed(*tracker, "a"), kT1),
            (std::vector<int64_t>{1, 2}));
  TrackerState other = before;
  for (StoredTable& table : other.tables) {
    for (StoredLookup& lookup : table.lookups) lookup.ids = Ids({5});
  }
  ASSERT_TRUE(tracker->RestoreState(other).ok());
  EXPECT_EQ(IdsOf(ReadClosed(*tracker, "b"), kT1), std::vector<int64_t>{5});

  // A compaction asked for from outside (it may cross a cursor) drops them.
  ASSERT_TRUE(tracker->RestoreState(before).ok());
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({3})}}).ok());
  tracker->Step();
  const Delta a = ReadClosed(*tracker, "a");
  EXPECT_EQ(IdsOf(a, kT1), (std::vector<int64_t>{1, 2, 3}));
  tracker->Compact(0, 2);
  EXPECT_NE(ReadClosed(*tracker, "b").tables.at(kT1).ids.data_ptr(),
            a.tables.at(kT1).ids.data_ptr());
}

// One lookup of kT1 and one of kT2: `n` IDs each, drawn from [0, range),
// with random states of `dim` columns.
std::vector<TableLookup> RandomLookups(std::mt19937_64& rng, int n,
                                       int64_t range, int64_t dim) {
  std::vector<TableLookup> lookups;
  for (const char* fqn : {kT1, kT2}) {
    std::vector<int64_t> ids;
    for (int i = 0; i < n; ++i) {
      ids.push_back(static_cast<int64_t>(rng() % range));
    }
    lookups.push_back({fqn, Ids(ids), at::randn({n, dim})});
  }
  return lookups;
}

// A filling read (the service's stream) answers as GetDelta: two trackers get
// the same records; one is read with GetDelta, the other with GetDeltaFilling,
// whose rows are checked only once its fill says they are there. One
// consumer, so every read deletes what it read right after its copies; the
// tables span several copy pieces, and some reads find nothing new.
TEST(TrackerTest, FillingReadAnswersAsGetDelta) {
  auto plain = MakeTracker(EmbeddingOptions());
  auto filling = MakeTracker(EmbeddingOptions());
  std::mt19937_64 rng(11);
  for (int round = 0; round < 4; ++round) {
    for (int step = 0; step < 3 && round != 2; ++step) {
      const std::vector<TableLookup> lookups =
          RandomLookups(rng, 6000, 20000, 16);
      for (Tracker* tracker : {plain.get(), filling.get()}) {
        ASSERT_TRUE(tracker->RecordTables(lookups).ok());
        tracker->Step();
        tracker->TriggerCompaction();
      }
    }
    const Delta expected = Read(*plain);
    std::unique_ptr<StatesFill> fill;
    DeltaRequest request;
    request.consumer = "default";
    absl::StatusOr<Delta> got = filling->GetDeltaFilling(request, &fill);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_NE(fill, nullptr);
    EXPECT_EQ(got->end_batch, expected.end_batch);
    EXPECT_EQ(got->start_batch, expected.start_batch);
    ASSERT_EQ(got->tables.size(), expected.tables.size());
    for (const auto& [fqn, table] : expected.tables) {
      const TableDelta& mine = got->tables.at(fqn);
      ASSERT_TRUE(fill->AwaitRows(fqn, mine.ids.size(0)).ok());
      EXPECT_TRUE(at::equal(mine.ids, table.ids)) << fqn << " round " << round;
      EXPECT_TRUE(at::equal(mine.states, table.states))
          << fqn << " round " << round;
    }
  }
  std::unique_ptr<StatesFill> fill;
  DeltaRequest unknown;
  unknown.consumer = "nobody";
  EXPECT_EQ(filling->GetDeltaFilling(unknown, &fill).status().code(),
            absl::StatusCode::kNotFound);
}

// Filling reads from several threads at once queue on the tracker's one
// fill thread and answer as GetDelta; an id_only read (nothing to copy after
// the hand-out) runs on the calling thread, its fill done on return.
TEST(TrackerTest, FillingReadsAtOnceAnswerAsGetDelta) {
  constexpr int kReaders = 6;
  TrackerOptions embedding = EmbeddingOptions();
  TrackerOptions id_only;
  id_only.fqns_to_skip = {"ebc"};
  for (int c = 0; c < kReaders; ++c) {
    for (TrackerOptions* options : {&embedding, &id_only}) {
      options->consumers.push_back(absl::StrCat("c", c));
    }
  }
  for (const TrackerOptions& options : {embedding, id_only}) {
    auto plain = MakeTracker(options);
    auto filling = MakeTracker(options);
    std::mt19937_64 rng(5);
    for (int step = 0; step < 3; ++step) {
      const std::vector<TableLookup> lookups =
          RandomLookups(rng, 5000, 30000, 8);
      for (Tracker* tracker : {plain.get(), filling.get()}) {
        ASSERT_TRUE(tracker->RecordTables(lookups).ok());
        tracker->Step();
      }
    }
    std::vector<Delta> expected;
    for (int c = 0; c < kReaders; ++c) {
      expected.push_back(Read(*plain, absl::StrCat("c", c)));
    }
    std::vector<absl::StatusOr<Delta>> got(kReaders, absl::UnknownError(""));
    std::vector<std::unique_ptr<StatesFill>> fills(kReaders);
    std::vector<std::thread> readers;
    for (int c = 0; c < kReaders; ++c) {
      readers.emplace_back([&, c] {
        DeltaRequest request;
        request.consumer = absl::StrCat("c", c);
        got[c] = filling->GetDeltaFilling(request, &fills[c]);
      });
    }
    for (std::thread& reader : readers) reader.join();
    for (int c = 0; c < kReaders; ++c) {
      ASSERT_TRUE(got[c].ok()) << got[c].status();
      ASSERT_NE(fills[c], nullptr);
      EXPECT_EQ(got[c]->end_batch, expected[c].end_batch);
      for (const auto& [fqn, table] : expected[c].tables) {
        const TableDelta& mine = got[c]->tables.at(fqn);
        ASSERT_TRUE(fills[c]->AwaitRows(fqn, mine.ids.size(0)).ok());
        EXPECT_TRUE(at::equal(mine.ids, table.ids)) << fqn << " c" << c;
        EXPECT_EQ(mine.states.defined(), table.states.defined()) << fqn;
        if (table.states.defined()) {
          EXPECT_TRUE(at::equal(mine.states, table.states)) << fqn << " c" << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace deltastream
