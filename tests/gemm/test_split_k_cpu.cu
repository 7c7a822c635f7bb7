// CPU tests of split-K (kernels/gemm/split_k.hpp) and the GEMM's launch choice
// (kernels/gemm/plan.hpp).
#include <array>
#include <gtest/gtest.h>

#include <vector>

#include "gemm/plan.hpp"
#include "gemm/split_k.hpp"
#include "gemm/swapped_schedule.hpp"

using namespace weave::gemm;

namespace {

// Walks the kernel's loop and checks that every (item, K iteration) is computed exactly once,
// that whole rounds stay whole, that each split item has exactly `splits` segments with distinct
// split indices, and that the split items are numbered split-major.
void check_partition(int items, int iters, int workers, int splits) {
  const SplitK s = make_split_k(items, iters, workers, splits);
  SCOPED_TRACE(testing::Message() << items << " items x " << iters << " iters on " << workers << " workers, "
                                  << splits << " splits -> dp " << s.dp_items << ", splits " << s.splits);
  ASSERT_LE(s.dp_items, items);
  ASSERT_GE(s.splits, 1);
  ASSERT_LE(s.splits, iters > 0 ? iters : 1);
  if (s.dp_items < items) {
    ASSERT_EQ(s.dp_items % workers, 0);
    ASSERT_EQ(items - s.dp_items, items % workers);
  }
  std::vector<std::vector<int>> hits(items, std::vector<int>(iters, 0));
  std::vector<std::vector<int>> split_seen(items);
  int prev_split = -1;
  for (int w = 0; w < num_work(s); ++w) {
    const Segment g = segment(s, w);
    ASSERT_GE(g.item, 0);
    ASSERT_LT(g.item, items);
    ASSERT_GE(g.k_iters, 1);
    ASSERT_LE(g.k_begin + g.k_iters, iters);
    ASSERT_EQ(g.split >= 0, g.item >= s.dp_items);
    if (g.split < 0) {
      ASSERT_EQ(g.k_iters, iters);
    } else {
      ASSERT_GE(g.split, prev_split);  // split-major
      prev_split = g.split;
      split_seen[g.item].push_back(g.split);
    }
    for (int k = g.k_begin; k < g.k_begin + g.k_iters; ++k) ++hits[g.item][k];
  }
  for (int i = 0; i < items; ++i) {
    for (int k = 0; k < iters; ++k) ASSERT_EQ(hits[i][k], 1) << "item " << i << " iteration " << k;
    if (i >= s.dp_items && s.dp_items < items) {
      ASSERT_EQ(static_cast<int>(split_seen[i].size()), s.splits) << "item " << i;
      for (int j = 0; j < s.splits; ++j) ASSERT_EQ(split_seen[i][j], j) << "item " << i;
    }
  }
}

}  // namespace

TEST(SplitK, EveryIterationOnce) {
  for (int items : {1, 2, 3, 7, 43, 56, 112, 131, 132, 133, 200, 263, 264, 265, 1000, 4096})
    for (int iters : {1, 2, 3, 17, 64, 129})
      for (int workers : {1, 2, 7, 66, 132})
        for (int splits : {1, 2, 3, 5, 16}) check_partition(items, iters, workers, splits);
}

TEST(SplitK, OnlyThePartialRoundSplits) {
  EXPECT_EQ(make_split_k(264, 64, 132, 4).dp_items, 264);  // two whole rounds: nothing to split
  const SplitK s = make_split_k(300, 64, 132, 4);
  EXPECT_EQ(s.dp_items, 264);
  EXPECT_EQ(num_work(s), 264 + 36 * 4);
  EXPECT_EQ(make_split_k(1, 3, 132, 16).splits, 3);  // never more splits than iterations
  // Rounds: 43 decode tiles of 64 iterations on 132 workers: one round of 64 whole, or one round
  // of 22 with three splits.
  EXPECT_EQ(split_rounds(43, 64, 132, 1), 64);
  EXPECT_EQ(split_rounds(43, 64, 132, 3), 22);
  EXPECT_EQ(best_splits(43, 64, 132, 16, 3.0), 3);
  EXPECT_EQ(best_splits(264, 64, 132, 16, 3.0), 1);
}

namespace {
PlanInputs inputs(int M, int N, int K, bool aligned = true) {
  PlanInputs p;
  p.M = M, p.N = N, p.K = K, p.aligned = aligned, p.sm_count = 132, p.pair_clusters = 66, p.mid = true;
  return p;
}
}  // namespace

// The eight shapes the GEMM was tuned on keep the choice they were measured with (the 128x256
// tile, unsplit): the model must not move a tuned shape. Small tiles win only where the big ones
// cannot fill the machine (1024^3: 32 tiles of 128x256 on 132 SMs, with split-K forbidden).
TEST(GemmPlan, CoreShapesKeepTheirChoice) {
  const int core[][3] = {{4096, 2048, 4096},   {8192, 8192, 8192},   {16384, 16384, 16384}, {16384, 8192, 16384},
                         {32768, 16384, 4096}, {16384, 16384, 1024}, {16384, 16384, 2048},  {8192, 1024, 8192}};
  for (auto& s : core) {
    const Choice c = plan_gemm(inputs(s[0], s[1], s[2]));
    EXPECT_EQ(c.tile, Tile::M128N256) << s[0] << "x" << s[1] << "x" << s[2];
    EXPECT_EQ(c.splits, 1) << s[0] << "x" << s[1] << "x" << s[2];
  }
  PlanInputs small = inputs(1024, 1024, 1024);
  small.split_k = false;
  EXPECT_EQ(plan_gemm(small).tile, Tile::M128N128);
}

