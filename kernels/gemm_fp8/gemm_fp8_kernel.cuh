// fp8 GEMMs (Hopper e4m3 / e5m2 tensor cores) as LCSC kernels: C (bf16, M x N) = A * B^T with A
// M x K and B N x K, both row-major, i.e. both K-major as fp8 wgmma requires (wgmma_fp8.cuh).
//
// GemmFp8Kernel (per-tensor scales): the bf16 GEMM's schedule (kernels/gemm/gemm_kernel.cuh) with
// BK = 128 fp8 = 128 bytes per row, so that the 128-byte swizzle and every descriptor value of
// the bf16 kernel carry over; four m64nBNk32 wgmmas per stage. The tensor core accumulates all
// of K (like cuBLASLt's FP8 "fast accumulation"); the epilogue multiplies the fp32 accumulators
// by scale_a * scale_b (read on the device, no host sync) before the bf16 rounding.
//
// GemmFp8BlockKernel (DeepSeek-V3 block scales): A has one scale per (row, 128-K block), B one per
// (128 x 128) block. One stage is one 128-K block. Its four wgmmas go into a temporary fp32
// accumulator (first one with scale-d = 0); once they completed, the temporary is multiplied by
// scale_a[row, kb] * scale_b[nb, kb] and added to the main accumulator in fp32 on the CUDA cores
// ("promotion"): the tensor core's reduced-precision accumulation then spans only 128 of K. The
// main and temporary accumulators need 2 x BN/2 floats per thread: with 64 x 256 per consumer that
// is 256 > the 232 registers a consumer has, so this kernel's tiles are 128 x 192 (2 x 96 floats)
// and 128 x 128.
#pragma once
#include <cuda.h>

#include "gemm/output_staging.hpp"
#include "gemm/scheduler.hpp"
#include "gemm/transposed_staging.cuh"
#include "weave/tile/cluster.cuh"
#include "weave/tile/fragment.cuh"
#include "weave/tile/mbarrier.cuh"
#include "weave/tile/tma.cuh"
#include "weave/tile/types.cuh"
#include "weave/tile/wgmma.cuh"
#include "weave/tile/wgmma_fp8.cuh"

namespace weave::gemm_fp8 {

using gemm::TileCoord;

struct Fp8Globals {
  CUtensorMap a;  // fp8 as bytes, box {128 (K), 128 rows}, 128B swizzle
  CUtensorMap b;  // box {128 (K), BN rows}
  CUtensorMap c;  // bf16, box {64 (N), 128 rows}
  // Per-tensor: one float each. Block scales: scale_a is ceil(K/128) x M (K-block-major: the
  // 128 rows of a tile are contiguous for one K block), scale_b is ceil(N/128) x ceil(K/128).
  const float* scale_a;
  const float* scale_b;
  int M, N, K;
  int tiles_m, tiles_n, group_m;
  int kblocks;     // ceil(K / 128)
  int accumulate;  // always 0 (gemm/split_k.cuh's store reads it)
};

// What the two kernels share: tile order, loads, the output store.
// BM_ = 64 (the 64-row tile for M <= 256 on narrow N, as the bf16 GEMM's): both consumers read
// the same 64 rows of A and split the tile's columns, BN/2 each.
// TransOut (the swapped 128 x w tile, as the bf16 GEMM's): the caller passes the weights as A and
// the tokens as B; the tile is stored transposed, one {64, BN} box per consumer (C = X W^T).
// Cluster = 2 (the 128 x 256 tile, for pitches off the 128-byte grid, as the bf16 GEMM's cluster
// tile): the two CTAs of a cluster compute tile rows 2i and 2i + 1 of one tile column, each loading
// its own A and half of B and multicasting that half into both, so B crosses L2 -> SM once per pair.
template <int BN_, int Stages, int BM_ = 128, bool TransOut = false, int Cluster = 1>
struct Fp8Common {
  using bf16 = tile::bf16;
  using Globals = Fp8Globals;
  static constexpr int BM = BM_, BN = BN_, BK = 128;
  // Each consumer warpgroup's share: 64 rows x kWN columns (gemm/split_k.cuh's share too).
  static constexpr int kWN = BM == 128 ? BN : BN / 2;
  static_assert(BM == 128 || (BM == 64 && BN == 128), "BM 128, or 64 with BN 128");
  static constexpr int kStages = Stages;
  static constexpr int kConsumers = 2;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;  // (40 + 2 * 232) * 128 = 64,512 of 65,536
  static constexpr int kOutputParts = 1;
  static constexpr int kClusterSize = Cluster;
  static constexpr int kBRowsPerCta = BN_ / Cluster;  // B rows each CTA loads (and multicasts)
  static_assert(Cluster == 1 || (Cluster == 2 && BM_ == 128 && BN_ == 256 && !TransOut),
                "clusters of 2 along M for the 128 x 256 tile only");
  static constexpr bool kBlockScales = false;
  // A width off the 64-column grid (the 128 x w tiles) stages the bf16 output dense, for one
  // {BN, 128} store box (kernels/gemm/output_staging.hpp).
  using Staging = gemm::OutputStaging<BN_, 2>;
  static constexpr bool kTransOut = TransOut;
  static_assert(!TransOut || (BM_ == 128 && BN_ % 8 == 0), "a transposed output: BM = 128");
  static constexpr bool kDenseOut = !TransOut && Staging::kDense;
  static constexpr int kOutBlockCols = TransOut ? 64 : Staging::kBlockCols;
  static constexpr tile::Swizzle kOutSwizzle = TransOut ? tile::Swizzle::B128 : Staging::kSwizzle;
  static constexpr uint32_t kStageTxBytes = (BM + BN) * BK;  // one byte per element
  static constexpr int kInBytes = 1;                           // bytes per input element
  static_assert(BN == 128 || BN == 192 || BN == 256 || (kDenseOut && BN % 16 == 0 && BN < 256) || TransOut,
                "BN 128, 192, 256 or a multiple of 16");

