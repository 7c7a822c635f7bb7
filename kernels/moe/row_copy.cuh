// Moving token rows (16-byte vectors) between device buffers, as the MoE kernels do: one row read
// once and stored to n destinations by `stride` cooperating threads (thread `first` takes vectors
// first, first + stride, ...), Unroll loads in flight per thread before their stores. FromL2: the
// row was written during this kernel (by peers or other blocks), so it is read past L1 (__ldcg);
// otherwise it is read-only for the kernel (__ldg).
#pragma once
#include <vector_types.h>

namespace weave::moe {

template <int Unroll, bool FromL2>
__device__ __forceinline__ void fanout_row(const int4* src, int4* const* dst, int n, int nv, int first, int stride) {
#pragma unroll 1
  for (int v0 = first; v0 < nv; v0 += stride * Unroll) {
    int4 val[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      const int v = v0 + u * stride;
      if (v < nv) val[u] = FromL2 ? __ldcg(src + v) : __ldg(src + v);
    }
#pragma unroll 1
    for (int q = 0; q < n; ++q) {
      int4* d = dst[q];
#pragma unroll
      for (int u = 0; u < Unroll; ++u) {
        const int v = v0 + u * stride;
        if (v < nv) d[v] = val[u];
      }
    }
  }
}

template <int Unroll, bool FromL2>
__device__ __forceinline__ void copy_row(const int4* src, int4* dst, int nv, int first, int stride) {
  fanout_row<Unroll, FromL2>(src, &dst, 1, nv, first, stride);
}

}  // namespace weave::moe
