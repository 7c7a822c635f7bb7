// The single-GPU bf16 GEMM as an LCSC kernel: C = A * B (+ bias) (or C += ...), fp32 accumulation.
// A is M x K row-major (ALayout::MK) or K x M row-major (ALayout::KM); B is K x N row-major
// (BLayout::KN) or N x K row-major (BLayout::NK). C is bf16 or fp32 (OutT); with Bias, a vector
// of N values (bf16 or fp32, chosen at run time) is added to every row in fp32 before rounding.
// Fused tensor-parallel kernels extend this struct (its storer and communicator) with the
// defaults: A M x K, bf16 output, no bias.
//
// Tile BM x BN x 64 with BM = 128: two consumer warpgroups of 64 x BN each, one
// m64nBNk16 wgmma per 16 of K. BM = 64 (decode shapes, M <= 64): the two consumers split N, each
// 64 x BN/2 with one m64n(BN/2)k16 per 16 of K, reading the same A rows. Operands arrive by TMA
// with the 128-byte swizzle. The epilogue packs the accumulators to bf16 and stmatrix-es them
// (fp32: 8-byte shared stores) into a swizzled staging tile (dense for a BN off the 64-column
// grid), and the storer thread writes it with TMA stores (reduce-add stores for C +=), while the
// consumers go on to the next tile.
//
// Cluster = 2: the two CTAs of a cluster compute vertically adjacent tiles (tile rows 2i and
// 2i+1, same tile column), so they need the same B panel. Each loads its own A and half of B,
// multicasting that half into both CTAs: B crosses L2 -> SM once per pair. BN = 320 (clusters
// only: a wider B panel per A row loaded, so fewer L2 requests per FLOP where a misaligned pitch
// doubles them): each consumer's 64 x 320 accumulator is two wgmmas of 192 and 128 columns per
// k16 step (wgmma's N stops at 256), and the output goes out in two parts of 192 and 128 columns.
// Cluster = 4 (the swapped 128 x w tile only): four weight panels share the token tile, each CTA
// loading a quarter of it, so the token rows cross L2 -> SM once per four weight panels.
//
// TransOut (the swapped 128 x w tile, Tile::SwappedW): the caller passes the weights W (N x K, or
// K x N as an input gradient reads them: then A is M-major, ALayout::KM) as A and the tokens X
// (M x K) as B, so that 128 weight rows sit on the wgmma's M side and the few tokens on its N side
// (no rows of a 128-row token tile wasted, and the stages hold weights); the kernel computes
// D = W X^T (its M is the GEMM's N) and stores D transposed, as C = X W^T: each consumer's 64
// weight rows are one staging block of BN token rows x 128 B (swizzled), one TMA box.
// BM = 256 (TransOut only): 256 weight rows per tile, each consumer 128 of them as two m64nBNk16
// accumulators sharing each B (token) operand, so a token row loaded feeds twice the FLOPs; the
// output goes through the staging tile in two parts (part p: each consumer's rows 64p..), which
// leaves room for 3 stages.
#pragma once
#include <cuda.h>

#include <type_traits>

#include "gemm/layout.hpp"
#include "gemm/output_staging.hpp"
#include "gemm/scheduler.hpp"
#include "gemm/transposed_staging.cuh"
#include "weave/tile/cluster.cuh"
#include "weave/tile/fragment.cuh"
#include "weave/tile/mbarrier.cuh"
#include "weave/tile/tma.cuh"
#include "weave/tile/types.cuh"
#include "weave/tile/wgmma.cuh"

