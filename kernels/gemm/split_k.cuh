// Split-K on top of a GEMM kernel struct (gemm_kernel.cuh): the same roles, stages and
// epilogue, with the work items of split_k.hpp instead of whole tiles.
//
// A split item's partial sums stay fp32. Each consumer warpgroup handles its own share of the
// tile on its own (64 rows x kWN columns: the rows' half when BM = 128, the columns' half when
// BM = 64): it writes its accumulators to its split's slot of the workspace (in
// register order, so that a warp's stores are 512 contiguous bytes and the reader, which holds the
// same registers, reads them back the same way), then counts itself in on the half's counter. The
// warpgroup that completes the count adds the other splits' slots to its registers, resets the
// counter for the next launch, and runs the base epilogue (bias, rounding, staging); the others
// skip it, and the storer stores only the shares whose warpgroup finished them (BM = 128: a TMA
// store with a 64-row box; BM = 64: the share's own column blocks). No one waits for another worker, so any grid makes progress.
//
// Memory order: a writer's stores, then __threadfence, then the relaxed atomic add; the last
// arriver's add reads that value, then a fence, then L2 loads (ld.global.cg: the L1 of this SM
// may hold a line of the same slot from an earlier launch).
#pragma once
#include <cuda.h>

#include "gemm/scheduler.hpp"
#include "gemm/split_k.hpp"
#include "weave/tile/cluster.cuh"
#include "weave/tile/tma.cuh"
#include "weave/tile/warpgroup.cuh"

namespace weave::gemm {

// One consumer warpgroup's part in a split item's exchange (the kernels' shared step: SplitKKernel
// below, the MoE grouped GEMM's split): writes its Q float4s per thread of fp32 partials `d` to
// slot_of(split), counts itself in on counter_of(), and, when it completes the count, resets the
// counter, adds the other splits' slots to `d` and returns true (`finished`, in shared memory,
// says so to the storer; the caller stores only finished halves). `live`: whether this warp's rows
// exist (a warp past the rows neither writes nor reads). Uses named barrier 6 + c (the fused
// kernels use the low ids).
template <int Q, class SlotOf, class CounterOf>
__device__ __forceinline__ bool exchange_partials(float* d, SlotOf slot_of, CounterOf counter_of, int splits,
                                                  int split, bool live, int c, int& finished) {
  const int i = static_cast<int>(threadIdx.x) % 128;
  if (live) {
    float4* dst = reinterpret_cast<float4*>(slot_of(split)) + i;
#pragma unroll
    for (int q = 0; q < Q; ++q) __stcg(dst + q * 128, make_float4(d[4 * q], d[4 * q + 1], d[4 * q + 2], d[4 * q + 3]));
  }
  __threadfence();
  const int bar = 6 + c;
  tile::named_barrier_sync(bar, 128);
  if (i == 0) {
    int* counter = counter_of();
    const int before = atomicAdd(counter, 1);
    const int last = before == splits - 1;
    if (last) *counter = 0;  // the next launch starts from zero (kernel boundaries order it)
    finished = last;
  }
  tile::named_barrier_sync(bar, 128);
  if (!finished) return false;
  __threadfence();
  if (live) {
    for (int j = 0; j < splits; ++j) {
      if (j == split) continue;
      const float4* src = reinterpret_cast<const float4*>(slot_of(j)) + i;
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        const float4 v = __ldcg(src + q * 128);
        d[4 * q] += v.x;
        d[4 * q + 1] += v.y;
        d[4 * q + 2] += v.z;
        d[4 * q + 3] += v.w;
      }
    }
  }
  return true;
}

template <class Base>
struct SplitKGlobals : Base::Globals {
  SplitK sk;
  CUtensorMap c_half;  // BM = 128: C with a box of 64 rows (one consumer warpgroup's half)
  float* partials;     // tail_items * splits * Cluster * 2 slots of 64 x kWN floats
  int* counters;       // tail_items * Cluster * 2, zero between launches
};

template <class Base>
struct SplitKKernel : Base {
  using Globals = SplitKGlobals<Base>;
  using typename Base::ConsumerState;
  using typename Base::Stage;
  static constexpr int kSlotFloats = 64 * Base::kWN;
  static_assert(Base::kOutputParts == 1, "split-K: one output part");
  static_assert(Base::kConsumers == 2, "split-K: two consumer warpgroups");

  struct alignas(1024) Output : Base::Output {
    int finished[2];  // per consumer half: 1 when this item's half is stored from here
  };
  struct LoadState {
    TileCoord t;
    int k_begin;
  };

  static __host__ __device__ int num_work(const Globals& g) { return gemm::num_work(g.sk); }
  static __device__ __forceinline__ int num_iters(const Globals& g, int w) { return segment(g.sk, w).k_iters; }

  static __device__ __forceinline__ LoadState tile_of(const Globals& g, int w) {
    const Segment s = segment(g.sk, w);
    return {Base::coord(g, s.item), s.k_begin};
  }
  static __device__ __forceinline__ void load(const Globals& g, Stage& st, tile::Mbarrier& full, const LoadState& l,
                                              int it) {
    Base::load(g, st, full, l.t, l.k_begin + it);
  }

