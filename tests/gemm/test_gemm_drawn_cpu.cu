// `weave-bench gemm --set drawn`'s rule (tools/weave-bench/gemm_drawn.hpp): replayable from its
// seed, every shape a valid GEMM of the layout it names, and the mix the rule promises (passes,
// token bands, ragged rows, dimensions from the issue's lists); and the GEMM planner over drawn
// shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "check/error_of.hpp"
#include "gemm/gemm.hpp"
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

// The planner never hands gemm() a launch it would refuse: over drawn shapes of every layout and
// M from 1, with each epilogue (bf16 or fp32 output, bias or none, C +=) and communicator SMs, the
// launch plan_launch picks, forced back through Options, passes validate_args, and each tile keeps
// to the layouts and epilogues its kernels are instantiated for (kernels/gemm/README.md, "Tiles").
namespace {

TEST(GemmDrawn, EveryPlannedLaunchIsOneGemmRuns) {
  using namespace weave;
  using gemm::Tile;
  alignas(16) static char buf[64];
  const void* p = buf;
  int planned = 0;
  std::set<Tile> seen;
  auto shapes = draw_gemm_shapes(20261206, 600);
  for (int M : {1, 7, 16, 17, 100, 257}) shapes.push_back({M, 14336, 4096, 1, M, true, false});
  for (const DrawnGemm& d : shapes)
    for (int variant = 0; variant < 6; ++variant) {
      gemm::Options o;
      const bool f32 = variant == 1 || variant == 4;
      if (d.layout == 2) o.a_layout = gemm::ALayout::KM;
      if (variant == 2 || variant == 4) o.bias_type = gemm::BiasType::BF16, o.bias = p;
      if (variant == 3) o.accumulate = true;
      if (variant == 5) o.lcsc.num_comm_sms = 8;
      const gemm::BLayout bl = d.layout == 1 ? gemm::BLayout::NK : gemm::BLayout::KN;
      const int sms = 132 - o.lcsc.num_comm_sms;
      const gemm::Launch l = gemm::plan_launch(d.M, d.N, d.K, bl, sms, sms / 2, o, f32);
      const std::string what = std::to_string(d.M) + "x" + std::to_string(d.N) + "x" + std::to_string(d.K) +
                               " layout " + std::to_string(d.layout) + " variant " + std::to_string(variant) +
                               ": " + gemm::launch_name(l);
      const bool plain = o.a_layout == gemm::ALayout::MK && !f32 && o.bias_type == gemm::BiasType::None;
      EXPECT_NE(l.tile, Tile::Auto) << what;
      EXPECT_GE(l.splits, 1) << what;
      if (l.splits > 1) EXPECT_TRUE(plain) << what;
      switch (l.tile) {
        case Tile::Swapped:
          EXPECT_TRUE(d.M <= 16 && bl == gemm::BLayout::NK && o.a_layout == gemm::ALayout::MK &&
                      o.lcsc.num_comm_sms == 0) << what;
          break;
        case Tile::M128Nw:
          EXPECT_TRUE(gemm::is_wide_width(l.width) && bl == gemm::BLayout::NK && o.a_layout == gemm::ALayout::MK &&
                      !f32) << what;
          break;
        case Tile::SwappedW:
          EXPECT_TRUE(gemm::is_swapped_width(l.width) && plain) << what;  // B either layout
          if (l.cluster == 2) EXPECT_TRUE(gemm::swapped_width_clusters(l.width)) << what;
          break;
        case Tile::SwappedW256:
          EXPECT_TRUE(gemm::is_swapped256_width(l.width) && bl == gemm::BLayout::NK && plain && l.splits == 1) << what;
          break;
        case Tile::M128N256C2:
        case Tile::M128N320C2:
          EXPECT_TRUE(!f32 && o.bias_type == gemm::BiasType::None && o.lcsc.num_comm_sms % 2 == 0) << what;
          break;
        case Tile::M128N192:
          EXPECT_TRUE(o.a_layout == gemm::ALayout::MK && !f32) << what;
          break;
        default:
          break;
      }
      gemm::Options forced = o;
      forced.tile = l.tile, forced.split_k = l.splits;
      if (l.tile == Tile::M128Nw || l.tile == Tile::SwappedW || l.tile == Tile::SwappedW256) forced.tile_n = l.width;
      if (l.tile == Tile::SwappedW) forced.tile_cluster = l.cluster;
      EXPECT_EQ(weave::check::error_of([&] { gemm::validate_args(p, p, p, d.M, d.N, d.K, forced, f32); }), "") << what;
      ++planned;
      seen.insert(l.tile);
    }
  EXPECT_EQ(planned, 606 * 6);
  // The draw reaches every tile the planner picks (else this test checks less than it says).
  for (Tile t : {Tile::Swapped, Tile::M128Nw, Tile::SwappedW, Tile::SwappedW256, Tile::M128N256C2, Tile::M128N320C2,
                 Tile::M128N256, Tile::M128N192, Tile::M64N128, Tile::M128N128})
    EXPECT_TRUE(seen.count(t)) << gemm::tile_name(t);
}

}  // namespace
