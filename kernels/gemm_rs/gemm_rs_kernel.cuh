// GEMM + reduce-scatter, intra-SM: the GEMM kernel (gemm/gemm_kernel.cuh) whose storer sends
// every finished tile to the rank that owns its rows. The communication is the storer below
// (store + store_done) and the per-owner loads; README.md counts the lines.
#pragma once
#include "gemm/gemm_kernel.cuh"
#include "tp_common/schedule.hpp"
#include "weave/signal.cuh"
#include "weave/store.cuh"

namespace weave::tp {

struct RsGlobals : gemm::GemmGlobals {
  CUtensorMap out[kMaxWorld];  // owner q's output (its shard's rows x N), 128 x 64 boxes
  signals ready;               // ready[tile] on a peer: the owner's own partial is in place
  signals done;                // done[0] on an owner: tiles its peers added (running total)
  Layout L;
  int rank;
  unsigned long long ready_round, done_round;
};

struct RsKernel : gemm::GemmKernel<256, gemm::BLayout::KN, 3> {
  using Base = gemm::GemmKernel<256, gemm::BLayout::KN, 3>;
  using Globals = RsGlobals;

  static __host__ __device__ int num_work(const RsGlobals& g) { return g.L.work(); }

  static __device__ __forceinline__ void prologue(const RsGlobals& g) {
    tile::tma::prefetch(&g.a);
    tile::tma::prefetch(&g.b);
  }

  // A rows of the owner's shard (rows past it are computed and then clipped by the store).
  static __device__ __forceinline__ void load(const RsGlobals& g, Stage& s, tile::Mbarrier& full, int w, int it) {
    const Item t = item(g.L, g.rank, w);
    const int k0 = it * BK;
    tile::tma::load_2d(s.a, &g.a, &full, k0, t.a_row);
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) tile::tma::load_2d(s.b + j * 64 * BK, &g.b, &full, t.n * BN + 64 * j, k0);
  }

  // Own tile: plain store (overwrites last call's result), writes complete, then ready on every
  // peer. Peer's tile: wait for the owner's ready, then reduce-add into the owner's output.
  static __device__ __forceinline__ void store(const RsGlobals& g, Output& o, int w, int) {
    const Item t = item(g.L, g.rank, w);
    const bool own = t.owner == g.rank;
    const int idx = rs_ready_index(g.L, t);
    if (!own) {
      wait(g.ready, idx, g.ready_round * rs_ready_expected());
      tile::fence_proxy_async_global();  // our async-proxy adds follow the owner's store
    }
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) {
      const int n = t.n * BN + 64 * j;
      if (n >= g.N) break;
      if (own) tile::tma::store_2d(&g.out[t.owner], o.c + j * BM * 64, n, t.i * BM);
      else tile::tma::reduce_add_2d(&g.out[t.owner], o.c + j * BM * 64, n, t.i * BM);
    }
    if (own) {
      tile::tma::commit_group();
      store_wait();
      weave::detail::fence_release_sys();
      for (int p = 0; p < g.L.W; ++p)
        if (p != g.rank) weave::detail::red_relaxed_sys_add(g.ready.ptr[p] + idx, 1);
    }
  }

  // All this block's adds are complete (the template waited): tell each owner how many; the
  // owner's block 0 then waits for every peer's adds, so the output is final when we return.
  static __device__ __forceinline__ void store_done(const RsGlobals& g, int compute_blocks) {
    const int b = static_cast<int>(blockIdx.x);
    for (int q = 0; q < g.L.W; ++q) {
      const int n = rs_block_adds(g.L, g.rank, b, compute_blocks, q);
      if (n > 0) signal(g.done, q, 0, static_cast<unsigned long long>(n));
    }
    if (b == 0) wait(g.done, 0, g.done_round * rs_done_expected(g.L, g.rank));
  }

  static __device__ __forceinline__ void communicator(const RsGlobals&, void*, int, int) {}
};

}  // namespace weave::tp
