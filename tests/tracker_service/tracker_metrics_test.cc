// tracker_service/tracker_metrics.h against a real Tracker and real RocksDB
// snapshots, scraped over HTTP from a base/metrics.h endpoint.
#include "tracker_service/tracker_metrics.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/metrics.h"
#include "tests/base/http_scrape.h"

namespace deltastream {
namespace {

at::Tensor Ids(std::vector<int64_t> ids) {
  return at::tensor(ids, at::TensorOptions(at::kLong));
}

double Value(const std::string& scrape, const std::string& series) {
  return SampleValue(scrape, series).value_or(-1);
}

TEST(TrackerMetricsTest, ScrapesTablesConsumersAndSnapshots) {
  TrackerOptions options;
  options.consumers = {"predictor", "checkpoint"};
  options.acknowledged_reads = true;
  absl::StatusOr<std::unique_ptr<Tracker>> tracker =
      Tracker::Create(std::move(options));
  ASSERT_TRUE(tracker.ok()) << tracker.status();
  ASSERT_TRUE((*tracker)->RecordTables({{"t1", Ids({1, 2, 3}), {}}}).ok());
  (*tracker)->Step();
  ASSERT_TRUE(
      (*tracker)
          ->RecordTables({{"t1", Ids({3, 4}), {}}, {"t2", Ids({9}), {}}})
          .ok());
  (*tracker)->Step();
  DeltaRequest read;
  read.consumer = "predictor";
  ASSERT_TRUE((*tracker)->GetDelta(read).ok());  // delivered, not committed

  const std::string db = std::string(std::getenv("TEST_TMPDIR") != nullptr
                                         ? std::getenv("TEST_TMPDIR")
                                         : "/tmp") +
                         "/tracker_metrics_test_db";
  std::filesystem::remove_all(db);
  absl::StatusOr<std::unique_ptr<TrackerSnapshots>> snapshots =
      TrackerSnapshots::Open(db, tracker->get());
  ASSERT_TRUE(snapshots.ok()) << snapshots.status();
  ASSERT_TRUE((*snapshots)->Snapshot().ok());

  auto collector =
      std::make_shared<TrackerMetrics>(tracker->get(), snapshots->get());
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0",
                             std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  (*endpoint)->Add(collector);
  const std::string scrape = ScrapeMetrics((*endpoint)->port());

  EXPECT_EQ(Value(scrape, "deltastream_tracker_current_batch"), 2) << scrape;
  EXPECT_GE(Value(scrape, "deltastream_tracker_table_rows{table=\"t1\"}"), 4)
      << scrape;
  EXPECT_EQ(Value(scrape, "deltastream_tracker_table_rows{table=\"t2\"}"), 1);
  EXPECT_GT(Value(scrape, "deltastream_tracker_table_bytes{table=\"t1\"}"), 0);
  EXPECT_GT(Value(scrape, "deltastream_tracker_memory_held_bytes"), 0);
  // The predictor read up to the open batch (its read is pending), the
  // checkpoint consumer read nothing: it lags both closed batches.
  EXPECT_EQ(Value(scrape,
                  "deltastream_tracker_consumer_pending_reads{"
                  "consumer=\"predictor\"}"),
            1);
  EXPECT_EQ(Value(scrape,
                  "deltastream_tracker_consumer_pending_reads{"
                  "consumer=\"checkpoint\"}"),
            0);
  EXPECT_EQ(Value(scrape,
                  "deltastream_tracker_consumer_lag_steps{consumer="
                  "\"checkpoint\"}"),
            2)
      << scrape;
  EXPECT_GE(Value(scrape,
                  "deltastream_tracker_consumer_lag_seconds{consumer="
                  "\"checkpoint\"}"),
            0);
  EXPECT_EQ(Value(scrape,
                  "deltastream_tracker_consumer_resync_required{"
                  "consumer=\"checkpoint\"}"),
            0);
  EXPECT_EQ(Value(scrape, "deltastream_tracker_dropped_rows_total"), 0);
  EXPECT_NE(scrape.find("# TYPE deltastream_tracker_dropped_rows_total "
                        "counter"),
            std::string::npos);
  EXPECT_EQ(Value(scrape, "deltastream_tracker_snapshot_generation"), 1);
  EXPECT_GT(Value(scrape, "deltastream_tracker_snapshot_bytes"), 0);
  EXPECT_GE(Value(scrape, "deltastream_tracker_snapshot_duration_seconds"), 0);
  EXPECT_GE(Value(scrape, "deltastream_tracker_snapshot_age_seconds"), 0);
  EXPECT_GT(Value(scrape, "deltastream_tracker_snapshot_timestamp_seconds"), 0);
}

// Per consumer: resyncs (times it was made to resync) and the unread rows
// the memory cap dropped; a consumer that keeps up counts none.
TEST(TrackerMetricsTest, CountsResyncsAndDroppedRowsPerConsumer) {
  TrackerOptions options;
  options.consumers = {"fast", "slow"};
  options.memory_cap_bytes = 3 * 64 * 8 + 1;  // about three batches of IDs
  absl::StatusOr<std::unique_ptr<Tracker>> tracker =
      Tracker::Create(std::move(options));
  ASSERT_TRUE(tracker.ok()) << tracker.status();
  int64_t batch = 0;
  // Ten batches of 64 IDs compaction cannot shrink; "fast" reads each.
  auto record_ten = [&] {
    for (int i = 0; i < 10; ++i, ++batch) {
      ASSERT_TRUE((*tracker)
                      ->RecordTables({{"t",
                                       at::arange(batch * 64, (batch + 1) * 64,
                                                  at::kLong) *
                                           1000003,
                                       {}}})
                      .ok());
      DeltaRequest read;
      read.consumer = "fast";
      ASSERT_TRUE((*tracker)->GetDelta(read).ok());
      (*tracker)->Step();
    }
  };
  auto collector = std::make_shared<TrackerMetrics>(tracker->get(), nullptr);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0",
                             std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  (*endpoint)->Add(collector);
  const std::string resyncs = "deltastream_tracker_consumer_resyncs_total";
  const std::string dropped = "deltastream_tracker_consumer_dropped_rows_total";

  std::string scrape = ScrapeMetrics((*endpoint)->port());
  EXPECT_EQ(Value(scrape, resyncs + "{consumer=\"slow\"}"), 0) << scrape;
  EXPECT_EQ(Value(scrape, dropped + "{consumer=\"slow\"}"), 0);
  EXPECT_NE(scrape.find("# TYPE " + resyncs + " counter"), std::string::npos);
  EXPECT_NE(scrape.find("# TYPE " + dropped + " counter"), std::string::npos);

  record_ten();
  const TrackerStatus status = (*tracker)->Status();
  ASSERT_GT(status.dropped_ids, 0);
  scrape = ScrapeMetrics((*endpoint)->port());
  // Every dropped row was one "slow" had not read; one resync, however many
  // drops it took.
  EXPECT_EQ(Value(scrape, dropped + "{consumer=\"slow\"}"),
            static_cast<double>(status.dropped_ids))
      << scrape;
  EXPECT_EQ(Value(scrape, resyncs + "{consumer=\"slow\"}"), 1);
  EXPECT_EQ(Value(scrape, dropped + "{consumer=\"fast\"}"), 0);
  EXPECT_EQ(Value(scrape, resyncs + "{consumer=\"fast\"}"), 0);

  // Told (the read says so), then behind again: a second resync; the
  // counters only grow.
  DeltaRequest read;
  read.consumer = "slow";
  absl::StatusOr<Delta> told = (*tracker)->GetDelta(read);
  ASSERT_TRUE(told.ok()) << told.status();
  EXPECT_TRUE(told->resync_required);
  record_ten();
  scrape = ScrapeMetrics((*endpoint)->port());
  EXPECT_EQ(Value(scrape, resyncs + "{consumer=\"slow\"}"), 2) << scrape;
  EXPECT_EQ(Value(scrape, dropped + "{consumer=\"slow\"}"),
            static_cast<double>((*tracker)->Status().dropped_ids));
  EXPECT_EQ(Value(scrape, resyncs + "{consumer=\"fast\"}"), 0);

  // Restored from a snapshot (a restart), every counter starts again: the
  // cap's came back from the snapshot while the consumers' did not, and
  // went down after a crash, which Prometheus reads as a reset.
  TrackerOptions same;
  same.consumers = {"fast", "slow"};
  same.memory_cap_bytes = 3 * 64 * 8 + 1;
  absl::StatusOr<std::unique_ptr<Tracker>> restarted =
      Tracker::Create(std::move(same));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE((*restarted)->RestoreState((*tracker)->SaveState()).ok());
  const TrackerStatus restored = (*restarted)->Status();
  EXPECT_EQ(restored.dropped_ids, 0);
  EXPECT_EQ(restored.dropped_bytes, 0);
  EXPECT_EQ(restored.cap_drops, 0);
  EXPECT_EQ(restored.cap_compactions, 0);
}

}  // namespace
}  // namespace deltastream
