// One persistent kernel runs any collective's plan: strided copies and element-wise reductions
// over peer-mapped buffers with 16-byte loads and stores, framed by an "arrived" signal (no rank
// touches a peer's buffers before that peer reached the call) and a "done" signal (no rank
// finishes before every peer finished reading its input and writing its output).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "collectives/plan.hpp"
#include "collectives/state.cuh"
#include "weave/reduce.cuh"
#include "weave/pdl.cuh"
#include "weave/signal.cuh"

namespace weave::coll {

struct DevXfer {
  const char* src[kMaxWorld];
  char* dst[kMaxWorld];
  int nsrc, ndst;
  int vec;                 // bytes per unit: 16, or the element size where alignment forbids 16
  unsigned upr;            // units per row
  unsigned rows;           // rows per outer step
  unsigned long long units;  // outer * rows * upr
  long long src_outer_pitch, dst_outer_pitch, src_pitch, dst_pitch;
};

struct Launch {
  DevXfer x[kMaxXfers];
  int n;
  signals sig;     // counter 0: arrived, 1: done
  CallState* st;   // arrived, done: the counters' totals before this call
};

// Three kernel shapes. Reductions hold up to 8 sources' vectors per unit: 256 threads x 2 units is
// what fits without spills (ptxas -v). Copies hold one: more threads keep more peer stores in
// flight (512 measured +6 % over 256 on all_gather, perf-notes). Overridable at build time only,
// for those experiments.
#ifndef WEAVE_COLL_COPY_THREADS
#define WEAVE_COLL_COPY_THREADS 1024
#endif
template <int MaxSrc_, int Threads_, int Unroll_>
struct KernelShape {
  static constexpr int MaxSrc = MaxSrc_, Threads = Threads_, Unroll = Unroll_;
};
using ReduceShape = KernelShape<kMaxWorld, 256, 2>;
// Reductions over two sources (every reduction on 2 ranks): the registers freed by the missing
// six sources hold more units, so twice the threads with twice the units keep 4x the peer loads
// in flight per SM (measured +1-3 % at 64 MiB-1 GiB, no change at <= 8 MiB, perf-notes).
using PairShape = KernelShape<2, 512, 4>;
using CopyShape = KernelShape<1, WEAVE_COLL_COPY_THREADS, 2>;

namespace detail {

__device__ __forceinline__ void unit_addr(const DevXfer& x, unsigned long long u, long long& so, long long& dof) {
  if (x.rows == 1 && x.units == x.upr) {  // one contiguous row: no division
    so = dof = static_cast<long long>(u) * x.vec;
    return;
  }
  const unsigned idx = static_cast<unsigned>(u);
  const unsigned row_lin = idx / x.upr, col = idx - row_lin * x.upr;
  const unsigned o = row_lin / x.rows, row = row_lin - o * x.rows;
  so = o * x.src_outer_pitch + row * x.src_pitch + static_cast<long long>(col) * x.vec;
  dof = o * x.dst_outer_pitch + row * x.dst_pitch + static_cast<long long>(col) * x.vec;
}

template <class V>
__device__ __forceinline__ V load(const char* p) {
  if constexpr (sizeof(V) == 16) return __ldcg(reinterpret_cast<const int4*>(p));
  else return *reinterpret_cast<const V*>(p);
}

// The element-wise reduction of v[0..n-1] (n <= Src), in fp32 and rank order (bit-identical on
// every rank that reduces the same data); v[0] itself for one source.
template <class T, ReduceOp Op, int Src, class V>
__device__ __forceinline__ V reduce_vec(const V* v, int n) {
  constexpr int E = sizeof(V) / sizeof(T);
  V out = v[0];
  if (Src > 1 && n > 1) {
    float acc[E];
    const T* e0 = reinterpret_cast<const T*>(&v[0]);
#pragma unroll
    for (int i = 0; i < E; ++i) acc[i] = weave::detail::to_f32(e0[i]);
#pragma unroll
    for (int r = 1; r < Src; ++r) {
      if (r >= n) break;
      const T* e = reinterpret_cast<const T*>(&v[r]);
#pragma unroll
      for (int i = 0; i < E; ++i) acc[i] = weave::detail::combine<Op>(acc[i], weave::detail::to_f32(e[i]));
    }
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int i = 0; i < E; ++i) o[i] = weave::detail::from_f32<T>(acc[i]);
  }
  return out;
}

// Processes `cnt` (<= Unroll) units u0, u0 + stride, ... of transfer x; all loads are issued
// before the first use so that several peer loads are in flight per thread.
template <class T, ReduceOp Op, class S, class V>
__device__ __forceinline__ void run_units(const DevXfer& x, unsigned long long u0, unsigned long long stride, int cnt) {
  constexpr int kUnroll = S::Unroll, kSrc = S::MaxSrc;
  long long so[kUnroll], dof[kUnroll];
  V v[kUnroll][kSrc];
#pragma unroll
  for (int k = 0; k < kUnroll; ++k)
    if (k < cnt) {
      unit_addr(x, u0 + k * stride, so[k], dof[k]);
#pragma unroll
      for (int r = 0; r < kSrc; ++r)
        if (r < x.nsrc) v[k][r] = load<V>(x.src[r] + so[k]);
    }
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    if (k >= cnt) break;
    const V out = reduce_vec<T, Op, kSrc>(v[k], x.nsrc);
#pragma unroll
    for (int d = 0; d < kMaxWorld; ++d) {
      if (d >= x.ndst) break;
      *reinterpret_cast<V*>(x.dst[d] + dof[k]) = out;
    }
  }
}

// The grid takes a thread-strided share of the transfer's units, kUnroll units per step.
template <class T, ReduceOp Op, class S, class V>
__device__ __forceinline__ void run_xfer(const DevXfer& x) {
  constexpr int kUnroll = S::Unroll;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x, end = x.units;
  for (unsigned long long u = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x; u < end;
       u += stride * kUnroll) {
    const unsigned long long left = (end - u + stride - 1) / stride;
    run_units<T, Op, S, V>(x, u, stride, left < kUnroll ? static_cast<int>(left) : kUnroll);
  }
}

}  // namespace detail

// S: ReduceShape, PairShape for plans with two sources at most, CopyShape for one source.
template <class T, ReduceOp Op, class S>
__global__ void __launch_bounds__(S::Threads) collective_kernel(const __grid_constant__ Launch L) {
  pdl_enter();
  const int W = L.sig.world;
  const unsigned long long done_expect = L.st->done + dones_per_call(W, gridDim.x);
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) signal_all(L.sig, 0);
    wait(L.sig, 0, L.st->arrived + arrivals_per_call(W));
  }
  __syncthreads();
  // Transfers run one after the other on the whole grid, in the plan's order (remote first,
  // staggered by rank). Running them side by side on block groups measured slower (perf-notes).
  for (int j = 0; j < L.n; ++j) {
    const DevXfer& x = L.x[j];
    if (x.vec == 16) detail::run_xfer<T, Op, S, int4>(x);
    else if (x.vec == 8) detail::run_xfer<T, Op, S, int2>(x);
    else if (x.vec == 4 && sizeof(T) <= 4) detail::run_xfer<T, Op, S, int>(x);
    else detail::run_xfer<T, Op, S, T>(x);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    signal_all(L.sig, 1);
    if (blockIdx.x == 0) wait(L.sig, 1, done_expect);
  }
  leave(L.st, [&](CallState& s) {
    s.arrived += arrivals_per_call(W);
    s.done += dones_per_call(W, gridDim.x);
  });
}

}  // namespace weave::coll
