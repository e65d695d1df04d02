// The tracker under concurrent readers, random runs against an event model,
// and a filling read's StatesFill.
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "tests/tracker_service/tracker_fixture.h"

namespace deltastream {
namespace {

class GuardedRowsReader : public TensorRowsReader {
 public:
  void PinRows() override { mu_.ReaderLock(); }
  void UnpinRows() override { mu_.ReaderUnlock(); }
  SharedMutex& mu() { return mu_; }

 private:
  SharedMutex mu_;
};

TEST(TrackerConcurrencyTest, ReadsSeeTheRowsOfTheirEndBatchExactly) {
  GuardedRowsReader reader;
  reader.SetTable(kT1, at::zeros({4, 1}));
  TrackerOptions options;
  options.fqns_to_skip = {"ebc", "t2"};
  options.auto_compact = true;
  auto tracker = MakeTracker(options, &reader);
  constexpr int kSteps = 2000;
  std::atomic<bool> done{false};
  std::thread trainer([&] {
    for (int step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({step % 4})}}).ok());
      tracker->TriggerCompaction();
      // Step s sets every row to s + 1, then closes the batch, under the
      // guard: a read ending at batch b must see b everywhere.
      WriterLock guard(&reader.mu());
      reader.embeddings(kT1).fill_(step + 1);
      tracker->Step();
    }
    done.store(true);
  });
  DeltaRequest request;
  request.through_current_batch = false;
  request.all_rows = true;
  int reads = 0, wrong = 0;
  // At least two reads (one of all rows, one of changed rows), however fast
  // the trainer thread ends on a loaded machine.
  while (!done.load() || reads < 2) {
    auto delta = tracker->GetDelta(request);
    ASSERT_TRUE(delta.ok()) << delta.status();
    const at::Tensor& rows = delta->tables[kT1].values;
    const std::vector<float> values =
        rows.defined() ? ToFloats(rows) : std::vector<float>{};
    for (float v : values) {
      if (v != delta->end_batch && wrong++ < 5) {
        ADD_FAILURE() << "read " << reads << " through batch "
                      << delta->end_batch << " saw a row of step " << v;
      }
    }
    request.all_rows = (++reads % 2) == 0;
  }
  trainer.join();
  EXPECT_EQ(wrong, 0);
}

// Live rows whose next read of embeddings, once armed, waits until released,
// saying when it has begun: a read held in the middle of reading live rows.
class HeldRowsReader : public TensorRowsReader {
 public:
  void HoldNextRead() { hold_.store(true); }
  void WaitUntilHeld() { held_.WaitForNotification(); }
  void Release() { release_.Notify(); }

  absl::StatusOr<at::Tensor> ReadEmbeddings(absl::string_view fqn,
                                            const at::Tensor& ids) override {
    if (hold_.exchange(false)) {
      held_.Notify();
      release_.WaitForNotification();
    }
    return TensorRowsReader::ReadEmbeddings(fqn, ids);
  }

 private:
  std::atomic<bool> hold_{false};
  absl::Notification held_, release_;
};

TEST(TrackerConcurrencyTest, RecordsDoNotWaitForAReadOfLiveRows) {
  HeldRowsReader reader;
  reader.SetTable(kT1, at::arange(8, at::kFloat).reshape({8, 1}));
  TrackerOptions options;
  options.fqns_to_skip = {"ebc", "t2"};
  auto tracker = MakeTracker(options, &reader);
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1, 3})}}).ok());
  tracker->Step();
  reader.HoldNextRead();
  DeltaRequest concurrent;  // closed batches only, as a concurrent reader
  concurrent.through_current_batch = false;
  absl::StatusOr<Delta> delta;
  std::thread consumer([&] { delta = tracker->GetDelta(concurrent); });
  reader.WaitUntilHeld();
  // The training thread records the next batch while the read reads values.
  std::future<absl::Status> recorded = std::async(std::launch::async, [&] {
    return tracker->RecordTables({{kT1, Ids({5})}});
  });
  const bool done =
      recorded.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  reader.Release();
  consumer.join();
  ASSERT_TRUE(done) << "a record waited for a read of live rows";
  EXPECT_TRUE(recorded.get().ok());
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(ToIds(delta->tables[kT1].ids), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(ToFloats(delta->tables[kT1].values), (std::vector<float>{1, 3}));
  // Delivered: the cursor moved to the read's end; the record made during it
  // belongs to the next read.
  tracker->Step();
  EXPECT_EQ(ToIds(Read(*tracker).tables[kT1].ids), (std::vector<int64_t>{5}));
}

