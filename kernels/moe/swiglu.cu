// SwiGLU on the grouped rows (swiglu.hpp). A memory-bound elementwise pass: every lane handles 8
// consecutive columns at a time, i.e. one 16-byte load of the gate, one of the up half and one
// 16-byte store, so each warp access moves 512 contiguous bytes. The row bound comes from device
// memory (the dispatch's total), so the grid is sized for the capacity and the warps stride over
// the rows below the bound the device reads: warps of a lightly filled buffer exit at once.
#include <algorithm>
#include <cstdint>

#include "moe/swiglu.hpp"
#include "moe/swiglu_row.cuh"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"

namespace weave::moe {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) swiglu_kernel(const uint4* __restrict__ G, uint4* __restrict__ Hout,
                                                          const int* __restrict__ rows_ptr, int R_cap, int F8) {
  const int rows = rows_ptr ? min(max(*rows_ptr, 0), R_cap) : R_cap;
  // One warp per row (rows strided over the grid's warps), lanes over the row's 16-byte groups of
  // 8 columns: G's row is 2 F8 groups (gate then up), H's F8. The issue's F (2048, 1536, 14336)
  // give F8 = 256, 192, 1792, whole multiples of 32 lanes.
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * (kThreads / 32);
  for (int r = blockIdx.x * (kThreads / 32) + threadIdx.x / 32; r < rows; r += warps) {
    swiglu_row(G + static_cast<size_t>(r) * 2 * F8, Hout + static_cast<size_t>(r) * F8, F8, lane);
  }
}


}  // namespace

int swiglu_blocks(int R_cap, int F, int sms) {
  // One warp per row of a full buffer, capped at 8 resident 256-thread blocks per SM (2048
  // threads: one wave); the warps stride over the rows the device finds. F does not change the
  // grid (a warp walks its row), it is an argument for the contract's sake.
  (void)F;
  const long long need = (static_cast<long long>(std::max(R_cap, 0)) + kThreads / 32 - 1) / (kThreads / 32);
  return static_cast<int>(std::max<long long>(1, std::min<long long>(need, 8LL * std::max(sms, 1))));
}

void swiglu(const __nv_bfloat16* G, __nv_bfloat16* Hout, const int* rows, int R_cap, int F, cudaStream_t stream) {
  WEAVE_CHECK(F > 0 && F % 8 == 0, "moe swiglu: F = ", F, " must be a positive multiple of 8 (16-byte vectors)");
  WEAVE_CHECK(R_cap >= 0, "moe swiglu: negative capacity ", R_cap);
  if (R_cap == 0) return;
  WEAVE_CHECK(is_aligned(G) && is_aligned(Hout), "moe swiglu: G (", static_cast<const void*>(G), ") and H (",
              static_cast<const void*>(Hout), ") must be 16-byte aligned");
  // The kernel may read and write every row up to the capacity (the count is on the device).
  check_extent("moe swiglu", "G", G, size_t(R_cap) * 2 * F * sizeof(__nv_bfloat16));
  check_extent("moe swiglu", "Hout", Hout, size_t(R_cap) * F * sizeof(__nv_bfloat16));
  if (rows) check_extent("moe swiglu", "rows", rows, sizeof(int));
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  swiglu_kernel<<<swiglu_blocks(R_cap, F, sms), kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(G),
                                                                       reinterpret_cast<uint4*>(Hout), rows, R_cap,
                                                                       F / 8);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace weave::moe
