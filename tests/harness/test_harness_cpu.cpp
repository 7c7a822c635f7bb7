// The test main's verdicts (issue 23: skips must not hide failures): run on a helper binary for
// the exit codes CTest sees, and the GPU gate on injected CUDA results.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "tests/gpu_gate.hpp"

namespace {

struct Outcome {
  int status = -1;
  std::string out;
};

// The helper with `args` under `env` (assignments for env(1); WEAVE_TEST_GPUS is unset unless
// they set it), stdout and stderr together.
Outcome helper(const std::string& env, const std::string& args) {
  const std::string cmd = "env -u WEAVE_TEST_GPUS " + env + " '" HARNESS_HELPER_BIN "' " + args + " 2>&1";
  Outcome r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Each case: the helper's exit code and a line of its output. A skip inside a passing run is
// CTest's "skipped", a failure wins over a skip, more GPUs than any machine has skip (where the
// driver is loaded and CUDA fails: fail, which the case allows), a malformed count fails.
TEST(Harness, ExitCodes) {
  const int skipped = weave::test::kSkipped;
  const struct {
    const char *env, *filter;
    int status;
    const char* says;
  } cases[] = {
      {"", "Helper.Passes", 0, "[  PASSED  ] 1 test"},
      {"", "Helper.Passes:Helper.Skips", skipped, "skipped: 1 test(s) did not run: Helper.Skips"},
      {"", "Helper.Skips:Helper.Fails", 1, "replay with WEAVE_TEST_SEED="},
      {"WEAVE_TEST_GPUS=1000", "Helper.Passes", skipped, "skipped: needs 1000 GPU(s)"},
      {"WEAVE_TEST_GPUS=two", "Helper.Passes", 1, "WEAVE_TEST_GPUS='two' is not an integer"},
  };
  for (const auto& c : cases) {
    const Outcome r = helper(c.env, std::string("--gtest_filter=") + c.filter);
    SCOPED_TRACE(std::string(c.env) + " " + c.filter + ":\n" + r.out);
    if (r.status == 1 && has(r.out, "failing, not skipping")) continue;  // CUDA fails on this machine's driver
    EXPECT_EQ(r.status, c.status);
    EXPECT_TRUE(has(r.out, c.says));
  }
}

// count_gpus' verdict on injected cudaGetDeviceCount results, through the gate the test main applies.
TEST(GpuGate, CudaErrorFailsWhereTheDriverIsLoaded) {
  using weave::gpu_count_from;
  using weave::test::gpu_gate;
  // No GPU here: the errors CUDA gives without a driver or devices skip, where no driver is loaded.
  for (cudaError_t e : {cudaErrorNoDevice, cudaErrorInsufficientDriver}) {
    const weave::GpuCount g = gpu_count_from(e, 0, false);
    EXPECT_FALSE(g.error) << e;
    EXPECT_EQ(g.count, 0);
    EXPECT_EQ(gpu_gate(1, g).exit_code, weave::test::kSkipped) << e;
  }
  // The same errors where the driver is loaded, and any other error anywhere: a failure.
  for (const auto& [e, driver] : {std::pair{cudaErrorNoDevice, true}, std::pair{cudaErrorInsufficientDriver, true},
                                  std::pair{cudaErrorInitializationError, false},
                                  std::pair{cudaErrorInitializationError, true}, std::pair{cudaErrorUnknown, true}}) {
    const weave::GpuCount g = gpu_count_from(e, 0, driver);
    EXPECT_TRUE(g.error) << e << " driver " << driver;
    EXPECT_TRUE(has(g.why, cudaGetErrorName(e))) << g.why;
    const weave::test::GpuGate gate = gpu_gate(1, g);
    EXPECT_EQ(gate.exit_code, 1) << e << " driver " << driver;
    EXPECT_TRUE(has(gate.message, "failing, not skipping")) << gate.message;
    EXPECT_EQ(gpu_gate(0, g).exit_code, 1) << "an error fails even where no GPU is needed";
  }
  // Success: the count decides.
  EXPECT_EQ(gpu_count_from(cudaSuccess, 2, false).count, 2);
  EXPECT_EQ(gpu_gate(2, gpu_count_from(cudaSuccess, 2, true)).exit_code, -1);
  EXPECT_EQ(gpu_gate(3, gpu_count_from(cudaSuccess, 2, true)).exit_code, weave::test::kSkipped);
  EXPECT_TRUE(has(gpu_gate(3, gpu_count_from(cudaSuccess, 2, true)).message, "needs 3 GPU(s), 2 visible"));
}

}  // namespace
