// GEMM + reduce-scatter: the GEMM kernel (gemm/gemm_kernel.cuh), in four of RsVariant's variants
// (tp_common/variants.hpp; ShardGemms (3) and CopyEngine (4) are host only, gemm_rs.cu).
// Intra-SM, OwnerFirst (0) and ZeroFirst (1): its storer sends every finished tile to the rank
// that owns its rows; ZeroFirst also zeroes the own output with the producer's idle warps (the
// aux role of weave/lcsc.cuh). InterSm (2): tiles go to a local scratch and the owner's
// communicator blocks reduce them. Chain (5): each rank walks the owners in a ring, storing into
// or adding onto what the previous rank left there. The communication is the storer below
// (store + store_done), aux, communicator and the per-owner loads; README.md counts the lines.
#pragma once
#include "gemm/gemm_kernel.cuh"
#include "gemm_fp8/gemm_fp8_kernel.cuh"
#include "tp_common/reduce_tile.cuh"
#include "tp_common/adaptive_split.cuh"
#include "tp_common/schedule.hpp"
#include "tp_common/variants.hpp"
#include "weave/lcsc.cuh"
#include "weave/signal.cuh"
#include "weave/store.cuh"

namespace weave::tp {

// GG: the GEMM's globals (gemm::GemmGlobals for bf16 inputs, gemm_fp8::Fp8Globals for fp8 with
// per-tensor scales), whose consumer reads them.
template <class GG>
struct RsGlobalsT : GG {
  CUtensorMap out[kMaxWorld];  // owner q's output (its shard's rows x N), 128 x 64 boxes
  signals ready;               // v0: ready[tile] on a peer: the owner's own partial is in place
                               // v5: ready[tile] on rank r + 1: rank r's contribution is in place
  signals zeroed;              // v1: zeroed[q]: blocks of rank q that zeroed their slice
                               // v5: zeroed[0] on rank r + 1: rank r entered the call
  signals done;                // done[0] on an owner: tiles its peers added (running total)
  Layout L;
  int rank;
  int variant;                 // RsVariant's number (tp_common/variants.hpp): 0 OwnerFirst, plain
                               // own stores; 1 ZeroFirst, all reduce-adds; 2 InterSm (scratch +
                               // communicator reduce); 5 Chain (3 and 4 are host only)
  __nv_bfloat16* own;          // this rank's output (v1 zeroes it, v2's reducers write it)
  CUtensorMap sc[kMaxWorld];   // v2: owner q's rows of this rank's scratch, 128 x 64 boxes
  __nv_bfloat16* scr[kMaxWorld];  // v2: every rank's scratch (M x N), as mapped here
  long long own_elems;
  Round ready_round, zeroed_round, done_round;
};

using RsGlobals = RsGlobalsT<gemm::GemmGlobals>;
using RsGlobalsFp8 = RsGlobalsT<gemm_fp8::Fp8Globals>;

// Gemm: the 128 x 256 GEMM whose loads, consumer and staging this kernel takes: bf16 with B K x N
// (BLayout::KN) or N x K (NK: an nn.Linear weight, read in place), or fp8 e4m3 (B N x K; the
// per-tensor scales multiply this rank's partial in the epilogue, before it is sent). The
// partials travel and are reduced in bf16 either way.
template <class Gemm>
struct RsKernelT : Gemm {
  using Base = Gemm;
  using typename Base::Output, typename Base::Stage;
  using Base::BK, Base::BM, Base::BN;
  using Globals = RsGlobalsT<typename Base::Globals>;
  static_assert(BM == kBM && BN == kBN, "the TP schedule's 128 x 256 tiles");
  struct AuxShared {};

  static __host__ __device__ int num_work(const Globals& g) { return g.L.work(); }
  // Whether this launch runs variant v (the globals carry its number).
  static __device__ __forceinline__ bool is(const Globals& g, RsVariant v) { return g.variant == to_int(v); }

  static __device__ __forceinline__ void prologue(const Globals& g) {
    tile::tma::prefetch(&g.a);
    tile::tma::prefetch(&g.b);
  }

