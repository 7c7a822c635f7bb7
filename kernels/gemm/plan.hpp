// The GEMM's launch choice (tile, split-K) as a pure function of the shape and the device, from a
// cost model in units of one 128x256x64 tile iteration on one SM (CPU-tested; the constants are
// measured, see kernels/gemm/README.md "Tile choice" and docs/perf-notes.md).
//
// What the model captures:
// - rounds: a persistent grid of P workers runs ceil(items / P) rounds of whole items; split-K
//   cuts the items of the last partial round into K ranges (split_k.hpp), plus the partial-sum
//   exchange (kSplitCost); above decode sizes split rounds run slower than whole ones
//   (kSplitSlowdown) and more than kMaxSplitsWide splits never paid;
// - wave quantisation: the 128x192 tile (kMidCost), the 128 x w tiles (wide_cost) and, up to
//   M = 256, the 64x128 tile (kNarrowCost) give other tile counts per round than 128x256;
// - the 128x128 tile moves twice the operand bytes per FLOP (kSmallCost per iteration of half the
//   FLOPs);
// - a row pitch that is not a multiple of 128 bytes makes every 128-byte TMA row read touch five
//   32-byte sectors instead of four, and the large tiles run near the L2 -> SM bandwidth, so they
//   slow down; the 2-CTA cluster tile, which multicasts B into both CTAs (a third less L2 traffic
//   per FLOP), hardly does (kMisaligned*), and the 128x320 one, a tenth fewer again, less
//   (kMisalignedWidePair).
#pragma once

#include <algorithm>
#include <iterator>

#include "gemm/gemm.hpp"
#include "gemm/scheduler.hpp"
#include "gemm/split_k.hpp"
#include "gemm/swapped_schedule.hpp"
#include "gemm/swapped_wide.hpp"

