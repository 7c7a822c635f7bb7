// LL128 all-reduce, all-gather and reduce-scatter for small and medium inputs. LL (ll.cuh) puts a
// flag in every 8-byte line, which doubles the bytes and sends them as 8-byte writes. Here a line
// is 128 bytes, written by 8 lanes of a warp in one 16-byte-per-lane store and read back the same
// way, with one 4-byte flag (plan.hpp, ll128_slot_word): 31 of 32 words are data. It relies on
// what NCCL's LL128 protocol relies on over NVLink: an aligned 128-byte line written by one warp
// store instruction lands in the peer's memory as one write, so once the reader has seen this
// call's flag in the line, a load of the line issued afterwards sees the line's data too
// (detail::receive; the load that saw the flag is not trusted for the data). Hence the stores
// leave with the warp converged (__syncwarp before each), and the plan takes LL128 only where
// every pair of GPUs is NVLink-connected (plan.hpp, ll128_links_ok). No fence, no signal phase;
// 3 % more bytes than the data.
//
// Scratch: its own region, slot [parity][source], reused under LL's argument (ll.cuh): the
// parity and the flag come from the one counter of all LL-family calls, and every LL128 call
// sends at least one line to every peer and waits for at least one from every peer.
//
// Work split: warp w of the grid takes steps s = 0, 1, ...; step s covers 4 lines, one per 8-lane
// group, lines 4 (s * warps + w) + group. Each warp sends step s, then receives step s - lag: its
// peer twin sent those lines `lag` steps ago, so the receive rarely waits, and the flight of the
// last steps is the only latency left at the end. Any lag >= 1 is deadlock-free: a warp waits
// only for steps its twin sends before waiting itself.
#pragma once
#include <cstdint>

#include "collectives/ll.cuh"
#include "collectives/ll128_line.cuh"
#include "collectives/plan.hpp"
#include "weave/reduce.cuh"
#include "weave/pdl.cuh"
#include "weave/signal.cuh"

namespace weave::coll {

namespace detail {

// Byte offsets of a region's words for increasing word indices: one division for a lane's first
// word of a line, then carries. WordRegion::byte divides per word, and a lane touches 4-8 words of
// up to two regions per line: that arithmetic alone is tens of microseconds per 8 MiB on the SMs.
struct WordWalker {
  const WordRegion& g;
  long long i = -1, row = 0, col = 0;
  __device__ explicit WordWalker(const WordRegion& r) : g(r) {}
  __device__ long long byte(long long to) {
    if (i < 0) {
      row = to / g.wpr;
      col = to - row * g.wpr;
    } else {
      col += to - i;
      while (col >= g.wpr) col -= g.wpr, ++row;
    }
    i = to;
    return g.off + row * g.pitch + col * 4;
  }
  __device__ uint32_t load(const unsigned char* base, long long to) {
    return *reinterpret_cast<const uint32_t*>(base + byte(to));
  }
  __device__ void store(unsigned char* base, long long to, uint32_t w) {
    *reinterpret_cast<uint32_t*>(base + byte(to)) = w;
  }
};

template <class T, ReduceOp Op>
__device__ __forceinline__ void fold(float (&acc)[4][4 / sizeof(T)], const uint4& v, bool first) {
  constexpr int E = 4 / sizeof(T);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t w = (&v.x)[k];
    const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const float x = weave::detail::to_f32(e[i]);
      acc[k][i] = first ? x : weave::detail::combine<Op>(acc[k][i], x);
    }
  }
}
template <class T>
__device__ __forceinline__ uint4 unfold(const float (&acc)[4][4 / sizeof(T)]) {
  constexpr int E = 4 / sizeof(T);
  uint4 v;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    T* o = reinterpret_cast<T*>(&at(v, k));
#pragma unroll
    for (int i = 0; i < E; ++i) o[i] = weave::detail::from_f32<T>(acc[k][i]);
  }
  return v;
}
__device__ __forceinline__ uint4* ll128_slot(unsigned long long* p) { return reinterpret_cast<uint4*>(p); }
__device__ __forceinline__ const uint4* ll128_slot(const unsigned long long* p) {
  return reinterpret_cast<const uint4*>(p);
}