namespace weave::gemm {

struct GemmGlobals {
  CUtensorMap a;  // MK: box {64 (K), 128 rows}; KM: box {64 (M), 64 (K)}
  CUtensorMap b;  // KN: box {64 (N), 64 (K)}; NK: box {64 (K), BN rows}
  CUtensorMap c;  // box {128 bytes of N (64 bf16 or 32 fp32), BM rows}
  int M, N, K;
  int tiles_m, tiles_n, group_m;
  int accumulate;
};

// Only kernels with an fp32 output or a bias take these, so that the default kernel's (and the
// fused kernels') parameters stay what they were.
struct GemmEpilogueGlobals : GemmGlobals {
  const void* bias;  // N values (16-byte aligned), or null: no bias
  int bias_f32;      // 1: bias is float, 0: bf16
};

template <int BN_, BLayout L, int Stages, int OutParts = 1, int Cluster = 1, ALayout LA = ALayout::MK,
          class OutT = tile::bf16, bool Bias = false, int BM_ = 128, bool TransOut = false>
struct GemmKernel {
  using bf16 = tile::bf16;
  static constexpr bool kF32Out = std::is_same_v<OutT, float>;
  static_assert(kF32Out || std::is_same_v<OutT, bf16>, "bf16 or fp32 output");
  static constexpr bool kPlainEpilogue = !kF32Out && !Bias;
  using Globals = std::conditional_t<kPlainEpilogue, GemmGlobals, GemmEpilogueGlobals>;
  static constexpr ALayout kALayout = LA;
  static constexpr BLayout kBLayout = L;
  static constexpr int BM = BM_, BN = BN_, BK = 64;
  // Each consumer warpgroup's share of the tile: kMSub x 64 rows x kWN columns.
  static constexpr int kWN = BM == 64 ? BN / 2 : BN;
  static constexpr int kMSub = BM == 256 ? 2 : 1;  // m64 accumulators per consumer
  // BN > 256: the consumer's columns as two wgmmas, the first of whole 64-column blocks (a K x N
  // B's second one then starts at a box, and the halves' accumulators laid end to end are the
  // layout one m64nBNk16 would have, which the epilogue's stores read).
  static constexpr bool kNSplit = BN_ > 256;
  static constexpr int kMmaN0 = kNSplit ? (BN_ / 2 + 63) / 64 * 64 : kWN;
  static constexpr int kMmaN1 = kWN - kMmaN0;
  static_assert(BM == 128 || BM == 64 || BM == 256,
                "BM of 128 (consumers split M), 64 (consumers split N) or 256 (transposed output)");
  static_assert(BM != 64 || (OutParts == 1 && Cluster == 1), "BM = 64: one output part, no cluster");
  static_assert(BM != 256 || (TransOut && OutParts == 2 && Cluster == 1),
                "BM = 256: the transposed output in two parts, no cluster");
  // A width that is not whole 64-column blocks (the 128 x w tiles, for wave quantisation) stages
  // the output dense (output_staging.hpp) and stores it with one {BN, BM} box; B must be N x K (a
  // K x N tile is read in 64-column boxes).
  using Staging = OutputStaging<BN_, static_cast<int>(sizeof(OutT))>;
  static constexpr bool kTransOut = TransOut;
  static constexpr bool kDenseOut = !TransOut && Staging::kDense;
  static_assert(!TransOut || (BM_ != 64 && L == BLayout::NK && (LA == ALayout::MK || BM_ == 128) &&
                              OutParts == BM_ / 128 && std::is_same_v<OutT, bf16> && !Bias && BN_ % (8 * Cluster) == 0),
                "a transposed output: BM = 128 (A either layout) or 256 (A K-major), B K-major, a bf16 output "
                "without bias, BM / 128 parts");
  static_assert(!kDenseOut || (BM_ == 128 && L == BLayout::NK && OutParts == 1 && Cluster == 1 &&
                               std::is_same_v<OutT, bf16> && BN_ % 16 == 0),
                "a width off the 64-column grid: BM = 128, B as N x K, a bf16 output, one part, no cluster");
  static constexpr int kStages = Stages;
  static constexpr int kConsumers = 2;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;  // (40 + 2 * 232) * 128 = 64,512 of 65,536
  static constexpr int kReleaseLag = 1;
  static constexpr int kOutputParts = OutParts;
  static constexpr int kClusterSize = Cluster;
  static constexpr int kBRowsPerCta = BN_ / Cluster;  // NK: B rows each CTA loads (and multicasts)
  static_assert(Cluster == 1 || Cluster == 2 || (Cluster == 4 && TransOut && BM_ == 128),
                "clusters of 1 or 2 along M (4: the swapped 128 x w tile)");
  // Output columns per staging row block (TransOut: C's columns, i.e. 64 of the tile's rows).
  static constexpr int kOutBlockCols = TransOut ? 64 : Staging::kBlockCols;
  // Output columns per part: whole staging blocks (the last part may be narrower: 320 = 192 + 128).
  static constexpr int kPartCols = TransOut || kDenseOut ? BN_ / OutParts
                                                         : (BN_ / OutParts + kOutBlockCols - 1) / kOutBlockCols *
                                                               kOutBlockCols;
  static __host__ __device__ constexpr int part_cols(int p) { return p == OutParts - 1 ? BN_ - p * kPartCols : kPartCols; }
  template <int P>
  static constexpr int kWPartCols = BM_ == 128 ? part_cols(P) : BN_ / 2;  // one consumer's columns of part P
  static constexpr tile::Swizzle kOutSwizzle = TransOut ? tile::Swizzle::B128 : Staging::kSwizzle;
  static constexpr uint32_t kStageTxBytes = (BM + BN) * BK * sizeof(bf16);
  static constexpr int kInBytes = sizeof(bf16);  // bytes per input element (the TP pushes count bytes)
  static_assert((BN % 64 == 0 || kDenseOut || TransOut) && (BN <= 256 || (BN == 320 && BM == 128 && Cluster == 2 &&
                                                                            OutParts == 2 && !TransOut)),
                "BN in 64..256, a multiple of 64 (or of 16, dense; of 8, transposed); 320 in 2-CTA clusters, "
                "two output parts");
  static_assert((kPartCols % 64 == 0 || kDenseOut || TransOut) && kPartCols * (OutParts - 1) < BN &&
                    kPartCols * OutParts >= BN,
                "output parts of whole 64-column blocks");

