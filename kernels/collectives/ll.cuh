// LL ("low latency") all-reduce, all-gather and reduce-scatter for small inputs. Every rank
// writes its input into every peer's scratch as 8-byte lines {4 data bytes, 4 flag bytes}; an
// aligned 8-byte store is single-copy atomic, so a reader that sees this call's flag in a line
// sees the line's data too: no fence and no signal phase, only the stores' flight. The price is
// twice the bytes on the link, so it wins only while latency, not bandwidth, decides.
//
// Scratch reuse: slot [parity][source] is rewritten two LL calls later. A rank that starts call
// n+2 has finished call n+1, whose data every peer wrote in its own call n+1, after its call n
// (and so its reads of the slot) ended: no extra synchronization is needed. This holds across
// the three kinds because every LL call sends at least one line to every peer and waits for at
// least one from every peer (LLPlan), and all kinds count calls with one counter.
#pragma once
#include <cstdint>

#include "collectives/plan.hpp"
#include "collectives/state.cuh"
#include "weave/config.hpp"
#include "weave/memory_order.cuh"
#include "weave/reduce.cuh"
#include "weave/pdl.cuh"
#include "weave/signal.cuh"

namespace weave::coll {

// What every LL-family call takes besides its data: the slots of both parities (the call's number,
// read on the device, picks one), the device call count, and the restart's scratch and barrier.
struct LLCommon {
  unsigned long long* slot[2][kMaxWorld];        // [parity][q]: rank q's scratch[parity][this rank]
  const unsigned long long* mine[2][kMaxWorld];  // [parity][r]: my scratch[parity][r], rank r's lines
  CallState* st;                                 // ll_calls: the calls before this one
  unsigned period;                               // of the flags (plan.hpp, ll_flag)
  signals sig;                                   // rank, world, and the timeout diagnostics
  signals restart;                               // counter 0: the restart's barrier
  unsigned long long* zero[2];                   // this rank's LL and LL128 scratch (null: none yet)
  unsigned long long zero_words[2];
};

struct LLArgs {
  const unsigned char* in;  // this rank's input
  unsigned char* out;
  long long bytes;  // input bytes (a multiple of the element size)
  LLCommon ll;
  int lag;  // LL128 only: steps sent ahead of the one received
};

// all_gather / reduce_scatter: what moves is described by the plan (plan.hpp), in words.
struct LLShardArgs {
  const unsigned char* in;
  unsigned char* out;
  LLPlan plan;
  LLCommon ll;
  int lag;  // LL128 only, as in LLArgs
};

// One call's number made concrete: its flag and its parity's slots.
struct LLCall {
  unsigned flag;                          // never 0
  unsigned long long* const* slot;        // [q]
  const unsigned long long* const* mine;  // [r]
};

inline constexpr int kLLThreads = 512;

namespace detail {
// Word i (4 bytes) of a buffer of `bytes` bytes; a 16-bit tensor of odd length ends in half a word.
__device__ __forceinline__ uint32_t ll_load(const unsigned char* p, long long i, long long bytes) {
  if (4 * i + 4 <= bytes) return *reinterpret_cast<const uint32_t*>(p + 4 * i);
  return *reinterpret_cast<const uint16_t*>(p + 4 * i);
}
__device__ __forceinline__ void ll_store(unsigned char* p, long long i, long long bytes, uint32_t w) {
  if (4 * i + 4 <= bytes) *reinterpret_cast<uint32_t*>(p + 4 * i) = w;
  else *reinterpret_cast<uint16_t*>(p + 4 * i) = static_cast<uint16_t>(w);
}
// Rank `from`'s line i of this call (polled until its flag is this call's).
__device__ __forceinline__ uint32_t ll_receive(const signals& sig, const unsigned long long* p, int from,
                                               unsigned flag) {
  unsigned long long line = 0;
  weave::detail::poll(
      sig, from, flag, [&] { return static_cast<unsigned>((line = ld_relaxed_sys(p)) >> 32) == flag; },
      [&] { return line >> 32; });
  return static_cast<uint32_t>(line);
}
// Every rank's scratch zeroed (each block a stripe of its own rank's) before any block of any
// rank goes on: a restart (plan.hpp, ll_restart_at). Every block of the grid is resident (at most
// one per SM), so the blocks can wait for each other. `base`: the barrier counter's total so far.
__device__ __forceinline__ void ll_zero_and_meet(const LLCommon& c, unsigned long long base) {
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x,
                  stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (int z = 0; z < 2; ++z)
    if (c.zero[z])
      for (long long i = first; i < static_cast<long long>(c.zero_words[z]); i += stride) c.zero[z][i] = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    signal_all(c.restart, 0);
    wait(c.restart, 0, base + static_cast<unsigned long long>(c.sig.world) * gridDim.x);
  }
  __syncthreads();
}
}  // namespace detail