// Weight shapes (N, K) of the models' forward projections.
const int kPairs[][2] = {{14336, 4096}, {4096, 14336}, {28672, 8192}, {11008, 4096}};

// The swapped 128 x w tile over several token tiles (docs/perf-notes.md, 2026-12-04 and its second
// session): only above kSwappedWideMaxM tokens where they pad fewer token rows than 128-row tiles
// (288 tokens as 2 x 144 or 3 x 96, 520 as 3 x 176, 900 as 6 x 160), unsplit, and there only where
// the rounds model rates them faster. Each row's expectation is the tile that measured fastest (or
// within 3 % of it) on one H200 among those the planners old and new picked and the forced widths
// (five and six tiles of 96 lost on the last two rows). Never without swapped_tiles (the fp8 GEMM).
TEST(GemmPlan, SwappedTokenTilesWherePaddingFalls) {
  struct Row {
    int M, N, K;
    int width;  // 0: not the swapped tile
  };
  const Row rows[] = {{288, 14336, 4096, 144}, {320, 28672, 8192, 160},  {320, 14344, 4104, 160},
                      {288, 4096, 14336, 96},  {288, 5120, 13824, 96},   {264, 11008, 4096, 96},
                      {448, 11008, 4096, 160}, {320, 11008, 4096, 0},    {320, 5120, 13824, 112},
                      {480, 14336, 4096, 0},   {480, 28672, 8192, 0},    {352, 28672, 8192, 176},
                      {520, 11008, 4096, 176}, {900, 11008, 4096, 160},  {520, 13824, 5120, 0},
                      {450, 53248, 16384, 0}};
  for (const Row& r : rows) {
    PlanInputs in = inputs(r.M, r.N, r.K, pitch_aligned(r.K));
    in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = true;
    const Choice c = plan_gemm(in);
    const std::string name = std::to_string(r.M) + "x" + std::to_string(r.N) + "x" + std::to_string(r.K);
    EXPECT_EQ(c.tile == Tile::SwappedW, r.width > 0) << name;
    if (r.width > 0) {
      EXPECT_EQ(c.width, r.width) << name;
      EXPECT_EQ(c.splits, 1) << name;
      EXPECT_EQ(c.cluster, pitch_aligned(r.K) ? 1 : 2) << name;
    }
    in.swapped_tiles = false;
    EXPECT_NE(plan_gemm(in).tile, Tile::SwappedW) << name;
  }
  // Wherever the planner takes several token tiles, they pad fewer token rows than the 128-row
  // tiles, there are at most kSwappedMaxTokenTiles of them, and without swapped_splits they run
  // unsplit; at a multiple of 128 tokens (nothing to save) it never takes them.
  for (int M = 193; M <= 2000; M += 3) {
    for (const int* nk : {kPairs[0], kPairs[1], kPairs[2], kPairs[3]}) {
      PlanInputs in = inputs(M, nk[0], nk[1]);
      in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = true;
      const Choice c = plan_gemm(in);
      if (c.tile != Tile::SwappedW) continue;
      const int tiles = ceil_div(M, c.width);
      EXPECT_LT(tiles * c.width, 128 * ceil_div(M, 128)) << M << "x" << nk[0] << "x" << nk[1];
      EXPECT_LE(tiles, kSwappedMaxTokenTiles) << M;
      EXPECT_EQ(c.splits, 1) << M;
      EXPECT_NE(M % 128, 0) << M;
    }
  }
}

// Above 128 tokens with swapped_splits (the bf16 GEMM) the swapped tile splits K over one or more
// token tiles: on these rows the split choice measured 0.61-0.96 -> 0.89-1.06 of cuBLAS (old and new
// planner alternating on one H200, perf-notes 2026-12-04 third session; the 200-token rows on the
// width 208). Everywhere: at most kMaxSplitsSwappedPadded splits of at least kMinSplitItersSwapped
// iterations, and up to 128 tokens the choice without the flag.
TEST(GemmPlan, SwappedSplitsAbove128Tokens) {
  struct Row {
    int M, N, K, width, splits;
  };
  const Row rows[] = {{136, 5120, 13824, 144, 3}, {176, 7168, 18432, 176, 2}, {300, 4096, 14336, 160, 2},
                      {300, 4096, 11008, 160, 2}, {300, 18432, 7168, 160, 4}, {520, 13824, 5120, 176, 2},
                      {200, 5120, 13824, 208, 3}, {200, 8192, 28672, 208, 2}};
  for (const Row& r : rows) {
    PlanInputs in = inputs(r.M, r.N, r.K);
    in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = in.swapped256 = in.swapped_splits = true;
    const Choice c = plan_gemm(in);
    const std::string name = std::to_string(r.M) + "x" + std::to_string(r.N) + "x" + std::to_string(r.K);
    EXPECT_EQ(c.tile, Tile::SwappedW) << name;
    EXPECT_EQ(c.width, r.width) << name;
    EXPECT_EQ(c.splits, r.splits) << name;
  }
  for (const int* nk : {kPairs[0], kPairs[1], kPairs[2], kPairs[3]})
    for (int M = 17; M <= 1500; M += 7) {
      PlanInputs in = inputs(M, nk[0], nk[1]);
      in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = in.swapped256 = true;
      const Choice without = plan_gemm(in);
      in.swapped_splits = true;
      const Choice c = plan_gemm(in);
      if (M <= 128) {
        EXPECT_EQ(c.tile, without.tile) << M;
        EXPECT_EQ(c.splits, without.splits) << M;
      }
      if (c.tile != Tile::SwappedW || c.splits == 1) continue;
      EXPECT_LE(c.splits, plan_model::kMaxSplitsSwappedPadded) << M;
      EXPECT_GE(ceil_div(nk[1], 64) / c.splits, plan_model::kMinSplitItersSwapped) << M << "x" << nk[0] << "x" << nk[1];
    }
}

