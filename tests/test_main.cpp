// GoogleTest main for every weave test binary. A binary built for GPUs declares how many it
// needs through WEAVE_TEST_GPUS (set by CTest); with fewer visible it exits 77, which CTest
// reports as skipped, never as passed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

int main(int argc, char** argv) {
  if (const char* need = std::getenv("WEAVE_TEST_GPUS")) {
    int n = std::atoi(need), have = 0;
    if (cudaGetDeviceCount(&have) != cudaSuccess) have = 0;
    if (have < n) {
      std::printf("skipped: needs %d GPU(s), %d visible\n", n, have);
      return 77;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