// What the tests of a large read's copy share: 64 MB of rows to copy
// (kCopyRows x kCopyDim) recorded into an auto-compacted embedding tracker,
// read from its closed batches.
constexpr int64_t kCopyRows = 250000, kCopyDim = 64;

std::unique_ptr<Tracker> AutoCompactingTracker() {
  TrackerOptions options = EmbeddingOptions();
  options.auto_compact = true;
  return MakeTracker(options);
}

DeltaRequest ClosedBatches() {
  DeltaRequest closed;
  closed.through_current_batch = false;
  return closed;
}

// A filling read (the service's stream) copies its rows with the tracker's
// lock released: the training thread records, steps and triggers compaction
// while a large read's rows are still being copied (with the lock held for
// the copy, the record returned only after the last row, in every attempt).
// The read is delivered after its copy, so what was recorded meanwhile goes
// to the next read, and the compaction deferred to the copy's end changes no
// answer.
TEST(TrackerConcurrencyTest, RecordsDoNotWaitForAFillingReadsCopy) {
  auto tracker = AutoCompactingTracker();
  const at::Tensor states = at::randn({kCopyRows, kCopyDim});
  const DeltaRequest closed = ClosedBatches();
  bool recorded_during_copy = false;
  for (int attempt = 0; attempt < 5 && !recorded_during_copy; ++attempt) {
    ASSERT_TRUE(
        tracker->RecordTables({{kT1, at::arange(kCopyRows, at::kLong), states}})
            .ok());
    tracker->Step();
    std::unique_ptr<StatesFill> fill;
    absl::StatusOr<Delta> delta = tracker->GetDeltaFilling(closed, &fill);
    ASSERT_TRUE(delta.ok()) << delta.status();
    const at::Tensor late = at::full({2, kCopyDim}, -1.0f);
    ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({7, 3}), late}}).ok());
    tracker->Step();
    tracker->TriggerCompaction();
    recorded_during_copy = !fill->HasRows(kT1, kCopyRows);
    ASSERT_TRUE(fill->AwaitRows(kT1, kCopyRows).ok());
    EXPECT_TRUE(at::equal(delta->tables.at(kT1).states, states));
    fill.reset();  // waits for the read's end: delivered
    const absl::StatusOr<Delta> next = tracker->GetDelta(closed);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->start_batch, delta->end_batch);
    EXPECT_EQ(IdsOf(*next, kT1), (std::vector<int64_t>{3, 7}));
    EXPECT_TRUE(at::equal(next->tables.at(kT1).states, late));
  }
  EXPECT_TRUE(recorded_during_copy)
      << "every record waited for the copy of a filling read";
}

// In-process GetDelta copies the same way, on the calling thread: the
// training thread goes on recording and stepping while a 64 MB read copies,
// and the next read gets exactly what was recorded meanwhile. (With the copy
// under the lock, of the records after the read's start only the one that
// waited for its end, and the few until its thread says it ended, would
// complete.)
TEST(TrackerConcurrencyTest, RecordsDoNotWaitForGetDeltasCopy) {
  auto tracker = AutoCompactingTracker();
  const at::Tensor states = at::randn({kCopyRows, kCopyDim});
  const DeltaRequest closed = ClosedBatches();
  int64_t most_after_start = 0;
  for (int attempt = 0; attempt < 5 && most_after_start < 20; ++attempt) {
    ASSERT_TRUE(
        tracker->RecordTables({{kT1, at::arange(kCopyRows, at::kLong), states}})
            .ok());
    tracker->Step();
    std::atomic<bool> reading{true};
    absl::StatusOr<Delta> delta;
    std::thread reader([&] {
      delta = tracker->GetDelta(closed);
      reading = false;
    });
    // Each recorded ID, and whether the read had not ended when its record
    // and step returned.
    std::vector<std::pair<int64_t, bool>> recorded;
    while (reading.load()) {
      const int64_t id = kCopyRows + static_cast<int64_t>(recorded.size());
      ASSERT_TRUE(
          tracker
              ->RecordTables({{kT1, Ids({id}), at::full({1, kCopyDim}, 2.0f)}})
              .ok());
      tracker->Step();
      tracker->TriggerCompaction();
      recorded.emplace_back(id, reading.load());
    }
    reader.join();
    ASSERT_TRUE(delta.ok()) << delta.status();
    std::vector<int64_t> all = IdsOf(*delta, kT1);
    ASSERT_GE(all.size(), kCopyRows);
    EXPECT_TRUE(at::equal(delta->tables.at(kT1).states.narrow(0, 0, kCopyRows),
                          states));
    // Records before the read took its batches are in it; the rest follow.
    const std::set<int64_t> read(all.begin(), all.end());
    int64_t after_start = 0;
    for (const auto& [id, during] : recorded) {
      after_start += during && read.count(id) == 0;
    }
    most_after_start = std::max(most_after_start, after_start);
    const absl::StatusOr<Delta> next = tracker->GetDelta(closed);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(next->start_batch, delta->end_batch);
    const std::vector<int64_t> later = IdsOf(*next, kT1);
    all.insert(all.end(), later.begin(), later.end());
    std::vector<int64_t> expected(kCopyRows);
    std::iota(expected.begin(), expected.end(), 0);
    for (const auto& [id, during] : recorded) expected.push_back(id);
    EXPECT_EQ(all, expected);
  }
  EXPECT_GE(most_after_start, 20)
      << "records waited for the copy of an in-process GetDelta";
}

