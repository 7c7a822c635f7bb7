// GEMM + all-reduce. Inter-SM (ArKernel): the GEMM kernel writes each tile to this rank's buffer
// and signals the tile's owner; the owner's communicator blocks reduce the tile over all ranks
// (16-byte peer loads, fp32, rank order 0..W-1: bit-identical on every rank) and write the sum
// into every rank's buffer, then signal `done` everywhere. Intra-SM (ArIntraKernel): the storer
// stores its tile locally, then reduce-adds it into every peer's (schedule.hpp). README.md counts
// the lines.
#pragma once
#include "gemm/gemm_kernel.cuh"
#include "tp_common/adaptive_split.cuh"
#include "tp_common/reduce_tile.cuh"
#include "tp_common/schedule.hpp"
#include "weave/lcsc.cuh"
#include "weave/signal.cuh"
#include "weave/store.cuh"

namespace weave::tp {

struct ArGlobals : gemm::GemmGlobals {  // c: this rank's buffer (M x N), the output in place
  __nv_bfloat16* buf[kMaxWorld];          // every rank's buffer, as mapped here
  signals ready;                          // ready[w] on the owner: ranks whose tile w is written
  signals done;                           // done[0]: tiles whose sum reached this rank
  ArLayout L;
  int rank;
  Round ready_round, done_round;
};

// B is K x N (BLayout::KN) or N x K (NK: an nn.Linear weight, read in place); the GEMM's own loads.
template <gemm::BLayout BL>
struct ArKernelT : gemm::GemmKernel<256, BL, 3> {
  using Base = gemm::GemmKernel<256, BL, 3>;
  using typename Base::Output;
  using Globals = ArGlobals;

  static __device__ __forceinline__ void store(const ArGlobals& g, Output& o, int w, int part) {
    Base::store(g, o, w, part);
    tile::tma::commit_group();
    store_wait();
    signal(g.ready, ar_owner(g.L, w), w);
  }

  // The owner's reduction of tile w: every rank's partial into every rank's buffer, by threads
  // t = 0..nt-1 (the whole block by default).
  static __device__ __forceinline__ void reduce_tile(const ArGlobals& g, int w, int t = threadIdx.x,
                                                     int nt = blockDim.x) {
    const gemm::TileCoord c = gemm::grouped_tile(w, g.L.tiles_m, g.L.tiles_n, g.L.group_m);
    const int r0 = c.m * kBM, c0 = c.n * kBN;
    const long long off = static_cast<long long>(r0) * g.N + c0;
    tp::reduce_tile(g.buf, g.L.W, off, g.buf, g.L.W, off, min(kBM, g.M - r0), min(kBN, g.N - c0) / 8, g.N, t, nt);
  }

  static __device__ __forceinline__ void communicator(const ArGlobals& g, void*, int c, int nc) {
    for (int k = 0;; ++k) {
      const int w = ar_comm_tile(g.L, g.rank, c, nc, k);
      if (w < 0) break;
      if (threadIdx.x == 0) wait(g.ready, w, g.ready_round * ar_ready_expected(g.L));
      __syncthreads();
      reduce_tile(g, w);
      __syncthreads();
      if (threadIdx.x == 0) signal_all(g.done, 0);
    }
    if (c == 0 && threadIdx.x == 0) wait(g.done, 0, g.done_round * ar_done_expected(g.L));
  }
};

// Adaptive (ArVariant::Adaptive): v0's tasks without a fixed split. Every block starts computing;
// at each task boundary its loader asks the SM split's policy (tp_common/sm_split.hpp, over the
// call's ledger, sm_ledger.cuh) whether the block computes the next tile or reduces the next tile
// this rank owns (run by the block's consumer warpgroups, as v0's communicator blocks do with the
// whole block); the lcsc template's dynamic tasks carry it out. The ledger is a signal set's
// words on this rank (zero when made; the last block out zeroes it again).
struct ArAdaptiveGlobals : ArGlobals, tp::SplitGlobals {};  // priors: cycles per tile and per reduction

template <gemm::BLayout BL>
struct ArAdaptiveKernelT : ArKernelT<BL> {
  using Base = ArKernelT<BL>;
  using Globals = ArAdaptiveGlobals;
  static constexpr bool kDynamicTasks = true;
  using TaskState = AdaptiveReductionState;

