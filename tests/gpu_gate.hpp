// Whether a test binary that needs GPUs runs its tests, reports skipped or fails, from the GPUs
// this machine counted (apart from the test main so that the harness tests can inject CUDA errors).
#pragma once
#include <string>

#include "weave/common/gpus.hpp"

namespace weave::test {

inline constexpr int kSkipped = WEAVE_SKIP_CODE;  // CTest's SKIP_RETURN_CODE, cmake/tests.cmake's

struct GpuGate {
  int exit_code = -1;   // < 0: run the tests; else exit with it after printing `message`
  std::string message;
};

// A CUDA error on a machine whose driver is loaded fails the binary: skipping there would turn
// a broken GPU into a green run.
inline GpuGate gpu_gate(int need, const GpuCount& g) {
  if (g.error)
    return {1, "error: this machine has an NVIDIA driver but CUDA cannot count its GPUs (" + g.why +
                   "); failing, not skipping"};
  if (g.count < need)
    return {kSkipped, "skipped: needs " + std::to_string(need) + " GPU(s), " + std::to_string(g.count) + " visible"};
  return {};
}

}  // namespace weave::test