  struct alignas(1024) Stage {
    bf16 a[BM * BK];  // MK: BM rows of 128 B (K-major); KM: BM/64 blocks of 64 K-rows x 128 B (M-major)
    bf16 b[BN * BK];  // NK: BN rows of 128 B; KN: BN/64 blocks of 64 K-rows x 128 B (N-major)
  };
  struct alignas(1024) Output {
    // kPartCols/kOutBlockCols blocks of BM rows x 128 B, swizzled (or dense); TransOut: one block of
    // BN rows x 128 B per consumer.
    OutT c[TransOut ? 2 * 64 * BN : BM * kPartCols];  // BN = 320: the larger part (192 columns)
  };
  struct ConsumerStateOne {
    float d[kWN / 2];
  };
  struct ConsumerStateTwo {  // BM = 256: rows 0-63 and 64-127 of the consumer's share
    float d[kWN / 2];
    float d1[kWN / 2];
  };
  using ConsumerState = std::conditional_t<kMSub == 2, ConsumerStateTwo, ConsumerStateOne>;

  static __host__ __device__ int num_work(const Globals& g) { return clustered_work<Cluster>(g); }
  static __device__ __forceinline__ int num_iters(const Globals& g, int) { return (g.K + BK - 1) / BK; }
  static __device__ __forceinline__ TileCoord coord(const Globals& g, int w) {
    return clustered_tile<Cluster>(g, w, [] { return tile::cluster::ctarank(); });
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
    if constexpr (LA == ALayout::MK) {
      tile::tma::load_2d(s.a, &g.a, &full, k0, t.m * BM);
    } else {
      // One 64 (M) x 64 (K) box per consumer warpgroup: a box's 128-byte rows hold 64 M of one k.
#pragma unroll
      for (int j = 0; j < BM / 64; ++j) tile::tma::load_2d(s.a + j * 64 * BK, &g.a, &full, t.m * BM + 64 * j, k0);
    }
    if constexpr (Cluster == 1) {
      load_b(&g.b, s, full, k0, t.n);
    } else {
      const int r = static_cast<int>(tile::cluster::ctarank());
      constexpr uint16_t all = (1u << Cluster) - 1;
      if constexpr (L == BLayout::NK) {
        tile::tma::load_2d_multicast(s.b + r * kBRowsPerCta * BK, &g.b, &full, k0, t.n * BN + r * kBRowsPerCta, all);
      } else {
        // Each CTA a run of the panel's 64-column boxes (BN = 320: 3 and 2).
        constexpr int per = (BN / 64 + Cluster - 1) / Cluster;
        constexpr int last = BN / 64;
#pragma unroll
        for (int j = r * per; j < (r + 1) * per; ++j)
          if (last % Cluster == 0 || j < last)
            tile::tma::load_2d_multicast(s.b + j * 64 * BK, &g.b, &full, t.n * BN + 64 * j, k0, all);
      }
    }
  }

