#include <gtest/gtest.h>
TEST(Sharded, A) {}
TEST(Sharded, B) {}
TEST(Sharded, C) {}
TEST(Sharded, D) {}