  struct alignas(1024) Stage {
    uint8_t a[BM * BK];  // BM rows of 128 B (K-major, swizzled)
    uint8_t b[BN * BK];  // BN rows of 128 B
  };
  struct alignas(1024) Output {
    bf16 c[BM * BN];  // BN/64 blocks of BM rows x 128 B, swizzled (or one dense block)
  };

  static __host__ __device__ int num_work(const Globals& g) { return gemm::clustered_work<Cluster>(g); }
  static __device__ __forceinline__ int num_iters(const Globals& g, int) { return g.kblocks; }
  static __device__ __forceinline__ TileCoord coord(const Globals& g, int w) {
    return gemm::clustered_tile<Cluster>(g, w, [] { return tile::cluster::ctarank(); });
  }

  static __device__ __forceinline__ void prologue(const Globals& g) {
    tile::tma::prefetch(&g.a);
    tile::tma::prefetch(&g.b);
    tile::tma::prefetch(&g.c);
  }
  static __device__ __forceinline__ TileCoord tile_of(const Globals& g, int w) { return coord(g, w); }
  // K past the end (K % 128 != 0) and rows past M or N are zero-filled by TMA: they add 0.
  static __device__ __forceinline__ void load(const Globals& g, Stage& s, tile::Mbarrier& full, const TileCoord& t,
                                              int it) {
    const int k0 = it * BK;
    tile::tma::load_2d(s.a, &g.a, &full, k0, t.m * BM);
    if constexpr (Cluster == 1) {
      load_b(&g.b, s, full, k0, t.n);
    } else {
      const int r = static_cast<int>(tile::cluster::ctarank());
      tile::tma::load_2d_multicast(s.b + r * kBRowsPerCta * BK, &g.b, &full, k0, t.n * BN + r * kBRowsPerCta,
                                   (1u << Cluster) - 1);
    }
  }
  // B's tile column n at k0 into the stage (the TP kernels' loaders too).
  static __device__ __forceinline__ void load_b(const CUtensorMap* b, Stage& s, tile::Mbarrier& full, int k0, int n) {
    static_assert(Cluster == 1, "load_b: one CTA's B (a cluster multicasts its share)");
    tile::tma::load_2d(s.b, b, &full, k0, n * BN);
  }

