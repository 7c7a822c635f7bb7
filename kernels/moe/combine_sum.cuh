// The weighted sum of a token's k expert output rows, shared by the non-fused combine
// (exchange_kernels.cuh, combine_rows: rows pulled from the experts' ranks) and the fused
// gemm_combine's final sum (gemm_combine_kernel.cuh, sum_landed: rows pushed into the local landing
// buffer): one code for both, so the two paths give bit-identical outputs for the same expert rows.
#pragma once
#include <cuda_bf16.h>

namespace weave::moe::detail {

// Output vector v (8 bf16 columns) of one token: bf16(sum_j wt[j] * src[j][v]), fp32 fma in slot
// order (the result does not depend on the grid), four slots' 16-byte loads in flight before
// their sum. __ldcg: the rows were written by other GPUs (or another kernel) since this SM's L1
// could have cached them.
__device__ __forceinline__ int4 weighted_sum_vec(const int4* const* src, const float* wt, int k, int v) {
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  for (int j0 = 0; j0 < k; j0 += 4) {
    int4 val[4];
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (j0 + q < k) val[q] = __ldcg(src[j0 + q] + v);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      if (j0 + q >= k) break;
      const float w = wt[j0 + q];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&val[q]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h[i]);
        acc[2 * i] = __fmaf_rn(w, f.x, acc[2 * i]);
        acc[2 * i + 1] = __fmaf_rn(w, f.y, acc[2 * i + 1]);
      }
    }
  }
  int4 o;
  __nv_bfloat162* ob = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int i = 0; i < 4; ++i) ob[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return o;
}

// What a failed dispatch's combine writes: bf16 0xffff, a NaN, in every column.
__device__ __forceinline__ int4 nan_vec() { return make_int4(-1, -1, -1, -1); }

}  // namespace weave::moe::detail
