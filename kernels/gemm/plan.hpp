// The GEMM's launch choice (tile, split-K) as a pure function of the shape and the device, from a
// cost model in units of one 128x256x64 tile iteration on one SM (CPU-tested; the constants are
// measured, see kernels/gemm/README.md "Tile choice" and docs/perf-notes.md).
//
// What the model captures:
// - rounds: a persistent grid of P workers runs ceil(items / P) rounds of whole items; split-K
//   cuts the items of the last partial round into K ranges (split_k.hpp), plus the partial-sum
//   exchange (kSplitCost);
// - the 128x128 tile moves twice the operand bytes per FLOP (kSmallCost per iteration of half the
//   FLOPs);
// - a row pitch that is not a multiple of 128 bytes makes every 128-byte TMA row read touch five
//   32-byte sectors instead of four, and the large tiles run near the L2 -> SM bandwidth, so they
//   slow down; the 2-CTA cluster tile, which multicasts B into both CTAs (a third less L2 traffic
//   per FLOP), hardly does (kMisaligned*).
#pragma once

#include "gemm/gemm.hpp"
#include "gemm/scheduler.hpp"
#include "gemm/split_k.hpp"

namespace weave::gemm {

struct PlanInputs {
  int M = 0, N = 0, K = 0;
  bool aligned = true;     // every operand's row pitch is a multiple of 128 bytes
  int sm_count = 0;        // compute SMs (without communicator SMs)
  int pair_clusters = 0;   // 2-CTA clusters the device holds at once (0: the cluster tile is not allowed)
  bool split_k = true;     // split-K allowed
};

struct Choice {
  Tile tile = Tile::M128N256;
  int splits = 1;   // K ranges of each item of the last partial round (1: none)
  int workers = 0;  // the workers the choice was made for (compute blocks, or clusters)
  double cost = 0;  // model units (for tests and the bench's log)
};

namespace plan_model {
inline constexpr double kSmallCost = 0.575;       // 128x128 iteration vs 128x256 (perf-notes: 10-25 % slower per FLOP)
inline constexpr double kSplitCost = 3.0;         // write, count and read back one fp32 partial
inline constexpr int kMaxSplits = 16;
inline constexpr double kDecodeCost = 0.5;        // 64x128 iteration vs 128x256, memory-bound
inline constexpr double kMisalignedBig = 1.30;    // 8192x28672x8200 nk: 0.766 of cuBLAS vs 1.03 aligned
inline constexpr double kMisalignedSmall = 1.80;  // the same shapes on 128x128: 0.51-0.55
inline constexpr double kMisalignedPair = 1.03;   // 128x256 clusters: 0.977
inline constexpr double kSplitGain = 0.95;        // split-K only when the model says >= 5 % faster
inline constexpr double kTileGain = 0.97;         // another tile only when >= 3 % faster than 128x256

}  // namespace plan_model

inline Choice plan_gemm(const PlanInputs& in) {
  using namespace plan_model;
  const int iters = ceil_div(in.K, 64);
  const int tm = ceil_div(in.M, 128);
  auto best_of = [&](Tile t, int items, int workers, double unit, bool split_ok) {
    Choice c{t, 1, workers, static_cast<double>(split_rounds(items, iters, workers, 1)) * unit};
    if (split_ok && in.split_k) {
      const int s = best_splits(items, iters, workers, kMaxSplits, kSplitCost);
      const double cost = (static_cast<double>(split_rounds(items, iters, workers, s)) + kSplitCost) * unit;
      if (s > 1 && cost <= kSplitGain * c.cost) c = {t, s, workers, cost};
    }
    return c;
  };
  // Decode (M <= 64): the 64-row tile, whose 8 stages keep twice the weight bytes in flight per SM
  // of the 128x256 tile's 3 (the regime is memory-bound: measured 16x28672x8192 in 122 us against
  // 148 us, and faster on all eight decode shapes tried); split to fill the machine. A 64x128
  // iteration reads half the B bytes of a 128x256 one.
  if (in.M <= 64) return best_of(Tile::M64N128, ceil_div(in.N, 128), in.sm_count, kDecodeCost, true);
  Choice best = best_of(Tile::M128N256, tm * ceil_div(in.N, 256), in.sm_count, in.aligned ? 1.0 : kMisalignedBig, true);
  const Choice small = best_of(Tile::M128N128, tm * ceil_div(in.N, 128), in.sm_count,
                               kSmallCost * (in.aligned ? 1.0 : kMisalignedSmall), false);
  if (small.cost < kTileGain * best.cost) best = small;
  if (in.pair_clusters > 0) {
    const Choice pair = best_of(Tile::M128N256C2, ceil_div(tm, 2) * ceil_div(in.N, 256), in.pair_clusters,
                                in.aligned ? 1.0 : kMisalignedPair, true);
    if (pair.cost < kTileGain * best.cost) best = pair;
  }
  return best;
}

// Whether a matrix of `cols` bf16 columns per row has rows starting on 128-byte boundaries.
inline bool pitch_aligned(long long cols) { return (cols * 2) % 128 == 0; }

}  // namespace weave::gemm