  // Descriptors (wgmma.cuh, make_desc): both operands K-major with the 128-byte swizzle, rows of
  // 128 bytes as TMA wrote them. Start = the row block's base plus 32 bytes per k32 step (the
  // swizzle is applied by the hardware on absolute address bits, so advancing the start inside the
  // 128-byte row is how CUTLASS and the bf16 kernel step K as well); LBO is unused for swizzled
  // K-major layouts (16, i.e. 1, by convention); SBO = 1024 = 8 rows x 128 B, the distance between
  // 8-row core-matrix groups; base offset 0 because every stage buffer is 1024-byte aligned.
  // BM = 128: consumer c reads A rows 64c .. 64c + 63 (64 x 128 B further into the stage) and all
  // of B. BM = 64: both read all of A, consumer c B rows c kWN on.
  static __device__ __forceinline__ uint64_t desc_a(const Stage& s, int c, int kk) {
    return tile::wgmma::make_desc(tile::smem_u32(s.a) + (BM == 128 ? c * 64 * BK : 0) + kk * 32, 16, 1024,
                                  tile::Swizzle::B128);
  }
  static __device__ __forceinline__ uint64_t desc_b(const Stage& s, int c, int kk) {
    return tile::wgmma::make_desc(tile::smem_u32(s.b) + (BM == 128 ? 0 : c * kWN * BK) + kk * 32, 16, 1024,
                                  tile::Swizzle::B128);
  }

  // TransOut: staging block j (the tile's rows 64j.., C's columns) to C at the tile's tokens.
  static __device__ __forceinline__ void store_block(const Globals& g, Output& o, const TileCoord& t, int j) {
    static_assert(TransOut, "the transposed output's store");
    gemm::store_transposed_block<BN>(&g.c, o.c + j * BN * 64, t.m * 128 + 64 * j, t.n * BN, g.M, false);
  }

  static __device__ __forceinline__ void store(const Globals& g, Output& o, int w, int) {
    const TileCoord t = coord(g, w);
    if constexpr (Cluster > 1)
      if (t.m >= g.tiles_m) return;
    if constexpr (TransOut) {
      store_block(g, o, t, 0);
      store_block(g, o, t, 1);
    } else {
#pragma unroll
      for (int j = 0; j < BN / kOutBlockCols; ++j) {
        const int n = t.n * BN + kOutBlockCols * j;
        if (n >= g.N) break;
        tile::tma::store_2d(&g.c, o.c + j * BM * kOutBlockCols, n, t.m * BM);
      }
    }
  }

  static __device__ __forceinline__ void communicator(const Globals&, void*, int, int) {}
};

// The per-tensor kernel's consumer and epilogue on a Common (an Fp8Common): GemmFp8Kernel and, in
// 2-CTA clusters, GemmFp8PairKernel.
template <class TA, class TB, class Common>
struct Fp8TensorScaled : Common {
  using Base = Common;
  using typename Base::Globals;
  using typename Base::Output;
  using typename Base::Stage;
  using Base::BK;
  using Base::BM;
  using Base::BN;
  static constexpr int kReleaseLag = 1;
  using Base::kWN;

  struct ConsumerState {
    float d[kWN / 2];
    float scale;  // scale_a * scale_b, loaded at a tile's first K step, used in its epilogue
  };

  static __device__ __forceinline__ void consume(const Globals& g, ConsumerState& st, Stage& s, int, int it, int c) {
    // Issued here, used after the whole K loop: the load's latency hides behind the mainloop.
    if (it == 0) st.scale = __ldg(g.scale_a) * __ldg(g.scale_b);
    tile::wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BK / 32; ++kk)
      tile::wgmma::mma_fp8_ss<TA, TB, kWN>(st.d, Base::desc_a(s, c, kk), Base::desc_b(s, c, kk),
                                           (it > 0 || kk > 0) ? 1 : 0);
    tile::wgmma::commit_group();
    tile::wgmma::wait_group<1>();  // the previous stage's batch is done: the template frees it
  }

  static __device__ __forceinline__ void drain(ConsumerState& st) {
    tile::wgmma::wait_group<0>();
    tile::wgmma::fence_operands(st.d);
  }

  // Scaling the fp32 sum before the single bf16 rounding (not the bf16 value after it) keeps the
  // output's error at one bf16 rounding for any scale; NaN and Inf pass through the product.
  static __device__ __forceinline__ void finish(const Globals&, ConsumerState& st, Output& o, int, int c, int) {
#pragma unroll
    for (int i = 0; i < kWN / 2; ++i) st.d[i] *= st.scale;
    if constexpr (Base::kTransOut)
      gemm::store_accumulator_transposed<BN>(o.c + c * BN * 64, st.d);
    else if constexpr (Base::kDenseOut)
      tile::store_accumulator_dense<tile::bf16, BN>(o.c, BN, c * 64, st.d);
    else if constexpr (BM == 64)  // consumer c's columns: staging blocks c kWN / 64 on
      tile::store_accumulator_swizzled<tile::bf16, kWN>(o.c + c * kWN * BM, BM, 0, st.d);
    else
      tile::store_accumulator_swizzled<tile::bf16, BN>(o.c, BM, c * 64, st.d);
  }
};

