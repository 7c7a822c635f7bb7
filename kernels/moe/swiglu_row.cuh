// SwiGLU's math on one row of the grouped layout, shared by the packed pass (swiglu.cu) and the
// low-latency mode's fixed-stride one (low_latency_kernels.cuh): G's row is 2 F8 16-byte groups
// (gate, then up), H's F8; the warp's lanes take 8 consecutive columns at a time, so each warp
// access moves 512 contiguous bytes, and every output is rounded to bf16 once.
#pragma once
#include <cuda_bf16.h>
#include <vector_types.h>

namespace weave::moe {

__device__ __forceinline__ float silu(float g) {
  // g * sigmoid(g) = g / (1 + e^-g). __expf(x) is ex2.approx(x log2 e): ~|x| 2^-24 relative from
  // the argument's rounding plus a few ulp, and the fast division a few ulp: below 2^-18 for
  // |g| < 30, far below the single bf16 rounding (2^-8) that follows. For g below about -87 the
  // divisor passes 2^126 and __fdividef returns 0 (the true value is under 1e-36); for large g,
  // e^-g underflows and the result is g.
  return __fdividef(g, 1.f + __expf(-g));
}

__device__ __forceinline__ void swiglu_row(const uint4* __restrict__ g_row, uint4* __restrict__ h_row, int F8, int lane) {
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

}  // namespace weave::moe