// The call's number from the device count (after pdl_enter), the restart where it is due.
__device__ __forceinline__ LLCall ll_begin(const LLCommon& c) {
  const unsigned long long n = c.st->ll_calls + 1;
  if (ll_restart_at(n, c.period)) detail::ll_zero_and_meet(c, c.st->restarted);
  const int p = ll_parity(n);
  return {ll_flag(n, c.period), c.slot[p], c.mine[p]};
}
// Every thread at the kernel's end: the last block counts the call (and its restart).
__device__ __forceinline__ void ll_end(const LLCommon& c) {
  leave(c.st, [&](CallState& s) {
    const unsigned long long n = s.ll_calls + 1;
    if (ll_restart_at(n, c.period)) s.restarted += static_cast<unsigned long long>(c.sig.world) * gridDim.x;
    s.ll_calls = n;
  });
}

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kLLThreads) ll_all_reduce_kernel(const __grid_constant__ LLArgs a) {
  pdl_enter();
  const LLCall call = ll_begin(a.ll);
  constexpr int E = 4 / sizeof(T);
  const int W = a.ll.sig.world, me = a.ll.sig.rank;
  const long long words = (a.bytes + 3) / 4, stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (long long i = first; i < words; i += stride) {
    const unsigned long long line = static_cast<unsigned long long>(call.flag) << 32 | detail::ll_load(a.in, i, a.bytes);
    for (int k = 0; k < W - 1; ++k) st_relaxed_sys(call.slot[(me + 1 + k) % W] + i, line);
  }
  for (long long i = first; i < words; i += stride) {
    float acc[E];
    for (int r = 0; r < W; ++r) {
      uint32_t w;
      if (r == me) {
        w = detail::ll_load(a.in, i, a.bytes);
      } else {
        w = detail::ll_receive(a.ll.sig, call.mine[r] + i, r, call.flag);
      }
      const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int j = 0; j < E; ++j)
        acc[j] = r == 0 ? weave::detail::to_f32(e[j]) : weave::detail::combine<Op>(acc[j], weave::detail::to_f32(e[j]));
    }
    uint32_t w;
    T* o = reinterpret_cast<T*>(&w);
#pragma unroll
    for (int j = 0; j < E; ++j) o[j] = weave::detail::from_f32<T>(acc[j]);
    detail::ll_store(a.out, i, a.bytes, w);
  }
  ll_end(a.ll);
}

namespace detail {
__device__ __forceinline__ uint32_t ld_word(const unsigned char* base, const WordRegion& g, long long i) {
  return *reinterpret_cast<const uint32_t*>(base + g.byte(i));
}
__device__ __forceinline__ void st_word(unsigned char* base, const WordRegion& g, long long i, uint32_t w) {
  *reinterpret_cast<uint32_t*>(base + g.byte(i)) = w;
}
__device__ __forceinline__ long long ll_first() {
  return static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long ll_stride() { return static_cast<long long>(gridDim.x) * blockDim.x; }
}  // namespace detail

// all_gather: my input to every peer as lines (and into my own output), then every peer's lines
// into my output at that peer's place. Bytes are bytes: one instantiation serves every dtype.
__global__ void __launch_bounds__(kLLThreads) ll_all_gather_kernel(const __grid_constant__ LLShardArgs a) {
  pdl_enter();
  const LLCall call = ll_begin(a.ll);
  const int W = a.ll.sig.world, me = a.ll.sig.rank;
  const LLPlan& p = a.plan;
  const long long n = p.place[me].words(), lines = n > 0 ? n : 1;
  for (long long i = detail::ll_first(); i < lines; i += detail::ll_stride()) {
    const uint32_t w = i < n ? detail::ld_word(a.in, p.send[me], i) : 0;
    const unsigned long long line = static_cast<unsigned long long>(call.flag) << 32 | w;
    for (int k = 0; k < W - 1; ++k) st_relaxed_sys(call.slot[(me + 1 + k) % W] + i, line);
    if (i < n) detail::st_word(a.out, p.place[me], i, w);
  }
  for (int k = 0; k < W - 1; ++k) {
    const int q = (me + 1 + k) % W;
    const long long nq = p.place[q].words();
    for (long long i = detail::ll_first(); i < p.lines_from[q]; i += detail::ll_stride()) {
      const uint32_t w = detail::ll_receive(a.ll.sig, call.mine[q] + i, q, call.flag);
      if (i < nq) detail::st_word(a.out, p.place[q], i, w);
    }
  }
  ll_end(a.ll);
}

// reduce_scatter: rank q's slab of my input to rank q as lines, then my slab reduced over ranks
// 0..W-1 in order (fp32, the direct path's order) into my contiguous output.
template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kLLThreads) ll_reduce_scatter_kernel(const __grid_constant__ LLShardArgs a) {
  pdl_enter();
  const LLCall call = ll_begin(a.ll);
  constexpr int E = 4 / sizeof(T);
  const int W = a.ll.sig.world, me = a.ll.sig.rank;
  const LLPlan& p = a.plan;
  for (int k = 0; k < W - 1; ++k) {
    const int q = (me + 1 + k) % W;
    const long long nq = p.send[q].words();
    for (long long i = detail::ll_first(); i < p.lines_to[q]; i += detail::ll_stride()) {
      const uint32_t w = i < nq ? detail::ld_word(a.in, p.send[q], i) : 0;
      st_relaxed_sys(call.slot[q] + i, static_cast<unsigned long long>(call.flag) << 32 | w);
    }
  }
  const long long n = p.own.words(), lines = n > 0 ? n : 1;
  for (long long i = detail::ll_first(); i < lines; i += detail::ll_stride()) {
    float acc[E];
    for (int r = 0; r < W; ++r) {
      const uint32_t w = r == me ? (i < n ? detail::ld_word(a.in, p.own, i) : 0)
                                 : detail::ll_receive(a.ll.sig, call.mine[r] + i, r, call.flag);
      const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int j = 0; j < E; ++j)
        acc[j] = r == 0 ? weave::detail::to_f32(e[j]) : weave::detail::combine<Op>(acc[j], weave::detail::to_f32(e[j]));
    }
    if (i >= n) continue;
    uint32_t w;
    T* o = reinterpret_cast<T*>(&w);
#pragma unroll
    for (int j = 0; j < E; ++j) o[j] = weave::detail::from_f32<T>(acc[j]);
    reinterpret_cast<uint32_t*>(a.out)[i] = w;
  }
  ll_end(a.ll);
}

}  // namespace weave::coll