  // A Base that runs its K loop itself (lcsc kOwnsKLoop) runs this segment's K range.
  template <class Pipe>
  static __device__ __forceinline__ void consume_range(const Globals& g, ConsumerState& st, Pipe& pipe, int w,
                                                       int k_begin, int iters, int c) {
    const Segment s = segment(g.sk, w);
    Base::consume_range(g, st, pipe, s.item, s.k_begin + k_begin, iters, c);
  }

  static __device__ __forceinline__ int cta_rank() {
    if constexpr (Base::kClusterSize > 1) return static_cast<int>(tile::cluster::ctarank());
    return 0;
  }
  // Split j of tail item t, consumer half c.
  static __device__ __forceinline__ float* slot(const Globals& g, int t, int j, int c) {
    const long long i = ((static_cast<long long>(t) * g.sk.splits + j) * Base::kClusterSize + cta_rank()) * 2 + c;
    return g.partials + i * kSlotFloats;
  }

  // This warpgroup's rows that exist: warps whose 16 rows all lie past M neither write nor read.
  static __device__ __forceinline__ bool warp_rows_live(const Globals& g, const TileCoord& t, int c) {
    const int row0 = t.m * Base::BM + (Base::BM == 128 ? c * 64 : 0);
    return row0 + 16 * tile::warp_in_warpgroup() < g.M;
  }

  // Returns whether this warpgroup completes the item's half c (and then holds the full sums).
  static __device__ __forceinline__ bool combine(const Globals& g, ConsumerState& st, Output& o, const Segment& s,
                                                 int c) {
    const int t = s.item - g.sk.dp_items;
    return exchange_partials<Base::kWN / 8>(
        st.d, [&](int j) { return slot(g, t, j, c); },
        [&] { return g.counters + (static_cast<long long>(t) * Base::kClusterSize + cta_rank()) * 2 + c; },
        g.sk.splits, s.split, warp_rows_live(g, Base::coord(g, s.item), c), c, o.finished[c]);
  }

  static __device__ __forceinline__ void finish(const Globals& g, ConsumerState& st, Output& o, int w, int c,
                                                int part) {
    const Segment s = segment(g.sk, w);
    if (s.split >= 0) {
      if (!combine(g, st, o, s, c)) return;
    } else if (threadIdx.x % 128 == 0) {
      o.finished[c] = 1;
    }
    Base::finish(g, st, o, s.item, c, part);
  }

  static __device__ __forceinline__ void store(const Globals& g, Output& o, int w, int part) {
    const Segment s = segment(g.sk, w);
    if (s.split < 0) {
      Base::store(g, o, s.item, part);
      return;
    }
    const TileCoord t = Base::coord(g, s.item);
    if (t.m >= g.tiles_m) return;
    if constexpr (Base::kTransOut) {
      // Consumer h's 64 weight rows are staging block h, a whole box of C's columns.
      for (int h = 0; h < 2; ++h)
        if (o.finished[h]) Base::store_block(g, o, t, h);
    } else {
      store_rows(g, o, t);
    }
  }

  static __device__ __forceinline__ void store_rows(const Globals& g, Output& o, const TileCoord& t) {
    constexpr int cols = Base::kOutBlockCols;  // one 128-byte staging row
    using OutT = std::remove_reference_t<decltype(o.c[0])>;
    if constexpr (Base::BM == 64) {
      // Consumer h's columns are staging blocks [h kWN / cols, (h + 1) kWN / cols): the plain
      // store's blocks, only those of the finished shares.
#pragma unroll
      for (int j = 0; j < Base::BN / cols; ++j) {
        if (!o.finished[j / (Base::kWN / cols)]) continue;
        const int n = t.n * Base::BN + cols * j;
        if (n >= g.N) break;
        const OutT* src = o.c + j * Base::BM * cols;
        if (g.accumulate)
          tile::tma::reduce_add_2d(&g.c, src, n, t.m * Base::BM);
        else
          tile::tma::store_2d(&g.c, src, n, t.m * Base::BM);
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = t.m * Base::BM + 64 * h;
        if (!o.finished[h] || row >= g.M) continue;
#pragma unroll
        for (int j = 0; j < Base::BN / cols; ++j) {
          const int n = t.n * Base::BN + cols * j;
          if (n >= g.N) break;
          // Rows 64h.. of staging block j: 8 KB on, a whole number of 1024-byte swizzle atoms, so
          // the 64-row box reads the same swizzle the 128-row one would.
          const OutT* src = o.c + j * Base::BM * cols + h * 64 * cols;
          if (g.accumulate)
            tile::tma::reduce_add_2d(&g.c_half, src, n, row);
          else
            tile::tma::store_2d(&g.c_half, src, n, row);
        }
      }
    }
  }
};

}  // namespace weave::gemm
