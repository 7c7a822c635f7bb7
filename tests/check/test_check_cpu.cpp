// The checker itself: the per-element bound, the per-tile report, non-finite handling, seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "weave/common/error.hpp"

using namespace weave::check;

TEST(TileCheck, ElementRatio) {
  EXPECT_DOUBLE_EQ(element_ratio(1.0, 1.0, 0, 0, 0, 0), 0.0);  // exact match needs no bound
  EXPECT_NEAR(element_ratio(1.01, 1.0, 1.0, 0.0, 0.02, 0), 0.5, 1e-9);
  EXPECT_TRUE(std::isinf(element_ratio(1.01, 1.0, 0, 0, 0, 0)));  // zero bound, any error fails
  EXPECT_TRUE(std::isinf(element_ratio(NAN, 1.0, 1, 1, 1, 1)));   // unwritten (poisoned) element
  EXPECT_TRUE(std::isinf(element_ratio(1.0, NAN, 1, 1, 1, 1)));
  EXPECT_DOUBLE_EQ(element_ratio(NAN, NAN, 0, 0, 0, 0), 0.0);       // NaN propagated like the reference
  EXPECT_DOUBLE_EQ(element_ratio(INFINITY, INFINITY, 0, 0, 0, 0), 0.0);
  EXPECT_TRUE(std::isinf(element_ratio(-INFINITY, INFINITY, 1, 1, 1, 1)));
  EXPECT_TRUE(std::isinf(element_ratio(NAN, INFINITY, 1, 1, 1, 1)));
}

// One wrong element in one tile of a large output fails that tile only, although its share of
// the whole output's norm is tiny.
TEST(TileCheck, OneWrongTileOfMany) {
  const long long R = 1000, C = 777;
  std::vector<double> x(R * C), r(R * C);
  for (long long i = 0; i < R * C; ++i) r[i] = x[i] = std::sin(0.001 * i) * 10;
  x[513 * C + 700] += 0.5;  // tile (4, 5) with 128 x 128 tiles
  const Bound b{1.0 / 256, 0, 1e-3};
  const Report rep = compare_host(R, C, [&](long long i, long long j) { return x[i * C + j]; },
                                  [&](long long i, long long j) { return r[i * C + j]; },
                                  [](long long, long long) { return 0.0; }, b);
  EXPECT_FALSE(rep.ok);
  EXPECT_EQ(rep.bad_tiles, 1);
  EXPECT_EQ(rep.tiles, 8 * 7);
  EXPECT_EQ(rep.worst_row, 513);
  EXPECT_EQ(rep.worst_col, 700);
  EXPECT_NE(rep.str().find("tile (4, 5)"), std::string::npos) << rep.str();
  x[513 * C + 700] = r[513 * C + 700];
  const Report good = compare_host(R, C, [&](long long i, long long j) { return x[i * C + j]; },
                                   [&](long long i, long long j) { return r[i * C + j]; },
                                   [](long long, long long) { return 0.0; }, b);
  EXPECT_TRUE(good.ok) << good.str();
}

TEST(TileCheck, ScaleTermAllowsNoiseOfTheSum) {
  // r = 0 (a cancelling sum) with scale s = 1: an error of 2^-9 passes with scale 2^-8 and fails without.
  auto one = [](double v) { return [v](long long, long long) { return v; }; };
  EXPECT_TRUE(compare_host(4, 4, one(1.0 / 512), one(0.0), one(1.0), Bound{kBf16Round, kBf16Round, 0}).ok);
  EXPECT_FALSE(compare_host(4, 4, one(1.0 / 512), one(0.0), one(1.0), Bound{kBf16Round, 0, 0}).ok);
  const Report nan = compare_host(4, 4, one(NAN), one(0.0), one(1.0), Bound{1, 1, 1});
  EXPECT_FALSE(nan.ok);
  EXPECT_EQ(nan.nonfinite, 16);
}

TEST(Seed, DeriveDiffers) {
  EXPECT_NE(derive(1, 0), derive(1, 1));
  EXPECT_NE(derive(1, 0, 0), derive(1, 0, 1));
  EXPECT_NE(derive(1, 2), derive(2, 2));
  EXPECT_EQ(derive(7, 3, 4), derive(7, 3, 4));
}

// A test's case seeds depend on its name and its own count only: replayed alone (a filtered run)
// it draws what it drew after other tests in the full run.
// The ranks of one weave-run job share a seed (so any rank's printed seed replays the job); two
// launches, whose ids differ in their random part, do not.
TEST(Seed, OneSeedPerJob) {
  const uint64_t a = job_seed("host-101-00000000deadbeef");
  EXPECT_EQ(job_seed("host-101-00000000deadbeef"), a);
  EXPECT_NE(job_seed("host-101-00000000deadbeee"), a);
  EXPECT_NE(job_seed("host-102-00000000deadbeef"), a);
  EXPECT_NE(job_seed(""), a);
}

// WEAVE_TEST_SEED first; a job id only with weave-run's WEAVE_RANK beside it (a WEAVE_JOB_ID a user
// fixes for torchrun or mpirun would repeat one run's inputs forever); otherwise the OS.
TEST(Seed, JobIdOnlyFromWeaveRun) {
  EXPECT_EQ(choose_seed("0x10", "job", "0").kind, SeedChoice::Env);
  EXPECT_EQ(choose_seed("0x10", "job", "0").value, 16u);
  EXPECT_EQ(choose_seed(nullptr, "job", "1").kind, SeedChoice::Job);
  EXPECT_EQ(choose_seed(nullptr, "job", "1").value, job_seed("job"));
  EXPECT_EQ(choose_seed("", "job", "1").kind, SeedChoice::Job);
  EXPECT_EQ(choose_seed(nullptr, "job", nullptr).kind, SeedChoice::Os);
  EXPECT_EQ(choose_seed(nullptr, "", "0").kind, SeedChoice::Os);
  EXPECT_EQ(choose_seed(nullptr, nullptr, nullptr).kind, SeedChoice::Os);
  EXPECT_THROW(choose_seed("12x", nullptr, nullptr), weave::Error);
}

TEST(Seed, CaseSeedsRestartPerTest) {
  begin_test_cases("Suite.A");
  const uint64_t a0 = case_seed(1), a1 = case_seed(1), a1b = case_seed(2);
  begin_test_cases("Suite.B");
  const uint64_t b0 = case_seed(1);
  begin_test_cases("Suite.A");
  EXPECT_EQ(case_seed(1), a0);
  EXPECT_EQ(case_seed(1), a1);
  EXPECT_NE(a0, a1);
  EXPECT_NE(a1, a1b);
  EXPECT_NE(a0, b0);
}
