// `weave-bench gemm --set drawn`'s rule (tools/weave-bench/gemm_drawn.hpp): replayable from its
// seed, every shape a valid GEMM of the layout it names, and the mix the rule promises (passes,
// token bands, ragged rows, dimensions from the lists).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "gemm_drawn.hpp"

namespace {

using weave::bench::DrawnGemm;
using weave::bench::draw_gemm_shapes;

bool listed(int x, const int* v, int n) { return std::find(v, v + n, x) != v + n; }
bool hidden(int x) { return listed(x, weave::bench::kDrawnHidden, 5); }
bool ffn(int x) { return listed(x, weave::bench::kDrawnFfn, 5); }

// The weight's two dimensions (in, out) of a drawn row: N, K forward and input gradient; M, N weight gradient.
std::pair<int, int> weight_dims(const DrawnGemm& d) { return d.layout == 2 ? std::pair{d.M, d.N} : std::pair{d.N, d.K}; }

TEST(GemmDrawn, SameSeedSameShapesOtherSeedOthers) {
  const auto a = draw_gemm_shapes(12345, 64), b = draw_gemm_shapes(12345, 64), c = draw_gemm_shapes(12346, 64);
  ASSERT_EQ(a.size(), 64u);
  int same = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].M == b[i].M && a[i].N == b[i].N && a[i].K == b[i].K && a[i].layout == b[i].layout) << i;
    same += a[i].M == c[i].M && a[i].N == c[i].N && a[i].K == c[i].K && a[i].layout == c[i].layout;
  }
  EXPECT_LT(same, 8);
  // A longer draw starts with the shorter one (a replayed seed with more --draws adds rows).
  const auto longer = draw_gemm_shapes(12345, 80);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(longer[i].M, a[i].M) << i;
}

TEST(GemmDrawn, EveryShapeIsAValidGemmOfItsLayout) {
  for (const DrawnGemm& d : draw_gemm_shapes(7, 4000)) {
    ASSERT_GE(d.M, 1);
    EXPECT_EQ(d.N % 8, 0) << d.M << "x" << d.N << "x" << d.K;
    EXPECT_EQ(d.K % 8, 0) << d.M << "x" << d.N << "x" << d.K;
    if (d.layout == 2) EXPECT_EQ(d.M % 8, 0) << d.M << "x" << d.N << "x" << d.K;  // A stored K x M
    EXPECT_TRUE(d.layout >= 0 && d.layout <= 2);
    EXPECT_LE(2.0 * d.M * d.N * d.K, weave::bench::kDrawnMaxFlop) << d.M << "x" << d.N << "x" << d.K;
    EXPECT_EQ(d.tokens, d.layout == 2 ? d.K : d.M);
    EXPECT_TRUE(d.tokens >= 1 && d.tokens <= 32768);
    const auto [a, b] = weight_dims(d);
    if (d.ragged) {  // both weight dimensions moved off the 64 grid by 8..56
      EXPECT_NE(a % 64, 0) << a;
      EXPECT_NE(b % 64, 0) << b;
      EXPECT_LE(std::abs(a - (a + 32) / 64 * 64), 32) << a;
    } else {  // one hidden size and one FFN size, in the order the projection says
      const int in = d.layout == 2 ? b : d.layout == 1 ? b : a;  // fwd: K = in; dgrad: N = in; wgrad: N = in
      const int out = d.layout == 2 ? a : d.layout == 1 ? a : b;
      EXPECT_TRUE(d.up ? hidden(in) && ffn(out) : ffn(in) && hidden(out)) << d.M << "x" << d.N << "x" << d.K;
    }
  }
}

TEST(GemmDrawn, TheMixTheRulePromises) {
  const auto v = draw_gemm_shapes(99, 4000);
  int fwd = 0, dgrad = 0, wgrad = 0, ragged = 0, decode = 0, mid = 0, large = 0, up = 0, backward_small = 0;
  std::set<int> hs, fs;
  for (const DrawnGemm& d : v) {
    (d.layout == 1 ? fwd : d.layout == 0 ? dgrad : wgrad)++;
    ragged += d.ragged, up += d.up;
    if (d.layout == 1) (d.M <= 256 ? decode : d.M < 2048 ? mid : large)++;
    else backward_small += d.tokens < 256 && 2.0 * d.M * d.N * d.K * 2 <= weave::bench::kDrawnMaxFlop;
    if (!d.ragged) {
      const auto [a, b] = weight_dims(d);
      for (int x : {a, b}) (hidden(x) ? hs : fs).insert(x);
    }
  }
  const double n = static_cast<double>(v.size());
  EXPECT_NEAR(fwd / n, 0.5, 0.04);
  EXPECT_NEAR(dgrad / n, 0.25, 0.04);
  EXPECT_NEAR(wgrad / n, 0.25, 0.04);
  EXPECT_NEAR(ragged / n, 0.25, 0.04);
  EXPECT_NEAR(up / n, 0.5, 0.04);
  // Forward token bands with equal odds; the FLOP cap only moves large rows down.
  EXPECT_NEAR(decode / static_cast<double>(fwd), 1.0 / 3, 0.05);
  EXPECT_GT(mid, fwd / 4);
  EXPECT_GT(large, fwd / 5);
  EXPECT_EQ(backward_small, 0);  // backward rows start at 256 tokens; below only when halved by the cap
  EXPECT_EQ(hs.size(), 5u);
  EXPECT_EQ(fs.size(), 5u);
}

}  // namespace
