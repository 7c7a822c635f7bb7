// The fused dispatch_gemm as an LCSC kernel (README.md, "Fused dispatch_gemm"): the grouped GEMM's
// kernel (grouped_gemm_kernel.cuh, unchanged math, loads and stores) whose producer warpgroup's
// two idle warps (lcsc.cuh's aux role) move the dispatch's rows, and whose loader starts an
// expert's tiles once that expert's rows are complete on this rank.
//
// Aux warps (every compute block of every rank; dispatch_gemm_schedule.hpp): for each local
// expert l, send this rank's entries of l (metadata into every row, the token's data into its
// primary slot's row, peer stores over NVLink or local ones), signal l's arrival counter on every
// rank; then, without waiting, complete every expert whose rows have arrived from every rank: copy
// its primary rows into its other rows (local HBM) and signal this rank's ready counter of it.
// After the last expert, wait for the rest. Loader: before a tile's first load, wait until its
// expert is ready (every aux warp of this rank completed it), then order the TMA reads after the
// generic-proxy writes (fence.proxy.async). Experts come in order for every block (grouped_tile),
// so the loader waits at most once per expert.
//
// A block waits only for the aux warps of blocks of the same grid, which are all resident (one
// block per SM, at most as many blocks as SMs), and for peers' aux warps, which wait for nothing
// of this rank's grid: ranks time-slicing one GPU progress.
#pragma once
#include <cuda_bf16.h>

#include "moe/dispatch_gemm_schedule.hpp"
#include "moe/exchange_args.hpp"
#include "moe/gemm_combine_schedule.hpp"
#include "moe/grouped_gemm_kernel.cuh"
#include "moe/row_copy.cuh"
#include "weave/memory_order.cuh"
#include "weave/signal.cuh"
#include "weave/tile/proxy.cuh"

namespace weave::moe {

struct DispatchGemmGlobals : GroupedGlobals {
  const __nv_bfloat16* x;             // T x H: this rank's tokens
  const int2* plan;                   // T x k: {rank, row} of each (token, slot)
  const int2* slist;                  // this rank's entries in send order
  const int* order;                   // E + 1: send_offsets
  const int* offsets;                 // L + 1: this rank's rows per local expert (prefix)
  const int* failed;                  // the call's verdict (nonzero: nothing to send or copy)
  __nv_bfloat16* xrecv[kMaxWorld];    // every rank's grouped buffer (capacity x H)
  RowMeta* meta[kMaxWorld];           // every rank's rows' metadata
  signals sig;                        // counters l < L: arrivals of l; L + l: l ready here
  Round arrive_expected, ready_expected;  // running totals (exchange.cu), device cells once captured
  int k, hidden;
};

struct DispatchGemmKernel : GroupedKernel<gemm::BLayout::NK> {
  using Base = GroupedKernel<gemm::BLayout::NK>;
  using Globals = DispatchGemmGlobals;
  using bf16 = Base::bf16;
  using Stage = Base::Stage;
  struct AuxShared {};
  static constexpr int kUnroll = 2;  // 16-byte vectors in flight per lane (the aux warps have 40 registers)

  // The last expert the loader saw ready (its tiles come expert after expert).
  static __device__ __forceinline__ int& ready_upto() {
    __shared__ int e;
    return e;
  }

  static __device__ void setup(const Globals& g) {
    if (threadIdx.x == 32) ready_upto() = -1;  // warp 1: warp 0 builds the grouped table
    Base::setup(g);
  }

  static __device__ __forceinline__ void load(const Globals& g, Stage& s, tile::Mbarrier& full, const GroupedTile& t,
                                              int it) {
    if (it == 0 && t.expert > ready_upto()) {
      weave::wait(g.sig, g.experts + t.expert, g.ready_expected);
      tile::fence_proxy_async_global();  // the TMA reads rows the generic proxy wrote
      ready_upto() = t.expert;
    }
    Base::load(g, s, full, t, it);
  }