// Filling reads of two consumers, each copying with the lock released, while
// the training thread records, compacts and steps and another thread
// compacts and reads the status: every consumer gets every row once, with its
// state, and nothing is left.
TEST(TrackerConcurrencyTest, FillingReadsDuringTrainingMissNothing) {
  TrackerOptions options = EmbeddingOptions();
  options.consumers = {"a", "b"};
  options.auto_compact = true;
  options.memory_cap_bytes = 64 << 20;  // applied, never reached
  auto tracker = MakeTracker(options);
  constexpr int64_t kBatches = 200, kPerBatch = 3000, kDim = 8;
  std::atomic<bool> done{false};
  std::map<std::string, std::vector<int64_t>> seen = {{"a", {}}, {"b", {}}};
  std::vector<std::thread> threads;
  for (const std::string consumer : {"a", "b"}) {
    threads.emplace_back([&, consumer] {
      DeltaRequest request;
      request.consumer = consumer;
      request.through_current_batch = false;
      std::vector<int64_t>& mine = seen.at(consumer);
      bool last = false;
      while (!last) {
        last = done.load();
        std::unique_ptr<StatesFill> fill;
        absl::StatusOr<Delta> delta = tracker->GetDeltaFilling(request, &fill);
        ASSERT_TRUE(delta.ok()) << delta.status();
        const std::vector<int64_t> ids = IdsOf(*delta, kT1);
        ASSERT_TRUE(
            fill->AwaitRows(kT1, static_cast<int64_t>(ids.size())).ok());
        if (ids.empty()) continue;
        // Row i's state is ID i in every column.
        const at::Tensor& rows = delta->tables.at(kT1).states;
        ASSERT_TRUE(at::equal(rows, delta->tables.at(kT1)
                                        .ids.to(at::kFloat)
                                        .unsqueeze(1)
                                        .expand({-1, kDim})))
            << consumer;
        mine.insert(mine.end(), ids.begin(), ids.end());
      }
    });
  }
  threads.emplace_back([&] {
    while (!done.load()) {
      tracker->CompactAll();
      EXPECT_GE(tracker->Status().current_batch, 0);
    }
  });
  for (int64_t b = 0; b < kBatches; ++b) {
    const at::Tensor ids = at::arange(b * kPerBatch, (b + 1) * kPerBatch);
    const at::Tensor states =
        ids.to(at::kFloat).unsqueeze(1).expand({-1, kDim}).contiguous();
    ASSERT_TRUE(tracker->RecordTables({{kT1, ids, states}}).ok());
    tracker->TriggerCompaction();
    tracker->Step();
  }
  done = true;
  for (std::thread& t : threads) t.join();
  for (const std::string consumer : {"a", "b"}) {
    std::vector<int64_t>& ids = seen[consumer];
    std::sort(ids.begin(), ids.end());
    ASSERT_EQ(ids.size(), static_cast<size_t>(kBatches * kPerBatch))
        << consumer;
    for (int64_t i = 0; i < kBatches * kPerBatch; ++i) {
      ASSERT_EQ(ids[i], i) << consumer;
    }
  }
  EXPECT_EQ(tracker->Status().usage.total.lookups, 0);
  EXPECT_EQ(tracker->Status().cap_drops, 0);
}

