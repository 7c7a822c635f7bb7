// Bitwise comparison of two device arrays for the benchmarks' checks of copies (a gathered A
// must equal the regenerated one bit for bit): tp.cu and net_tp.cu.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "weave/common/error.hpp"

namespace weave::bench {

// The count of elements (U: an unsigned type of the element's size) where a and b differ.
template <class U>
__global__ void mismatch_kernel(const U* a, const U* b, size_t n, unsigned long long* out) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    bad += a[i] != b[i];
  for (int o = 16; o > 0; o >>= 1) bad += __shfl_xor_sync(0xffffffff, bad, o);
  if ((threadIdx.x & 31) == 0 && bad) atomicAdd(out, bad);
}
template <class U>
unsigned long long mismatches_bits(const U* a, const U* b, size_t n, cudaStream_t st) {
  unsigned long long* d = nullptr;
  unsigned long long h = 0;
  WEAVE_CUDA_CHECK(cudaMalloc(&d, sizeof h));
  WEAVE_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof h, st));
  mismatch_kernel<<<1024, 256, 0, st>>>(a, b, n, d);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  WEAVE_CUDA_CHECK(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, st));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  WEAVE_CUDA_CHECK(cudaFree(d));
  return h;
}

}  // namespace weave::bench
