// tracker_service/tracker_snapshots.h against a real Tracker and a real
// RocksDB database: snapshots taken from several threads at once (the
// periodic thread, the Snapshot RPC, the trainer's own) while the tracker
// steps leave the newest state as the newest generation.
#include "tracker_service/tracker_snapshots.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/randint.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/test_dirs.h"

namespace deltastream {
namespace {

std::unique_ptr<Tracker> MakeTracker() {
  TrackerOptions options;
  options.consumers = {"c"};
  absl::StatusOr<std::unique_ptr<Tracker>> tracker =
      Tracker::Create(std::move(options));
  EXPECT_TRUE(tracker.ok()) << tracker.status();
  return tracker.ok() ? *std::move(tracker) : nullptr;
}

TEST(TrackerSnapshotsTest, ConcurrentSnapshotsEndWithTheNewestState) {
  const std::string db = TestTempDir() + "/tracker_snapshots_test_db";
  std::filesystem::remove_all(db);
  std::unique_ptr<Tracker> tracker = MakeTracker();
  ASSERT_NE(tracker, nullptr);
  absl::StatusOr<std::unique_ptr<TrackerSnapshots>> snapshots =
      TrackerSnapshots::Open(db, tracker.get());
  ASSERT_TRUE(snapshots.ok()) << snapshots.status();

  // The training thread steps every 0.2 ms, so that every snapshot takes
  // another state, and a write (an SST file ingested and synced, about a
  // millisecond) overlaps the next snapshots' states.
  std::atomic<bool> done{false};
  std::thread trainer([&] {
    for (int64_t step = 0; !done.load(); ++step) {
      ASSERT_TRUE(
          tracker
              ->RecordTables({{"t", at::randint(10000, {256}, at::kLong), {}}})
              .ok());
      tracker->Step();
      tracker->TriggerCompaction();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  constexpr int kThreads = 3, kEach = 15;
  std::vector<int64_t> newest(kThreads, -1);
  std::vector<std::thread> snapshotters;
  for (int t = 0; t < kThreads; ++t) {
    snapshotters.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        absl::StatusOr<SnapshotInfo> info = (*snapshots)->Snapshot();
        ASSERT_TRUE(info.ok()) << info.status();
        newest[t] = std::max(newest[t], info->owner_batch);
      }
    });
  }
  for (std::thread& t : snapshotters) t.join();
  done = true;
  trainer.join();

  const int64_t taken = *std::max_element(newest.begin(), newest.end());
  ASSERT_TRUE((*snapshots)->latest().has_value());
  EXPECT_EQ((*snapshots)->latest()->owner_batch, taken)
      << "an older state was written after a newer one";
  snapshots->reset();
  // Reopened and restored: that newest state.
  std::unique_ptr<Tracker> restored = MakeTracker();
  ASSERT_NE(restored, nullptr);
  absl::StatusOr<std::unique_ptr<TrackerSnapshots>> reopened =
      TrackerSnapshots::Open(db, restored.get());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  absl::StatusOr<std::optional<SnapshotInfo>> info = (*reopened)->Restore();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(info->has_value());
  EXPECT_EQ((*info)->owner_batch, taken);
  EXPECT_EQ(restored->current_batch(), taken);
}

}  // namespace
}  // namespace deltastream