  // B's tile column n at k0 into the stage, as layout L stores it (the TP kernels' loaders too).
  static __device__ __forceinline__ void load_b(const CUtensorMap* b, Stage& s, tile::Mbarrier& full, int k0, int n) {
    static_assert(Cluster == 1, "load_b: one CTA's B (a cluster multicasts its share)");
    if constexpr (L == BLayout::NK) {
      tile::tma::load_2d(s.b, b, &full, k0, n * BN);
    } else {
#pragma unroll
      for (int j = 0; j < BN / 64; ++j) tile::tma::load_2d(s.b + j * 64 * BK, b, &full, n * BN + 64 * j, k0);
    }
  }

  static __device__ __forceinline__ void consume(const Globals&, ConsumerState& st, Stage& s, int, int it, int c) {
    // BM = 128: consumer c's 64 rows of A (8 KB on, either A layout), all of B. BM = 64: all of A,
    // B's columns c * kWN on: kWN rows of 128 B (NK) or kWN / 64 blocks of 8 KB (KN), the same bytes.
    const uint32_t a0 = tile::smem_u32(s.a) + (BM == 64 ? 0 : c * (BM / 2) * 128);
    const uint32_t b0 = tile::smem_u32(s.b) + (BM == 64 ? c * kWN * 128 : 0);
    tile::wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint64_t da;
      if constexpr (LA == ALayout::MK) {
        da = tile::wgmma::make_desc(a0 + kk * 32, 16, 1024, tile::Swizzle::B128);
      } else {
        // M-major A, the same descriptor as B stored K x N: this consumer's box is 64 k-rows of
        // 128 B (64 M each); a k16 step starts 16 rows = 2048 B on; SBO = 1024 B is the next
        // 8 k-rows (one swizzle atom). LBO is the stride to the next 64-M block (the next box,
        // 8192 B); an m64 operand never reaches it, but it is the true value.
        da = tile::wgmma::make_desc(a0 + kk * 16 * 128, BK * 128, 1024, tile::Swizzle::B128);
      }
      constexpr int kTransA = LA == ALayout::KM ? 1 : 0;
      if constexpr (kNSplit) {
        // The second wgmma's B: kMmaN0 rows on (N x K) or kMmaN0 / 64 boxes of 64 k-rows on (K x N).
        constexpr int kTransB = L == BLayout::KN ? 1 : 0;
        const uint32_t bk = L == BLayout::NK ? kk * 32 : kk * 16 * 128;
        const uint32_t lbo = L == BLayout::NK ? 16 : BK * 128;
        const uint32_t b1 = L == BLayout::NK ? kMmaN0 * 128 : kMmaN0 / 64 * 64 * BK * 2;
        const uint64_t db0 = tile::wgmma::make_desc(b0 + bk, lbo, 1024, tile::Swizzle::B128);
        const uint64_t db1 = tile::wgmma::make_desc(b0 + b1 + bk, lbo, 1024, tile::Swizzle::B128);
        const int acc = (it > 0 || kk > 0) ? 1 : 0;
        tile::wgmma::mma_ss<bf16, kMmaN0, kTransB, kTransA>(*reinterpret_cast<float(*)[kMmaN0 / 2]>(st.d), da, db0, acc);
        tile::wgmma::mma_ss<bf16, kMmaN1, kTransB, kTransA>(*reinterpret_cast<float(*)[kMmaN1 / 2]>(st.d + kMmaN0 / 2),
                                                            da, db1, acc);
      } else if constexpr (L == BLayout::NK) {
        const uint64_t db = tile::wgmma::make_desc(b0 + kk * 32, 16, 1024, tile::Swizzle::B128);
        tile::wgmma::mma_ss<bf16, kWN, 0, kTransA>(st.d, da, db, (it > 0 || kk > 0) ? 1 : 0);
        if constexpr (kMSub == 2) {  // the consumer's next 64 weight rows, 8 KB on, the same tokens
          const uint64_t da1 = tile::wgmma::make_desc(a0 + 64 * 128 + kk * 32, 16, 1024, tile::Swizzle::B128);
          tile::wgmma::mma_ss<bf16, kWN, 0, kTransA>(st.d1, da1, db, (it > 0 || kk > 0) ? 1 : 0);
        }
      } else {
        const uint64_t db = tile::wgmma::make_desc(b0 + kk * 16 * 128, BK * 128, 1024, tile::Swizzle::B128);
        tile::wgmma::mma_ss<bf16, kWN, 1, kTransA>(st.d, da, db, (it > 0 || kk > 0) ? 1 : 0);
      }
    }
    tile::wgmma::commit_group();
    tile::wgmma::wait_group<1>();  // the previous stage's batch is done: the template frees it
  }

