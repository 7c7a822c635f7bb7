// Online-softmax helpers over wgmma accumulators. Each thread holds two rows (l/4 and l/4+8 of
// its warp's 16) spread over the 4 lanes of a quad, so a row reduction is a local pass plus two
// butterfly shuffles.
#pragma once

namespace weave::tile {

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffff, v, 1);
  return v + __shfl_xor_sync(0xffffffff, v, 2);
}

// row 0 = elements 4j+0..1, row 1 = elements 4j+2..3 of a 64xN accumulator.
template <int R>
__device__ __forceinline__ void row_max(const float (&d)[R], float (&m)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float v = -INFINITY;
#pragma unroll
    for (int j = 0; j < R / 4; ++j) v = fmaxf(v, fmaxf(d[4 * j + 2 * r], d[4 * j + 2 * r + 1]));
    m[r] = quad_max(v);
  }
}
// d = exp2(d * scale - m * scale): one FFMA and one MUFU.EX2 per element (scale folds
// log2(e) and the softmax temperature).
template <int R>
__device__ __forceinline__ void exp2_rows(float (&d)[R], const float (&m)[2], float scale) {
#pragma unroll
  for (int j = 0; j < R / 4; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float off = m[r] * scale;
      d[4 * j + 2 * r] = exp2_approx(fmaf(d[4 * j + 2 * r], scale, -off));
      d[4 * j + 2 * r + 1] = exp2_approx(fmaf(d[4 * j + 2 * r + 1], scale, -off));
    }
}

}  // namespace weave::tile
