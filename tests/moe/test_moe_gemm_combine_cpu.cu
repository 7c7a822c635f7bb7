// The fused gemm_combine's index functions (kernels/moe/gemm_combine_schedule.hpp) on the CPU:
// - stage_offset against an independent model of the staging tile (64-column blocks of 128 rows x
//   128 B, the 16-byte chunk index XOR the row mod 8), every (row, lane) a distinct chunk;
// - aux_rows / aux_row: the two aux warps take every row of a tile exactly once; push_col: the
//   lanes cover a column tile's 256 columns exactly once;
// - landing_row: in-range metadata maps to token * k + slot, anything else to -1;
// - the whole push of a call, simulated: for W = 2..8 and random and adversarial routings (skewed,
//   all to one expert, a token's experts all on one rank, repeated ids, T = 0 on a rank, T not a
//   multiple of 128, ragged H), each rank's receiver metadata built from layout.hpp's
//   plan_dispatch, each rank's grouped GEMM tiles walked in the kernel's order (grouped_tile), each
//   tile's rows and lanes sent where the kernel sends them: every element of every home rank's
//   landing rows [0, T k) x [0, H) written exactly once, and nothing outside them;
// - the final sum's expected count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "check/seed.hpp"
#include "moe/gemm_combine_schedule.hpp"
#include "moe/grouped_gemm_schedule.hpp"
#include "moe/layout.hpp"

using namespace weave;
using namespace weave::moe;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 g(check::derive(check::test_seed(), 0x6c6d));
  return g;
}

TEST(GemmCombineSchedule, StageOffsetIsTheSwizzledTile) {
  std::vector<int> seen(kGroupedBM * kGroupedBN * 2 / 16, 0);
  for (int r = 0; r < kGroupedBM; ++r)
    for (int lane = 0; lane < 32; ++lane) {
      const uint32_t block = lane / 8, chunk = lane % 8;
      const uint32_t want = block * kGroupedBM * 128 + r * 128 + ((chunk ^ (r % 8)) * 16);
      ASSERT_EQ(stage_offset(r, lane), want) << "row " << r << " lane " << lane;
      ASSERT_EQ(stage_offset(r, lane) % 16, 0u);
      ++seen[stage_offset(r, lane) / 16];
    }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "chunk " << i;
}

TEST(GemmCombineSchedule, AuxWarpsTakeEveryRowOnce) {
  for (int rows = 0; rows <= kGroupedBM; ++rows) {
    std::vector<int> seen(kGroupedBM, 0);
    for (int warp = 0; warp < kAuxWarps; ++warp) {
      ASSERT_LE(aux_rows(rows, warp), 64) << "a lane holds two rows' pointers: at most 64 per warp";
      for (int i = 0; i < aux_rows(rows, warp); ++i) {
        const int r = aux_row(warp, i);
        ASSERT_GE(r, 0);
        ASSERT_LT(r, rows) << "rows " << rows << " warp " << warp << " i " << i;
        ++seen[r];
      }
    }
    for (int r = 0; r < rows; ++r) ASSERT_EQ(seen[r], 1) << "rows " << rows << " row " << r;
  }
}

TEST(GemmCombineSchedule, LanesCoverAColumnTileOnce) {
  for (int n = 0; n < 4; ++n) {
    std::vector<int> seen(kGroupedBN, 0);
    for (int lane = 0; lane < 32; ++lane) {
      const int c = push_col(n, lane);
      ASSERT_EQ(c % 8, 0);
      for (int q = 0; q < 8; ++q) ++seen[c + q - n * kGroupedBN];
      // The lane's staging chunk holds these columns: block c / 64 of the tile, bytes (c % 64) * 2.
      ASSERT_EQ(static_cast<int>(stage_offset(0, lane)), ((c - n * kGroupedBN) / 64) * kGroupedBM * 128 + (c % 64) * 2);
    }
    for (int c = 0; c < kGroupedBN; ++c) ASSERT_EQ(seen[c], 1);
  }
}

