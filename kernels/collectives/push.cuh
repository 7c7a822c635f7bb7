// Push all_reduce for large inputs: two-shot with both halves made of stores (plan.hpp,
// PushPlan). Every warp of the grid is one pipe and runs the same pipeline over its pieces of
// the slabs:
//   iteration i: push step i of every peer's slab into that peer's scratch slot (once the slot is
//   free), then reduce step i - kPushLag of the own slab (own input + what the peers pushed, all
//   local) into every rank's output, then one system-scope fence and the two signals.
// Pipe e of rank r synchronizes only with pipe e of its peers, through its own counters: warps
// never wait for their block, so while one warp waits for its stores' acknowledgements (the
// fence) the others of its SM keep the link busy. Only the owner reads its input: in place is
// safe because rank q writes slab q of rank r's buffer only after r pushed (read) that piece.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "collectives/kernel.cuh"
#include "collectives/plan.hpp"
#include "collectives/state.cuh"
#include "weave/reduce.cuh"
#include "weave/pdl.cuh"
#include "weave/signal.cuh"

namespace weave::coll {

struct PushArgs {
  const char* in;               // this rank's input
  char* out[kMaxWorld];         // every rank's output
  char* scratch[kMaxWorld];     // every rank's scratch (push_scratch_bytes)
  PushPlan plan;
  signals sig;                  // push_data_counter / push_free_counter
  CallState* st;                // push_steps: every counter's total before this call
  int vec;                      // 16, or less where this rank's input or an output is not 16-byte aligned
};

namespace detail {

template <class V>
__device__ __forceinline__ V load_cg(const char* p) {
  if constexpr (sizeof(V) == 16) return __ldcg(reinterpret_cast<const int4*>(p));
  else if constexpr (sizeof(V) == 8) return __ldcg(reinterpret_cast<const int2*>(p));
  else if constexpr (sizeof(V) == 4) {
    const int x = __ldcg(reinterpret_cast<const int*>(p));
    return *reinterpret_cast<const V*>(&x);
  } else {
    const unsigned short x = __ldcg(reinterpret_cast<const unsigned short*>(p));
    return *reinterpret_cast<const V*>(&x);
  }
}

// dst[d][x] = op over s of src[s][x] for the `bytes` bytes of one piece, on one warp, in V-sized
// units (every pointer V-aligned), the last bytes % sizeof(V) element by element. Loads
// bypass L1: the scratch is rewritten by peers between steps. Sources in rank order, so the
// result is the same bits whichever rank computes it.
template <class T, ReduceOp Op, class S, class V>
__device__ __forceinline__ void move_piece(const char* const* src, int nsrc, char* const* dst, int ndst,
                                           long long bytes) {
  constexpr int kUnroll = S::Unroll, kSrc = S::MaxSrc, kLanes = 32;
  const int lane = threadIdx.x % kLanes;
  const long long units = bytes / static_cast<long long>(sizeof(V));
  for (long long u0 = lane; u0 < units; u0 += kLanes * kUnroll) {
    V v[kUnroll][kSrc];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const long long u = u0 + k * kLanes;
      if (u < units) {
#pragma unroll
        for (int r = 0; r < kSrc; ++r)
          if (r < nsrc) v[k][r] = load_cg<V>(src[r] + u * sizeof(V));
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const long long u = u0 + k * kLanes;
      if (u >= units) break;
      const V out = reduce_vec<T, Op, kSrc>(v[k], nsrc);
#pragma unroll
      for (int d = 0; d < kSrc; ++d) {  // as many destinations as sources: every rank
        if (d >= ndst) break;
        *reinterpret_cast<V*>(dst[d] + u * sizeof(V)) = out;
      }
    }
  }
  if constexpr (sizeof(V) > sizeof(T)) {
    for (long long x = units * sizeof(V) + lane * sizeof(T); x < bytes; x += kLanes * sizeof(T)) {
      float acc = weave::detail::to_f32(load_cg<T>(src[0] + x));
      for (int r = 1; r < nsrc; ++r) acc = weave::detail::combine<Op>(acc, weave::detail::to_f32(load_cg<T>(src[r] + x)));
      for (int d = 0; d < ndst; ++d) *reinterpret_cast<T*>(dst[d] + x) = weave::detail::from_f32<T>(acc);
    }
  }
}

template <class T, ReduceOp Op, class S>
__device__ __forceinline__ void move_piece_vec(int vec, const char* const* src, int nsrc, char* const* dst, int ndst,
                                               long long bytes) {
  if (vec == 16) move_piece<T, Op, S, int4>(src, nsrc, dst, ndst, bytes);
  else if (vec == 8) move_piece<T, Op, S, int2>(src, nsrc, dst, ndst, bytes);
  else if (vec == 4 && sizeof(T) <= 4) move_piece<T, Op, S, int>(src, nsrc, dst, ndst, bytes);
  else move_piece<T, Op, S, T>(src, nsrc, dst, ndst, bytes);
}

}  // namespace detail

// Grid: plan.pipes / (S::Threads / 32) blocks of S::Threads (S::MaxSrc >= world: the
// reduction's sources are every rank).
template <class T, ReduceOp Op, class S>
__global__ void __launch_bounds__(S::Threads) push_all_reduce_kernel(const __grid_constant__ PushArgs a) {
  pdl_enter();
  const unsigned long long base = a.st->push_steps;
  const PushPlan& p = a.plan;
  const int W = a.sig.world, me = a.sig.rank, e = blockIdx.x * (S::Threads / 32) + threadIdx.x / 32;
  const bool lead = threadIdx.x % 32 == 0;
  for (int i = 0; i < p.steps + kPushLag; ++i) {
    const bool push = i < p.steps;
    const int j = i - kPushLag;
    if (push) {
      if (lead)
        for (int k = 0; k + 1 < W; ++k)
          wait(a.sig, push_free_counter(e, staggered(me, k, W), W, p.pipes), push_free_expect(p, base, i));
      __syncwarp();
      for (int k = 0; k + 1 < W; ++k) {  // peers in staggered order: at any moment ranks push to different peers
        const int q = staggered(me, k, W);
        const Range pc = push_piece(p, q, e, i);
        const char* src = a.in + pc.begin;
        char* dst = a.scratch[q] + push_slot(p, W, me, q, e, base + i);
        detail::move_piece_vec<T, Op, S>(a.vec, &src, 1, &dst, 1, pc.size);
      }
    }
    if (j >= 0) {
      if (lead)
        for (int k = 0; k + 1 < W; ++k)
          wait(a.sig, push_data_counter(e, staggered(me, k, W), W), push_data_expect(base, j));
      __syncwarp();
      const Range pc = push_piece(p, me, e, j);
      const char* src[S::MaxSrc];
      char* dst[S::MaxSrc];
#pragma unroll
      for (int r = 0; r < S::MaxSrc; ++r)
        if (r < W) {
          src[r] = r == me ? a.in + pc.begin : a.scratch[me] + push_slot(p, W, r, me, e, base + j);
          dst[r] = a.out[staggered(me, r, W)] + pc.begin;  // itself last
        }
      detail::move_piece_vec<T, Op, S>(a.vec, src, W, dst, W, pc.size);
    }
    __syncwarp();
    // One fence covers this iteration's pushes (data), its reads of the scratch and its output
    // stores (free): one MEMBAR.SYS per warp and iteration, not per signal.
    if (lead) {
      fence_acq_rel_sys();
      for (int k = 0; k + 1 < W; ++k) {
        const int q = staggered(me, k, W);
        if (push) red_add_relaxed_sys(a.sig.ptr[q] + push_data_counter(e, me, W), 1);
        if (j >= 0) red_add_relaxed_sys(a.sig.ptr[q] + push_free_counter(e, me, W, p.pipes), 1);
      }
    }
  }
  // Every peer's pipe e has reduced all it got from here and finished writing into this rank's
  // output: the call is complete on this rank when every pipe passed this wait.
  if (lead)
    for (int k = 0; k + 1 < W; ++k)
      wait(a.sig, push_free_counter(e, staggered(me, k, W), W, p.pipes), base + p.steps);
  leave(a.st, [&](CallState& s) { s.push_steps += p.steps; });
}

}  // namespace weave::coll