  // A rows of the owner's shard (rows past it are computed and then clipped by the store).
  struct LoadTile {
    int a_row, n;
  };
  static __device__ __forceinline__ LoadTile tile_of(const Globals& g, int w) {
    const Item t = rs_order(g.L, g.rank, w, g.variant);
    return {t.a_row, t.n};
  }
  static __device__ __forceinline__ void load(const Globals& g, Stage& s, tile::Mbarrier& full, const LoadTile& t,
                                              int it) {
    const int k0 = it * BK;
    tile::tma::load_2d(s.a, &g.a, &full, k0, t.a_row);
    Base::load_b(&g.b, s, full, k0, t.n);
  }

  // v1: the 64 aux threads zero this block's slice of the own output, then one system-scope
  // release tells every rank (their reduce-adds, an async proxy, follow an acquire + proxy fence).
  static __device__ __forceinline__ void aux(const Globals& g, AuxShared&, int compute_blocks, int t) {
    if (is(g, RsVariant::Chain)) {  // this call's output is free: rank + 1's step 1 may store into it
      if (blockIdx.x == 0 && t == 0 && g.L.W > 1) signal(g.zeroed, (g.rank + 1) % g.L.W, 0);
      return;
    }
    if (!is(g, RsVariant::ZeroFirst)) return;
    long long e0, e1;
    rs_zero_range(g.own_elems, static_cast<int>(blockIdx.x), compute_blocks, &e0, &e1);
    int4* p = reinterpret_cast<int4*>(g.own);
    for (long long v = e0 / 8 + t; v < e1 / 8; v += 64) p[v] = make_int4(0, 0, 0, 0);
    tile::named_barrier_sync(1, 64);
    if (t == 0) signal_all(g.zeroed, g.rank);
  }

  // v0: own tile: plain store (overwrites last call's result), writes complete, then ready on
  // every peer; peer's tile: wait for the owner's ready, then reduce-add into the owner's output.
  // v1: before the block's first add, every rank's zeroing is complete; then every tile is a
  // reduce-add into its owner's output.
  static __device__ __forceinline__ void store(const Globals& g, Output& o, int w, int) {
    const Item t = rs_order(g.L, g.rank, w, g.variant);
    if (is(g, RsVariant::Chain)) {
      store_chain(g, o, w, t);
      return;
    }
    if (is(g, RsVariant::InterSm)) {  // inter-SM: the tile into the local scratch, then ready on its owner
#pragma unroll
      for (int j = 0; j < BN / 64; ++j) {
        const int n = t.n * BN + 64 * j;
        if (n >= g.N) break;
        tile::tma::store_2d(&g.sc[t.owner], o.c + j * BM * 64, n, t.i * BM);
      }
      tile::tma::commit_group();
      store_wait();
      signal(g.ready, t.owner, rs_ready_index(g.L, t));
      return;
    }
    const bool own = t.owner == g.rank && is(g, RsVariant::OwnerFirst);
    const int idx = rs_ready_index(g.L, t);
    if (is(g, RsVariant::ZeroFirst)) {
      if (w == static_cast<int>(blockIdx.x)) {
        for (int q = 0; q < g.L.W; ++q) wait(g.zeroed, q, g.zeroed_round * rs_zeroed_expected(gridDim.x));
        tile::fence_proxy_async_global();
      }
    } else if (!own) {
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
      weave::fence_acq_rel_sys();
      for (int p = 0; p < g.L.W; ++p)
        if (p != g.rank) weave::red_add_relaxed_sys(g.ready.ptr[p] + idx, 1);
    }
  }