TEST(TrackerConcurrencyTest, AReadWhoseConsumerChangedMeanwhileReadsAgain) {
  HeldRowsReader reader;
  reader.SetTable(kT1, at::arange(8, at::kFloat).reshape({8, 1}));
  TrackerOptions options;
  options.fqns_to_skip = {"ebc", "t2"};
  options.acknowledged_reads = true;
  auto tracker = MakeTracker(options, &reader);
  DeltaRequest concurrent;  // closed batches only, as a concurrent reader
  concurrent.through_current_batch = false;
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({1, 3})}}).ok());
  tracker->Step();
  absl::StatusOr<Delta> first = tracker->GetDelta(concurrent);
  ASSERT_TRUE(first.ok()) << first.status();
  const int64_t first_end = first->end_batch;  // pending, uncommitted
  ASSERT_TRUE(tracker->RecordTables({{kT1, Ids({2})}}).ok());
  tracker->Step();
  reader.HoldNextRead();
  absl::StatusOr<Delta> delta;
  std::thread consumer([&] { delta = tracker->GetDelta(concurrent); });
  reader.WaitUntilHeld();
  // Meanwhile the consumer commits its first read: the held read, which
  // started at the old cursor, must not be delivered as it was.
  ASSERT_TRUE(tracker->Commit("default", first_end).ok());
  reader.Release();
  consumer.join();
  ASSERT_TRUE(delta.ok()) << delta.status();
  EXPECT_EQ(delta->start_batch, first_end);
  EXPECT_EQ(ToIds(delta->tables[kT1].ids), (std::vector<int64_t>{2}));
  EXPECT_EQ(ToFloats(delta->tables[kT1].values), (std::vector<float>{2}));
}

// An independent model of the semantics: every recorded (batch, id, state) in
// order; a consumer's delta is the first (or last) state of each ID recorded
// in [cursor, end). Compaction and deletion must never change an answer.
struct Event {
  int64_t batch;
  int64_t id;
  float value;
};

TEST(TrackerModelTest, RandomRunsMatchTheEventModel) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 40; ++round) {
    TrackerOptions options;
    options.mode = round % 2 ? TrackingMode::kEmbedding : TrackingMode::kIdOnly;
    options.fqns_to_skip = {"ebc"};
    options.consumers = {"a", "b", "c"};
    options.delete_on_read = rng() % 2;
    options.auto_compact = rng() % 2;
    auto tracker = MakeTracker(options);
    std::vector<Event> events;
    std::map<std::string, int64_t> cursor = {{"a", -1}, {"b", -1}, {"c", -1}};
    int64_t batch = 0;
    for (int op = 0; op < 80; ++op) {
      const int kind = static_cast<int>(rng() % 11);
      if (kind == 10) {
        // A restart from a snapshot taken now changes nothing that follows.
        TrackerState state = tracker->SaveState();
        tracker = MakeTracker(options);
        ASSERT_TRUE(tracker->RestoreState(std::move(state)).ok());
        continue;
      }
      if (kind < 5) {
        const int64_t n = static_cast<int64_t>(rng() % 6);
        std::vector<int64_t> ids;
        std::vector<float> values;
        for (int64_t i = 0; i < n; ++i) {
          ids.push_back(static_cast<int64_t>(rng() % 12));
          values.push_back(static_cast<float>(events.size()));
          events.push_back({batch, ids.back(), values.back()});
        }
        at::Tensor states = at::tensor(values).reshape({n, 1});
        ASSERT_TRUE(tracker->RecordTables({{kT1, Ids(ids), states}}).ok());
      } else if (kind < 7) {
        tracker->TriggerCompaction();
        tracker->Step();
        ++batch;
      } else if (kind < 8) {
        tracker->CompactAll();
      } else {
        const std::string consumer(1, static_cast<char>('a' + rng() % 3));
        DeltaRequest request;
        request.consumer = consumer;
        request.through_current_batch = rng() % 2;
        auto delta = tracker->GetDelta(request);
        ASSERT_TRUE(delta.ok());
        const int64_t end = request.through_current_batch ? batch + 1 : batch;
        std::map<int64_t, float> expected;
        for (const Event& e : events) {
          if (e.batch >= cursor[consumer] && e.batch < end) {
            expected.emplace(e.id, e.value);  // first occurrence wins
          }
        }
        cursor[consumer] = std::max(cursor[consumer], end);
        std::vector<int64_t> expected_ids;
        std::vector<float> expected_values;
        for (auto& [id, value] : expected) {
          expected_ids.push_back(id);
          expected_values.push_back(value);
        }
        ASSERT_EQ(IdsOf(*delta, kT1), expected_ids)
            << "round " << round << " op " << op;
        if (options.mode == TrackingMode::kEmbedding && !expected_ids.empty()) {
          ASSERT_EQ(ToFloats(delta->tables[kT1].states), expected_values)
              << "round " << round << " op " << op;
        }
      }
    }
  }
}