template <class TA, class TB, int BN_, int Stages, int BM_ = 128, bool TransOut = false>
struct GemmFp8Kernel : Fp8TensorScaled<TA, TB, Fp8Common<BN_, Stages, BM_, TransOut>> {};

// The 128 x 256 tile in 2-CTA clusters (B multicast), 3 stages: for K pitches off the 128-byte grid.
template <class TA, class TB>
struct GemmFp8PairKernel : Fp8TensorScaled<TA, TB, Fp8Common<256, 3, 128, false, 2>> {};

// Block scales' bookkeeping, one consumer thread's share: where its scales are, the next K
// block's (loaded from global memory one block ahead: a whole stage to arrive), and the
// promotion. Accumulator rows of this thread (wgmma.cuh's layout): warp w of the consumer holds
// rows 16w .. 16w + 15, lane l rows l/4 and l/4 + 8. Rows past M (a ragged last tile) read row
// M - 1's scale, columns past N the last N block's: their results are clipped by the TMA store.
// (Loading A's scales into the stage by TMA instead measured 4-7 % slower on the 128x192 tile:
// docs/perf-notes.md, 2026-12-03.)
//
// B's two scales of a K block (one per 128-column block) are the same for the whole warp. Loaded
// as they are (LaneB false), ptxas keeps them in uniform registers and converts each right after
// its load (R2UR), which waits for the load within the K block that issued it: hidden behind the
// wgmmas while scale_a sits in L2, but with scale_a out of L2 (32768 x 16384 x 53248: 54 MB) it
// stalled every block, 0.80 -> 0.65 of per-tensor. With LaneB even lanes load the first block's
// scale and odd lanes the second's (a per-lane address: no uniform register), and the next block
// takes both by shuffles: 0.75 there, but 4-8 % slower than uniform loads on the core set. The
// launch picks LaneB when scale_a is at least half of L2 (block_lane_scales).
template <int BN, bool LaneB>
struct BlockScales {
  const float* sa0;    // scale_a of this thread's two rows (row r and r + 8), K block 0
  const float* sa1;
  const float* sb_lo;  // scale_b of the tile's first and second N block, K block 0
  const float* sb_hi;
  int split;  // the tile's first column in the second N block
  // The next K block's scales; with LaneB next_lo holds this lane's B scale (lo or hi).
  float next_a0, next_a1, next_lo, next_hi;

  // One K block's multipliers scale_a * scale_b.
  struct Factors {
    float lo0, lo1, hi0, hi1;  // rows r and r + 8; columns before `split`, and from it
  };

  // The tile's scales from K block kb on (split-K starts a tile's range at kb > 0).
  __device__ __forceinline__ void start(const Fp8Globals& g, const TileCoord& t, int BM, int c, int kb) {
    const int lane = threadIdx.x & 31, warp = (threadIdx.x / 32) % 4;
    const int r0 = t.m * BM + c * 64 + warp * 16 + lane / 4;
    const int r1 = r0 + 8;
    sa0 = g.scale_a + (r0 < g.M ? r0 : g.M - 1);
    sa1 = g.scale_a + (r1 < g.M ? r1 : g.M - 1);
    const int col0 = t.n * BN, nb_last = (g.N - 1) / 128;
    const int nb0 = col0 / 128, nb1 = nb0 < nb_last ? nb0 + 1 : nb_last;
    split = (nb0 + 1) * 128 - col0;
    sb_lo = g.scale_b + static_cast<size_t>(nb0) * g.kblocks;
    sb_hi = g.scale_b + static_cast<size_t>(nb1) * g.kblocks;
    load(g, kb);
  }
  __device__ __forceinline__ void load(const Fp8Globals& g, int kb) {
    const size_t off = static_cast<size_t>(kb) * g.M;
    next_a0 = __ldg(sa0 + off);
    next_a1 = __ldg(sa1 + off);
    if constexpr (LaneB) {
      next_lo = __ldg(((threadIdx.x & 1) ? sb_hi : sb_lo) + kb);  // sb_hi is valid at BN = 128 too
    } else {
      next_lo = __ldg(sb_lo + kb);
      if constexpr (BN > 128) next_hi = __ldg(sb_hi + kb);
      else next_hi = 0.f;
    }
  }

