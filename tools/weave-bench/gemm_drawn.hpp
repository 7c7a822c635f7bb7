// `weave-bench gemm --set drawn` (and gemm_fp8's): GEMM shapes drawn at random by issue 20's rule
// instead of listed, so that a planner tuned on the listed sets is checked on shapes nobody chose.
// A pure function of the seed (CPU-tested in tests/gemm/test_gemm_drawn_cpu.cu); the bench prints
// the seed, and `--draw-seed S` replays a draw.
//
// The rule: an MLP projection of a model, in = hidden and out = FFN (up) or the reverse (down),
// hidden and FFN drawn independently from the sizes; T tokens from one of three bands with
// equal odds (decode 1-256, 257-2047, 2048-32768; log-uniform inside each, so that small counts are
// as likely as large ones); the pass forward (half the rows), input gradient or weight gradient
// (a quarter each; both at training token counts, T >= 256); a quarter of the rows ragged, N and K
// moved by a multiple of 8 off the 64-element grid (as the `models` set's ragged rows: a row pitch
// off the 128-byte grid). The weight gradient's K (= T) is rounded up to a multiple of 8 (TMA
// pitches). A shape above 2^44 FLOP (about 30 ms on cuBLAS) halves its T until it fits, to bound
// the bench's time.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace weave::bench {

// One drawn GEMM: M x N x K and the layout code of gemm_shape_rows (1 forward: A M x K, B N x K;
// 0 input gradient: B K x N; 2 weight gradient: A K x M, B K x N), with where it came from.
struct DrawnGemm {
  int M, N, K, layout;
  int tokens;
  bool up, ragged;
};

inline constexpr int kDrawnHidden[] = {4096, 5120, 7168, 8192, 16384};
inline constexpr int kDrawnFfn[] = {11008, 14336, 18432, 28672, 53248};
inline constexpr double kDrawnMaxFlop = 17592186044416.0;  // 2^44

// splitmix64: a fixed generator (std's distributions may differ between standard libraries).
struct DrawRng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }  // 0 .. n-1
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }            // [0, 1)
  // log-uniform integer in [lo, hi]
  int log_uniform(int lo, int hi) {
    const double l = std::log(lo), h = std::log(hi + 1.0);
    const int x = static_cast<int>(std::exp(l + unit() * (h - l)));
    return x < lo ? lo : x > hi ? hi : x;
  }
};

inline std::vector<DrawnGemm> draw_gemm_shapes(uint64_t seed, int count) {
  DrawRng r{seed};
  std::vector<DrawnGemm> v;
  for (int i = 0; i < count; ++i) {
    DrawnGemm d{};
    const int hidden = kDrawnHidden[r.below(5)], ffn = kDrawnFfn[r.below(5)];
    d.up = r.below(2) == 0;
    const int in = d.up ? hidden : ffn, out = d.up ? ffn : hidden;
    const int pass = r.below(4);  // 0, 1: forward; 2: input gradient; 3: weight gradient
    d.layout = pass < 2 ? 1 : pass == 2 ? 0 : 2;
    const int band = d.layout == 1 ? r.below(3) : 1 + r.below(2);
    int T = band == 0 ? r.log_uniform(1, 256) : band == 1 ? r.log_uniform(257, 2047) : r.log_uniform(2048, 32768);
    d.ragged = r.below(4) == 0;
    // N and K off the 64-element grid by 8..56 (either sign).
    auto rag = [&](int x) { return d.ragged ? x + (r.below(2) ? 1 : -1) * 8 * (1 + r.below(7)) : x; };
    const int in_r = rag(in), out_r = rag(out);
    for (;;) {
      const int t = d.layout == 2 ? (T + 7) / 8 * 8 : T;
      if (d.layout == 1) d.M = t, d.N = out_r, d.K = in_r;        // Y = X W^T
      else if (d.layout == 0) d.M = t, d.N = in_r, d.K = out_r;   // dX = dY W
      else d.M = out_r, d.N = in_r, d.K = t;                      // dW = dY^T X
      if (2.0 * d.M * d.N * d.K <= kDrawnMaxFlop || T == 1) break;
      T = T / 2 > 0 ? T / 2 : 1;
    }
    d.tokens = d.layout == 2 ? d.K : d.M;
    v.push_back(d);
  }
  return v;
}

}  // namespace weave::bench