// The swapped 256 x w tile: only above kSwappedWideMaxM tokens, on aligned pitches, unsplit, with
// the flag (the fp8 GEMM has no such tile); on rows where it measured faster than the other tiles
// (1300 x 8192 x 28672: 0.86 -> 1.00 of cuBLAS; 1100 x 28672 x 8192: 0.93 -> 1.01; 2026-12-04
// second session) the planner takes it, and not where it lost by far (300 x 4096 x 14336: 0.41
// against 0.60; it still takes it on 3 of 156 measured rows where it lost > 3 %, 520 x 7168 x 18432
// 0.85 -> 0.78 the worst).
TEST(GemmPlan, Swapped256WhereItMeasuredFaster) {
  for (const int* nk : {kPairs[0], kPairs[1], kPairs[2], kPairs[3]})
    for (int M = 1; M <= 3000; M += 37) {
      PlanInputs in = inputs(M, nk[0], nk[1]);
      in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = in.swapped256 = true;
      const Choice c = plan_gemm(in);
      if (c.tile != Tile::SwappedW256) continue;
      EXPECT_GT(M, kSwappedWideMaxM);
      EXPECT_EQ(c.splits, 1) << M;
      EXPECT_TRUE(is_swapped256_width(c.width)) << M;
      in.aligned = false;
      EXPECT_NE(plan_gemm(in).tile, Tile::SwappedW256) << M;
      in.aligned = true, in.swapped256 = false;
      EXPECT_NE(plan_gemm(in).tile, Tile::SwappedW256) << M;
    }
  struct Row {
    int M, N, K;
    bool swapped256;
  };
  for (const Row& r : {Row{1300, 8192, 28672, true}, Row{1100, 28672, 8192, true}, Row{300, 4096, 14336, false},
                       Row{8000, 7168, 4096, false}}) {  // above kSwapped256MaxM: never measured there
    PlanInputs in = inputs(r.M, r.N, r.K);
    in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = in.swapped256 = true;
    EXPECT_EQ(plan_gemm(in).tile == Tile::SwappedW256, r.swapped256) << r.M << "x" << r.N << "x" << r.K;
  }
}

// The swapped 128 x w tile's widths 104-120 (the stages of 128, fewer padded token rows): one token
// tile of them (112 x 14336 x 4096: 0.95 -> 0.96-0.97 of cuBLAS) and three or more (300 x 5120 x
// 13824: 3 x 104, 0.82 -> 0.97; 400 x 4096 x 6144: 4 x 104, 0.78 -> 1.02), never two (216 x 28672 x
// 8192: 2 x 112 lost 8 %), and only the widths that are multiples of 16 in 2-CTA clusters (2026-12-04
// fourth session).
TEST(GemmPlan, SwappedMidWidths) {
  for (const int* nk : kPairs)
    for (int M = 97; M <= 1500; M += 3)
      for (bool aligned : {true, false}) {
        PlanInputs in = inputs(M, nk[0], nk[1] + (aligned ? 0 : 8), aligned);
        in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = in.swapped_splits = true;
        const Choice c = plan_gemm(in);
        if (c.tile != Tile::SwappedW) continue;
        const std::string name = std::to_string(M) + "x" + std::to_string(nk[0]) + "x" + std::to_string(nk[1]);
        EXPECT_TRUE(is_swapped_width(c.width)) << name;
        if (c.width > 96 && c.width < 128) EXPECT_NE(ceil_div(M, c.width), 2) << name;
        if (c.cluster == 2) EXPECT_TRUE(swapped_width_clusters(c.width)) << name;
      }
  struct Row {
    int M, N, K, width;
  };
  for (const Row& r : {Row{300, 5120, 13824, 104}, Row{400, 4096, 6144, 104}, Row{112, 14336, 4096, 112},
                       Row{450, 4096, 14336, 120}}) {
    PlanInputs in = inputs(r.M, r.N, r.K);
    in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = in.swapped_splits = true;
    const Choice c = plan_gemm(in);
    EXPECT_EQ(c.tile, Tile::SwappedW) << r.M << "x" << r.N << "x" << r.K;
    EXPECT_EQ(c.width, r.width) << r.M << "x" << r.N << "x" << r.K;
  }
  PlanInputs in = inputs(216, 28672, 8192);
  in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = in.swapped_splits = true;
  EXPECT_FALSE(plan_gemm(in).tile == Tile::SwappedW && plan_gemm(in).width == 112);
}

