// reduce, all_reduce: element-wise reduction of one tile across every rank's copy of a pgl,
// without multicast: 16-byte peer loads, fp32 accumulation in a fixed rank order (so every
// rank that reduces the same data gets bit-identical results). Block-cooperative: all threads
// of the block call it with the same arguments. Edge tiles are clipped to the tensor.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "weave/pgl.cuh"
#include "weave/types.hpp"

namespace weave {

namespace detail {
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <ReduceOp Op>
__device__ __forceinline__ float combine(float a, float b) {
  if constexpr (Op == ReduceOp::sum) return a + b;
  else if constexpr (Op == ReduceOp::max) return fmaxf(a, b);
  else return fminf(a, b);
}

// Reduces the 16-byte chunk at element offset `off` (vector == whole chunk inside the row) or the
// `n` scalars starting there, over all ranks, and hands each result element to `put(i, value)`.
template <ReduceOp Op, class T, int W, class Put>
__device__ __forceinline__ void reduce_chunk(const pgl<T, W>& p, long long off, int n, Put&& put) {
  constexpr int V = 16 / sizeof(T);
  float acc[V];
  if (n == V) {
    int4 v[W];
#pragma unroll
    for (int r = 0; r < W; ++r)
      if (r < p.world) v[r] = __ldcg(reinterpret_cast<const int4*>(p.ptr[r] + off));
#pragma unroll
    for (int r = 0; r < W; ++r) {
      if (r >= p.world) break;
      const T* e = reinterpret_cast<const T*>(&v[r]);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] = r == 0 ? to_f32(e[i]) : combine<Op>(acc[i], to_f32(e[i]));
    }
  } else {
    for (int i = 0; i < n; ++i) {
      acc[i] = to_f32(p.ptr[0][off + i]);
      for (int r = 1; r < p.world; ++r) acc[i] = combine<Op>(acc[i], to_f32(p.ptr[r][off + i]));
    }
  }
  put(n, acc);
}

// Visits the tile's 16-byte chunks, spread over the block's threads.
template <class T, int W, class F>
__device__ __forceinline__ void for_each_chunk(const pgl<T, W>& p, int tile_row, int tile_col, F&& f) {
  constexpr int V = 16 / sizeof(T);
  const int r0 = tile_row * p.tile_rows, c0 = tile_col * p.tile_cols;
  const int nr = min(p.tile_rows, p.rows - r0), nc = min(p.tile_cols, p.cols - c0);
  if (nr <= 0 || nc <= 0) return;
  const int per_row = (nc + V - 1) / V;
  const int nthreads = blockDim.x * blockDim.y * blockDim.z;
  const int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  for (int i = tid; i < nr * per_row; i += nthreads) {
    const int r = i / per_row, c = (i % per_row) * V;
    f(r, c, (r0 + r) * p.ld + c0 + c, min(V, nc - c));
  }
}
}  // namespace detail

// dst (this rank's memory, row-major with pitch ld_dst, pointing at the tile's first element)
// receives Op over ranks of tile (tile_row, tile_col) of p.
template <ReduceOp Op, class T, int W>
__device__ __forceinline__ void reduce(const pgl<T, W>& p, int tile_row, int tile_col, T* dst, long long ld_dst) {
  detail::for_each_chunk(p, tile_row, tile_col, [&](int r, int c, long long off, int n) {
    detail::reduce_chunk<Op>(p, off, n, [&](int m, const float* acc) {
      T* d = dst + r * ld_dst + c;
      for (int i = 0; i < m; ++i) d[i] = detail::from_f32<T>(acc[i]);
    });
  });
}

// Every rank's copy of tile (tile_row, tile_col) becomes Op over ranks. Exactly one block of one
// rank may all-reduce a given tile between two barriers (it reads every copy, then writes every
// copy); partition tiles among ranks and blocks.
template <ReduceOp Op, class T, int W>
__device__ __forceinline__ void all_reduce(const pgl<T, W>& p, int tile_row, int tile_col) {
  constexpr int V = 16 / sizeof(T);
  detail::for_each_chunk(p, tile_row, tile_col, [&](int, int, long long off, int n) {
    detail::reduce_chunk<Op>(p, off, n, [&](int m, const float* acc) {
      if (m == V) {
        int4 out;
        T* o = reinterpret_cast<T*>(&out);
#pragma unroll
        for (int i = 0; i < V; ++i) o[i] = detail::from_f32<T>(acc[i]);
#pragma unroll
        for (int r = 0; r < W; ++r)
          if (r < p.world) *reinterpret_cast<int4*>(p.ptr[r] + off) = out;
      } else {
        for (int r = 0; r < p.world; ++r)
          for (int i = 0; i < m; ++i) p.ptr[r][off + i] = detail::from_f32<T>(acc[i]);
      }
    });
  });
}

}  // namespace weave
