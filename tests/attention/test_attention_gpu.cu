// Attention forward against a float64 CPU reference on small random cases: ragged S (not a
// multiple of the 128-row tiles), causal and not, grouped-query heads, D 64 and 128, the
// softmax-scale option, ping-pong on and off, persistent and one CTA per tile (with more tiles
// than SMs, so persistent CTAs take several). O and LSE are poisoned first (NaN) and followed
// by guard words that must survive; every valid element is checked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "attention/attention.hpp"
#include "weave/common/error.hpp"

using namespace weave;
using bf16 = __nv_bfloat16;
using attention::Shape;

namespace {

constexpr size_t kGuard = 4096;
constexpr uint16_t kGuardBits = 0x7E57;

struct Case {
  int B, S, Hq, Hkv, D;
  bool causal;
  float scale;  // 0 = default
};

std::vector<bf16> random_bf16(size_t n, std::mt19937& g) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<bf16> v(n);
  for (auto& x : v) x = __float2bfloat16(u(g));
  return v;
}

// O (B, S, Hq, D) and LSE (B, Hq, S) in float64.
void reference(const Case& c, const std::vector<bf16>& q, const std::vector<bf16>& k, const std::vector<bf16>& v,
               std::vector<double>& o, std::vector<double>& lse) {
  const int B = c.B, S = c.S, Hq = c.Hq, Hkv = c.Hkv, D = c.D, grp = Hq / Hkv;
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(double(D));
  o.assign(size_t(B) * S * Hq * D, 0.0);
  lse.assign(size_t(B) * Hq * S, 0.0);
  std::vector<double> sc(S);
  auto at = [&](const std::vector<bf16>& t, int H, int b, int s, int h, int d) {
    return double(__bfloat162float(t[((size_t(b) * S + s) * H + h) * D + d]));
  };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      const int hk = h / grp;
      for (int i = 0; i < S; ++i) {
        const int jmax = c.causal ? i : S - 1;
        double mx = -INFINITY;
        for (int j = 0; j <= jmax; ++j) {
          double acc = 0;
          for (int d = 0; d < D; ++d) acc += at(q, Hq, b, i, h, d) * at(k, Hkv, b, j, hk, d);
          sc[j] = acc * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j <= jmax; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
        double* out = &o[((size_t(b) * S + i) * Hq + h) * D];
        for (int j = 0; j <= jmax; ++j) {
          const double w = sc[j] / sum;
          for (int d = 0; d < D; ++d) out[d] += w * at(v, Hkv, b, j, hk, d);
        }
        lse[(size_t(b) * Hq + h) * S + i] = mx + std::log(sum);
      }
    }
}

template <class T>
struct Dev {
  T* p = nullptr;
  explicit Dev(size_t n) { WEAVE_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T))); }
  ~Dev() { cudaFree(p); }
};