// This lane's piece v of line L into `slot` (a peer's scratch for this rank's lines).
__device__ __forceinline__ void put_piece(unsigned long long* slot, const LL128Lane& l, long long L, const uint4& v) {
  st_piece(ll128_slot(slot) + L * kLL128Pieces + l.j, v);
}
// Line L (this lane's piece v) to one peer's slot, or to every peer's (slots[(me + k) % W], k =
// 1..W-1); `send` false where this lane's group has no line this step. Warp-collective: the warp
// converges first, so that the line's 8 pieces leave in one store instruction (packing a line
// may diverge).
__device__ __forceinline__ void send_line(const LL128Lane& l, unsigned long long* slot, long long L, bool send,
                                          const uint4& v) {
  __syncwarp();
  if (send) put_piece(slot, l, L, v);
}
__device__ __forceinline__ void send_line_to_peers(const LL128Lane& l, unsigned long long* const* slots, int me, int W,
                                                   long long L, bool send, const uint4& v) {
  __syncwarp();
  if (send)
    for (int k = 1; k < W; ++k) put_piece(slots[(me + k) % W], l, L, v);
}

// Line L reduced over ranks 0..W-1 in order (fp32, so every rank gets the same bits): my words
// `mine`, already loaded, and each peer's piece from its lines in my scratch (`from[r]`).
template <class T, ReduceOp Op>
__device__ __forceinline__ uint4 reduce_line(const signals& sig, const LL128Lane& l,
                                             const unsigned long long* const* from, long long L, bool active,
                                             unsigned flag, const uint4& mine) {
  float acc[4][4 / sizeof(T)];
  for (int r = 0; r < sig.world; ++r) {
    const uint4 v = r == sig.rank ? mine : receive(sig, l, ll128_slot(from[r]), L, active, r, flag);
    fold<T, Op>(acc, v, r == 0);
  }
  return unfold<T>(acc);
}

}  // namespace detail

// all_reduce, one-shot through the peers' scratch: my input to every peer as lines, then every
// position reduced over ranks 0..W-1 in order (fp32; the same bits on every rank). In place is
// safe: a lane reads its input words before it writes the same output words, and no peer reads
// my buffers.
template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kLL128Threads) ll128_all_reduce_kernel(const __grid_constant__ LLArgs a) {
  pdl_enter();
  const LLCall call = ll_begin(a.ll);
  const int W = a.ll.sig.world, me = a.ll.sig.rank;
  const detail::LL128Lane l;
  const long long n = (a.bytes + 3) / 4, lines = ll_lines(n, kLL128Words), steps = l.steps(lines);
  auto word = [&](long long i) { return detail::ll_load(a.in, i, a.bytes); };
  const int lag = a.lag;
  for (long long s = 0; s < steps + lag; ++s) {
    const bool recv = s >= lag;
    const long long L = recv ? l.line(s - lag) : 0;
    const bool active = recv && L < lines;
    // This step's own words are loaded before the send, so their latency overlaps the send's
    // loads and the polling instead of following them.
    const uint4 mine = active ? detail::pack(l, L, n, 0, word) : make_uint4(0, 0, 0, 0);
    if (s < steps) {
      const long long Ls = l.line(s);
      const bool send = Ls < lines;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (send) v = detail::pack(l, Ls, n, call.flag, word);
      detail::send_line_to_peers(l, call.slot, me, W, Ls, send, v);
    }
    if (!recv) continue;
    const uint4 sum = detail::reduce_line<T, Op>(a.ll.sig, l, call.mine, L, active, call.flag, mine);
    if (active) detail::unpack(l, L, n, sum, [&](long long i, uint32_t w) { detail::ll_store(a.out, i, a.bytes, w); });
  }
  ll_end(a.ll);
}

