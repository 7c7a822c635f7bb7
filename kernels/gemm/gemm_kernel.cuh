// The single-GPU bf16 GEMM as an LCSC kernel: C = A * B (or C += A * B), fp32 accumulation.
// A is M x K row-major; B is K x N row-major (BLayout::KN) or N x K row-major (BLayout::NK).
// Fused tensor-parallel kernels extend this struct (its storer and communicator).
//
// Tile BM x BN x 64 with BM = 128: two consumer warpgroups of 64 x BN each, one
// m64nBNk16 wgmma per 16 of K. Operands arrive by TMA with the 128-byte swizzle. The epilogue
// packs the accumulators to bf16, stmatrix-es them into a swizzled staging tile and the storer
// thread writes it with TMA stores (reduce-add stores for C +=), while the consumers go on to
// the next tile.
//
// Cluster = 2: the two CTAs of a cluster compute vertically adjacent tiles (tile rows 2i and
// 2i+1, same tile column), so they need the same B panel. Each loads its own A and half of B,
// multicasting that half into both CTAs: B crosses L2 -> SM once per pair.
#pragma once
#include <cuda.h>

#include "gemm/layout.hpp"
#include "gemm/scheduler.hpp"
#include "weave/tile/cluster.cuh"
#include "weave/tile/fragment.cuh"
#include "weave/tile/mbarrier.cuh"
#include "weave/tile/tma.cuh"
#include "weave/tile/types.cuh"
#include "weave/tile/wgmma.cuh"

namespace weave::gemm {

struct GemmGlobals {
  CUtensorMap a;  // box {64 (K), 128 rows}
  CUtensorMap b;  // KN: box {64 (N), 64 (K)}; NK: box {64 (K), BN rows}
  CUtensorMap c;  // box {64 (N), 128 rows}
  int M, N, K;
  int tiles_m, tiles_n, group_m;
  int accumulate;
};

template <int BN_, BLayout L, int Stages, int OutParts = 1, int Cluster = 1>
struct GemmKernel {
  using bf16 = tile::bf16;
  using Globals = GemmGlobals;
  static constexpr int BM = 128, BN = BN_, BK = 64;
  static constexpr int kStages = Stages;
  static constexpr int kConsumers = 2;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;  // (40 + 2 * 232) * 128 = 64,512 of 65,536
  static constexpr int kReleaseLag = 1;
  static constexpr int kOutputParts = OutParts;
  static constexpr int kClusterSize = Cluster;
  static constexpr int kBRowsPerCta = BN_ / Cluster;  // NK: B rows each CTA loads (and multicasts)
  static_assert(Cluster == 1 || Cluster == 2, "clusters of 1 or 2 along M");
  static constexpr int kPartCols = BN_ / OutParts;
  static constexpr uint32_t kStageTxBytes = (BM + BN) * BK * sizeof(bf16);
  static_assert(BN % 64 == 0 && BN <= 256, "BN in 64..256, multiple of 64");
  static_assert(kPartCols % 64 == 0 && kPartCols * OutParts == BN, "output parts of whole 64-column blocks");

  struct alignas(1024) Stage {
    bf16 a[BM * BK];  // 128 rows of 128 B (K-major, swizzled)
    bf16 b[BN * BK];  // NK: BN rows of 128 B; KN: BN/64 blocks of 64 K-rows x 128 B (N-major)
  };
  struct alignas(1024) Output {
    bf16 c[BM * kPartCols];  // kPartCols/64 blocks of 128 rows x 128 B, swizzled
  };
  struct ConsumerState {
    float d[BN / 2];
  };

  static __host__ __device__ int num_work(const Globals& g) { return (g.tiles_m + Cluster - 1) / Cluster * g.tiles_n; }
  static __device__ __forceinline__ int num_iters(const Globals& g, int) { return (g.K + BK - 1) / BK; }
  static __device__ __forceinline__ TileCoord coord(const Globals& g, int w) {
    if constexpr (Cluster == 1) {
      return grouped_tile(w, g.tiles_m, g.tiles_n, g.group_m);
    } else {
      const int group = g.group_m / Cluster > 0 ? g.group_m / Cluster : 1;
      TileCoord t = grouped_tile(w, (g.tiles_m + Cluster - 1) / Cluster, g.tiles_n, group);
      t.m = t.m * Cluster + static_cast<int>(tile::cluster::ctarank());
      return t;  // t.m may equal tiles_m (odd tile rows): loads zero-fill, the store is skipped
    }
  }