  // v5 (schedule.hpp, rs_chain_item): step 1 stores into owner r - 1's output once it entered the
  // call; every later step adds onto what rank r - 1 left there (ready[tile]); steps before the
  // own one tell rank r + 1 when their store or add has landed. That signal lags one tile: it
  // goes out once the next tile's store is issued (or before the storer waits, or at the end), so
  // the storer never holds the staging tile while a remote store completes; the peer needs the
  // signal only in its own step, half a kernel later at W = 2.
  static __device__ __forceinline__ int& chain_pending() {
    __shared__ int tile;  // ready index of the storer's store not yet signalled, or -1
    return tile;
  }
  static __device__ __forceinline__ void chain_signal(const Globals& g, int idx) {
    weave::fence_acq_rel_sys();
    weave::red_add_relaxed_sys(g.ready.ptr[(g.rank + 1) % g.L.W] + idx, 1);
  }
  static __device__ __forceinline__ void chain_flush(const Globals& g) {
    int& pending = chain_pending();
    if (pending < 0) return;
    store_wait();
    chain_signal(g, pending);
    pending = -1;
  }
  static __device__ __forceinline__ void store_chain(const Globals& g, Output& o, int w, const Item& t) {
    const int W = g.L.W, idx = rs_ready_index(g.L, t);
    const bool first = t.phase == 1 && W > 1;
    int& pending = chain_pending();
    if (w == static_cast<int>(blockIdx.x)) {
      pending = -1;
      if (first) wait(g.zeroed, 0, g.zeroed_round);
    }
    if (!first && W > 1) {
      chain_flush(g);  // nobody waits on us while we wait
      wait(g.ready, idx, g.ready_round);
      tile::fence_proxy_async_global();  // our async-proxy add follows rank r - 1's
    }
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) {
      const int n = t.n * BN + 64 * j;
      if (n >= g.N) break;
      if (first || W == 1) tile::tma::store_2d(&g.out[t.owner], o.c + j * BM * 64, n, t.i * BM);
      else tile::tma::reduce_add_2d(&g.out[t.owner], o.c + j * BM * 64, n, t.i * BM);
    }
    if (t.phase < W) {
      tile::tma::commit_group();
      if (pending >= 0) {  // every group but this tile's is complete: the previous tile landed
        tile::tma::wait_group<1>();
        chain_signal(g, pending);
      }
      pending = idx;
    }
  }

  // All this block's adds are complete (the template waited): tell each owner how many; the
  // owner's block 0 then waits for every peer's adds, so the output is final when we return.
  static __device__ __forceinline__ void store_done(const Globals& g, int compute_blocks) {
    // v2: the communicator blocks end the call; v5: the own adds, last, waited for every peer's.
    if (is(g, RsVariant::Chain) && static_cast<int>(blockIdx.x) < num_work(g)) chain_flush(g);  // (had a tile)
    if (is(g, RsVariant::InterSm) || is(g, RsVariant::Chain)) return;
    const int b = static_cast<int>(blockIdx.x);
    for (int q = 0; q < g.L.W; ++q) {
      const int n = rs_block_adds(g.L, g.rank, b, compute_blocks, q, g.variant);
      if (n > 0) signal(g.done, q, 0, static_cast<unsigned long long>(n));
    }
    if (b == 0) wait(g.done, 0, g.done_round * rs_done_expected(g.L, g.rank));
  }

  // v2: communicator block c of n reduces this rank's tiles j = c, c + n, ... (in the order the
  // storers finish them) from every rank's scratch into the output, then tells every rank; block
  // 0 ends the call when every owner consumed every tile (its scratch is free again).
  static __device__ __forceinline__ void communicator(const Globals& g, void*, int c, int nc) {
    const Range sh = shard(g.M, g.L.W, g.rank);
    for (int j = c; j < g.L.owner_tiles(g.rank); j += nc) {
      const gemm::TileCoord t = gemm::grouped_tile(j, g.L.tm[g.rank], g.L.tiles_n, g.L.group_m);
      if (threadIdx.x == 0)
        wait(g.ready, (g.L.off[g.rank] + t.m) * g.L.tiles_n + t.n, g.ready_round * rs_inter_ready_expected(g.L));
      __syncthreads();
      const int c0 = t.n * kBN;
      const long long rows = static_cast<long long>(t.m) * kBM;
      reduce_tile(g.scr, g.L.W, (sh.begin + rows) * g.N + c0, &g.own, 1, rows * g.N + c0,
                  min(kBM, sh.size - t.m * kBM), min(kBN, g.N - c0) / 8, g.N);
      __syncthreads();
      if (threadIdx.x == 0) signal_all(g.done, 0);
    }
    if (c == 0 && threadIdx.x == 0) wait(g.done, 0, g.done_round * rs_inter_done_expected(g.L));
  }
};