// The swapped 256 x w tile's narrow widths (96-120) only over one or two rounds of SMs, where they
// measured faster (900 x 7168 x 18432: 0.87 -> 0.99 of cuBLAS on 256 x 104; 1300 x 5120 x 13824: 0.88
// -> 0.99), not over more, where they lost (900 x 16384 x 53248: 5 rounds of 256 x 96, 0.83 against
// 0.94 on 256 x 160; 2026-12-04 fourth session).
TEST(GemmPlan, Swapped256NarrowOverFewRounds) {
  for (const int* nk : kPairs)
    for (int M = kSwappedWideMaxM + 1; M <= plan_model::kSwapped256MaxM; M += 23)
      for (int sms : {132, 114, 78}) {
        PlanInputs in = inputs(M, nk[0], nk[1]);
        in.sm_count = sms, in.pair_clusters = sms / 2;
        in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = in.swapped256 = true;
        const Choice c = plan_gemm(in);
        if (c.tile != Tile::SwappedW256 || c.width >= plan_model::kSwapped256NarrowWidth) continue;
        const int items = ceil_div(nk[0], 256) * ceil_div(M, c.width);
        EXPECT_LE(ceil_div(items, sms), plan_model::kSwapped256NarrowMaxRounds) << M << "x" << nk[0] << "x" << nk[1] << " on " << sms;
      }
  struct Row {
    int M, N, K, width;
  };
  for (const Row& r : {Row{900, 7168, 18432, 104}, Row{1300, 5120, 13824, 104}, Row{900, 16384, 53248, 160}}) {
    PlanInputs in = inputs(r.M, r.N, r.K);
    in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = in.swapped256 = true;
    const Choice c = plan_gemm(in);
    EXPECT_EQ(c.tile, Tile::SwappedW256) << r.M << "x" << r.N << "x" << r.K;
    EXPECT_EQ(c.width, r.width) << r.M << "x" << r.N << "x" << r.K;
  }
}

// The swapped tile's K order, for bf16 (2-byte elements, k16 multiplies) and fp8 (1 byte, k32):
// the 8 multiplies of a chunk cover its 256 bytes exactly once, a lane's 8 bytes of one multiply
// lie inside its 16-byte vector, and within a multiply every logical k of the mma layout is fed
// exactly once (by 4 lanes x 8 bytes).
TEST(SwappedSchedule, ChunkOrderIsAPermutation) {
  using namespace swapped;
  for (int bytes : {2, 1}) {
    SCOPED_TRACE(bytes == 2 ? "bf16" : "fp8");
    const int k_per_mma = 32 / bytes;
    std::vector<int> hits(kChunkBytes, 0);
    for (int q = 0; q < kMultiplies; ++q) {
      std::vector<int> logical(k_per_mma, 0);
      for (int c = 0; c < 4; ++c) {
        const int b0 = chunk_byte(c, q);
        EXPECT_EQ(b0 / 16, chunk_byte(c, q - q % 2) / 16) << "q " << q << " c " << c << ": not in the lane's vector";
        for (int e = 0; e < 8; ++e) {
          ASSERT_LT(b0 + e, kChunkBytes);
          ++hits[b0 + e];
          const int l = logical_k(c, e, bytes);
          ASSERT_GE(l, 0);
          ASSERT_LT(l, k_per_mma);
          if (bytes == 1 || e % 2 == 0) ++logical[l];  // a bf16 element is two bytes
        }
      }
      for (int l = 0; l < k_per_mma; ++l) EXPECT_EQ(logical[l], 1) << "q " << q << " logical k " << l;
    }
    for (int b = 0; b < kChunkBytes; ++b) EXPECT_EQ(hits[b], 1) << "byte " << b;
  }
  EXPECT_EQ(token_blocks(1), 1);
  EXPECT_EQ(token_blocks(8), 1);
  EXPECT_EQ(token_blocks(9), 2);
  EXPECT_EQ(token_blocks(kMaxTokens), 2);
  EXPECT_EQ(strips(4104), 257);
  EXPECT_EQ(chunks(8, 2), 1);
  EXPECT_EQ(chunks(4104, 2), 33);
  EXPECT_EQ(chunks(4112, 1), 17);
}

// Decode with W as N x K (M <= 16) takes the swapped tile; more tokens, or the tile not allowed
// (another layout), keep the tiled choice.
TEST(GemmPlan, DecodeTakesTheSwappedTile) {
  for (int M : {1, 7, 16})
    for (int N : {1024, 4096, 11008, 28672}) {
      PlanInputs in = inputs(M, N, 4096);
      in.swapped = true;
      const Choice c = plan_gemm(in);
      EXPECT_EQ(c.tile, Tile::Swapped) << M << "x" << N;
      EXPECT_EQ(c.splits, 1);
      EXPECT_EQ(c.workers, 132);
    }
  PlanInputs wide = inputs(swapped::kMaxTokens + 1, 11008, 4096);
  wide.swapped = true;
  EXPECT_NE(plan_gemm(wide).tile, Tile::Swapped);
  EXPECT_EQ(plan_gemm(inputs(1, 11008, 4096)).tile, Tile::M64N128);  // not allowed
}