TEST(GemmCombineSchedule, LandingRowChecksTheMetadata) {
  const int W = 4, k = 3, maxT = 10;
  EXPECT_EQ(landing_row(RowMeta{2, 7, 0, 1}, W, k, maxT), 7 * 3 + 1);
  EXPECT_EQ(landing_row(RowMeta{0, 0, 0, 0}, W, k, maxT), 0);
  EXPECT_EQ(landing_row(RowMeta{3, 9, 0, 2}, W, k, maxT), 9 * 3 + 2);
  EXPECT_EQ(landing_row(RowMeta{-1, 0, 0, 0}, W, k, maxT), -1);
  EXPECT_EQ(landing_row(RowMeta{4, 0, 0, 0}, W, k, maxT), -1);
  EXPECT_EQ(landing_row(RowMeta{0, 10, 0, 0}, W, k, maxT), -1);
  EXPECT_EQ(landing_row(RowMeta{0, -1, 0, 0}, W, k, maxT), -1);
  EXPECT_EQ(landing_row(RowMeta{0, 0, 0, 3}, W, k, maxT), -1);
  EXPECT_EQ(landing_row(RowMeta{0, 0, 0, -1}, W, k, maxT), -1);
  // 0xffff... poison reads as -1 everywhere.
  EXPECT_EQ(landing_row(RowMeta{-1, -1, -1, -1}, W, k, maxT), -1);
}

TEST(GemmCombineSchedule, ExpectedSignals) {
  EXPECT_EQ(landed_per_round(2, 132), 264ull);
  EXPECT_EQ(landed_per_round(8, 132), 1056ull);
  EXPECT_EQ(landed_per_round(1, 1), 1ull);
}

enum class Kind { random, skewed, all_to_one, same_rank, repeated };

std::vector<int> route(Kind kind, const Geometry& g, int T, int k, std::mt19937_64& r) {
  const int E = g.experts, L = g.local_experts();
  std::vector<int> idx(static_cast<size_t>(T) * k);
  auto distinct = [&](int limit, int kk, int* out, bool skew) {
    for (int j = 0; j < kk; ++j) {
      int e;
      do {
        e = skew ? static_cast<int>(std::min<uint64_t>(r() % limit, r() % limit)) : static_cast<int>(r() % limit);
      } while (std::find(out, out + j, e) != out + j);
      out[j] = e;
    }
  };
  for (int t = 0; t < T; ++t) {
    int* row = idx.data() + static_cast<size_t>(t) * k;
    switch (kind) {
      case Kind::random:
        distinct(E, std::min(k, E), row, false);
        for (int j = std::min(k, E); j < k; ++j) row[j] = row[0];
        break;
      case Kind::skewed:
        distinct(E, std::min(k, E), row, true);
        for (int j = std::min(k, E); j < k; ++j) row[j] = row[0];
        break;
      case Kind::all_to_one:
        for (int j = 0; j < k; ++j) row[j] = j == 0 ? 0 : static_cast<int>(1 + r() % (E - 1));
        break;
      case Kind::same_rank: {
        const int d = static_cast<int>(r() % g.world);
        for (int j = 0; j < k; ++j) row[j] = g.expert(d, static_cast<int>(r() % L));
        break;
      }
      case Kind::repeated:
        for (int j = 0; j < k; ++j) row[j] = static_cast<int>(r() % E);
        break;
    }
  }
  return idx;
}