// all_gather: my input to every peer as lines (and into my own output), then every peer's lines
// into my output at that peer's place.
__global__ void __launch_bounds__(kLL128Threads) ll128_all_gather_kernel(const __grid_constant__ LLShardArgs a) {
  pdl_enter();
  const LLCall call = ll_begin(a.ll);
  const int W = a.ll.sig.world, me = a.ll.sig.rank;
  const LLPlan& p = a.plan;
  const detail::LL128Lane l;
  const long long n = p.place[me].words(), mine_lines = ll_lines(n, kLL128Words), steps = l.steps(p.max_lines);
  const int lag = a.lag;
  for (long long s = 0; s < steps + lag; ++s) {
    if (s < steps) {
      const long long L = l.line(s);
      const bool send = L < mine_lines;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (send) {
        detail::WordWalker src(p.send[me]), own(p.place[me]);
        v = detail::pack(l, L, n, call.flag, [&](long long i) {
          const uint32_t w = src.load(a.in, i);
          own.store(a.out, i, w);
          return w;
        });
      }
      detail::send_line_to_peers(l, call.slot, me, W, L, send, v);
    }
    if (s < lag) continue;
    const long long L = l.line(s - lag);
    for (int k = 1; k < W; ++k) {
      const int q = (me + k) % W;
      const bool active = L < p.lines_from[q];
      const uint4 v = detail::receive(a.ll.sig, l, detail::ll128_slot(call.mine[q]), L, active, q, call.flag);
      if (active) {
        detail::WordWalker dst(p.place[q]);
        detail::unpack(l, L, p.place[q].words(), v, [&](long long i, uint32_t w) { dst.store(a.out, i, w); });
      }
    }
  }
  ll_end(a.ll);
}

// reduce_scatter: rank q's slab of my input to rank q as lines, then my slab reduced over ranks
// 0..W-1 in order (fp32) into my contiguous output.
template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kLL128Threads) ll128_reduce_scatter_kernel(const __grid_constant__ LLShardArgs a) {
  pdl_enter();
  const LLCall call = ll_begin(a.ll);
  const int W = a.ll.sig.world, me = a.ll.sig.rank;
  const LLPlan& p = a.plan;
  const detail::LL128Lane l;
  const long long n = p.own.words(), steps = l.steps(p.max_lines);
  const long long own_lines = ll_lines(n, kLL128Words);
  const int lag = a.lag;
  for (long long s = 0; s < steps + lag; ++s) {
    const bool recv = s >= lag;
    const long long L = recv ? l.line(s - lag) : 0;
    const bool active = recv && L < own_lines;
    // Own slab words first, as in all_reduce: loaded while this step is sent and polled.
    uint4 mine = make_uint4(0, 0, 0, 0);
    if (active) {
      detail::WordWalker src(p.own);
      mine = detail::pack(l, L, n, 0, [&](long long i) { return src.load(a.in, i); });
    }
    if (s < steps) {
      const long long Ls = l.line(s);
      for (int k = 1; k < W; ++k) {
        const int q = (me + k) % W;
        const bool send = Ls < p.lines_to[q];
        uint4 v = make_uint4(0, 0, 0, 0);
        if (send) {
          detail::WordWalker src(p.send[q]);
          v = detail::pack(l, Ls, p.send[q].words(), call.flag, [&](long long i) { return src.load(a.in, i); });
        }
        detail::send_line(l, call.slot[q], Ls, send, v);
      }
    }
    if (!recv) continue;
    const uint4 sum = detail::reduce_line<T, Op>(a.ll.sig, l, call.mine, L, active, call.flag, mine);
    if (active)
      detail::unpack(l, L, n, sum, [&](long long i, uint32_t w) { reinterpret_cast<uint32_t*>(a.out)[i] = w; });
  }
  ll_end(a.ll);
}

}  // namespace weave::coll