void run_case(const Case& c) {
  const char* what = c.causal ? "causal" : "full";
  std::printf("case B=%d S=%d Hq=%d Hkv=%d D=%d %s scale=%g\n", c.B, c.S, c.Hq, c.Hkv, c.D, what, c.scale);
  std::fflush(stdout);
  SCOPED_TRACE(testing::Message() << "B=" << c.B << " S=" << c.S << " Hq=" << c.Hq << " Hkv=" << c.Hkv
                                  << " D=" << c.D << " " << what << " scale=" << c.scale);
  std::mt19937 gen(c.B * 7919 + c.S * 131 + c.Hq * 17 + c.Hkv * 5 + c.D + (c.causal ? 1 : 0));
  const size_t nq = size_t(c.B) * c.S * c.Hq * c.D, nk = size_t(c.B) * c.S * c.Hkv * c.D;
  const size_t nl = size_t(c.B) * c.Hq * c.S;
  const auto q = random_bf16(nq, gen), k = random_bf16(nk, gen), v = random_bf16(nk, gen);
  std::vector<double> ro, rl;
  reference(c, q, k, v, ro, rl);

  Dev<bf16> dq(nq), dk(nk), dv(nk), dout(nq + kGuard);
  Dev<float> dl(nl + kGuard);
  WEAVE_CUDA_CHECK(cudaMemcpy(dq.p, q.data(), nq * 2, cudaMemcpyHostToDevice));
  WEAVE_CUDA_CHECK(cudaMemcpy(dk.p, k.data(), nk * 2, cudaMemcpyHostToDevice));
  WEAVE_CUDA_CHECK(cudaMemcpy(dv.p, v.data(), nk * 2, cudaMemcpyHostToDevice));
  // Ping-pong on/off x per-tile/persistent with the default tile order, then tile-order sections
  // of 3 and 5 heads (they do not divide B * Hq: the last section is partial).
  struct Variant {
    bool pp, persistent;
    int section;
  };
  constexpr Variant kVariants[] = {{false, false, 0}, {true, false, 0}, {false, true, 0},
                                   {true, true, 0},   {true, false, 3}, {true, true, 5}};
  for (const Variant& var : kVariants) {
    const bool pp = var.pp, persistent = var.persistent;
    const int section = var.section;
    SCOPED_TRACE(testing::Message() << (pp ? "pingpong" : "no pingpong") << (persistent ? " persistent" : "")
                                    << " sections " << section);
    std::vector<uint16_t> ob(nq + kGuard, 0xFFFF);  // bf16 NaN
    std::vector<uint32_t> lb(nl + kGuard, 0xFFFFFFFFu);
    for (size_t i = nq; i < ob.size(); ++i) ob[i] = kGuardBits;
    for (size_t i = nl; i < lb.size(); ++i) lb[i] = 0x7E577E57u;
    WEAVE_CUDA_CHECK(cudaMemcpy(dout.p, ob.data(), ob.size() * 2, cudaMemcpyHostToDevice));
    WEAVE_CUDA_CHECK(cudaMemcpy(dl.p, lb.data(), lb.size() * 4, cudaMemcpyHostToDevice));
    attention::Options opt;
    opt.causal = c.causal;
    opt.softmax_scale = c.scale;
    opt.pingpong = pp;
    opt.schedule = persistent ? attention::Options::Schedule::Persistent : attention::Options::Schedule::PerTile;
    opt.heads_per_section = section;
    attention::forward(dq.p, dk.p, dv.p, dout.p, dl.p, Shape{c.B, c.S, c.Hq, c.Hkv, c.D}, opt);
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<bf16> out(nq + kGuard);
    std::vector<float> lse(nl + kGuard);
    WEAVE_CUDA_CHECK(cudaMemcpy(out.data(), dout.p, out.size() * 2, cudaMemcpyDeviceToHost));
    WEAVE_CUDA_CHECK(cudaMemcpy(lse.data(), dl.p, lse.size() * 4, cudaMemcpyDeviceToHost));
    double err2 = 0, ref2 = 0, max_err = 0, lse_err = 0;
    size_t bad = 0, first_bad = 0;
    for (size_t i = 0; i < nq; ++i) {
      const double x = __bfloat162float(out[i]);
      if (!std::isfinite(x)) {
        if (bad++ == 0) first_bad = i;
        continue;
      }
      const double e = std::fabs(x - ro[i]);
      err2 += e * e;
      ref2 += ro[i] * ro[i];
      max_err = std::max(max_err, e);
    }
    size_t bad_lse = 0;
    for (size_t i = 0; i < nl; ++i) {
      if (!std::isfinite(lse[i])) {
        ++bad_lse;
        continue;
      }
      lse_err = std::max(lse_err, std::fabs(lse[i] - rl[i]) / std::max(1.0, std::fabs(rl[i])));
    }
    size_t guard_hit = 0;
    for (size_t i = nq; i < out.size(); ++i) {
      uint16_t bits;
      std::memcpy(&bits, &out[i], 2);
      guard_hit += bits != kGuardBits;
    }
    for (size_t i = nl; i < lse.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &lse[i], 4);
      guard_hit += bits != 0x7E577E57u;
    }
    EXPECT_EQ(bad, 0u) << "O elements not written / non-finite; first at flat index " << first_bad;
    EXPECT_EQ(bad_lse, 0u) << "LSE elements not written / non-finite";
    EXPECT_EQ(guard_hit, 0u) << "writes past the end of O or LSE";
    const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
    EXPECT_LT(rel, 1e-2) << "relative Frobenius error of O";
    EXPECT_LT(max_err, 2e-2) << "max abs error of O";
    EXPECT_LT(lse_err, 2e-3) << "max relative error of LSE";
    std::printf("  %s%s: O rel %.2e max %.2e, LSE %.2e, bad %zu/%zu guard %zu\n", pp ? "pp  " : "nopp", persistent ? " persistent" : " per-tile  ", rel, max_err,
                lse_err, bad, bad_lse, guard_hit);
  }
}

}  // namespace

