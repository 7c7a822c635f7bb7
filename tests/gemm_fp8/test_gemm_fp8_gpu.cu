// fp8 GEMMs (per-tensor and block scales) against an independent float32 reference: the fp8
// operands decoded and scaled to float by a plain kernel, multiplied by cuBLASLt in float32
// (check/gemm_fp8_ref.hpp), element by element, reported per 128 x 128 tile, fresh random inputs
// (WEAVE_TEST_SEED replays them), outputs poisoned first. Small cases also check 256 sampled
// elements against float64 dot products on the host, decoding the fp8 bits there.
//
// The bounds (derived in check/gemm_fp8_ref.hpp): one bf16 rounding 2^-8 |r| + 2^-10 s, plus the
// fp8 tensor core's truncating 13-bit accumulation, 2^-13 per k32 instruction of the running sum,
// over all of K for the per-tensor kernel (fp8_tensor_core_bound(K)) and over 128 of K for the
// block-scaled one (fp8_promoted_bound()). A tile that misses one 128-K block must fail them:
// MissingKBlockFailsTheBound checks exactly that with the kernel's own output, so the bound is not
// only derived but shown to be tight enough on the hardware.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "check/device_buffer.hpp"
#include "check/gemm_fp8_ref.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "gemm_fp8/gemm_fp8.hpp"

using namespace weave;
using bf16 = __nv_bfloat16;
using gemm_fp8::Fp8;
using gemm_fp8::Tile;