  // K block kb's scales, and block kb + 1's requested.
  __device__ __forceinline__ Factors take(const Fp8Globals& g, int kb) {
    float lo = next_lo, hi = next_hi;
    if constexpr (LaneB) {
      lo = __shfl_sync(0xffffffffu, next_lo, 0);
      hi = BN > 128 ? __shfl_sync(0xffffffffu, next_lo, 1) : 0.f;
    }
    const Factors r{next_a0 * lo, next_a1 * lo, next_a0 * hi, next_a1 * hi};
    if (kb + 1 < g.kblocks) load(g, kb + 1);
    return r;
  }

  // acc += part * scale over 8-column groups: part[4j + 0..1] belong to row r, part[4j + 2..3] to
  // row r + 8, columns 8j on. Split is a constant so that each group's scale is too.
  template <int Split>
  static __device__ __forceinline__ void promote(float (&acc)[BN / 2], const float (&part)[BN / 2], const Factors& s) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const float s0 = 8 * j < Split ? s.lo0 : s.hi0, s1 = 8 * j < Split ? s.lo1 : s.hi1;
      acc[4 * j + 0] = fmaf(part[4 * j + 0], s0, acc[4 * j + 0]);
      acc[4 * j + 1] = fmaf(part[4 * j + 1], s0, acc[4 * j + 1]);
      acc[4 * j + 2] = fmaf(part[4 * j + 2], s1, acc[4 * j + 2]);
      acc[4 * j + 3] = fmaf(part[4 * j + 3], s1, acc[4 * j + 3]);
    }
  }
  __device__ __forceinline__ void promote(float (&acc)[BN / 2], const float (&part)[BN / 2], const Factors& s) const {
    if (BN == 128 || split == 128)
      promote<128>(acc, part, s);
    else
      promote<64>(acc, part, s);
  }
};

// What both block-scaled kernels share: the wgmma batch of one K block, the epilogue.
template <class TA, class TB, int Stages, int BN_, bool LaneB>
struct Fp8BlockCommon : Fp8Common<BN_, Stages> {
  using Base = Fp8Common<BN_, Stages>;
  using typename Base::Globals;
  using typename Base::Output;
  using Base::BK;
  using Base::BM;
  using Base::BN;
  using typename Base::Stage;
  static constexpr bool kBlockScales = true;
  using Scales = BlockScales<BN_, LaneB>;
  static constexpr bool kOwnsKLoop = true;  // consume_range releases each stage itself

  // One 128-K block's four wgmmas into a temporary (the first overwrites it: scale-d 0).
  static __device__ __forceinline__ void issue(float (&part)[BN / 2], const Stage& s, int c) {
    tile::wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BK / 32; ++kk)
      tile::wgmma::mma_fp8_ss<TA, TB, BN>(part, Base::desc_a(s, c, kk), Base::desc_b(s, c, kk), kk > 0 ? 1 : 0);
    tile::wgmma::commit_group();
  }

  static __device__ __forceinline__ void finish_acc(float (&acc)[BN / 2], Output& o, int c) {
    tile::store_accumulator_swizzled<tile::bf16, BN>(o.c, BM, c * 64, acc);
  }
};

// Each block's wgmmas are waited for (wait_group 0), the stage released, and the block promoted
// at once: the tensor core idles on this warpgroup while it promotes, and the other consumer,
// which read the same stage, promotes at the same time. What that costs and what was tried
// against it (the two consumers' batches taken in turn, two accumulator chains per consumer,
// deeper scale prefetch) is in docs/perf-notes.md (2026-12-02, eighth session, and 2026-12-03).
//
// BN = 192 (two consumers of 64 x 192: 2 x 96 floats) is the faster tile of this kernel; its
// columns straddle two of B's 128-column scale blocks, so a K block has two B scales, split at
// column `split` of the tile (128 for an even tile column, 64 for an odd one). BN = 128 has one.
template <class TA, class TB, int Stages, int BN_, bool LaneB = false>
struct GemmFp8BlockKernel : Fp8BlockCommon<TA, TB, Stages, BN_, LaneB> {
  using Base = Fp8BlockCommon<TA, TB, Stages, BN_, LaneB>;
  using typename Base::Globals;
  using typename Base::Output;
  using Base::BN;
  static_assert(BN == 128 || BN == 192, "block scales: 128 or 192 columns");

  struct ConsumerState {
    float d[BN / 2];     // the tile's sum, fp32 on the CUDA cores (split-K's partial when split)
    float part[BN / 2];  // one 128-K block from the tensor core
    typename Base::Scales sc;
  };