  // This warp's share of local expert l's entries, one per step (a step's loads are the same
  // address in every lane): the entry's metadata, and for the token's primary slot on that rank its
  // data, the whole warp copying. One entry per warp and step, not 32: a warp that owned 32
  // consecutive entries copied their rows one after the other while most warps had none (an
  // expert has a few hundred entries, the grid 264 warps), measured 5x slower than unfused.
  static __device__ void send_expert(const Globals& g, int l, int warp, int warps, int lane) {
    const int W = g.sig.world, me = g.sig.rank, k = g.k, nv = g.hidden / 8;
    const int end = g.order[(l + 1) * W];
#pragma unroll 1
    for (int q = g.order[l * W] + warp; q < end; q += warps) {
      const int2 en = g.slist[q];  // {token * k + slot, primary slot}
      const int t = en.x / k, j = en.x - t * k;
      const int2 p = g.plan[en.x];  // {rank, row}
      const bool prim = en.y == j;
      if (lane == 0) {
        const int prow = prim ? p.y : g.plan[static_cast<long long>(t) * k + en.y].y;
        *reinterpret_cast<int4*>(g.meta[p.x] + p.y) = make_int4(me, t, prow, j);
      }
      if (prim)
        copy_row<kUnroll, false>(reinterpret_cast<const int4*>(g.x + static_cast<long long>(t) * g.hidden),
                        reinterpret_cast<int4*>(g.xrecv[p.x] + static_cast<long long>(p.y) * g.hidden), nv, lane, 32);
    }
  }

  // This warp's share of local expert l's rows here, one per step: a row that is not its token's
  // primary gets the primary row's data (arrived: the primary's expert is at or before l).
  static __device__ void copy_duplicates(const Globals& g, int l, int warp, int warps, int lane) {
    const int me = g.sig.rank, nv = g.hidden / 8;
    const int end = g.offsets[l + 1];
    bf16* buf = g.xrecv[me];
#pragma unroll 1
    for (int r = g.offsets[l] + warp; r < end; r += warps) {
      const int from = __ldcg(&g.meta[me][r].primary);
      if (from != r)
        copy_row<kUnroll, true>(reinterpret_cast<const int4*>(buf + static_cast<long long>(from) * g.hidden),
                       reinterpret_cast<int4*>(buf + static_cast<long long>(r) * g.hidden), nv, lane, 32);
    }
  }

  static __device__ __forceinline__ bool arrived(const Globals& g, int l, int lane) {
    int ok = 0;
    if (lane == 0) ok = ld_acquire_sys(g.sig.ptr[g.sig.rank] + l) >= g.arrive_expected;
    return __shfl_sync(0xffffffffu, ok, 0) != 0;
  }

  static __device__ __forceinline__ void complete(const Globals& g, int l, bool failed, int warp, int warps, int lane) {
    if (!failed) copy_duplicates(g, l, warp, warps, lane);
    __syncwarp();
    if (lane == 0) weave::signal(g.sig, g.sig.rank, g.experts + l);  // release: the warp's copies
  }

  // Threads t = 0..63 of warps 2-3 of every compute block.
  static __device__ void aux(const Globals& g, AuxShared&, int compute_blocks, int t) {
    const int lane = t % 32;
    const int warp = static_cast<int>(blockIdx.x) * kAuxWarps + t / 32, warps = compute_blocks * kAuxWarps;
    const int L = g.experts;
    const bool failed = *g.failed != 0;
    int next = 0;  // the first expert not completed by this warp
#pragma unroll 1
    for (int l = 0; l < L; ++l) {
      if (!failed) send_expert(g, l, warp, warps, lane);
      __syncwarp();
      if (lane == 0) signal_all(g.sig, l);  // the warp's rows of l, released to every rank
      while (next <= l && arrived(g, next, lane)) complete(g, next++, failed, warp, warps, lane);
    }
#pragma unroll 1
    for (; next < L; ++next) {
      if (lane == 0) weave::wait(g.sig, next, g.arrive_expected);
      __syncwarp();
      complete(g, next, failed, warp, warps, lane);
    }
  }
};

}  // namespace weave::moe