  static __device__ __forceinline__ void drain(ConsumerState& st) {
    tile::wgmma::wait_group<0>();
    tile::wgmma::fence_operands(st.d);
    if constexpr (kMSub == 2) tile::wgmma::fence_operands(st.d1);
  }

  // bias[n] added to columns [C0, C0 + CN) of the accumulator. A thread's columns come in pairs
  // (8j + 2(lane % 4) + {0, 1}) on two rows; N % 8 == 0, so a pair is inside N or outside it.
  template <class BiasT, int C0, int CN>
  static __device__ __forceinline__ void add_bias_cols(const BiasT* bias, int n0, int N, ConsumerState& st) {
    const int n_lane = n0 + 2 * (threadIdx.x & 3);
#pragma unroll
    for (int j = C0 / 8; j < (C0 + CN) / 8; ++j) {
      const int n = n_lane + 8 * j;
      float b0 = 0.f, b1 = 0.f;
      if (n < N) {
        if constexpr (std::is_same_v<BiasT, float>) {
          const float2 v = __ldg(reinterpret_cast<const float2*>(bias + n));
          b0 = v.x, b1 = v.y;
        } else {
          const float2 v = __bfloat1622float2(__ldg(reinterpret_cast<const __nv_bfloat162*>(bias + n)));
          b0 = v.x, b1 = v.y;
        }
      }
      st.d[4 * j + 0] += b0;
      st.d[4 * j + 1] += b1;
      st.d[4 * j + 2] += b0;
      st.d[4 * j + 3] += b1;
    }
  }

  // fp32 accumulator -> the fp32 staging tile: blocks of 32 columns x BM rows of 128 B with the
  // 128B swizzle (what a TMA store with a {32, BM} box reads). No stmatrix for 32-bit elements:
  // each thread writes its column pairs as 8-byte stores. In one store the warp's 8 rows x 32 B
  // land, through the swizzle, on 16 different 16-byte chunks: two wavefronts for 256 B, the
  // minimum.
  template <int C0, int CN>
  static __device__ __forceinline__ void store_f32_swizzled(float* tile_base, int row0, const ConsumerState& st) {
    const int lane = threadIdx.x & 31;
    const int warp = (threadIdx.x / 32) % 4;
    const uint32_t row = static_cast<uint32_t>(row0 + warp * 16 + lane / 4);
    const uint32_t base = tile::smem_u32(tile_base);
#pragma unroll
    for (int j = C0 / 8; j < (C0 + CN) / 8; ++j) {
      const int col = 8 * j + 2 * (lane & 3) - C0;
      const uint32_t blk = static_cast<uint32_t>(col / 32) * BM * 128u;
      const uint32_t byte = static_cast<uint32_t>(col % 32) * 4u;
      const uint32_t a0 = base + blk + tile::swizzled_offset(tile::Swizzle::B128, row, byte);
      const uint32_t a1 = base + blk + tile::swizzled_offset(tile::Swizzle::B128, row + 8, byte);
      tile::st_shared_v2(a0, st.d[4 * j + 0], st.d[4 * j + 1]);
      tile::st_shared_v2(a1, st.d[4 * j + 2], st.d[4 * j + 3]);
    }
  }

