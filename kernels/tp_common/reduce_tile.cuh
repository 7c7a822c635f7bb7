// The communicator blocks' tile reduction of the inter-SM kernels (gemm_ar v0, gemm_rs v2): a
// tile of nr rows x ncv 16-byte chunks, read from every rank's partial (16-byte peer loads,
// U chunks x MW ranks in flight per thread), summed in fp32 in rank order 0..W-1 (so every rank
// that computes the same tile gets bit-identical bf16), written to ndst destinations.
#pragma once
#include <cuda_bf16.h>

namespace weave::tp {

// src[r] + src_off (+ row * ld + chunk * 8): rank r's partial; dst[d] + dst_off likewise. Threads
// t = 0..nt-1 of the caller's group share the tile.
template <int MW, int U>
__device__ __forceinline__ void reduce_tile_rows(__nv_bfloat16* const* src, int W, long long src_off,
                                                 __nv_bfloat16* const* dst, int ndst, long long dst_off, int nr,
                                                 int ncv, long long ld, int t, int nt) {
  const int total = nr * ncv;
  for (int base = t; base < total; base += nt * U) {
    int4 v[U][MW];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = base + u * nt;
      if (e >= total) break;
      const long long off = static_cast<long long>(e / ncv) * ld + (e % ncv) * 8;
#pragma unroll
      for (int r = 0; r < MW; ++r)
        if (r < W) v[u][r] = __ldcg(reinterpret_cast<const int4*>(src[r] + src_off + off));
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = base + u * nt;
      if (e >= total) break;
      const long long off = static_cast<long long>(e / ncv) * ld + (e % ncv) * 8;
      float acc[8];
      const __nv_bfloat16* x0 = reinterpret_cast<const __nv_bfloat16*>(&v[u][0]);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = __bfloat162float(x0[i]);
#pragma unroll
      for (int r = 1; r < MW; ++r) {
        if (r >= W) break;
        const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(&v[u][r]);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += __bfloat162float(x[i]);
      }
      int4 out;
      __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&out);
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = __float2bfloat16_rn(acc[i]);
      for (int d = 0; d < ndst; ++d) *reinterpret_cast<int4*>(dst[d] + dst_off + off) = out;
    }
  }
}

// The same with the unroll chosen by the world size (registers: U * MW int4 per thread); by
// default the whole block shares the tile.
__device__ __forceinline__ void reduce_tile(__nv_bfloat16* const* src, int W, long long src_off,
                                            __nv_bfloat16* const* dst, int ndst, long long dst_off, int nr, int ncv,
                                            long long ld, int t = threadIdx.x, int nt = blockDim.x) {
  if (W <= 2) reduce_tile_rows<2, 4>(src, W, src_off, dst, ndst, dst_off, nr, ncv, ld, t, nt);
  else if (W <= 4) reduce_tile_rows<4, 2>(src, W, src_off, dst, ndst, dst_off, nr, ncv, ld, t, nt);
  else reduce_tile_rows<8, 1>(src, W, src_off, dst, ndst, dst_off, nr, ncv, ld, t, nt);
}

}  // namespace weave::tp