// The swapped tile's launch configuration, relative to the SM count: one token block gives every
// SM at least 16 warps with the fewest per block (8 when the strips are very many), and more while
// a warp would run over more than kMaxChunksPerWarp chunks of a row; two token
// blocks run two chunks in flight per warp, two strips per block in the middle range with the
// fewest warps giving 19 units per SM (one strip at 8 warps below 3 strips per SM). Every
// configuration is one swapped_launch.cuh instantiates.
TEST(SwappedSchedule, Config) {
  using swapped::Config;
  auto eq = [](Config a, Config b) {
    return a.strips_per_block == b.strips_per_block && a.warps == b.warps && a.depth == b.depth;
  };
  for (int sms : {8, 78, 132, 144}) {
    for (int N : {8, 1024, 4096, 4104, 11008, 16384, 53248}) {
      const long long s = swapped::strips(N);
      for (int K : {4096, 16384, 53296}) {  // 32, 128 and 417 chunks
        const Config c = swapped::config(1, N, K, sms), short_k = swapped::config(1, N, 4096, sms);
        EXPECT_EQ(c.strips_per_block, 1);
        EXPECT_GE(c.warps, short_k.warps);
        EXPECT_TRUE(c.warps == 16 || swapped::chunks(K, 2) <= swapped::kMaxChunksPerWarp * c.warps) << N << "x" << K;
        EXPECT_TRUE(c.warps == short_k.warps || swapped::chunks(K, 2) > swapped::kMaxChunksPerWarp * c.warps / 2)
            << N << "x" << K << " on " << sms << ": not the fewest";
      }
      const Config c1 = swapped::config(1, N, 4096, sms);
      EXPECT_EQ(c1.strips_per_block, 1);
      EXPECT_EQ(c1.depth, 1);
      if (s < 12LL * sms) {
        EXPECT_TRUE(s * c1.warps >= 16LL * sms || c1.warps == 16) << N << " on " << sms;
        EXPECT_TRUE(c1.warps == 4 || s * c1.warps / 2 < 16LL * sms) << N << " on " << sms << ": not the fewest";
      } else {
        EXPECT_EQ(c1.warps, 8);
      }
      const Config c2 = swapped::config(16, N, 4096, sms);
      EXPECT_EQ(c2.depth, 2);
      EXPECT_TRUE(eq(c2, {1, 8, 2}) || eq(c2, {1, 16, 2}) || eq(c2, {2, 4, 2}) || eq(c2, {2, 8, 2}))
          << N << " on " << sms;
      // one strip per block below swapped::kOneStripBelow strips per SM, two from there to 8
      if (s >= sms && s < 8LL * sms)
        EXPECT_EQ(c2.strips_per_block, s < swapped::kOneStripBelow * sms ? 1 : 2) << N << " on " << sms;
      EXPECT_EQ(swapped::blocks(N, c2), ceil_div(N, 16 * c2.strips_per_block));
    }
  }
  // The sweep's choices on 132 SMs (docs/perf-notes.md, "swapped").
  EXPECT_TRUE(eq(swapped::config(1, 11008, 4096, 132), {1, 4, 1}));   // 688 strips
  EXPECT_TRUE(eq(swapped::config(1, 4096, 4096, 132), {1, 16, 1}));   // 256 strips
  EXPECT_TRUE(eq(swapped::config(1, 28672, 4096, 132), {1, 8, 1}));   // 1792 strips
  EXPECT_TRUE(eq(swapped::config(16, 28672, 4096, 132), {1, 8, 2}));
  EXPECT_TRUE(eq(swapped::config(16, 11008, 4096, 132), {2, 4, 2}));
  EXPECT_TRUE(eq(swapped::config(16, 7168, 4096, 132), {2, 8, 2}));
  EXPECT_TRUE(eq(swapped::config(9, 4096, 4096, 132), {1, 8, 2}));    // 256 strips
  EXPECT_TRUE(eq(swapped::config(16, 5120, 4096, 132), {1, 8, 2}));   // 320
  EXPECT_TRUE(eq(swapped::config(16, 6400, 4096, 132), {2, 8, 2}));   // 400
  EXPECT_TRUE(eq(swapped::config(16, 1024, 4096, 132), {1, 16, 2}));
  // Long rows: 416 chunks, 104 per warp on 4 warps (1024 strips), 52 on 8 (447 strips).
  EXPECT_TRUE(eq(swapped::config(1, 16384, 53248, 132), {1, 8, 1}));
  EXPECT_TRUE(eq(swapped::config(8, 16424, 53296, 132), {1, 8, 1}));
  EXPECT_TRUE(eq(swapped::config(1, 16384, 53248 * 2, 132), {1, 16, 1}));
  EXPECT_TRUE(eq(swapped::config(1, 7144, 53288, 132), {1, 8, 1}));
  EXPECT_TRUE(eq(swapped::config(1, 53248, 16384, 132), {1, 8, 1}));
  EXPECT_TRUE(eq(swapped::config(16, 16384, 53248, 132), swapped::config(16, 16384, 4096, 132)));
  // fp8, one token block: at most 8 chunks of a row per warp, and 12 warps per SM (the fp8 sweep's
  // best on these rows); two token blocks as bf16.
  EXPECT_TRUE(eq(swapped::config_fp8(1, 11008, 4096, 132), {1, 4, 1}));
  EXPECT_TRUE(eq(swapped::config_fp8(1, 28672, 8192, 132), {1, 4, 1}));
  EXPECT_TRUE(eq(swapped::config_fp8(1, 8192, 28672, 132), {1, 16, 1}));
  EXPECT_TRUE(eq(swapped::config_fp8(8, 16384, 53248, 132), {1, 16, 1}));
  EXPECT_TRUE(eq(swapped::config_fp8(1, 5120, 13824, 132), {1, 8, 1}));
  EXPECT_TRUE(eq(swapped::config_fp8(16, 11008, 4096, 132), swapped::config(16, 11008, 4096, 132)));
}

// Decode (M <= 64) splits K across the machine on the 64-row tile.
TEST(GemmPlan, DecodeSplitsK) {
  for (int M : {1, 16, 64}) {
    const Choice c = plan_gemm(inputs(M, 4096, 14336));
    EXPECT_EQ(c.tile, Tile::M64N128) << M;
    EXPECT_GT(c.splits, 1) << M;
    EXPECT_EQ(c.workers, 132) << M;
  }
  PlanInputs no = inputs(16, 4096, 14336);
  no.split_k = false;
  EXPECT_EQ(plan_gemm(no).splits, 1);
}