  // The tiles this rank owns, in order: w = rank + k W (the ready counter's index is the tile's).
  static __device__ __forceinline__ lcsc::Task next_task(const Globals& g, TaskState& st, int blocks) {
    const AdaptiveTasks a{&g, g.L.work(), ar_owned_tiles(g.L, g.rank),
                          &g.ready, g.ready.ptr[g.rank],
                          static_cast<unsigned long long>(g.ready_round),
                          ar_ready_expected(g.L)};
    return adaptive_next_task(a, st, blocks, [&](long long k) { return g.rank + k * g.L.W; });
  }

  // Reduction k by the consumer threads t = 0..n-1: v0's communicator loop body (its input is in
  // place when the task is handed out; the wait is the acquire).
  static __device__ __forceinline__ unsigned long long other_task(const Globals& g, int k, int t, int n) {
    const int w = g.rank + k * g.L.W;
    return adaptive_reduction<ArAdaptiveKernelT>(g.ready, w, g.ready_round * ar_ready_expected(g.L), g.done, t,
                                                 [&] { Base::reduce_tile(g, w, t, n); });
  }

  static __device__ __forceinline__ void task_finished(const Globals& g, lcsc::Task t, unsigned long long cycles) {
    adaptive_task_finished(*g.ledger, t, cycles);
  }

  // The last block out zeroed the ledger; it then waits, as v0's communicator block 0, until every
  // tile's sum reached this rank.
  static __device__ __forceinline__ void block_exit(const Globals& g, int blocks) {
    if (sm_split::block_exit(*g.ledger, blocks)) wait(g.done, 0, g.done_round * ar_done_expected(g.L));
  }
};

// Intra-SM: no communicator SM; the storer does the communication (schedule.hpp, gemm_ar intra).
struct ArIntraGlobals : ArGlobals {
  CUtensorMap out[kMaxWorld];  // every rank's buffer (M x N), 128 x 64 boxes
};

template <gemm::BLayout BL>
struct ArIntraKernelT : gemm::GemmKernel<256, BL, 3> {
  using Base = gemm::GemmKernel<256, BL, 3>;
  using typename Base::Output;
  using Base::BM, Base::BN, Base::coord;
  using Globals = ArIntraGlobals;

  static __device__ __forceinline__ void store(const ArIntraGlobals& g, Output& o, int w, int) {
    const gemm::TileCoord t = coord(g, w);
    const int W = g.L.W;
    for (int k = 0; k < W; ++k) {  // k = 0: own plain store; then peers rank+1, rank+2, ...
      const int d = g.rank + k < W ? g.rank + k : g.rank + k - W;
      if (k > 0) {
        wait(g.ready, ar_intra_ready_index(g.L, w, d), g.ready_round * ar_intra_ready_expected());
        tile::fence_proxy_async_global();  // our async-proxy adds follow d's store
      }
#pragma unroll
      for (int j = 0; j < BN / 64; ++j) {
        const int n = t.n * BN + 64 * j;
        if (n >= g.N) break;
        if (k == 0) tile::tma::store_2d(&g.out[d], o.c + j * BM * 64, n, t.m * BM);
        else tile::tma::reduce_add_2d(&g.out[d], o.c + j * BM * 64, n, t.m * BM);
      }
      tile::tma::commit_group();
      if (k == 0) {
        store_wait();
        fence_acq_rel_sys();
        for (int p = 0; p < W; ++p)
          if (p != g.rank) red_add_relaxed_sys(g.ready.ptr[p] + ar_intra_ready_index(g.L, w, g.rank), 1);
      }
    }
  }

  // This block's adds are complete (the template waited): tell each peer how many it received;
  // block 0 then waits until every peer's adds into this rank's output landed.
  static __device__ __forceinline__ void store_done(const ArIntraGlobals& g, int compute_blocks) {
    const int b = static_cast<int>(blockIdx.x);
    const int n = ar_intra_block_tiles(g.L, b, compute_blocks);
    for (int d = 0; d < g.L.W; ++d)
      if (d != g.rank && n > 0) signal(g.done, d, 0, static_cast<unsigned long long>(n));
    if (b == 0) wait(g.done, 0, g.done_round * ar_intra_done_expected(g.L));
  }
};

using ArKernel = ArKernelT<gemm::BLayout::KN>;
using ArKernelNK = ArKernelT<gemm::BLayout::NK>;
using ArAdaptiveKernel = ArAdaptiveKernelT<gemm::BLayout::KN>;
using ArAdaptiveKernelNK = ArAdaptiveKernelT<gemm::BLayout::NK>;
using ArIntraKernel = ArIntraKernelT<gemm::BLayout::KN>;
using ArIntraKernelNK = ArIntraKernelT<gemm::BLayout::NK>;

}  // namespace weave::tp
