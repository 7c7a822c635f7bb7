// Cross-rank steps between plain kernels on a stream (ag_gemm v8, gemm_rs v3): one thread that
// optionally adds 1 to counter `index_dst` of rank `dst` (after the kernels before it on the
// stream, whose stores, local and to peers, are complete), then waits until this rank's counter
// `index_wait` reaches `expected` (0: no wait) with weave's timeout diagnostics. A
// cuStreamWaitValue64 would do the wait without a timeout: a peer that died or never called
// would hang the stream silently.
#pragma once
#include <cuda_runtime.h>

#include "weave/common/error.hpp"
#include "weave/signal.cuh"

namespace weave::tp {

namespace {  // one copy per translation unit (host-side helpers of two libraries include it)
__global__ void signal_wait_kernel(const __grid_constant__ signals s, int dst, int index_dst, int index_wait,
                                   unsigned long long expected) {
  if (dst >= 0) {
    fence_acq_rel_sys();
    signal(s, dst, index_dst);
  }
  if (expected) wait(s, index_wait, expected);
}
}  // namespace

inline void signal_wait(cudaStream_t st, const signals& s, int dst, int index_dst, int index_wait,
                        unsigned long long expected) {
  signal_wait_kernel<<<1, 1, 0, st>>>(s, dst, index_dst, index_wait, expected);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace weave::tp