// Between decode and full waves the model reproduces the fastest (tile, split) measured in the
// sweeps of docs/perf-notes.md (2026-12-02c) on these rows: the 64-row tile up to M = 256 where
// 128-row tiles leave most SMs idle, 128x192 where its tile count fills the rounds better, and
// few splits (split rounds are slower than whole ones there).
TEST(GemmPlan, MidSizeRowsTakeTheMeasuredBest) {
  struct Row {
    int M, N, K;
    Tile tile;
    int splits;
  };
  const Row rows[] = {{128, 4096, 11008, Tile::M64N128, 2},  {128, 8192, 28672, Tile::M64N128, 1},
                      {256, 4096, 14336, Tile::M64N128, 1},  {128, 11008, 4096, Tile::M128N128, 1},
                      {256, 7168, 18432, Tile::M128N128, 1}, {256, 18432, 7168, Tile::M128N192, 2},
                      {512, 5120, 13824, Tile::M128N192, 1}, {512, 13824, 5120, Tile::M128N192, 4}};
  for (const Row& r : rows) {
    const Choice c = plan_gemm(inputs(r.M, r.N, r.K));
    EXPECT_EQ(c.tile, r.tile) << r.M << "x" << r.N << "x" << r.K;
    EXPECT_EQ(c.splits, r.splits) << r.M << "x" << r.N << "x" << r.K;
    EXPECT_LE(c.splits, plan_model::kMaxSplitsWide);
  }
  // Without the 128x192 instantiation (A K x M, fp32 output) the planner never names it.
  PlanInputs no_mid = inputs(512, 5120, 13824);
  no_mid.mid = false;
  EXPECT_NE(plan_gemm(no_mid).tile, Tile::M128N192);
}

// With the 128 x w tiles (B as N x K), the rows of the width sweep (docs/perf-notes.md,
// 2026-12-02g) take the width measured fastest (or one within noise of it), the rows where an
// older tile won keep it, and the eight core shapes keep 128x256 unsplit. 128 x 4096 x 4096 runs
// 64x128 unsplit: two splits of its 64 iterations are items below kMinSplitItemCost.
TEST(GemmPlan, WideTilesWhereTheSweepMeasuredThemBest) {
  struct Row {
    int M, N, K;
    Tile tile;
    int width, splits;
  };
  const Row rows[] = {{128, 11008, 4096, Tile::M128Nw, 96, 1},   {256, 14336, 4096, Tile::M128Nw, 112, 1},
                      {512, 13824, 5120, Tile::M128Nw, 144, 1},  {512, 5120, 13824, Tile::M128Nw, 160, 1},
                      {256, 18432, 7168, Tile::M128Nw, 144, 1},  {256, 7168, 18432, Tile::M128Nw, 112, 1},
                      {384, 14336, 4096, Tile::M128Nw, 112, 1},  {512, 28672, 8192, Tile::M128Nw, 176, 1},
                      {1024, 5120, 4096, Tile::M128Nw, 160, 1},  {256, 4096, 14336, Tile::M64N128, 0, 1},
                      {128, 8192, 28672, Tile::M64N128, 0, 1},   {128, 4096, 4096, Tile::M64N128, 0, 1},
                      {2048, 11008, 4096, Tile::M128N256, 0, 3}, {768, 18432, 7168, Tile::M128N256, 0, 3}};
  for (const Row& r : rows) {
    PlanInputs in = inputs(r.M, r.N, r.K);
    in.wide = true;
    const Choice c = plan_gemm(in);
    EXPECT_EQ(c.tile, r.tile) << r.M << "x" << r.N << "x" << r.K;
    EXPECT_EQ(c.width, r.width) << r.M << "x" << r.N << "x" << r.K;
    EXPECT_EQ(c.splits, r.splits) << r.M << "x" << r.N << "x" << r.K;
    in.wide = false;
    EXPECT_NE(plan_gemm(in).tile, Tile::M128Nw);
  }
  const int core[][3] = {{4096, 2048, 4096},   {8192, 8192, 8192},   {16384, 16384, 16384}, {16384, 8192, 16384},
                         {32768, 16384, 4096}, {16384, 16384, 1024}, {16384, 16384, 2048},  {8192, 1024, 8192}};
  for (auto& s : core) {
    PlanInputs in = inputs(s[0], s[1], s[2]);
    in.wide = true;
    EXPECT_EQ(plan_gemm(in).tile, Tile::M128N256) << s[0] << "x" << s[1] << "x" << s[2];
  }
  // Off the 128-byte grid they ran no better than 128x128: not offered there.
  PlanInputs ragged = inputs(77, 14344, 4104, false);
  ragged.wide = true;
  EXPECT_NE(plan_gemm(ragged).tile, Tile::M128Nw);
  for (int w : kWideWidths) EXPECT_LT(plan_model::wide_cost(w), 1.0) << w;
  EXPECT_GT(plan_model::wide_cost(100), 1.0);
}