namespace weave::gemm {

struct PlanInputs {
  int M = 0, N = 0, K = 0;
  bool aligned = true;     // every operand's row pitch is a multiple of 128 bytes
  int sm_count = 0;        // compute SMs (without communicator SMs)
  int pair_clusters = 0;   // 2-CTA clusters the device holds at once (0: the cluster tile is not allowed)
  bool wide_pair = true;   // with pair_clusters: the 128x320 cluster tile too (fp8 has none)
  bool swapped_pairs = true;  // with pair_clusters: the swapped 128 x w tiles in clusters (fp8: single CTAs)
  bool split_k = true;     // split-K allowed
  bool mid = false;        // the 128x192 tile allowed (A M x K, bf16 output)
  bool wide = false;       // the 128 x w tiles allowed (A M x K, B N x K, bf16 output)
  bool narrow = true;      // the 64x128 tile allowed
  bool swapped = false;    // the swapped decode tile allowed (A M x K, B N x K, no communicator SMs)
  bool swapped_wide = false;  // the swapped 128 x w tiles allowed (A M x K, a bf16 output, no bias)
  bool swapped_tiles = false;  // ... also over several token tiles (up to kSwappedMaxTokenTiles)
  bool swapped256 = false;     // the swapped 256 x w tiles allowed (as swapped_wide, aligned pitches)
  bool swapped_splits = false;  // above 128 tokens the swapped 128 x w tile splits as kMaxSplitsSwappedPadded
                                // says (measured on bf16; fp8 lost with the rule's first form, 0.91 -> 0.88
                                // of cuBLASLt, and the final form was not measured on it)
};

struct Choice {
  Tile tile = Tile::M128N256;
  int splits = 1;   // K ranges of each item of the last partial round (1: none)
  int workers = 0;  // the workers the choice was made for (compute blocks, or clusters)
  double cost = 0;  // model units (for tests and the bench's log)
  int width = 0;    // Tile::M128Nw, SwappedW: its width
  int cluster = 1;  // Tile::SwappedW: CTAs per cluster (2: the token tile multicast)
};

// The most token tiles the planner runs the swapped 128 x w tile over (above kSwappedWideMaxM
// tokens): 7 x 208 = 1456 tokens. Eight would never pass its padding rule (8 w is a multiple of 128,
// so it pads no fewer rows than the 128-row tiles); above, the 128-row tiles pad at most 8 % of their
// rows, and the swapped tile was measured up to 1100 tokens (docs/perf-notes.md).
inline constexpr int kSwappedMaxTokenTiles = 7;

namespace plan_model {
// Fitted (docs/perf-notes.md, 2026-12-02c) to every tile and split on the 22 rows of the models
// set below 0.95 (two sweeps on one H200), with the rule that no other row's choice moves.
inline constexpr double kSmallCost = 0.55;        // 128x128 iteration vs 128x256 (0.5 of the FLOPs)
inline constexpr double kMidCost = 0.75;          // 128x192 iteration vs 128x256 (0.75 of the FLOPs)
inline constexpr double kSplitCost = 8.0;         // write, count and read back one fp32 partial
inline constexpr double kSplitSlowdown = 1.5;     // M > 64: split rounds run this much slower (shorter
                                                  // items refill the pipeline; K slices thin L2 reuse)
inline constexpr int kMaxSplits = 16;             // decode (M <= 64)
inline constexpr int kMaxSplitsWide = 4;          // M > 64: more was never faster in the sweeps
inline constexpr double kDecodeCost = 0.5;        // 64x128 iteration vs 128x256, memory-bound (M <= 64)
inline constexpr int kNarrowMaxM = 256;           // the 64x128 tile also competes up to this M
inline constexpr double kNarrowCost = 0.35;       // ... at this cost (B panels shared by 2-4 tile rows in L2)
inline constexpr double kMisalignedBig = 1.30;    // 8192x28672x8200 nk: 0.766 of cuBLAS vs 1.03 aligned
inline constexpr double kMisalignedSmall = 1.80;  // the same shapes on 128x128: 0.51-0.55
inline constexpr double kMisalignedMid = 1.60;    // 128x192 on the ragged rows: 0.46-0.67
inline constexpr double kMisalignedPair = 1.03;   // 128x256 clusters: 0.977
// The 128x320 cluster tile on a misaligned pitch, per 128x256 iteration's FLOPs: there the tiles are
// bound by L2 read requests (ncu, 2026-12-06 seventh session: 62-64 per cycle for both weave's
// 128x256 clusters and cuBLAS's 128x304 ones), and each CTA of the pair requests 288 rows per
// 128 x 320 x 64 step against 256 per 128 x 256 x 64: 0.9 of the requests per FLOP. Unsplit only. On 28
// misaligned rows (one H100, both tiles forced unsplit) 0.92 moved 18, 1.078x faster in geomean (0.98-1.18);
// 0.95 moved 11, leaving out five that gained 2-17 % and two that lost 2 %.
inline constexpr double kMisalignedWidePair = 0.92;
inline constexpr double kSplitGain = 0.95;        // split-K only when the model says >= 5 % faster
inline constexpr double kTileGain = 0.97;         // another tile only when >= 3 % faster than the best so far
// A 128 x w iteration vs 128x256, as measured per tile iteration over 15 rows (docs/perf-notes.md,
// 2026-12-02g) on the scale where the same run's 128x128 costs kSmallCost: about as dear per FLOP
// as 128x128 and 128x192.
inline constexpr double kWideMeasuredCosts[] = {0.44, 0.52, 0.62, 0.70, 0.78, 0.84};  // kWideWidths' order
static_assert(std::size(kWideMeasuredCosts) == std::size(kWideWidths), "one cost per width");
// What the planner charges below kWideManyRounds rounds of the tile: ~8 % under the measured costs,
// fitted so that it picks the measured best on the sweep's rows, where the rounds model overrates
// the tiles it already had (single-round and split rows run slower per iteration than their
// constants say).
inline constexpr double kWideCosts[] = {0.42, 0.48, 0.58, 0.66, 0.72, 0.80};
static_assert(std::size(kWideCosts) == std::size(kWideWidths), "one cost per width");
// From kWideManyRounds rounds on, the measured costs: there the rounds model rates every tile right
// (quantisation is a small share of many rounds), and the discount made the 128 x 208 tile cheaper
// per FLOP than 128x256 (0.80 for 0.81 of the FLOPs), so it took rows of 4-50 rounds for a 1-3 %
// rounding gain and ran 0.81-0.92 of cuBLAS there (one H100, perf-notes 2026-12-06 sixth session).
inline constexpr double kWideManyRounds = 6.0;
inline double wide_cost(int w, double rounds = 0) {
  for (size_t i = 0; i < std::size(kWideWidths); ++i)
    if (kWideWidths[i] == w) return rounds >= kWideManyRounds ? kWideMeasuredCosts[i] : kWideCosts[i];
  return 2.0;  // not a width the planner knows: never picked
}
// The swapped 128 x w tile streams each weight panel once from DRAM, so an iteration waits for its
// stage's round trip rather than for the tensor cores: with the same tokens (32 x 14336 x 4096) its
// time per iteration was 6.0-6.8 units divided by its stages at every width (10 stages: 0.68, 3:
// 2.07; docs/perf-notes.md, 2026-12-03 sixth session). kSwappedLatency is that round trip, fitted
// with the rules below to 56 rows of 24-176 tokens (the old choice against the swapped widths).
inline constexpr double kSwappedLatency = 2.6;
// ... and no less than its tensor work: w / 256 of a 128x256 iteration, at kSwappedCompute of that
// (the widest token tiles are compute-bound when full).
inline constexpr double kSwappedCompute = 0.9;
// Over three or more token tiles each weight panel is read once per token tile: fitted to 81 rows
// of 200-480 tokens (2026-12-04), where at 0.9 the 3 x 160 tiles of 400-480 tokens were picked and
// ran up to 12 % slower than the 128-row tiles (two token tiles keep 0.9: measured right). On 64
// rows of 300-1100 tokens over 3-7 token tiles of 144-192 the time measured against the other
// tiles' model put the factor at 0.80-1.12, median 1.0; 1.05 picked best there (perf-notes, 12-04
// second session).
inline constexpr double kSwappedComputeTiles = 1.05;  // three or more token tiles
// ... and, with every worker busy, no less than the L2 -> SM bytes of its iteration ((128 + w) rows
// of 128 B) against a 128x256 iteration's 384 rows, which runs near that bandwidth, at this factor:
// five and six token tiles of 96 ran 0.60-0.81 of cuBLAS where the 128-row tiles ran 0.82-0.95
// (450 x 53248 x 16384, 520 x 13824 x 5120, 520 x 18432 x 7168), while three of 96 on a part-idle
// machine (288 x 4096 x 14336: 96 items, fewer than the SMs) ran 0.89 against 0.57. Fitted on the 256
// measured rows of 200-1500 tokens (perf-notes, 2026-12-04 second session).
inline constexpr double kSwappedTilesBytes = 0.8;
// The swapped 256 x w tile (two m64 accumulators per consumer over one token operand): an iteration
// is 2 w / 256 of a 128x256 one's FLOPs at this cost per FLOP. Forced at each width on 196 rows of
// 200-4000 tokens, lower factors picked it where it lost: at 0.95 on 110 rows, 22 of them > 3 %
// slower than the other tiles; at 1.0 on 44 rows, one slower, the best geomean of the picks
// (perf-notes, 2026-12-04 second session).
inline constexpr double kSwapped256Compute = 1.0;
// The most tokens it was measured on (4000; at 1.0 per FLOP, like 128x256, it would otherwise win on
// wave quantisation alone at any M, unmeasured there).
inline constexpr int kSwapped256MaxM = 4096;
// Its narrow widths (below 128: 96-120, cuBLAS's widths on such rows) only where their items fill at
// most this many rounds of workers. Forced on 184 rows of 300-4000 tokens (2026-12-04 fourth session)
// they ran 1.04 of the other tiles' time in geometric mean on 18 rows of one or two rounds that the
// model rated cheaper, and lost up to 11 % on rows of more rounds (900 x 16384 x 53248 on 5 rounds of
// 256 x 96: 0.89 of 256 x 160): a narrow tile moves (256 + w) rows of 128 B per 256 w MACs, up to 30 %
// more bytes per FLOP than the 144-176 widths, which the rounds model does not see; its rounds
// quantisation only pays where there are few rounds.
inline constexpr int kSwapped256NarrowWidth = 128;
inline constexpr int kSwapped256NarrowMaxRounds = 2;
// Decode tokens (1-16) take the swapped 128 x 32 tile from sm_count / this many weight panels on
// (plan_gemm: on H100 and H200 it won from 40 weight panels of 128 rows on and lost at 32).
inline constexpr int kSwappedDecodeSmsPerPanel = 3;
// ... and at 1-8 tokens only where a weight row holds at least this many bytes: fp8, one H100
// (2026-12-07 sixth session), rows of 4 KB ran 1.5-4.4 % slower on it than on the mma.sync tile
// (11008 and 14336 rows of 4096 bytes), rows of 7 KB and more 0.6-6.4 % faster (7168-53248 rows of
// 7168-53248 bytes); the bf16 rows measured (8 KB and more, fifth session) all faster. Short rows
// leave the TMA tile's stages little K to stream after their fill; the mma.sync tile has no fill.
// PlanInputs::K counts 2-byte elements (fp8 passes its K blocks of 128 bytes as 64 each).
inline constexpr int kSwappedDecodeRowBytes = 6144;
inline constexpr double kMisalignedSwapped = 1.35;  // a pitch off the 128-byte grid (then 2-CTA clusters)
// The swapped 128 x w tile's mid widths, strictly between these two (104-120, cuBLAS's widths on
// such rows): over one token tile or three and more, never two, where the upper one runs instead
// (two token tiles of them, 209-240 tokens, lost to the tiles taken before on 31 of 46 rows, bf16
// and fp8, 26 by > 3 %, up to 25 %; 2026-12-04 fourth session).
inline constexpr int kSwappedMidAbove = 96, kSwappedMidBelow = 128;
static_assert(is_swapped_width(kSwappedMidAbove) && is_swapped_width(kSwappedMidBelow), "mid widths' bounds");
inline constexpr int kMaxSplitsSwapped = 2;  // up to 128 tokens: 3-4 splits of a few dozen weight panels lost
// ... in 2-CTA clusters (a misaligned pitch) up to 4: its items are pairs of panels, so a weight of
// 32-40 panels fills a third of the clusters unsplit. Forced at 1-4 splits on 15 misaligned rows of
// 17-114 tokens (one H200, 2026-12-06 tenth session), 3 splits where they fit one round ran 1.04-1.5x
// faster than 2 (109 x 4040 x 14352 0.83 -> 0.93 of cuBLAS, 93 x 5152 x 28632 0.80 -> 0.88), as
// cuBLAS's own split 3 there; splits past one round lost.
inline constexpr int kMaxSplitsSwappedPair = 4;
// Above 128 tokens (PlanInputs::swapped_splits) it splits over any number of token tiles, up to 4
// ways of at least 24 iterations each, its split rounds kSplitSlowdownSwapped slower than whole ones.
// Fitted on the 33 `--set tokens` rows below 0.90 of cuBLAS (136-1300 tokens) forced at every tile
// and 1-4 splits (a grid over 2-4 splits and slowdowns 1.0-1.5 picked best at 1.25), then checked
// old against new on the rows it moved; splits of 16-21 iterations (K = 4096 in 3-4) lost 4-7 %
// (perf-notes, 2026-12-04 third session).
inline constexpr int kMaxSplitsSwappedPadded = 4;
inline constexpr double kSplitSlowdownSwapped = 1.25;
inline constexpr int kMinSplitItersSwapped = 24;
// Above decode, a split of the only round (fewer items than workers) into items that cost less than
// this (model units: iterations times the tile's unit) lost. The planner's tile forced at 1-4 splits,
// alternating twice, bf16 and fp8 (one H100, 2026-12-06 ninth session): two splits of 11-16 units
// (the 64x128 tile's or the swapped 128 x 96's 32-43 iterations) ran 5-54 % slower than the same tile
// unsplit on all 8 such rows (128 x 4096 x 5504 bf16 64x128 +12 %, its fp8 twin 128 x 4096 x 11008
// +11 %, 100 x 5120 x 11008 fp8 +52 %); four splits of 43 iterations lost on every row tried; items of
// 22-32 units won 2-12 % (74 x 8248 x 11024 fp8 sw128x96/k2 on a misaligned pitch, 2 x 44 iterations;
// 86-112 iterations on 5 rows; on one H200, 2026-12-02c, the 128x256 tile's two splits of 32 on
// 128 x 11008 x 4096 and 77 x 14344 x 4104). The model's split costs (kSplitCost, kSplitSlowdown)
// were fitted on longer items: a short item's pipeline fill and exchange are a larger share of it.
// fp8 meets the bound at twice bf16's K: an fp8 iteration covers 128 of K.
inline constexpr double kMinSplitItemCost = 18.0;

}  // namespace plan_model

struct SplitChoice {
  int splits = 1;
  double cost = 0;  // model units: iterations of one item times `unit`
};

// One tile's cost for `items` items of `iters` iterations on `workers` workers (an iteration
// costing `unit`): unsplit, or, where split_ok, with the last partial round split as best_splits
// prefers when the model says that is kSplitGain faster (decode: M <= 64, more splits and no
// slowdown). The GEMM planners (plan_gemm, gemm_fp8's block-scaled one) use it per tile.
// max_splits > 0 overrides the default bound (kMaxSplits at decode, else kMaxSplitsWide). Also the
// MoE grouped GEMM's rule on the device, where its tiles are counted (moe::grouped_split).
__host__ __device__ inline SplitChoice split_choice(int items, int iters, int workers, bool decode, double unit,
                                                    bool split_ok, int max_splits = 0,
                                                    double slowdown = plan_model::kSplitSlowdown) {
  using namespace plan_model;
  SplitChoice c{1, static_cast<double>(split_rounds(items, iters, workers, 1)) * unit};
  if (!split_ok) return c;
  const int bound = max_splits > 0 ? max_splits : decode ? kMaxSplits : kMaxSplitsWide;
  const int s = best_splits(items, iters, workers, bound, kSplitCost);
  const long long whole = static_cast<long long>(items / workers) * iters;
  const double split =
      static_cast<double>(split_rounds(items, iters, workers, s) - whole) * (decode ? 1.0 : slowdown);
  const double cost = (static_cast<double>(whole) + split + kSplitCost) * unit;
  if (s > 1 && cost <= kSplitGain * c.cost) c = {s, cost};
  return c;
}

inline Choice plan_gemm(const PlanInputs& in) {
  using namespace plan_model;
  const int iters = ceil_div(in.K, 64);
  const int tm = ceil_div(in.M, 128);
  const bool decode = in.M <= 64;
  // The most splits of an only round (fewer items than workers) above decode: items that cost at
  // least kMinSplitItemCost (`bound` 0: split_choice's default; 1: split_choice keeps the round whole).
  auto split_bound = [&](int items, int workers, double unit, int bound) {
    if (decode || items >= workers) return bound;
    const int most = static_cast<int>(iters * unit / kMinSplitItemCost);
    return std::max(1, std::min(bound > 0 ? bound : kMaxSplitsWide, most));
  };
  auto best_of = [&](Tile t, int items, int workers, double unit, bool split_ok, int width = 0) {
    const int bound = split_bound(items, workers, unit, 0);
    const SplitChoice c = split_choice(items, iters, workers, decode, unit, split_ok && in.split_k, bound);
    return Choice{t, c.splits, workers, c.cost, width};
  };
  auto consider = [](Choice& best, const Choice& c) {
    if (c.cost < kTileGain * best.cost) best = c;
  };
  // Decode with W as N x K: the swapped tile (weights on the mma's M side), which streams them at
  // 0.92-1.31 of cuBLAS's rate up to 8 tokens and at 0.89-1.01 up to 16 (docs/perf-notes.md,
  // "the swapped decode tile"), against 0.78-0.94 for the 64x128 tile.
  // A weight of at least a third as many 128-row panels as SMs streams faster through the swapped
  // 128 x 32 tile's 10 stages, unsplit (its splits lost everywhere). 9-16 tokens, one H200: 56-224
  // panels 0.93-1.04 of cuBLAS against 0.91-0.97 on the mma.sync tile (one row of 144 panels 1.02
  // against 1.04), 32 panels 0.78-0.86 against 0.91-0.99 (2026-12-03 sixth session); one H100, bf16
  // and fp8 (2026-12-06 fourth session): 40-64 panels 8-24 % faster, 32 panels -12 to +1 %. 1-8
  // tokens, one H100 (2026-12-07 fifth session): 56-416 panels 0.99-1.07 of cuBLAS against
  // 0.95-1.04 (the mma.sync tile with 128-byte promotion), 32 panels 0.92-0.96 against 0.97-1.0;
  // fp8 the same way on rows of 7 KB and more (kSwappedDecodeRowBytes: shorter rows lost).
  if (in.swapped && in.M <= swapped::kMaxTokens) {
    const bool long_rows = swapped::token_blocks(in.M) > 1 ||
                           2LL * in.K >= kSwappedDecodeRowBytes;
    if (in.swapped_wide && in.aligned && long_rows && kSwappedDecodeSmsPerPanel * ceil_div(in.N, 128) >= in.sm_count)
      return {Tile::SwappedW, 1, in.sm_count, 0.0, swapped_width(in.M)};
    return {Tile::Swapped, 1, in.sm_count, 0.0};
  }
  // Up to kSwappedWideMaxM tokens of a forward X W^T: the swapped 128 x w tile of the narrowest
  // width that holds every token (two token tiles re-read each weight panel and never won), whose
  // stages hold weights rather than a 128-row token tile's empty rows. On a misaligned pitch it runs
  // in 2-CTA clusters that multicast the token tile (half the token rows' L2 requests per CTA).
  //
  // Above kSwappedWideMaxM tokens: t = 2 .. kSwappedMaxTokenTiles token tiles of the narrowest width
  // that holds M / t tokens, each where it pads fewer token rows than the 128-row tiles do (t w <
  // 128 ceil(M / 128): 288 tokens as 3 x 96, 320 as 2 x 160, 520 as 3 x 176, against 384 and 640
  // rows). There 128-row tiles ran 0.43-0.87 of cuBLAS, which runs such rows swapped with a token
  // width fitted to M (docs/perf-notes.md, 2026-12-04). Split as kMaxSplitsSwappedPadded says.
  auto consider_swapped_tiles = [&](Choice& best, int w, int token_tiles) {
    // 64 and 128 tokens fill the 64- and 128-row tiles exactly (nothing to save) and there the
    // swapped tile measured 0.94-1.0 of them.
    if (in.aligned && (in.M == 64 || in.M == 128)) return;
    const bool pair = !in.aligned && in.pair_clusters > 0 && in.swapped_pairs;
    const int workers = pair ? in.pair_clusters : in.sm_count;
    const int panels = ceil_div(in.N, 128);
    const double round_trip = kSwappedLatency / detail::swapped_wide_stages(w);
    const double compute = (token_tiles > 2 ? kSwappedComputeTiles : kSwappedCompute) * w / 256.0;
    const int items = (pair ? ceil_div(panels, 2) : panels) * token_tiles;
    const double bytes = token_tiles > 2 && items >= workers ? kSwappedTilesBytes * (128 + w) / 384.0 : 0.0;
    // A misaligned pitch without clusters (fp8's single CTAs) over several token tiles costs the swapped
    // tile what it costs the other single-CTA tiles of 128 rows (fp8, one H100: 6 rows of 308-969
    // tokens 13-36 % faster on 128x256 than on it); over one token tile, what it costs in clusters
    // (109 tokens: 0.89 of cuBLASLt on it, 0.72 on 64x128).
    const double pitch = in.aligned ? 1.0 : pair || token_tiles == 1 ? kMisalignedSwapped : kMisalignedSmall;
    const double unit = std::max({round_trip, compute, bytes}) * pitch;
    const bool padded = in.swapped_splits && in.M > 128;
    const int max_splits = split_bound(
        items, workers, unit,
        padded ? std::max(1, std::min(kMaxSplitsSwappedPadded, iters / kMinSplitItersSwapped))
        : pair && in.M <= 128 ? kMaxSplitsSwappedPair
                              : kMaxSplitsSwapped);
    const SplitChoice c = split_choice(items, iters, workers, false, unit, in.split_k && (padded || token_tiles == 1),
                                       max_splits, padded ? kSplitSlowdownSwapped : kSplitSlowdown);
    consider(best, Choice{Tile::SwappedW, c.splits, workers, c.cost, w, pair ? 2 : 1});
  };
  auto consider_swapped = [&](Choice& best) {
    if (!in.swapped_wide) return;
    // then only widths that run in clusters
    const bool pair = !in.aligned && in.pair_clusters > 0 && in.swapped_pairs;
    if (const int w = swapped_width(in.M, pair); w > 0) return consider_swapped_tiles(best, w, 1);
    if (!in.swapped_tiles) return;
    for (int t = 2; t <= kSwappedMaxTokenTiles; ++t) {
      int w = swapped_width(ceil_div(in.M, t), pair);
      if (t == 2 && w > kSwappedMidAbove && w < kSwappedMidBelow) w = kSwappedMidBelow;
      if (w > 0 && t * w < 128 * ceil_div(in.M, 128)) consider_swapped_tiles(best, w, t);
    }
  };
  // kSwappedWideMaxM < M <= kSwapped256MaxM tokens on an aligned pitch: the swapped 256 x w tile,
  // ceil(M / w) token tiles of each of its widths (the narrow ones over few rounds), unsplit (cuBLAS
  // runs such rows on 256 x 96-160 swapped tiles).
  auto consider_swapped256 = [&](Choice& best) {
    if (!in.swapped256 || !in.aligned || in.M <= kSwappedWideMaxM || in.M > kSwapped256MaxM) return;
    for (int w : kSwapped256Widths) {
      const int items = ceil_div(in.N, 256) * ceil_div(in.M, w);
      if (w < kSwapped256NarrowWidth && ceil_div(items, in.sm_count) > kSwapped256NarrowMaxRounds) continue;
      consider(best, best_of(Tile::SwappedW256, items, in.sm_count, kSwapped256Compute * 2 * w / 256.0, false, w));
    }
  };
  // Decode (M <= 64): the 64-row tile, whose 8 stages keep twice the weight bytes in flight per SM
  // of the 128x256 tile's 3 (the regime is memory-bound: measured 16x28672x8192 in 122 us against
  // 148 us, and faster on all eight decode shapes tried); split to fill the machine. A 64x128
  // iteration reads half the B bytes of a 128x256 one. Then the swapped 128 x w tile may replace it.
  if (decode && in.narrow) {
    Choice best = best_of(Tile::M64N128, ceil_div(in.N, 128), in.sm_count, kDecodeCost, true);
    consider_swapped(best);
    return best;
  }
  Choice best = best_of(Tile::M128N256, tm * ceil_div(in.N, 256), in.sm_count, in.aligned ? 1.0 : kMisalignedBig, true);
  consider(best, best_of(Tile::M128N128, tm * ceil_div(in.N, 128), in.sm_count,
                         kSmallCost * (in.aligned ? 1.0 : kMisalignedSmall), false));
  // Wave quantisation: 128x192 tiles fill rounds of SMs where 128x256 ones leave them part idle.
  if (in.mid)
    consider(best, best_of(Tile::M128N192, tm * ceil_div(in.N, 192), in.sm_count,
                           kMidCost * (in.aligned ? 1.0 : kMisalignedMid), true));
  // The 128 x w tiles, unsplit (their splits were not measured), on aligned pitches (on a misaligned
  // one they ran no better than 128x128, 0.65 of cuBLAS on 77x14344x4104).
  if (in.wide && in.aligned)
    for (int w : kWideWidths) {
      const int items = tm * ceil_div(in.N, w);
      consider(best, best_of(Tile::M128Nw, items, in.sm_count,
                             wide_cost(w, static_cast<double>(items) / in.sm_count), false, w));
    }
  if (in.narrow && in.M <= kNarrowMaxM)
    consider(best, best_of(Tile::M64N128, ceil_div(in.M, 64) * ceil_div(in.N, 128), in.sm_count,
                           kNarrowCost * (in.aligned ? 1.0 : kMisalignedSmall), true));
  if (in.pair_clusters > 0)
    consider(best, best_of(Tile::M128N256C2, ceil_div(tm, 2) * ceil_div(in.N, 256), in.pair_clusters,
                           in.aligned ? 1.0 : kMisalignedPair, true));
  if (in.pair_clusters > 0 && in.wide_pair && !in.aligned)
    consider(best, best_of(Tile::M128N320C2, ceil_div(tm, 2) * ceil_div(in.N, 320), in.pair_clusters,
                           320.0 / 256 * kMisalignedPair * kMisalignedWidePair, false));
  consider_swapped(best);
  consider_swapped256(best);
  return best;
}

// Whether a matrix of `cols` bf16 columns per row has rows starting on 128-byte boundaries.
inline bool pitch_aligned(long long cols) { return (cols * 2) % 128 == 0; }

}  // namespace weave::gemm
