// Output sanity for the benchmarks' correctness checks: how many elements are NaN or Inf (a
// poisoned output that a kernel failed to overwrite stays NaN).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "weave/common/error.hpp"

namespace weave::bench {

static __global__ void count_nonfinite_kernel(const __nv_bfloat16* x, size_t n, unsigned long long* bad) {
  unsigned long long c = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    c += !isfinite(__bfloat162float(x[i]));
  if (c) atomicAdd(bad, c);
}

inline unsigned long long count_nonfinite(const __nv_bfloat16* x, size_t n, cudaStream_t st = nullptr) {
  unsigned long long* d = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&d, sizeof *d));
  WEAVE_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof *d, st));
  count_nonfinite_kernel<<<264, 256, 0, st>>>(x, n, d);
  unsigned long long bad = 0;
  WEAVE_CUDA_CHECK(cudaMemcpyAsync(&bad, d, sizeof bad, cudaMemcpyDeviceToHost, st));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  WEAVE_CUDA_CHECK(cudaFree(d));
  return bad;
}

}  // namespace weave::bench
