#include <gtest/gtest.h>
TEST(Broken, DoesNotCompile) { undeclared_thing(); }