  // Accumulator columns [P * kPartCols, P * kPartCols + part_cols(P)) go to part P of the staging tile
  // (BM = 128: every consumer holds every column, at its own rows). BM = 64: one part; consumer
  // c's columns are the tile's c * kWN on, i.e. staging blocks from c * kWN / kOutBlockCols on,
  // c * kWN * BM elements.
  template <int P>
  static __device__ __forceinline__ void finish_part(const Globals& g, ConsumerState& st, Output& o, int w, int c) {
    if constexpr (TransOut) {
      if constexpr (P == 0)
        store_accumulator_transposed<BN>(o.c + c * BN * 64, st.d);
      else
        store_accumulator_transposed<BN>(o.c + c * BN * 64, st.d1);
    } else
      finish_rows<P>(g, st, o, w, c);
  }
  template <int P>
  static __device__ __forceinline__ void finish_rows(const Globals& g, ConsumerState& st, Output& o, int w, int c) {
    const int row0 = BM == 128 ? c * 64 : 0;
    OutT* const dst = o.c + (BM == 128 ? 0 : c * kWN * BM);
    if constexpr (Bias) {
      if (g.bias != nullptr) {
        const int n0 = coord(g, w).n * BN + (BM == 128 ? 0 : c * kWN);
        if (g.bias_f32)
          add_bias_cols<float, P * kPartCols, kWPartCols<P>>(static_cast<const float*>(g.bias), n0, g.N, st);
        else
          add_bias_cols<bf16, P * kPartCols, kWPartCols<P>>(static_cast<const bf16*>(g.bias), n0, g.N, st);
      }
    }
    if constexpr (kF32Out)
      store_f32_swizzled<P * kPartCols, kWPartCols<P>>(dst, row0, st);
    else if constexpr (kDenseOut)
      tile::store_accumulator_dense<bf16, kWN>(dst, BN, row0, st.d);
    else
      tile::store_accumulator_swizzled<bf16, kWN, P * kPartCols, kWPartCols<P>>(dst, BM, row0, st.d);
  }
  static __device__ __forceinline__ void finish(const Globals& g, ConsumerState& st, Output& o, int w, int c,
                                                int part) {
    if constexpr (OutParts == 1) {
      finish_part<0>(g, st, o, w, c);
    } else {
      static_assert(OutParts == 2, "1 or 2 output parts");
      if (part == 0) finish_part<0>(g, st, o, w, c);
      else finish_part<1>(g, st, o, w, c);
    }
  }

  // TransOut: consumer c's staging block of part p (the tile's weight rows (BM / 2) c + 64 p on, C's
  // columns) to C at the tile's tokens.
  static __device__ __forceinline__ void store_block(const Globals& g, Output& o, const TileCoord& t, int c,
                                                     int p = 0) {
    static_assert(TransOut, "the transposed output's store");
    store_transposed_block<BN>(&g.c, o.c + c * BN * 64, t.m * BM + (BM / 2) * c + 64 * p, t.n * BN, g.M,
                               g.accumulate != 0);
  }

  static __device__ __forceinline__ void store(const Globals& g, Output& o, int w, int part) {
    const TileCoord t = coord(g, w);
    if (t.m >= g.tiles_m) return;
    if constexpr (TransOut) {
      store_block(g, o, t, 0, part);
      store_block(g, o, t, 1, part);
    } else {
#pragma unroll
      for (int j = 0; j < part_cols(part) / kOutBlockCols; ++j) {
        const int n = t.n * BN + part * kPartCols + kOutBlockCols * j;
        if (n >= g.N) break;
        if (g.accumulate)  // fp32 or bf16 add at L2, by the tensor map's type
          tile::tma::reduce_add_2d(&g.c, o.c + j * BM * kOutBlockCols, n, t.m * BM);
        else
          tile::tma::store_2d(&g.c, o.c + j * BM * kOutBlockCols, n, t.m * BM);
      }
    }
  }

  static __device__ __forceinline__ void communicator(const Globals&, void*, int, int) {}
};

}  // namespace weave::gemm
