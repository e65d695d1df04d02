// trainer/trainer_metrics.h: steps observed as the step loop observes them,
// scraped over HTTP from a base/metrics.h endpoint.
#include "trainer/trainer_metrics.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "base/metrics.h"
#include "tests/base/http_scrape.h"

namespace deltastream {
namespace {

TEST(TrainerMetricsTest, StepsExamplesLossAndStepTimes) {
  auto registry = std::make_shared<prometheus::Registry>();
  TrainerMetrics metrics(*registry);
  metrics.ObserveStep(/*batch=*/0, /*seconds=*/0.25, /*examples=*/512, 0.75);
  metrics.ObserveStep(/*batch=*/1, /*seconds=*/0.5, /*examples=*/512, 0.5);
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const std::string scrape = ScrapeMetrics((*endpoint)->port());
  auto value = [&](const std::string& series) {
    return SampleValue(scrape, series).value_or(-1);
  };
  EXPECT_EQ(value("deltastream_trainer_steps_total"), 2) << scrape;
  EXPECT_EQ(value("deltastream_trainer_examples_total"), 1024);
  EXPECT_EQ(value("deltastream_trainer_examples_per_second"), 1024);
  EXPECT_EQ(value("deltastream_trainer_loss"), 0.5);
  EXPECT_EQ(value("deltastream_trainer_batch"), 1);
  EXPECT_EQ(value("deltastream_trainer_step_seconds_count"), 2);
  EXPECT_EQ(value("deltastream_trainer_step_seconds_sum"), 0.75);
  // 0.25 s falls in the 0.256 s bucket, 0.5 s in the 0.512 s one.
  EXPECT_EQ(value("deltastream_trainer_step_seconds_bucket{le=\"0.256\"}"), 1);
  EXPECT_EQ(value("deltastream_trainer_step_seconds_bucket{le=\"0.512\"}"), 2);
}

}  // namespace
}  // namespace deltastream