// One call's push, simulated: returns a failure message or "".
std::string simulate(int W, int L, int k, int H, const std::vector<int>& T, Kind kind, std::mt19937_64& r) {
  const Geometry g{W, W * L};
  const int E = g.experts;
  std::vector<std::vector<int>> idx(W);
  std::vector<int> counts(static_cast<size_t>(W) * E);
  int maxT = 1;
  for (int s = 0; s < W; ++s) {
    idx[s] = route(kind, g, T[s], k, r);
    count_rows(idx[s].data(), T[s], k, g, counts.data() + static_cast<size_t>(s) * E);
    maxT = std::max(maxT, T[s]);
  }
  // Receiver metadata of every rank, as the dispatch writes it (push_rows: {src, token, primary, slot}).
  std::vector<std::vector<RowMeta>> meta(W);
  for (int d = 0; d < W; ++d) meta[d].assign(rank_rows(counts.data(), g, d), RowMeta{-1, -1, -1, -1});
  for (int s = 0; s < W; ++s) {
    const DispatchPlan p = plan_dispatch(idx[s].data(), T[s], k, g, s, counts);
    for (int t = 0; t < T[s]; ++t)
      for (int j = 0; j < k; ++j) {
        const size_t i = static_cast<size_t>(t) * k + j;
        const int d = g.rank_of(idx[s][i]);
        meta[d][p.row[i]] = RowMeta{s, t, p.row[static_cast<size_t>(t) * k + p.primary[i]], j};
      }
  }
  // Coverage of every home rank's landing elements, in 8-column chunks.
  const int chunks = H / 8;
  std::vector<std::vector<int>> hits(W);
  for (int s = 0; s < W; ++s) hits[s].assign(static_cast<size_t>(maxT) * k * chunks, 0);
  const int tiles_n = (H + kGroupedBN - 1) / kGroupedBN;
  for (int d = 0; d < W; ++d) {
    std::vector<int> c(L), tb(L + 1), rb(L + 1);
    for (int l = 0; l < L; ++l) c[l] = expert_rows(counts.data(), g, g.expert(d, l));
    const int cap = std::max(1, rank_rows(counts.data(), g, d));
    if (build_prefix(c.data(), L, cap, tb.data(), rb.data()) >= 0) return "the prefix refused valid counts";
    for (int w = 0; w < tb[L] * tiles_n; ++w) {
      const GroupedTile t = grouped_tile(w, tb.data(), rb.data(), L, tiles_n, 16);
      for (int warp = 0; warp < kAuxWarps; ++warp)
        for (int i = 0; i < aux_rows(t.rows, warp); ++i) {
          const RowMeta& m = meta[d][t.row0 + aux_row(warp, i)];
          const long long row = landing_row(m, W, k, maxT);
          if (row < 0) return "rank " + std::to_string(d) + " row " + std::to_string(t.row0 + aux_row(warp, i)) +
                              ": metadata out of range";
          if (m.token >= T[m.src]) return "a landing row past the home rank's tokens";
          for (int lane = 0; lane < 32; ++lane) {
            const int col = push_col(t.n, lane);
            if (col < H) ++hits[m.src][static_cast<size_t>(row) * chunks + col / 8];
          }
        }
    }
  }
  for (int s = 0; s < W; ++s)
    for (size_t i = 0; i < hits[s].size(); ++i) {
      const bool inside = i < static_cast<size_t>(T[s]) * k * chunks;
      if (hits[s][i] != (inside ? 1 : 0))
        return "home " + std::to_string(s) + " token " + std::to_string(i / chunks / k) + " slot " +
               std::to_string(i / chunks % k) + " columns " + std::to_string(i % chunks * 8) + ": written " +
               std::to_string(hits[s][i]) + " times";
    }
  return "";
}

TEST(GemmCombineSchedule, EveryLandingElementWrittenOnce) {
  auto& r = rng();
  const Kind kinds[] = {Kind::random, Kind::skewed, Kind::all_to_one, Kind::same_rank, Kind::repeated};
  const int ks[] = {1, 2, 4, 8};
  const int Hs[] = {8, 200, 256, 264, 776};
  int cases = 0;
  for (int W = 2; W <= 8; ++W)
    for (Kind kind : kinds)
      for (int k : ks) {
        const int L = 1 + static_cast<int>(r() % 4);
        const int H = Hs[r() % 5];
        std::vector<int> T(W);
        for (int s = 0; s < W; ++s) T[s] = static_cast<int>(r() % 300);
        T[r() % W] = 0;  // a rank with no tokens
        if (W > 2) T[(r() % (W - 1)) + 1] = 129;
        const std::string why = simulate(W, L, k, H, T, kind, r);
        ASSERT_TRUE(why.empty()) << "W " << W << " L " << L << " k " << k << " H " << H << " kind "
                                 << static_cast<int>(kind) << ": " << why;
        ++cases;
      }
  EXPECT_EQ(cases, 7 * 5 * 4);
}

}  // namespace