  // K blocks k_begin .. k_begin + iters - 1 of tile `item` (split-K runs a range of them).
  template <class Pipe>
  static __device__ __forceinline__ void consume_range(const Globals& g, ConsumerState& st, Pipe& pipe, int item,
                                                       int k_begin, int iters, int c) {
    st.sc.start(g, Base::coord(g, item), Base::BM, c, k_begin);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) st.d[i] = 0.f;  // fma(p, s, 0) = p * s: every block adds alike
    for (int it = 0; it < iters; ++it) {
      auto t = pipe.take();
      Base::issue(st.part, t.stage, c);
      const auto sc = st.sc.take(g, k_begin + it);  // the next B scale loads overlap the wgmmas
      tile::wgmma::wait_group<0>();
      tile::wgmma::fence_operands(st.part);
      pipe.release(t.index);  // the loads of a later block start while this one is promoted
      st.sc.promote(st.d, st.part, sc);
    }
  }

  static __device__ __forceinline__ void finish(const Globals&, ConsumerState& st, Output& o, int, int c, int) {
    Base::finish_acc(st.d, o, c);
  }
};

// Block scales with the tensor core never drained: two temporaries, block it's wgmmas issued into
// one while block it - 1's, in the other, is waited for (wait_group 1) and promoted. The K loop
// is unrolled by two so that each temporary is a fixed set of registers and ptxas keeps the
// batches asynchronous. Main + two temporaries are 3 x BN/2 floats per thread: 192 at BN = 128,
// the only width that fits 232 registers.
template <class TA, class TB, int Stages, bool LaneB = false>
struct GemmFp8BlockPipeKernel : Fp8BlockCommon<TA, TB, Stages, 128, LaneB> {
  using Base = Fp8BlockCommon<TA, TB, Stages, 128, LaneB>;
  using typename Base::Globals;
  using typename Base::Output;
  using Base::BN;

  struct ConsumerState {
    float d[BN / 2];
    float part0[BN / 2];
    float part1[BN / 2];
    typename Base::Scales sc;
  };

  using Temp = float[BN / 2];
  using Factors = typename Base::Scales::Factors;

  // Issues block kb into `into`, then waits for and promotes the block in `done` (stage
  // `done_index`, scales `done_scales`), which become block kb's.
  template <class Pipe>
  static __device__ __forceinline__ void step(const Globals& g, ConsumerState& st, Pipe& pipe, Temp& into, Temp& done,
                                              Factors& done_scales, uint32_t& done_index, int kb, int c) {
    auto t = pipe.take();
    Base::issue(into, t.stage, c);
    const auto cur = st.sc.take(g, kb);
    tile::wgmma::wait_group<1>();
    tile::wgmma::fence_operands(done);
    pipe.release(done_index);
    st.sc.promote(st.d, done, done_scales);
    done_scales = cur;
    done_index = t.index;
  }
  // The tile's last block, in `done`.
  template <class Pipe>
  static __device__ __forceinline__ void last(ConsumerState& st, Pipe& pipe, Temp& done, const Factors& done_scales,
                                              uint32_t done_index) {
    tile::wgmma::wait_group<0>();
    tile::wgmma::fence_operands(done);
    pipe.release(done_index);
    st.sc.promote(st.d, done, done_scales);
  }

  template <class Pipe>
  static __device__ __forceinline__ void consume_range(const Globals& g, ConsumerState& st, Pipe& pipe, int item,
                                                       int k_begin, int iters, int c) {
    st.sc.start(g, Base::coord(g, item), Base::BM, c, k_begin);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) st.d[i] = 0.f;
    auto t = pipe.take();
    Base::issue(st.part0, t.stage, c);
    auto prev = st.sc.take(g, k_begin);
    uint32_t prev_index = t.index;
    for (int it = 1;; ++it) {
      if (it == iters) return last(st, pipe, st.part0, prev, prev_index);
      step(g, st, pipe, st.part1, st.part0, prev, prev_index, k_begin + it, c);
      if (++it == iters) return last(st, pipe, st.part1, prev, prev_index);
      step(g, st, pipe, st.part0, st.part1, prev, prev_index, k_begin + it, c);
    }
  }

  static __device__ __forceinline__ void finish(const Globals&, ConsumerState& st, Output& o, int, int c, int) {
    Base::finish_acc(st.d, o, c);
  }
};

}  // namespace weave::gemm_fp8
