// SwiGLU on the grouped rows (swiglu.hpp). A memory-bound elementwise pass: every lane handles 8
// consecutive columns at a time, i.e. one 16-byte load of the gate, one of the up half and one
// 16-byte store, so each warp access moves 512 contiguous bytes. The row bound comes from device
// memory (the dispatch's total), so the grid is sized for the capacity and the warps stride over
// the rows below the bound the device reads: warps of a lightly filled buffer exit at once.
#include <algorithm>
#include <cstdint>

#include "moe/swiglu.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"

namespace weave::moe {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float silu(float g) {
  // g * sigmoid(g) = g / (1 + e^-g). __expf(x) is ex2.approx(x log2 e): ~|x| 2^-24 relative from
  // the argument's rounding plus a few ulp, and the fast division a few ulp: below 2^-18 for
  // |g| < 30, far below the single bf16 rounding (2^-8) that follows. For g below about -87 the
  // divisor passes 2^126 and __fdividef returns 0 (the true value is under 1e-36); for large g,
  // e^-g underflows and the result is g.
  return __fdividef(g, 1.f + __expf(-g));
}

__global__ void __launch_bounds__(kThreads) swiglu_kernel(const uint4* __restrict__ G, uint4* __restrict__ Hout,
                                                          const int* __restrict__ rows_ptr, int R_cap, int F8) {
  const int rows = rows_ptr ? min(max(*rows_ptr, 0), R_cap) : R_cap;
  // One warp per row (rows strided over the grid's warps), lanes over the row's 16-byte groups of
  // 8 columns: G's row is 2 F8 groups (gate then up), H's F8. The issue's F (2048, 1536, 14336)
  // give F8 = 256, 192, 1792, whole multiples of 32 lanes.
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * (kThreads / 32);
  for (int r = blockIdx.x * (kThreads / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const uint4* g_row = G + static_cast<size_t>(r) * 2 * F8;
    uint4* h_row = Hout + static_cast<size_t>(r) * F8;
#pragma unroll 2
    for (int c = lane; c < F8; c += 32) {
      const uint4 gv = __ldg(g_row + c);
      const uint4 uv = __ldg(g_row + F8 + c);
      const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
      const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv);
      uint4 ov;
      __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&ov);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 g = __bfloat1622float2(g2[q]);
        const float2 u = __bfloat1622float2(u2[q]);
        o2[q] = __floats2bfloat162_rn(silu(g.x) * u.x, silu(g.y) * u.y);  // one rounding per output
      }
      h_row[c] = ov;
    }
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
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  swiglu_kernel<<<swiglu_blocks(R_cap, F, sms), kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(G),
                                                                       reinterpret_cast<uint4*>(Hout), rows, R_cap,
                                                                       F / 8);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace weave::moe
