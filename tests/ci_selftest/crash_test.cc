#include <cstdlib>
#include <gtest/gtest.h>
TEST(Crash, Passes) {}
TEST(Crash, Aborts) { std::abort(); }
