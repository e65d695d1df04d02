#include "clients/freshness_window.h"

#include <gtest/gtest.h>

namespace deltastream {
namespace {

TEST(FreshnessWindowTest, EmptyReportsZero) {
  FreshnessWindow window;
  EXPECT_EQ(window.size(), 0);
  EXPECT_EQ(window.Quantile(0.5), 0);
  EXPECT_EQ(window.Max(), 0);
}

TEST(FreshnessWindowTest, NearestRankQuantiles) {
  FreshnessWindow window;
  for (int ms = 100; ms >= 1; --ms) window.Add(ms);
  EXPECT_EQ(window.size(), 100);
  EXPECT_EQ(window.Quantile(0), 1);
  EXPECT_EQ(window.Quantile(0.5), 50);
  EXPECT_EQ(window.Quantile(0.99), 99);
  EXPECT_EQ(window.Quantile(1), 100);
  EXPECT_EQ(window.Max(), 100);
}

TEST(FreshnessWindowTest, KeepsTheLastSamplesOnly) {
  FreshnessWindow window(3);
  for (double ms : {500.0, 400.0, 1.0, 2.0, 3.0}) window.Add(ms);
  EXPECT_EQ(window.size(), 3);
  EXPECT_EQ(window.Max(), 3);
  EXPECT_EQ(window.Quantile(0), 1);
}

}  // namespace
}  // namespace deltastream
