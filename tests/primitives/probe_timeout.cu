// A deliberately missing signal: rank 0 waits for a counter nobody increments. The expected
// outcome is the timeout diagnostic and a non-zero exit (checked by CTest), never a hang.
#include <cstdio>

#include "weave/runtime/communicator.hpp"
#include "weave/signal.cuh"

__global__ void wait_forever(weave::signals s) {
  if (threadIdx.x == 0) weave::wait(s, 3, 1);
}

int main() {
  try {
    weave::runtime::CommOptions o;
    o.heap_bytes = size_t(32) << 20;
    o.wait_timeout_s = 1.0;
    weave::runtime::Communicator c(o);
    auto s = c.signals("never", 4);
    if (c.rank() == 0) {
      wait_forever<<<1, 32>>>(s.view());
      c.sync();
      std::printf("rank 0: the wait returned without a signal\n");
      return 0;
    }
    c.barrier();  // rank 0 never arrives: this rank is stopped by the launcher
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
}