// Adaptive (RsVariant::Adaptive, bf16): v2's tasks without a fixed split, as gemm_ar v2
// (gemm_ar_kernel.cuh, tp_common/sm_ledger.cuh): every block starts computing the tiles in v2's
// order (into the local scratch, then ready on the owner); at each task boundary its loader asks
// the SM split's policy whether it computes the next tile or reduces the next tile this rank owns
// (claimed once every rank's partial is in place; run by the block's consumer warpgroups). The
// globals carry variant 2, whose tile order and store this kernel takes.
struct RsAdaptiveGlobals : RsGlobals, SplitGlobals {};  // priors: cycles per tile and per reduction

template <class Gemm>
struct RsAdaptiveKernelT : RsKernelT<Gemm> {
  using Base = RsKernelT<Gemm>;
  using Globals = RsAdaptiveGlobals;
  static constexpr bool kDynamicTasks = true;  // (the lcsc template ignores the aux and store_done inherited)
  using TaskState = AdaptiveReductionState;

  // Task j's tile and its ready counter on this rank (the owner).
  static __device__ __forceinline__ gemm::TileCoord owned(const Globals& g, long long j) {
    return gemm::grouped_tile(static_cast<int>(j), g.L.tm[g.rank], g.L.tiles_n, g.L.group_m);
  }
  static __device__ __forceinline__ int ready_index(const Globals& g, const gemm::TileCoord& t) {
    return (g.L.off[g.rank] + t.m) * g.L.tiles_n + t.n;
  }

  static __device__ __forceinline__ lcsc::Task next_task(const Globals& g, TaskState& st, int blocks) {
    const AdaptiveTasks a{&g, g.L.work(), g.L.owner_tiles(g.rank),
                          &g.ready, g.ready.ptr[g.rank],
                          static_cast<unsigned long long>(g.ready_round),
                          rs_inter_ready_expected(g.L)};
    return adaptive_next_task(a, st, blocks, [&](long long j) { return ready_index(g, owned(g, j)); });
  }

  // Reduction j by the consumer threads t = 0..n-1: v2's communicator loop body.
  static __device__ __forceinline__ unsigned long long other_task(const Globals& g, int j, int t, int n) {
    const gemm::TileCoord c = owned(g, j);
    return adaptive_reduction<RsAdaptiveKernelT>(
        g.ready, ready_index(g, c), g.ready_round * rs_inter_ready_expected(g.L), g.done, t, [&] {
          const Range sh = shard(g.M, g.L.W, g.rank);
          const int c0 = c.n * kBN;
          const long long rows = static_cast<long long>(c.m) * kBM;
          reduce_tile(g.scr, g.L.W, (sh.begin + rows) * g.N + c0, &g.own, 1, rows * g.N + c0,
                      min(kBM, sh.size - c.m * kBM), min(kBN, g.N - c0) / 8, g.N, t, n);
        });
  }

  static __device__ __forceinline__ void task_finished(const Globals& g, lcsc::Task t, unsigned long long cycles) {
    adaptive_task_finished(*g.ledger, t, cycles);
  }

  // The last block out zeroed the ledger; it then waits, as v2's communicator block 0, until every
  // owner consumed every tile (this rank's scratch is free again).
  static __device__ __forceinline__ void block_exit(const Globals& g, int blocks) {
    if (sm_split::block_exit(*g.ledger, blocks)) wait(g.done, 0, g.done_round * rs_inter_done_expected(g.L));
  }
};

using RsKernel = RsKernelT<gemm::GemmKernel<kBN, gemm::BLayout::KN, 3>>;
using RsKernelNK = RsKernelT<gemm::GemmKernel<kBN, gemm::BLayout::NK, 3>>;
using RsKernelFp8 = RsKernelT<gemm_fp8::GemmFp8Kernel<tile::fp8e4m3, tile::fp8e4m3, kBN, 3>>;
using RsAdaptiveKernel = RsAdaptiveKernelT<gemm::GemmKernel<kBN, gemm::BLayout::KN, 3>>;
using RsAdaptiveKernelNK = RsAdaptiveKernelT<gemm::GemmKernel<kBN, gemm::BLayout::NK, 3>>;

// The fp8 kernel's launch, in its own translation unit (gemm_rs_fp8.cu): the build compiles it
// beside the bf16 ones.
lcsc::Plan launch_rs_fp8(const RsGlobalsFp8& g, const lcsc::Config& cfg, cudaStream_t s);

}  // namespace weave::tp