// From plan_model::kWideManyRounds rounds of a 128 x w tile on, it costs what it was measured to
// (at 208 columns dearer per FLOP than 128x256, not cheaper), so many-round forward rows keep
// 128x256 where the rounding of its last round is a small share (one H100, perf-notes 2026-12-06
// sixth session: 10887 x 7168 x 28672 on 128 x 208 0.85 of cuBLAS, on 128x256 1.00). Few-round
// rows keep the fitted discount (the rows above).
// Above decode the only round splits only into items of at least kMinSplitItemCost: the rows whose
// two splits of 32-43 iterations measured slower than unsplit (one H100, 2026-12-06 ninth session)
// run unsplit, those where longer items or dearer iterations won keep their splits, and decode splits
// as before.
TEST(GemmPlan, ShortSplitItemsOfTheOnlyRound) {
  struct Row {
    int M, N, K;  // K in bf16 elements (an fp8 row: its K / 2)
    bool aligned;
    Tile tile;
    int splits;
  };
  const Row rows[] = {{128, 4096, 5504, true, Tile::M64N128, 1},    // bf16, 2 x 43 iterations: +12 %
                      {128, 4096, 11008, true, Tile::M64N128, 2},   // bf16, 2 x 86: -3 %
                      {76, 5120, 5504, true, Tile::M64N128, 1},     // sw128x96 2 x 43: +5 % (fp8 76 x 5120 x 11008)
                      {76, 5120, 11008, true, Tile::SwappedW, 2},   // bf16 sw128x96 2 x 86: -12 %
                      {74, 8248, 5568, false, Tile::SwappedW, 2}};  // fp8 74 x 8248 x 11024 sw128x96 2 x 44: -3 %
  for (const Row& r : rows) {
    PlanInputs in = inputs(r.M, r.N, r.K, r.aligned);
    in.wide = in.swapped = in.swapped_wide = in.swapped_tiles = true;
    in.pair_clusters = r.aligned ? in.pair_clusters : 0;  // fp8's rows: single CTAs
    const Choice c = plan_gemm(in);
    EXPECT_EQ(c.tile, r.tile) << r.M << "x" << r.N << "x" << r.K;
    EXPECT_EQ(c.splits, r.splits) << r.M << "x" << r.N << "x" << r.K;
  }
  // Decode keeps splitting short items (64 x 4096 x 5504: 64x128 in more than one split).
  EXPECT_GT(plan_gemm(inputs(64, 4096, 5504)).splits, 1);
}

TEST(GemmPlan, WideTilesAtTheirMeasuredCostOnManyRounds) {
  for (size_t i = 0; i < std::size(kWideWidths); ++i) {
    const int w = kWideWidths[i];
    EXPECT_GT(plan_model::wide_cost(w, plan_model::kWideManyRounds), plan_model::wide_cost(w, 1.0)) << w;
    EXPECT_GT(plan_model::wide_cost(w, plan_model::kWideManyRounds) / (w / 256.0), 1.0) << w;  // per FLOP
  }
  const int many[][3] = {{10887, 7168, 28672}, {4228, 18432, 7168}, {7486, 14336, 8192}, {16479, 11008, 8192}};
  for (const auto& s : many) {
    PlanInputs in = inputs(s[0], s[1], s[2]);
    in.wide = true;
    EXPECT_EQ(plan_gemm(in).tile, Tile::M128N256) << s[0] << "x" << s[1] << "x" << s[2];
  }
}

// A row pitch off the 128-byte grid moves the large shapes to a cluster tile, never to 128x128:
// 8192 x 28672 x 8200 to the 128x320 one (32 pair rows of 90 tiles: 44 rounds of 66 pairs against 55
// of 112, each of 1.25 times the FLOPs at 0.92 of the cost per FLOP); where its rounds are no fewer
// (4095 x 1000 x 8200: 64 items either way; 2047 x 5128 x 13832: 3 rounds either way) the 128x256
// one, and never on an aligned pitch.
TEST(GemmPlan, MisalignedPitchPrefersTheClusterTile) {
  const Choice c = plan_gemm(inputs(8192, 28672, 8200, false));
  EXPECT_EQ(c.tile, Tile::M128N320C2);
  PlanInputs no_pair = inputs(8192, 28672, 8200, false);
  no_pair.pair_clusters = 0;
  EXPECT_EQ(plan_gemm(no_pair).tile, Tile::M128N256);
  EXPECT_NE(plan_gemm(inputs(2047, 5128, 13832, false)).tile, Tile::M128N128);
  EXPECT_NE(plan_gemm(inputs(2047, 5128, 13832, false)).tile, Tile::M128N320C2);
  EXPECT_NE(plan_gemm(inputs(4095, 1000, 8200, false)).tile, Tile::M128N320C2);
  for (const auto& s : {std::array<int, 3>{8192, 28672, 8192}, {10048, 8192, 28672}, {16384, 53248, 8192}})
    EXPECT_NE(plan_gemm(inputs(s[0], s[1], s[2])).tile, Tile::M128N320C2) << s[0] << "x" << s[1];
  EXPECT_TRUE(pitch_aligned(8192));
  EXPECT_FALSE(pitch_aligned(8200));
  EXPECT_TRUE(pitch_aligned(8256));
}

