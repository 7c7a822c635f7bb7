// Three tests for test_harness_cpu to pick with --gtest_filter: what the test main makes of a
// pass, a skip and a failure.
#include <gtest/gtest.h>

TEST(Helper, Passes) { SUCCEED(); }
TEST(Helper, Skips) { GTEST_SKIP() << "skipped on purpose"; }
TEST(Helper, Fails) { ADD_FAILURE() << "failed on purpose"; }
