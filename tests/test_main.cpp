// GoogleTest main for every weave test binary.
// - A binary built for GPUs declares how many it needs through WEAVE_TEST_GPUS (set by CTest);
//   with fewer visible it exits 77, which CTest reports as skipped, never as passed. On a machine
//   whose NVIDIA driver is loaded, a CUDA error while counting GPUs is a failure, not a skip.
// - A test that skipped itself (GTEST_SKIP) makes the whole binary exit 77 when nothing failed,
//   so CTest shows "skipped" rather than a pass that did not run everything.
// - The random seed is printed at the start and again after a failure (WEAVE_TEST_SEED replays,
//   one test alone with --gtest_filter: each test's case seeds start from its name).
#include <gtest/gtest.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "check/seed.hpp"
#include "tests/gpu_gate.hpp"
#include "weave/common/gpus.hpp"
#include "weave/runtime/env.hpp"

namespace {

// Each test draws its case seeds from its own name (check::begin_test_cases), so it replays
// alone under the run's seed.
class SeedPerTest : public testing::EmptyTestEventListener {
  void OnTestStart(const testing::TestInfo& info) override {
    weave::check::begin_test_cases(std::string(info.test_suite_name()) + "." + info.name());
  }
  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result() && info.result()->Failed())
      std::printf("%s.%s failed; replay with WEAVE_TEST_SEED=%llu and --gtest_filter=%s.%s\n", info.test_suite_name(),
                  info.name(), static_cast<unsigned long long>(weave::check::test_seed()), info.test_suite_name(),
                  info.name());
  }
};

std::vector<std::string> skipped_tests() {
  std::vector<std::string> out;
  const testing::UnitTest& u = *testing::UnitTest::GetInstance();
  for (int i = 0; i < u.total_test_suite_count(); ++i) {
    const testing::TestSuite& s = *u.GetTestSuite(i);
    for (int j = 0; j < s.total_test_count(); ++j) {
      const testing::TestInfo& t = *s.GetTestInfo(j);
      if (t.should_run() && t.result()->Skipped()) out.push_back(std::string(s.name()) + "." + t.name());
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (const auto need = weave::env::raw("WEAVE_TEST_GPUS"); need && !need->empty()) {
      const weave::test::GpuGate gate =
          weave::test::gpu_gate(weave::env::parse_int("WEAVE_TEST_GPUS", *need), weave::count_gpus());
      if (gate.exit_code >= 0) {
        std::printf("%s\n", gate.message.c_str());
        return gate.exit_code;
      }
    }
  } catch (const std::exception& e) {  // a malformed WEAVE_TEST_GPUS: fail, naming it
    std::printf("error: %s\n", e.what());
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  weave::check::test_seed();  // prints the seed before any test output
  testing::UnitTest::GetInstance()->listeners().Append(new SeedPerTest);
  const int rc = RUN_ALL_TESTS();
  if (rc != 0) return rc;
  const auto skipped = skipped_tests();
  if (!skipped.empty()) {
    std::printf("skipped: %zu test(s) did not run:", skipped.size());
    for (const auto& s : skipped) std::printf(" %s", s.c_str());
    std::printf("\n");
    return weave::test::kSkipped;
  }
  return 0;
}