// With the swapped 128 x w tiles allowed (forward rows, default epilogue), the rows of the A/B run
// (docs/perf-notes.md, 2026-12-03 sixth session: the old choice against the swapped widths on 56
// rows of 24-176 tokens) take what measured faster: the swapped tile of the narrowest width that
// holds the tokens (144 and 176 measured 0.96 and 0.92 of cuBLAS on 140 and 176 x 14336 x 4096
// against 0.94 and 0.88 for 160 and 192, 2026-12-04 second session), split at most twice (in 2-CTA
// clusters on a misaligned pitch, where a weight of few panels fills few clusters, up to 4 times:
// 109-114 tokens of 32-40 panels, 2026-12-06 tenth session); rows where the
// 128-row or 64-row tiles measured faster keep them (also 64 and 128 aligned tokens, which those
// tiles fill exactly: the models set's 64 x 53248 x 16384 and 128 x 28672 x 8192 ran 0.97-0.98 on
// the swapped tile against 1.01-1.02); above kSwappedWideMaxM tokens, or without
// the instantiation, the tile is never named; decode (M <= 16) keeps the mma.sync swapped tile
// but for a wide weight.
TEST(GemmPlan, SwappedWideWhereTheABMeasuredIt) {
  struct Row {
    int M, N, K;
    bool aligned;
    int width, splits, cluster;  // width 0: not the swapped 128 x w tile
  };
  const Row rows[] = {{80, 11008, 4096, true, 96, 1, 1},    {96, 28672, 8192, true, 96, 1, 1},
                      {80, 8192, 28672, true, 96, 2, 1},    {144, 14336, 4096, true, 144, 1, 1},
                      {160, 8192, 28672, true, 160, 2, 1},  {176, 14336, 4096, true, 176, 1, 1},
                      {40, 11008, 4096, true, 64, 1, 1},    {77, 14344, 4104, false, 96, 1, 2},
                      {48, 14344, 4104, false, 64, 1, 2},   {96, 28680, 8200, false, 96, 1, 2},
                      {112, 11008, 4096, true, 0, 0, 0},    {80, 4096, 14336, true, 0, 0, 0},
                      {176, 5120, 13824, true, 0, 0, 0},    {144, 5120, 13824, true, 0, 0, 0},
                      {256, 14336, 4096, true, 0, 0, 0},    {200, 4104, 11016, false, 0, 0, 0},
                      {64, 13824, 5120, true, 0, 0, 0},     {128, 28672, 8192, true, 0, 0, 0},
                      {109, 4040, 14352, false, 112, 4, 2}, {93, 5152, 28632, false, 96, 3, 2},
                      {114, 5064, 18416, false, 128, 3, 2}};
  for (const Row& r : rows) {
    PlanInputs in = inputs(r.M, r.N, r.K, r.aligned);
    in.wide = in.swapped = in.swapped_wide = true;
    const Choice c = plan_gemm(in);
    const std::string name = std::to_string(r.M) + "x" + std::to_string(r.N) + "x" + std::to_string(r.K);
    if (r.width == 0) {
      EXPECT_NE(c.tile, Tile::SwappedW) << name;
      continue;
    }
    EXPECT_EQ(c.tile, Tile::SwappedW) << name;
    EXPECT_EQ(c.width, r.width) << name;
    EXPECT_EQ(c.splits, r.splits) << name;
    EXPECT_EQ(c.cluster, r.cluster) << name;
    EXPECT_EQ(c.workers, r.cluster == 2 ? 66 : 132) << name;
    in.swapped_wide = false;
    EXPECT_NE(plan_gemm(in).tile, Tile::SwappedW) << name;
  }
  // No clusters to be had (odd communicator SMs): the single-CTA tile on a misaligned pitch.
  PlanInputs no_pair = inputs(77, 14344, 4104, false);
  no_pair.swapped_wide = true, no_pair.pair_clusters = 0;
  EXPECT_EQ(plan_gemm(no_pair).tile, Tile::SwappedW);
  EXPECT_EQ(plan_gemm(no_pair).cluster, 1);
  // Decode: the mma.sync swapped tile, except for a weight with at least sm_count / 3 panels
  // (aligned; 44 panels of 128 rows at the SM count inputs() gives), which takes the swapped 128 x 32
  // tile unsplit, at 1-8 tokens only with weight rows of at least kSwappedDecodeRowBytes (6 KB: K of
  // 3072 2-byte elements, as the planner counts K for fp8 too).
  for (int M : {1, 8, 9, 16})
    for (int N : {4096, 5504, 5512, 5632, 8192, 14336, 28672})
      for (int K : {2048, 3008, 3064, 3072, 4096, 8192}) {
        PlanInputs in = inputs(M, N, K);
        in.swapped = in.swapped_wide = true, in.aligned = K % 64 == 0;
        const std::string name = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
        const Choice c = plan_gemm(in);
        const bool wide = N >= 5512;  // 5504 = 43 panels; 5512 starts the 44th
        const bool rows = M > 8 || K >= 3072;
        EXPECT_EQ(c.tile, wide && rows && in.aligned ? Tile::SwappedW : Tile::Swapped) << name;
        EXPECT_EQ(c.splits, 1) << name;
        if (c.tile == Tile::SwappedW) EXPECT_EQ(c.width, 32) << name;
        in.aligned = false;
        EXPECT_EQ(plan_gemm(in).tile, Tile::Swapped) << name;
      }
  for (int M = 1; M <= 512; M += 7) {
    PlanInputs in = inputs(M, 14336, 4096);
    in.swapped = in.swapped_wide = true;
    const Choice c = plan_gemm(in);
    if (M <= swapped::kMaxTokens) EXPECT_EQ(c.tile, Tile::SwappedW) << M;  // 112 panels
    if (M > kSwappedWideMaxM) EXPECT_NE(c.tile, Tile::SwappedW) << M;
    if (c.tile == Tile::SwappedW) EXPECT_EQ(c.width, swapped_width(M)) << M;
  }
  const int core[][3] = {{4096, 2048, 4096},   {8192, 8192, 8192},   {16384, 16384, 16384}, {16384, 8192, 16384},
                         {32768, 16384, 4096}, {16384, 16384, 1024}, {16384, 16384, 2048},  {8192, 1024, 8192}};
  for (auto& s : core) {
    PlanInputs in = inputs(s[0], s[1], s[2]);
    in.wide = in.swapped_wide = true;
    EXPECT_EQ(plan_gemm(in).tile, Tile::M128N256) << s[0] << "x" << s[1] << "x" << s[2];
  }
  EXPECT_EQ(swapped_width(17), 32);
  EXPECT_EQ(swapped_width(97), 104);
  EXPECT_EQ(swapped_width(97, true), 112);  // 2-CTA clusters: widths that are multiples of 16
  EXPECT_EQ(swapped_width(113, true), 128);
  EXPECT_EQ(swapped_width(128, true), 128);
  EXPECT_EQ(swapped_width(192), 192);
  EXPECT_EQ(swapped_width(193), 208);
  EXPECT_EQ(swapped_width(209), 0);
}
