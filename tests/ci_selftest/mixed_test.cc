#include <gtest/gtest.h>
TEST(Mixed, PassesA) { EXPECT_EQ(1, 1); }
TEST(Mixed, PassesB) { SUCCEED(); }
TEST(Mixed, Fails) {
  EXPECT_EQ(1, 2) << "<testcase name=\"fake\"> <error in a message";
}
TEST(Mixed, Skips) { GTEST_SKIP() << "not here"; }
TEST(Mixed, DISABLED_Off) {}