TEST(AttentionGpu, SmallCases) {
  const std::vector<Case> cases = {
      {1, 1, 1, 1, 64, false, 0},     {1, 1, 1, 1, 128, true, 0},    {1, 128, 2, 2, 128, false, 0},
      {1, 128, 2, 1, 64, true, 0},    {2, 77, 4, 2, 64, false, 0},   {2, 77, 4, 2, 128, true, 0},
      {1, 200, 3, 1, 128, false, 0},  {1, 200, 3, 1, 64, true, 0},   {1, 256, 2, 2, 128, true, 0},
      {2, 300, 2, 1, 128, true, 1.0f}, {2, 300, 2, 1, 64, false, 1.0f}, {1, 333, 4, 4, 64, true, 0.3f},
  };
  for (const Case& c : cases) run_case(c);
}

// Longer sequences: the K/V rings wrap several times; GQA 4:1.
TEST(AttentionGpu, LongerSequences) {
  const std::vector<Case> cases = {
      {1, 1000, 4, 1, 128, true, 0}, {1, 777, 2, 1, 128, false, 0}, {1, 1000, 4, 1, 64, false, 0},
      {1, 1031, 2, 2, 64, true, 0},
  };
  for (const Case& c : cases) run_case(c);
}

// More tiles than SMs: persistent CTAs run several tiles each (Q reloads, O staging reuse,
// the tile counter).
TEST(AttentionGpu, ManyTiles) {
  const std::vector<Case> cases = {
      {2, 700, 16, 4, 64, false, 0},
      {2, 520, 16, 8, 128, true, 0},
  };
  for (const Case& c : cases) run_case(c);
}

TEST(AttentionGpu, NullLseAndRejections) {
  const Shape s{1, 100, 2, 1, 64};
  Dev<bf16> q(size_t(100) * 2 * 64), kv(size_t(100) * 64), o(size_t(100) * 2 * 64);
  EXPECT_NO_THROW(attention::forward(q.p, kv.p, kv.p, o.p, nullptr, s));
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_THROW(attention::forward(q.p, kv.p, kv.p, o.p, nullptr, Shape{1, 100, 2, 1, 96}), Error);
  EXPECT_THROW(attention::forward(q.p, kv.p, kv.p, o.p, nullptr, Shape{1, 100, 3, 2, 64}), Error);
  EXPECT_THROW(attention::forward(q.p + 1, kv.p, kv.p, o.p, nullptr, s), Error);
  attention::Options bad;
  bad.softmax_scale = -1.f;
  EXPECT_THROW(attention::forward(q.p, kv.p, kv.p, o.p, nullptr, s, bad), Error);
  attention::Options bad_sections;
  bad_sections.heads_per_section = -1;
  EXPECT_THROW(attention::forward(q.p, kv.p, kv.p, o.p, nullptr, s, bad_sections), Error);
}