namespace {

template <class T>
using DevBuf = check::DeviceBuffer<T>;

using check::case_seed;

check::Fp8GemmRef& ref() {
  static check::Fp8GemmRef r;
  return r;
}

struct Opts {
  Fp8 ta = Fp8::E4M3, tb = Fp8::E4M3;
  Tile tile = Tile::Auto;
  bool block = false;
  float scale_lo = 0.25f, scale_hi = 4.f;  // scales log-uniform in [lo, hi]
  float range = 4.f;                        // operands uniform in [-range, range) before rounding to fp8
  bool sub_a = false, sub_b = false;        // operands made of subnormal codes only
  int comm = 0;
  bool samples = false;
  bool expect_nonfinite = false;  // nonfinite_codes(): NaN in A's row 5, +-Inf in B's rows 9 and 10 (e5m2 B)
  int split_k = 0;                // Options::split_k
  int tile_n = 0;                 // Options::tile_n (Tile::M128Nw)
  int lane_scales = 0;            // Options::lane_scales (block scales)
};

bool e5(Fp8 t) { return t == Fp8::E5M2; }

check::Bound bound_for(const Opts& o, int K) {
  return o.block ? check::fp8_promoted_bound() : check::fp8_tensor_core_bound(K);
}

// Writes NaN at A[5, 17] (e4m3 0x7f or e5m2 0x7f: both NaN) and, for an e5m2 B, +Inf at B[9, 40]
// and -Inf at B[10, 41]: row 5 of C becomes NaN, columns 9 and 10 +-Inf (or NaN where A's
// element is 0), as an IEEE float32 GEMM of the decoded values gives.
void nonfinite_codes(void* A, void* B, Fp8 tb, int M, int N, int K) {
  if (M > 5 && K > 17) check::set_fp8(A, size_t(5) * K + 17, 0x7f);
  if (e5(tb) && N > 10 && K > 41) {
    check::set_fp8(B, size_t(9) * K + 40, 0x7c);
    check::set_fp8(B, size_t(10) * K + 41, 0xfc);
  }
}

// 256 sampled elements of C against float64 dot products of the host-decoded operands.
void check_samples(const uint8_t* dA, const uint8_t* dB, const bf16* dC, const float* dsa, const float* dsb, int M,
                   int N, int K, const Opts& o, uint64_t seed) {
  const int kb = gemm_fp8::k_blocks(K);
  std::vector<uint8_t> a(size_t(M) * K), b(size_t(N) * K);
  std::vector<bf16> c(size_t(M) * N);
  std::vector<float> sa(o.block ? gemm_fp8::block_scale_a_count(M, K) : 1),
      sb(o.block ? gemm_fp8::block_scale_b_count(N, K) : 1);
  WEAVE_CUDA_CHECK(cudaMemcpy(a.data(), dA, a.size(), cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaMemcpy(b.data(), dB, b.size(), cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaMemcpy(c.data(), dC, c.size() * 2, cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaMemcpy(sa.data(), dsa, sa.size() * 4, cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaMemcpy(sb.data(), dsb, sb.size() * 4, cudaMemcpyDeviceToHost));
  constexpr int kSamples = 256;
  std::mt19937_64 g(seed);
  std::vector<int> si(kSamples), sj(kSamples);
  std::vector<double> r(kSamples), s(kSamples);
  for (int t = 0; t < kSamples; ++t) {
    const int i = int(g() % M), j = int(g() % N);
    double acc = 0, sq = 0;
    for (int k = 0; k < K; ++k) {
      const double fa = o.block ? sa[size_t(k / 128) * M + i] : sa[0];
      const double fb = o.block ? sb[size_t(j / 128) * kb + k / 128] : sb[0];
      const double p = fa * check::fp8_to_double(a[size_t(i) * K + k], e5(o.ta)) * fb *
                       check::fp8_to_double(b[size_t(j) * K + k], e5(o.tb));
      acc += p;
      sq += p * p;
    }
    si[t] = i, sj[t] = j, r[t] = acc, s[t] = std::sqrt(sq);
  }
  const check::Report rep = check::compare_host(
      1, kSamples, [&](long long, long long t) { return double(__bfloat162float(c[size_t(si[t]) * N + sj[t]])); },
      [&](long long, long long t) { return r[t]; }, [&](long long, long long t) { return s[t]; }, bound_for(o, K), 1,
      kSamples);
  EXPECT_TRUE(rep.ok) << "sampled float64 check (column = sample): " << rep.str();
}

struct Fp8Run {
  int M, N, K;
  Opts o;
  DevBuf<uint8_t> A, B;
  DevBuf<float> sa, sb;
  DevBuf<bf16> C;
  DevBuf<float> r, s;
  Fp8Run(int m, int n, int k, const Opts& opts)
      : M(m), N(n), K(k), o(opts), A(size_t(m) * k), B(size_t(n) * k),
        sa(opts.block ? gemm_fp8::block_scale_a_count(m, k) : 1),
        sb(opts.block ? gemm_fp8::block_scale_b_count(n, k) : 1), C(size_t(m) * n), r(size_t(m) * n),
        s(size_t(m) * n) {
    if (o.sub_a) check::fill_fp8_subnormal(A.p, e5(o.ta), A.n, case_seed(1));
    else check::fill_fp8_uniform(A.p, e5(o.ta), A.n, case_seed(1), o.range);
    if (o.sub_b) check::fill_fp8_subnormal(B.p, e5(o.tb), B.n, case_seed(2));
    else check::fill_fp8_uniform(B.p, e5(o.tb), B.n, case_seed(2), o.range);
    check::fill_log_uniform(sa.p, sa.n, case_seed(3), o.scale_lo, o.scale_hi);
    check::fill_log_uniform(sb.p, sb.n, case_seed(4), o.scale_lo, o.scale_hi);
    if (o.expect_nonfinite) nonfinite_codes(A.p, B.p, o.tb, M, N, K);
  }
  // The reference of the current A, B and scales (r and s).
  void reference() {
    if (o.block) ref().run_block(A.p, e5(o.ta), B.p, e5(o.tb), M, N, K, sa.p, sb.p, r.p, s.p);
    else ref().run(A.p, e5(o.ta), B.p, e5(o.tb), M, N, K, sa.p, sb.p, r.p, s.p);
    check::sqrt_inplace(s.p, size_t(M) * N);
  }
  // weave on operand A `a` (A.p unless a test swaps in a faulty copy), C poisoned first.
  gemm_fp8::Options options() const {
    gemm_fp8::Options opt;
    opt.tile = o.tile;
    opt.lcsc.num_comm_sms = o.comm;
    opt.split_k = o.split_k;
    opt.tile_n = o.tile_n;
    opt.lane_scales = o.lane_scales;
    return opt;
  }
  lcsc::Plan call(const uint8_t* a) {
    check::poison(C.p, C.n);
    const gemm_fp8::Options opt = options();
    const lcsc::Plan p = o.block ? gemm_fp8::gemm_block_scaled(a, o.ta, B.p, o.tb, C.p, M, N, K, sa.p, sb.p, opt)
                                 : gemm_fp8::gemm(a, o.ta, B.p, o.tb, C.p, M, N, K, sa.p, sb.p, opt);
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    return p;
  }
  check::Report compare() {
    return check::compare({C.p, N}, {r.p, N}, {s.p, N}, M, N, bound_for(o, K));
  }
  std::string name() const {
    return std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " " + gemm_fp8::type_name(o.ta) +
           "x" + gemm_fp8::type_name(o.tb) + (o.block ? " block" : " tensor") + " tile " +
           (o.tile == Tile::M128Nw ? "128x" + std::to_string(o.tile_n) : gemm_fp8::tile_name(o.tile)) +
           (o.block && o.tile == Tile::Auto
                ? std::string("(") + gemm_fp8::launch_name(gemm_fp8::choose_block_launch(M, N, K, options())) + ")"
                : std::string()) +
           " scales [" + std::to_string(o.scale_lo) + ", " + std::to_string(o.scale_hi) + "]" +
           (o.sub_a ? " subA" : "") + (o.sub_b ? " subB" : "") + (o.comm ? " comm " + std::to_string(o.comm) : "") +
           (o.split_k ? " split " + std::to_string(o.split_k) : "") +
           (o.lane_scales ? " lane_scales " + std::to_string(o.lane_scales) : "");
  }
};

check::Report run_case(int M, int N, int K, const Opts& o) {
  Fp8Run c(M, N, K, o);
  SCOPED_TRACE(c.name());
  c.reference();
  c.call(c.A.p);
  const check::Report rep = c.compare();
  std::printf("check gemm_fp8 %s: %s\n", c.name().c_str(), rep.str().c_str());
  EXPECT_TRUE(rep.ok) << rep.str();
  if (!rep.ok && !o.block && o.tile != Tile::M128N128 && !o.expect_nonfinite) {
    // Every per-tensor tile sums an element's K in the same k32 steps in the same order, so the
    // 128x128 tile gives the same bits unless one of them is wrong: numerics (the bound) when it
    // fails alike, a kernel bug when it passes.
    c.o.tile = Tile::M128N128, c.o.split_k = 0;
    c.call(c.A.p);
    std::printf("  the same inputs on the 128x128 tile: %s\n", c.compare().str().c_str());
  }
  if (o.samples) check_samples(c.A.p, c.B.p, c.C.p, c.sa.p, c.sb.p, M, N, K, o, case_seed(5));
  return rep;
}

struct Shape {
  int M, N, K;
};
// Ragged in every dimension the kernel tiles (M, N not multiples of 128 or 64, K not of 128),
// plus tiny and exact shapes. K multiples of 16, N of 8.
const Shape kRagged[] = {{1000, 776, 528}, {16, 16, 16}, {1, 8, 32},     {129, 264, 144},   {128, 256, 128},
                         {255, 520, 1040}, {777, 1032, 4112}, {2048, 2048, 2048}, {3000, 136, 8192}};
// The per-tensor tiles with every type pair, and the block-scaled ones.
const Tile kTiles[] = {Tile::M128N256, Tile::M128N128, Tile::M64N128};
const Tile kBlockTiles[] = {Tile::M128N192, Tile::M128N128};

// NaN in A's row 5 and +-Inf in B's rows 9 and 10 (e5m2 B): the non-finite kinds match the
// reference's, all of C's row 5 is NaN and all of its column 9 Inf or NaN.
void check_nonfinite(int M, int N, int K, Opts o) {
  o.tb = Fp8::E5M2, o.expect_nonfinite = true;
  Fp8Run c(M, N, K, o);
  SCOPED_TRACE(c.name() + " with NaN / Inf inputs");
  c.reference();
  c.call(c.A.p);
  const check::Report rep = c.compare();  // non-finite kinds (NaN, +Inf, -Inf) must match
  std::printf("check gemm_fp8 %s with NaN/Inf inputs: %s\n", c.name().c_str(), rep.str().c_str());
  EXPECT_TRUE(rep.ok) << rep.str();
  std::vector<bf16> h(c.C.n);
  WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), c.C.p, h.size() * 2, cudaMemcpyDeviceToHost));
  int nan_row = 0, inf_col = 0;
  for (int j = 0; j < c.N; ++j) nan_row += std::isnan(__bfloat162float(h[size_t(5) * c.N + j]));
  for (int i = 0; i < c.M; ++i) inf_col += !std::isfinite(__bfloat162float(h[size_t(i) * c.N + 9]));
  EXPECT_EQ(nan_row, c.N) << "a NaN in A's row 5 must make all of C's row 5 NaN";
  EXPECT_EQ(inf_col, c.M) << "an Inf in B's row 9 must make all of C's column 9 Inf or NaN";
}

}  // namespace

TEST(GemmFp8, PerTensorRaggedShapesBothTiles) {
  for (Shape s : kRagged)
    for (Tile t : kTiles) {
      Opts o;
      o.tile = t;
      o.samples = double(s.M) * s.N * s.K < 1e9;
      run_case(s.M, s.N, s.K, o);
    }
}

// Split-K of the last partial round (the planner's choice with Auto, or forced on the 128x256
// tile): decode and narrow shapes, ragged K (a last K block cut short inside one split), e5m2, and
// NaN / Inf through the partial sums.
TEST(GemmFp8, PerTensorSplitK) {
  const Shape shapes[] = {{1, 4096, 11008}, {16, 1032, 4112}, {200, 776, 2064}, {129, 264, 8208}, {1000, 776, 528}};
  for (Shape s : shapes)
    for (int split : {0, 2, 3, 5})
      for (Tile t : {Tile::M128N256, Tile::M64N128}) {
        if (split == 0 && t == Tile::M64N128) continue;
        Opts o;
        o.tile = split == 0 ? Tile::Auto : t;
        o.split_k = split;
        o.samples = true;
        run_case(s.M, s.N, s.K, o);
      }
  for (Tile t : {Tile::M128N256, Tile::M64N128}) {
    Opts o;
    o.ta = Fp8::E5M2, o.tile = t, o.split_k = 4, o.range = 1000.f, o.samples = true;
    run_case(64, 1032, 4112, o);
    o = {};
    o.tile = t, o.split_k = 3;
    check_nonfinite(100, 264, 1040, o);
  }
}

// The 128 x w tiles (e4m3 x e4m3, per-tensor scales; dense output staging): every width on shapes
// ragged in M, N and K, N not a multiple of w, scales far from 1, and split-K of the last round.
TEST(GemmFp8, WideTiles) {
  for (int w : gemm::kWideWidths)
    for (Shape s : {Shape{200, 1000, 1040}, Shape{129, 392, 528}, Shape{256, 14336, 528}}) {
      Opts o;
      o.tile = Tile::M128Nw, o.tile_n = w, o.samples = true;
      run_case(s.M, s.N, s.K, o);
      o.scale_lo = 1e-3f, o.scale_hi = 1e3f, o.range = 448.f, o.split_k = 2;
      run_case(s.M, s.N, s.K, o);
    }
}

TEST(GemmFp8, E5m2Operands) {
  for (auto [ta, tb] : {std::pair{Fp8::E5M2, Fp8::E4M3}, std::pair{Fp8::E4M3, Fp8::E5M2}})
    for (Tile t : kTiles)
      for (Shape s : {Shape{1000, 776, 528}, Shape{255, 520, 4112}}) {
        Opts o;
        o.ta = ta, o.tb = tb, o.tile = t, o.samples = true;
        o.range = 1000.f;  // beyond e4m3's 448: e5m2 keeps the range (the e4m3 operand saturates)
        run_case(s.M, s.N, s.K, o);
      }
}

TEST(GemmFp8, ScalesOfVeryDifferentMagnitudes) {
  const std::pair<float, float> ranges[] = {{1e-3f, 1e-3f}, {1e3f, 1e3f}, {1e-3f, 1e3f}};
  for (auto [lo, hi] : ranges)
    for (Tile t : kTiles) {
      Opts o;
      o.tile = t, o.scale_lo = lo, o.scale_hi = hi, o.samples = true;
      o.range = 448.f;  // the whole e4m3 range: products up to 2e5, times scales up to 1e6
      run_case(1000, 776, 1040, o);
    }
}

TEST(GemmFp8, SubnormalInputs) {
  for (Tile t : kTiles) {
    Opts o;
    o.tile = t, o.samples = true;
    o.sub_a = true;  // e4m3 subnormals times normal B
    run_case(520, 776, 1040, o);
    o.sub_b = true, o.scale_lo = o.scale_hi = 1e3f;  // subnormal x subnormal, scaled back into range
    run_case(520, 776, 1040, o);
    o.tb = Fp8::E5M2;  // e5m2 subnormals (2^-16 .. 3 * 2^-16)
    run_case(520, 776, 1040, o);
  }
  Opts o;
  o.block = true, o.sub_a = true, o.samples = true, o.scale_lo = 1e-3f, o.scale_hi = 1e3f;
  run_case(520, 776, 1040, o);
}

TEST(GemmFp8, NanAndInfPropagate) {
  const auto run = [](bool block, Tile t) {
    Opts o;
    o.block = block, o.tile = t;
    check_nonfinite(300, 264, 528, o);
  };
  for (Tile t : kTiles) run(false, t);
  for (Tile t : kBlockTiles) run(true, t);
}

// The swapped decode tile (M <= 16, per-tensor scales): tokens around its 8-token blocks, N
// around its 16-row strips, K around its 256-byte chunks (16: one vector of one lane; 272 with
// two chunks in flight and one past K), every launch configuration on a 132-SM H200, all three
// operand type pairs, scales of very different magnitudes, and NaN / Inf.
TEST(GemmFp8, SwappedDecode) {
  const Shape shapes[] = {{1, 4104, 4112},  {5, 136, 16},     {8, 8, 32},        {2, 5000, 144},
                          {4, 11000, 528},  {3, 25352, 64},   {9, 11000, 528},   {12, 7176, 528},
                          {9, 4096, 1040},  {16, 392, 8208},  {16, 16904, 272},  {13, 2056, 1040}};
  for (Shape s : shapes)
    for (auto [ta, tb] : {std::pair{Fp8::E4M3, Fp8::E4M3}, std::pair{Fp8::E5M2, Fp8::E4M3},
                          std::pair{Fp8::E4M3, Fp8::E5M2}}) {
      Opts o;
      o.tile = Tile::Swapped, o.ta = ta, o.tb = tb, o.samples = true;
      if (e5(ta) || e5(tb)) o.range = 1000.f;
      run_case(s.M, s.N, s.K, o);
    }
  for (auto [lo, hi] : {std::pair{1e-3f, 1e-3f}, std::pair{1e-3f, 1e3f}}) {
    Opts o;
    o.tile = Tile::Swapped, o.scale_lo = lo, o.scale_hi = hi, o.range = 448.f, o.samples = true;
    run_case(16, 776, 1040, o);
  }
  Opts a;
  run_case(4, 14336, 4096, a);  // the planner's choice on a decode shape
  Opts o;
  o.tile = Tile::Swapped;
  check_nonfinite(9, 264, 528, o);
}

// Both block tiles. The 128x192 tile's columns straddle two 128-column scale blocks of B, split
// at its column 128 (even tile columns) or 64 (odd ones); N = 136 and 200 end inside the second
// block (its scale index clamped to the last block), 392 and 776 cut both kinds of tile short.
TEST(GemmFp8, BlockScaledRaggedShapes) {
  const Shape straddle[] = {{200, 136, 272}, {130, 200, 400}, {300, 392, 1040}, {64, 776, 528}};
  for (Tile t : kBlockTiles) {
    for (int lane : {1, 2})  // B's scales loaded uniform and per lane (the auto rule's two kernels)
      for (Shape s : straddle) {
        Opts o;
        o.block = true, o.tile = t, o.lane_scales = lane, o.scale_lo = 1e-3f, o.scale_hi = 1e3f, o.samples = true;
        run_case(s.M, s.N, s.K, o);
      }
    for (Shape s : kRagged) {
      Opts o;
      o.block = true, o.tile = t, o.scale_lo = 1e-3f, o.scale_hi = 1e3f;
      o.samples = double(s.M) * s.N * s.K < 1e9;
      run_case(s.M, s.N, s.K, o);
    }
    for (auto [ta, tb] : {std::pair{Fp8::E5M2, Fp8::E4M3}, std::pair{Fp8::E4M3, Fp8::E5M2}}) {
      Opts o;
      o.block = true, o.tile = t, o.ta = ta, o.tb = tb, o.range = 1000.f, o.samples = true;
      run_case(1000, 776, 1040, o);
    }
  }
}

// Split-K with block scales: the partials are promoted (scaled) fp32 sums, each split starts at
// its own K block (its B scales and A's stage scales from there). Forced splits on both tiles,
// with K ranges of 1, 2 and 3 blocks (the 128x128 kernel's loop runs blocks in pairs) and
// ragged M, N, K; the planner's choice on decode and narrow shapes; NaN / Inf through the partials.
TEST(GemmFp8, BlockScaledSplitK) {
  const Shape shapes[] = {{1, 4104, 4112}, {16, 776, 1040}, {64, 1032, 784}, {200, 392, 2064}, {130, 200, 400}};
  for (Tile t : kBlockTiles)
    for (int split : {2, 3, 5})
      for (Shape s : shapes) {
        Opts o;
        o.block = true, o.tile = t, o.split_k = split, o.scale_lo = 1e-3f, o.scale_hi = 1e3f, o.samples = true;
        run_case(s.M, s.N, s.K, o);
        o.lane_scales = 2;
        run_case(s.M, s.N, s.K, o);
      }
  for (Shape s : {Shape{1, 4096, 11008}, Shape{16, 14336, 4096}, Shape{128, 4096, 4096}, Shape{256, 7168, 18432}}) {
    Opts o;
    o.block = true, o.scale_lo = 1e-3f, o.scale_hi = 1e3f;
    run_case(s.M, s.N, s.K, o);
  }
  for (Tile t : kBlockTiles) {
    Opts o;
    o.block = true, o.tile = t, o.split_k = 3;
    check_nonfinite(100, 264, 1040, o);
  }
}

TEST(GemmFp8, RandomShapes) {
  std::mt19937 g(static_cast<unsigned>(case_seed(0)));
  for (int i = 0; i < 12; ++i) {
    Opts o;
    o.block = i % 3 == 2;
    run_case(1 + int(g() % 2000), 8 * (1 + int(g() % 250)), 16 * (1 + int(g() % 200)), o);
  }
}

TEST(GemmFp8, WithCommunicatorSms) {
  for (int comm : {1, 16}) {
    Opts o;
    o.comm = comm;
    run_case(2048, 3072, 1024, o);
    o.block = true;
    run_case(2048, 3072, 1024, o);
  }
}

TEST(GemmFp8, LargeSquare) {
  for (Tile t : kTiles) {
    Opts o;
    o.tile = t;
    run_case(8192, 8192, 8192, o);
  }
  Opts o;
  o.block = true, o.scale_lo = 1e-3f, o.scale_hi = 1e3f;
  run_case(8192, 8192, 8192, o);
  run_case(8191, 8200, 8208, o);  // ragged in every dimension
}

// The bound is only worth something if a wrong kernel breaks it: the kernel run on A with one
// 128-K block zeroed, against the reference of the intact A, must fail in every tile. Scales in
// [0.5, 2] so that no tile's missing block is scaled into insignificance.
TEST(GemmFp8, MissingKBlockFailsTheBound) {
  for (auto [block, tile] :
       {std::pair{false, Tile::Auto}, std::pair{true, kBlockTiles[0]}, std::pair{true, kBlockTiles[1]}}) {
    Opts o;
    o.block = block, o.tile = tile, o.scale_lo = 0.5f, o.scale_hi = 2.f;
    const int M = 1024, N = 1024, K = block ? 4096 : 8192;
    Fp8Run c(M, N, K, o);
    SCOPED_TRACE(c.name() + " with K block 3 of A zeroed");
    c.reference();
    c.call(c.A.p);
    const check::Report good = c.compare();
    EXPECT_TRUE(good.ok) << "intact inputs: " << good.str();
    DevBuf<uint8_t> faulty(c.A.n);
    WEAVE_CUDA_CHECK(cudaMemcpy(faulty.p, c.A.p, c.A.n, cudaMemcpyDeviceToDevice));
    WEAVE_CUDA_CHECK(cudaMemset2D(faulty.p + 3 * 128, K, 0, 128, M));
    c.call(faulty.p);
    const check::Report bad = c.compare();
    std::printf("check gemm_fp8 %s, K block 3 of A zeroed (must fail): %s\n", c.name().c_str(), bad.str().c_str());
    EXPECT_FALSE(bad.ok);
    EXPECT_EQ(bad.bad_tiles, bad.tiles) << "every tile misses the block, so every tile must fail: " << bad.str();
  }
}

TEST(GemmFp8, RejectsBadInput) {
  uint8_t* p = nullptr;
  float* f = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&p, 1 << 20));
  WEAVE_CUDA_CHECK(cudaMalloc(&f, 1 << 20));
  bf16* c = reinterpret_cast<bf16*>(p);
  auto expect_error = [](const char* what, const std::string& needle, auto&& fn) {
    try {
      fn();
      ADD_FAILURE() << what << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  const Fp8 e4 = Fp8::E4M3, e5 = Fp8::E5M2;
  expect_error("K = 100", "K = 100 is not a multiple of 16",
               [&] { gemm_fp8::gemm(p, e4, p, e4, c, 64, 64, 100, f, f); });
  expect_error("N = 12", "N = 12 is not a multiple of 8", [&] { gemm_fp8::gemm(p, e4, p, e4, c, 64, 12, 64, f, f); });
  expect_error("e5m2 x e5m2", "e5m2 x e5m2 is not supported",
               [&] { gemm_fp8::gemm(p, e5, p, e5, c, 64, 64, 64, f, f); });
  expect_error("misaligned A", "A (", [&] { gemm_fp8::gemm(p + 8, e4, p, e4, c, 64, 64, 64, f, f); });
  expect_error("misaligned C", "is not 16-byte aligned",
               [&] { gemm_fp8::gemm(p, e4, p, e4, reinterpret_cast<bf16*>(p + 2), 64, 64, 64, f, f); });
  expect_error("misaligned scale", "scale_b", [&] {
    gemm_fp8::gemm(p, e4, p, e4, c, 64, 64, 64, f, reinterpret_cast<const float*>(reinterpret_cast<uint8_t*>(f) + 2));
  });
  expect_error("null scale", "null scale pointer", [&] { gemm_fp8::gemm(p, e4, p, e4, c, 64, 64, 64, nullptr, f); });
  expect_error("host scale", "scale_a", [&] {
    static float host = 1.f;
    gemm_fp8::gemm(p, e4, p, e4, c, 64, 64, 64, &host, f);
  });
  gemm_fp8::Options big;
  big.tile = Tile::M128N256;
  expect_error("block scales on 128x256", "128x192 and 128x128 tiles only",
               [&] { gemm_fp8::gemm_block_scaled(p, e4, p, e4, c, 64, 64, 128, f, f, big); });
  gemm_fp8::Options sw;
  sw.tile = Tile::Swapped;
  expect_error("swapped tile, M = 17", "got M = 17", [&] { gemm_fp8::gemm(p, e4, p, e4, c, 17, 64, 64, f, f, sw); });
  expect_error("swapped block scales", "128x192 and 128x128 tiles only",
               [&] { gemm_fp8::gemm_block_scaled(p, e4, p, e4, c, 16, 64, 128, f, f, sw); });
  gemm_fp8::Options b192;
  b192.tile = Tile::M128N192;
  expect_error("per-tensor scales on 128x192", "gemm_block_scaled's",
               [&] { gemm_fp8::gemm(p, e4, p, e4, c, 64, 64, 64, f, f, b192); });
  gemm_fp8::Options wt;
  wt.tile = Tile::M128Nw, wt.tile_n = 144;
  expect_error("128 x w tile, e5m2 B", "e5m2 operand",
               [&] { gemm_fp8::gemm(p, e4, p, Fp8::E5M2, c, 64, 64, 64, f, f, wt); });
  wt.tile_n = 128;
  expect_error("128 x 128 as a w tile", "tile_n = 128", [&] { gemm_fp8::gemm(p, e4, p, e4, c, 64, 64, 64, f, f, wt); });
  gemm_fp8::Options comm;
  comm.lcsc.num_comm_sms = 100000;
  expect_error("num_comm_sms = 100000", "num_comm_sms",
               [&] { gemm_fp8::gemm(p, e4, p, e4, c, 64, 64, 64, f, f, comm); });
  // Each operand in turn shorter than the shape needs (p and f hold 1 MiB), the rest long enough.
  {
    const int M = 2048, N = 1024, K = 1024;  // A 2 MiB, B 1 MiB, C 4 MiB
    DevBuf<uint8_t> A(size_t(M) * K), B(size_t(N) * K);
    DevBuf<bf16> C(size_t(M) * N);
    expect_error("short A", "A needs", [&] { gemm_fp8::gemm(p, e4, B.p, e4, C.p, M, N, K, f, f); });
    expect_error("short C", "C needs", [&] { gemm_fp8::gemm(A.p, e4, B.p, e4, c, M, N, K, f, f); });
    expect_error("short B", "B needs", [&] { gemm_fp8::gemm(A.p, e4, p, e4, C.p, M, 2048, K, f, f); });
    // Block scales: scale_a needs ceil(K/128) * M floats (64 KB here), scale_b 64 floats; the last
    // float of f's 1 MiB allocation holds one (enough for a per-tensor scale, not for these).
    const float* tail = f + (1 << 18) - 1;
    DevBuf<float> sa(gemm_fp8::block_scale_a_count(M, K)), sb(gemm_fp8::block_scale_b_count(N, K));
    expect_error("short block scale_a", "scale_a needs",
                 [&] { gemm_fp8::gemm_block_scaled(A.p, e4, B.p, e4, C.p, M, N, K, tail, sb.p); });
    expect_error("short block scale_b", "scale_b needs",
                 [&] { gemm_fp8::gemm_block_scaled(A.p, e4, B.p, e4, C.p, M, N, K, sa.p, tail); });
  }
  cudaFree(p);
  cudaFree(f);
}
