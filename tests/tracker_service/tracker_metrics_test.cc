// tracker_service/tracker_metrics.h against a real Tracker and real RocksDB
// snapshots, scraped over HTTP from a base/metrics.h endpoint.
#include "tracker_service/tracker_metrics.h"

#include <ATen/ATen.h>
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

}  // namespace
}  // namespace deltastream