// The training thread records, steps and compacts while two service threads
// read closed batches: together the reads hold every recorded ID, for each
// consumer, and no read ever holds an ID twice.
TEST(TrackerConcurrencyTest, ConcurrentReadersMissNothing) {
  TrackerOptions options;
  options.consumers = {"a", "b"};
  options.auto_compact = true;
  auto tracker = MakeTracker(options);
  constexpr int64_t kBatches = 300;
  std::atomic<bool> done{false};
  std::map<std::string, std::set<int64_t>> seen = {{"a", {}}, {"b", {}}};
  std::vector<std::thread> readers;
  for (const std::string consumer : {"a", "b"}) {
    readers.emplace_back([&, consumer] {
      DeltaRequest request;
      request.consumer = consumer;
      request.through_current_batch = false;
      std::set<int64_t>& mine = seen.at(consumer);
      bool last = false;
      while (!last) {
        last = done.load();
        auto delta = tracker->GetDelta(request);
        ASSERT_TRUE(delta.ok());
        for (int64_t id : IdsOf(*delta, kT1)) mine.insert(id);
      }
    });
  }
  std::thread trainer([&] {
    for (int64_t b = 0; b < kBatches; ++b) {
      ASSERT_TRUE(
          tracker
              ->RecordTables({{kT1, at::cat({Ids({2 * b}), Ids({2 * b + 1})})}})
              .ok());
      tracker->TriggerCompaction();
      tracker->Step();
    }
    done = true;
  });
  trainer.join();
  for (std::thread& t : readers) t.join();
  for (const std::string consumer : {"a", "b"}) {
    EXPECT_EQ(seen[consumer].size(), static_cast<size_t>(2 * kBatches))
        << consumer;
  }
  EXPECT_EQ(tracker->Status().usage.total.lookups, 0);
}

TEST(StatesFillTest, AReadThatFailsWhileCopyingSaysSoForRowsNotWritten) {
  StatesFill fill;
  fill.Expect(kT1);
  fill.Expect("t2");
  fill.HandOut(Delta{});
  fill.Copied(kT1, 100);
  EXPECT_TRUE(fill.HasRows(kT1, 100));
  EXPECT_FALSE(fill.HasRows(kT1, 101));
  absl::Status waited;
  std::thread sender([&] { waited = fill.AwaitRows("t2", 10); });
  fill.Finish(absl::InternalError("copy failed"));
  sender.join();
  EXPECT_EQ(waited, absl::InternalError("copy failed"));
  // Rows written before the failure may go; none after them.
  EXPECT_TRUE(fill.AwaitRows(kT1, 100).ok());
  EXPECT_EQ(fill.AwaitRows(kT1, 101), absl::InternalError("copy failed"));
  // A table that came complete (no copy expected) is whole.
  EXPECT_TRUE(fill.AwaitRows("t3", 5).ok());
}

TEST(StatesFillTest, AReadThatEndsWellHasEveryRow) {
  StatesFill fill;
  fill.Expect(kT1);
  fill.HandOut(Delta{});
  fill.Copied(kT1, 10);
  absl::Status waited = absl::UnknownError("not waited");
  std::thread sender([&] { waited = fill.AwaitRows(kT1, 20); });
  fill.Copied(kT1, 20);
  fill.Finish();
  sender.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_TRUE(fill.AwaitRows(kT1, 1000).ok());
}

}  // namespace
}  // namespace deltastream
