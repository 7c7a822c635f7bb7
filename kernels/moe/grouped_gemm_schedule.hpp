// The grouped GEMM's work order as pure functions of the per-expert row counts (CPU-tested in
// tests/moe/test_grouped_gemm_cpu.cpp; the kernel runs the same code on a prefix table it builds
// in shared memory at block start).
//
// Expert e owns rows [row_begin[e], row_begin[e] + cnt[e]) of the grouped buffer (the receiver
// layout of layout.hpp: experts in order, no padding) and ceil(cnt[e] / 128) tile rows of
// ceil(N / 256) tiles each. Work items run expert after expert; inside an expert the tiles follow
// gemm::grouped_tile (tile rows first, in groups of group_m), so the blocks running at the same
// time share W[e]'s column panels in L2. A tile row never spans two experts: the last tile row of
// an expert is cut at the expert's end (`rows` < 128), and the storer writes only those rows.
#pragma once
#include "gemm/plan.hpp"       // split_choice
#include "gemm/scheduler.hpp"  // __host__ __device__: include from .cu files only
#include "gemm/split_k.hpp"
#include "weave/common/host_device.hpp"

namespace weave::moe {

constexpr int kGroupedBM = 128, kGroupedBN = 256, kGroupedBK = 64;
// The per-block prefix table holds E + 1 entries of two arrays (8 KB of shared memory at 1024).
constexpr int kMaxGroupedExperts = 1024;

// K steps of a tile: the `iters` grouped_split is given. In int (gemm::ceil_div divides in 64 bits,
// which moved the split kernel's register allocation).
WEAVE_HD inline int grouped_k_steps(int K) { return (K + kGroupedBK - 1) / kGroupedBK; }

WEAVE_HD inline int tile_rows_of(int cnt) { return (cnt + kGroupedBM - 1) / kGroupedBM; }

// What the host can know without reading the counts: the most tile rows any counts summing to
// at most `capacity` rows can make (each non-empty expert adds at most one partial tile row, and
// every tile row holds at least one row). Sizes the grid; the device runs the real count.
// sum_e ceil(c_e / 128) <= floor(sum_e c_e / 128) + (non-empty experts).
inline long long max_work(int capacity, int experts, int tiles_n) {
  const long long rows = capacity / kGroupedBM + (experts < capacity ? experts : capacity);
  return rows * tiles_n;
}

// Why a launch did nothing: the first expert (in layout order) that breaks the counts' contract.
// kGroupedStrideOverflow: fixed-stride layout only (row_stride > 0), an expert's count above the
// stride.
enum GroupedError : int { kGroupedOk = 0, kGroupedOverflow = 1, kGroupedNegativeCount = 2, kGroupedStrideOverflow = 3 };

// Exclusive prefixes of tile rows (tile_begin) and rows (row_begin), E + 1 entries each, and the
// first bad expert: a negative count, or the first whose rows end past `capacity`. Returns that
// expert or -1 (with *why set). The kernel's warp scan computes the same table.
WEAVE_HD inline int build_prefix(const int* counts, int experts, int capacity, int* tile_begin, int* row_begin,
                                     int* why = nullptr) {
  long long rows = 0;
  int tiles = 0, bad = -1, reason = kGroupedOk;
  for (int e = 0; e < experts; ++e) {
    tile_begin[e] = tiles;
    row_begin[e] = static_cast<int>(rows < capacity ? rows : capacity);
    const int c = counts[e];
    if (bad < 0 && c < 0) bad = e, reason = kGroupedNegativeCount;
    if (c > 0) {
      rows += c;
      tiles += tile_rows_of(c);
    }
    if (bad < 0 && rows > capacity) bad = e, reason = kGroupedOverflow;
  }
  tile_begin[experts] = tiles;
  row_begin[experts] = static_cast<int>(rows < capacity ? rows : capacity);
  if (why) *why = reason;
  return bad;
}

// The expert of work item w: the last e in [0, E) with tile_begin[e] * tiles_n <= w (empty
// experts share their successor's tile_begin and are skipped by taking the last such e).
WEAVE_HD inline int expert_of(int w, const int* tile_begin, int experts, int tiles_n) {
  const int q = w / tiles_n;  // tile_begin[e] * tiles_n <= w  <=>  tile_begin[e] <= floor(w / tiles_n)
  int lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_begin[mid] <= q) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct GroupedTile {
  int expert;
  int m;     // tile row inside the expert
  int n;     // tile column
  int row0;  // first row in the grouped buffer
  int rows;  // rows of this tile that belong to the expert (1..128)
};

// Needs a table without a bad expert (build_prefix returned -1): then row_begin[e + 1] - row_begin[e]
// is expert e's count.
WEAVE_HD inline GroupedTile grouped_tile(int w, const int* tile_begin, const int* row_begin, int experts,
                                             int tiles_n, int group_m) {
  const int e = expert_of(w, tile_begin, experts, tiles_n);
  const int tiles_m = tile_begin[e + 1] - tile_begin[e];
  const gemm::TileCoord t = gemm::grouped_tile(w - tile_begin[e] * tiles_n, tiles_m, tiles_n, group_m);
  const int left = row_begin[e + 1] - row_begin[e] - t.m * kGroupedBM;
  return {e, t.m, t.n, row_begin[e] + t.m * kGroupedBM, left < kGroupedBM ? left : kGroupedBM};
}

// The split of the last partial round (gemm/split_k.hpp's items: whole rounds first, then each
// remaining tile cut into `splits` K ranges whose fp32 partials meet in a workspace), chosen on the
// device once the counts give the tile count, for `workers` compute blocks:
// - forced > 1: that many ways (at most `iters`);
// - forced == 0: the dense GEMM's model (gemm::split_choice: a partial's exchange kSplitCost
//   iterations, >= 5 % gain) with split rounds as fast as whole ones (kGroupedSplitSlowdown), at
//   most kMaxSplitsWide splits and no more split items than workers, so that one workspace slot
//   pair per worker holds them (grouped_split_slots);
// - forced == 1, or no workspace: none.
// The dense GEMM's 1.5 left the Mixtral T 4096 Dirichlet down row (1104 tiles of 224 K steps, a
// last round of 48 on an H100's SMs) unsplit, and 2 ways ran it 4.1-7.5 % faster there (two runs),
// about the 5.6 % that a split round as fast as a whole one predicts (docs/perf-notes.md,
// 2026-12-06 third session).
inline constexpr double kGroupedSplitSlowdown = 1.0;

WEAVE_HD inline gemm::SplitK grouped_split(int items, int iters, int workers, int forced, bool workspace) {
  int s = 1;
  const int tail = workers > 0 && items > 0 ? items % workers : 0;
  if (workspace && tail > 0) {
    if (forced > 1) {
      s = forced;
    } else if (forced == 0) {
      const int bound = workers / tail < gemm::plan_model::kMaxSplitsWide ? workers / tail
                                                                          : gemm::plan_model::kMaxSplitsWide;
      if (bound >= 2)
        s = gemm::split_choice(items, iters, workers, false, 1.0, true, bound, kGroupedSplitSlowdown).splits;
    }
  }
  return gemm::make_split_k(items, iters, workers, s);
}

// Workspace slots per worker that grouped_split's items may use (two per slot: one per consumer
// half): the forced split's count, else one.
inline int grouped_split_slots(int forced) { return forced > 1 ? forced : 1; }

// ---------------------------------------------------------------------------------------------
// Fixed-stride layout (GroupedGemmOptions::row_stride = S > 0; the low-latency dispatch's
// receive buffer, low_latency.hpp): expert e's rows are [e S, e S + cnt[e]), rows between one
// expert's last row and the next expert's first are gaps, never read for a kept output and never
// written. The tile order is the packed layout's (tile_begin as above, expert after expert); only
// where a tile's rows start and how many it keeps differ.

// Tile-row prefix (tile_begin, E + 1 entries) and the clamped counts (count_out[e] in [0, S]), and
// the first bad expert: a negative count, or a count above S (kGroupedStrideOverflow). Returns
// that expert or -1 (with *why set). The host guarantees E S <= R_cap (validate_row_stride), so
// no expert's rows can end past the capacity.
WEAVE_HD inline int build_prefix_strided(const int* counts, int experts, int row_stride, int* tile_begin,
                                         int* count_out, int* why = nullptr) {
  int tiles = 0, bad = -1, reason = kGroupedOk;
  for (int e = 0; e < experts; ++e) {
    tile_begin[e] = tiles;
    const int c = counts[e];
    if (bad < 0 && c < 0) bad = e, reason = kGroupedNegativeCount;
    if (bad < 0 && c > row_stride) bad = e, reason = kGroupedStrideOverflow;
    count_out[e] = c < 0 ? 0 : (c > row_stride ? row_stride : c);
    if (c > 0) tiles += tile_rows_of(count_out[e]);
  }
  tile_begin[experts] = tiles;
  if (why) *why = reason;
  return bad;
}

// Work item w of the fixed-stride layout; needs a table without a bad expert. cnt: the counts
// (build_prefix_strided's count_out).
WEAVE_HD inline GroupedTile grouped_tile_strided(int w, const int* tile_begin, const int* cnt, int experts,
                                                 int tiles_n, int group_m, int row_stride) {
  const int e = expert_of(w, tile_begin, experts, tiles_n);
  const int tiles_m = tile_begin[e + 1] - tile_begin[e];
  const gemm::TileCoord t = gemm::grouped_tile(w - tile_begin[e] * tiles_n, tiles_m, tiles_n, group_m);
  const int left = cnt[e] - t.m * kGroupedBM;
  return {e, t.m, t.n, e * row_stride + t.m * kGroupedBM, left < kGroupedBM ? left : kGroupedBM};
}

}  // namespace weave::moe