  static __device__ __forceinline__ void prologue(const Globals& g) {
    tile::tma::prefetch(&g.a);
    tile::tma::prefetch(&g.b);
    tile::tma::prefetch(&g.c);
  }

  // The tile's coordinate once per tile, not per K step (lcsc.cuh, tile_of).
  static __device__ __forceinline__ TileCoord tile_of(const Globals& g, int w) { return coord(g, w); }
  static __device__ __forceinline__ void load(const Globals& g, Stage& s, tile::Mbarrier& full, const TileCoord& t,
                                              int it) {
    const int k0 = it * BK;
    tile::tma::load_2d(s.a, &g.a, &full, k0, t.m * BM);
    if constexpr (Cluster == 1) {
      if constexpr (L == BLayout::NK) {
        tile::tma::load_2d(s.b, &g.b, &full, k0, t.n * BN);
      } else {
#pragma unroll
        for (int j = 0; j < BN / 64; ++j) tile::tma::load_2d(s.b + j * 64 * BK, &g.b, &full, t.n * BN + 64 * j, k0);
      }
    } else {
      const int r = static_cast<int>(tile::cluster::ctarank());
      constexpr uint16_t all = (1u << Cluster) - 1;
      if constexpr (L == BLayout::NK) {
        tile::tma::load_2d_multicast(s.b + r * kBRowsPerCta * BK, &g.b, &full, k0, t.n * BN + r * kBRowsPerCta, all);
      } else {
        constexpr int per = BN / 64 / Cluster;
#pragma unroll
        for (int j = r * per; j < (r + 1) * per; ++j)
          tile::tma::load_2d_multicast(s.b + j * 64 * BK, &g.b, &full, t.n * BN + 64 * j, k0, all);
      }
    }
  }

  static __device__ __forceinline__ void consume(const Globals&, ConsumerState& st, Stage& s, int, int it, int c) {
    const uint32_t a0 = tile::smem_u32(s.a) + c * 64 * 128;
    const uint32_t b0 = tile::smem_u32(s.b);
    tile::wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      const uint64_t da = tile::wgmma::make_desc(a0 + kk * 32, 16, 1024, tile::Swizzle::B128);
      if constexpr (L == BLayout::NK) {
        const uint64_t db = tile::wgmma::make_desc(b0 + kk * 32, 16, 1024, tile::Swizzle::B128);
        tile::wgmma::mma_ss<bf16, BN, 0>(st.d, da, db, (it > 0 || kk > 0) ? 1 : 0);
      } else {
        const uint64_t db = tile::wgmma::make_desc(b0 + kk * 16 * 128, BK * 128, 1024, tile::Swizzle::B128);
        tile::wgmma::mma_ss<bf16, BN, 1>(st.d, da, db, (it > 0 || kk > 0) ? 1 : 0);
      }
    }
    tile::wgmma::commit_group();
    tile::wgmma::wait_group<1>();  // the previous stage's batch is done: the template frees it
  }

  static __device__ __forceinline__ void drain(ConsumerState& st) {
    tile::wgmma::wait_group<0>();
    tile::wgmma::fence_operands(st.d);
  }

  template <int P>
  static __device__ __forceinline__ void finish_part(ConsumerState& st, Output& o, int c) {
    tile::store_accumulator_swizzled<bf16, BN, P * kPartCols, kPartCols>(o.c, BM, c * 64, st.d);
  }
  static __device__ __forceinline__ void finish(const Globals&, ConsumerState& st, Output& o, int, int c, int part) {
    if constexpr (OutParts == 1) {
      finish_part<0>(st, o, c);
    } else {
      static_assert(OutParts == 2, "1 or 2 output parts");
      if (part == 0) finish_part<0>(st, o, c);
      else finish_part<1>(st, o, c);
    }
  }

  static __device__ __forceinline__ void store(const Globals& g, Output& o, int w, int part) {
    const TileCoord t = coord(g, w);
    if (t.m >= g.tiles_m) return;
#pragma unroll
    for (int j = 0; j < kPartCols / 64; ++j) {
      const int n = t.n * BN + part * kPartCols + 64 * j;
      if (n >= g.N) break;
      if (g.accumulate)
        tile::tma::reduce_add_2d(&g.c, o.c + j * BM * 64, n, t.m * BM);
      else
        tile::tma::store_2d(&g.c, o.c + j * BM * 64, n, t.m * BM);
    }
  }

  static __device__ __forceinline__ void communicator(const Globals&, void*, int, int) {}
};

}  // namespace weave::gemm
