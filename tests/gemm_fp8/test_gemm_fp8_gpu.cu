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
//
// transpose_fp8 (the gradient layouts, gemm_fp8/transpose.hpp): byte-exact against a host
// transpose, the destination poisoned so that every byte it must write differs from its poison,
// guard bytes around it checked untouched; dgrad and wgrad composed from it and the GEMM, checked
// against the reference of operands transposed on the host, and sampled in float64 from the
// untransposed forward-layout tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "check/device_buffer.hpp"
#include "check/error_of.hpp"
#include "check/gemm_fp8_ref.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "gemm_fp8/gemm_fp8.hpp"
#include "gemm_fp8/transpose.hpp"
#include "check/host_copy.hpp"

using namespace weave;
using bf16 = __nv_bfloat16;
using gemm_fp8::Fp8;
using gemm_fp8::Tile;

namespace {

template <class T>
using DevBuf = check::DeviceBuffer<T>;

using check::case_seed;

using check::fp8_gemm_ref;

struct Opts {
  Fp8 ta = Fp8::E4M3, tb = Fp8::E4M3;
  Tile tile = Tile::Auto;
  bool block = false;
  float scale_lo = 0.25f, scale_hi = 4.f;  // scales log-uniform in [lo, hi]
  float range = 4.f;                        // operands uniform in [-range, range) before rounding to fp8
  bool sub_a = false, sub_b = false;        // operands made of subnormal codes only
  int comm = 0;
  bool samples = false;
  bool expect_nonfinite = false;  // nonfinite_codes(): NaN in one operand's row 5, +-Inf in the other's rows 9, 10
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
// element is 0), as an IEEE float32 GEMM of the decoded values gives. With an e4m3 B and an e5m2
// A (the gradients' pair) the operands trade roles: NaN at B[5, 17], +-Inf at A[9, 40] and
// A[10, 41]; C's column 5 NaN, rows 9 and 10 +-Inf.
// Whether the non-finite codes trade roles: only A can hold an Inf (e5m2 A, e4m3 B).
bool roles_traded(Fp8 ta, Fp8 tb) { return e5(ta) && !e5(tb); }

void nonfinite_codes(void* A, void* B, Fp8 ta, Fp8 tb, int M, int N, int K) {
  const bool inf_in_a = roles_traded(ta, tb);
  void* const nan_op = inf_in_a ? B : A;
  void* const inf_op = inf_in_a ? A : B;
  const int nan_rows = inf_in_a ? N : M, inf_rows = inf_in_a ? M : N;
  if (nan_rows > 5 && K > 17) check::set_fp8(nan_op, size_t(5) * K + 17, 0x7f);
  if (e5(inf_in_a ? ta : tb) && inf_rows > 10 && K > 41) {
    check::set_fp8(inf_op, size_t(9) * K + 40, 0x7c);
    check::set_fp8(inf_op, size_t(10) * K + 41, 0xfc);
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
    if (o.expect_nonfinite) nonfinite_codes(A.p, B.p, o.ta, o.tb, M, N, K);
  }
  // The reference of the current A, B and scales (r and s).
  void reference() {
    if (o.block) fp8_gemm_ref().run_block(A.p, e5(o.ta), B.p, e5(o.tb), M, N, K, sa.p, sb.p, r.p, s.p);
    else fp8_gemm_ref().run(A.p, e5(o.ta), B.p, e5(o.tb), M, N, K, sa.p, sb.p, r.p, s.p);
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
           (o.tile == Tile::M128Nw ? "128x" + std::to_string(o.tile_n) : o.tile == Tile::SwappedW ? "sw128x" + std::to_string(o.tile_n) : std::string(gemm_fp8::tile_name(o.tile))) +
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

// NaN in A's row 5 and +-Inf in B's rows 9 and 10 (B made e5m2; with an e5m2 A, o.tb is kept and
// the operands trade roles, nonfinite_codes): the non-finite kinds match the reference's, all of C's
// row 5 is NaN and all of its column 9 Inf or NaN (C's column 5 and row 9 when they trade).
void check_nonfinite(int M, int N, int K, Opts o) {
  if (!e5(o.ta)) o.tb = Fp8::E5M2;
  o.expect_nonfinite = true;
  const bool traded = roles_traded(o.ta, o.tb);
  Fp8Run c(M, N, K, o);
  SCOPED_TRACE(c.name() + " with NaN / Inf inputs");
  c.reference();
  c.call(c.A.p);
  const check::Report rep = c.compare();  // non-finite kinds (NaN, +Inf, -Inf) must match
  std::printf("check gemm_fp8 %s with NaN/Inf inputs: %s\n", c.name().c_str(), rep.str().c_str());
  EXPECT_TRUE(rep.ok) << rep.str();
  std::vector<bf16> h(c.C.n);
  WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), c.C.p, h.size() * 2, cudaMemcpyDeviceToHost));
  const auto at = [&](int i, int j) { return __bfloat162float(h[size_t(i) * c.N + j]); };
  int nan_line = 0, inf_line = 0;
  const int nan_len = traded ? c.M : c.N, inf_len = traded ? c.N : c.M;
  for (int x = 0; x < nan_len; ++x) nan_line += std::isnan(traded ? at(x, 5) : at(5, x));
  for (int x = 0; x < inf_len; ++x) inf_line += !std::isfinite(traded ? at(9, x) : at(x, 9));
  EXPECT_EQ(nan_line, nan_len) << "a NaN in row 5 of one operand must make all of C's " << (traded ? "column" : "row")
                               << " 5 NaN";
  EXPECT_EQ(inf_line, inf_len) << "an Inf in row 9 of the other must make all of C's " << (traded ? "row" : "column")
                               << " 9 Inf or NaN";
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

// The 128 x w tiles (per-tensor scales; dense output staging): every width on shapes ragged in M, N
// and K, N not a multiple of w, scales far from 1, and split-K of the last round; e4m3 x e4m3, and
// the gradients' e5m2 x e4m3 (e5m2's range, NaN / Inf through the partial sums).
TEST(GemmFp8, WideTiles) {
  for (int w : gemm::kWideWidths)
    for (Shape s : {Shape{200, 1000, 1040}, Shape{129, 392, 528}, Shape{256, 14336, 528}}) {
      Opts o;
      o.tile = Tile::M128Nw, o.tile_n = w, o.samples = true;
      run_case(s.M, s.N, s.K, o);
      o.scale_lo = 1e-3f, o.scale_hi = 1e3f, o.range = 448.f, o.split_k = 2;
      run_case(s.M, s.N, s.K, o);
    }
  for (int w : gemm::kWideWidths) {
    Opts o;
    o.ta = Fp8::E5M2, o.tile = Tile::M128Nw, o.tile_n = w, o.samples = true, o.range = 1000.f;
    run_case(200, 1000, 1040, o);
    o.split_k = 3;
    run_case(129, 14336, 4112, o);
    Opts n;
    n.ta = Fp8::E5M2, n.tile = Tile::M128Nw, n.tile_n = w, n.split_k = 2;
    check_nonfinite(100, 264, 1040, n);
  }
}

// The swapped 128 x w tiles (e4m3 x e4m3, per-tensor scales; weights on the wgmma's M side, the
// tile stored transposed): every width on token counts below and at it, N off the 64- and 128-row
// grids, K ragged (a partial last K block) and whole, scales far from 1, split-K 2 and 3; several
// token tiles; and the planner's choice on forward rows of 12-900 tokens; then the gradients' e5m2 x
// e4m3 (e5m2 tokens on the kernel's N side) at every width, forced and split, with NaN / Inf, and the
// planner's choice on input-gradient rows of 144-917 tokens.
TEST(GemmFp8, SwappedWideTiles) {
  for (int w : gemm::kSwappedWidths)
    for (Shape s : {Shape{w > 32 ? w - 15 : 17, 14344, 1040}, Shape{w, 392, 512}, Shape{w - 3, 1000, 4112}}) {
      Opts o;
      o.tile = Tile::SwappedW, o.tile_n = w, o.samples = true;
      run_case(s.M, s.N, s.K, o);
      o.scale_lo = 1e-3f, o.scale_hi = 1e3f, o.range = 448.f, o.split_k = s.K > 1024 ? 3 : 2;
      run_case(s.M, s.N, s.K, o);
    }
  // Several token tiles, forced (M past the width, ragged) and as the planner picks them.
  for (auto [s, w] : {std::pair{Shape{300, 1000, 2048}, 160}, std::pair{Shape{521, 392, 1040}, 176},
                      std::pair{Shape{1001, 14344, 512}, 144}}) {
    Opts o;
    o.tile = Tile::SwappedW, o.tile_n = w, o.samples = true;
    run_case(s.M, s.N, s.K, o);
  }
  for (Shape s : {Shape{12, 14336, 4096}, Shape{77, 14336, 4096}, Shape{144, 8192, 2048}, Shape{176, 4104, 1040},
                  Shape{288, 14336, 4096}, Shape{520, 11008, 4096}, Shape{900, 11008, 4096}}) {
    Opts o;
    o.samples = true;
    run_case(s.M, s.N, s.K, o);
  }
  for (int w : gemm::kSwappedWidths) {
    Opts o;
    o.ta = Fp8::E5M2, o.tile = Tile::SwappedW, o.tile_n = w, o.samples = true, o.range = 1000.f;
    run_case(w > 32 ? w - 15 : 17, 14344, 1040, o);
    o.split_k = 3;
    run_case(w - 3, 1000, 4112, o);
    Opts n;
    n.ta = Fp8::E5M2, n.tile = Tile::SwappedW, n.tile_n = w, n.split_k = 2;
    check_nonfinite(w > 32 ? w - 7 : 20, 264, 1040, n);
  }
  for (Shape s : {Shape{144, 8192, 2048}, Shape{283, 28672, 5120}, Shape{566, 8192, 11008}, Shape{917, 18464, 5136}}) {
    Opts o;
    o.ta = Fp8::E5M2, o.samples = true, o.range = 1000.f;
    run_case(s.M, s.N, s.K, o);
  }
}

// The 128 x 256 tile in 2-CTA clusters (B multicast): the ragged shapes (odd and even tile-row
// counts: a cluster's second CTA past M), every type pair, split-K 2 and 3, communicator SMs, NaN /
// Inf; the planner's choice on rows with a K pitch off the 128-byte grid, and its refusal with an odd
// num_comm_sms.
TEST(GemmFp8, ClusterTile) {
  for (Shape s : kRagged) {
    Opts o;
    o.tile = Tile::M128N256C2, o.samples = true;
    run_case(s.M, s.N, s.K, o);
  }
  for (auto [ta, tb] : {std::pair{Fp8::E5M2, Fp8::E4M3}, std::pair{Fp8::E4M3, Fp8::E5M2}}) {
    Opts o;
    o.ta = ta, o.tb = tb, o.tile = Tile::M128N256C2, o.samples = true, o.range = 1000.f;
    run_case(300, 1000, 4112, o);
  }
  for (int split : {2, 3}) {
    Opts o;
    o.tile = Tile::M128N256C2, o.split_k = split, o.scale_lo = 1e-3f, o.scale_hi = 1e3f, o.samples = true;
    run_case(777, 1032, 4112, o);
    run_case(129, 14336, 1040, o);
  }
  Opts comm;
  comm.tile = Tile::M128N256C2, comm.comm = 8, comm.samples = true;
  run_case(1000, 776, 528, comm);
  Opts nf;
  nf.tile = Tile::M128N256C2, nf.split_k = 2;
  check_nonfinite(300, 264, 1040, nf);
  for (Shape s : {Shape{2089, 18480, 7152}, Shape{989, 8136, 10992}, Shape{8785, 14360, 4128}}) {
    Opts o;
    o.samples = true;
    EXPECT_EQ(gemm_fp8::choose_launch(s.M, s.N, s.K).tile, Tile::M128N256C2) << s.M << "x" << s.N << "x" << s.K;
    run_case(s.M, s.N, s.K, o);
  }
  Opts odd;
  odd.tile = Tile::M128N256C2, odd.comm = 7;
  Fp8Run c(256, 256, 528, odd);
  EXPECT_THROW(c.call(c.A.p), Error);
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
  expect_error("128 x w tile, e5m2 B", "and an e5m2 B",
               [&] { gemm_fp8::gemm(p, e4, p, Fp8::E5M2, c, 64, 64, 64, f, f, wt); });
  wt.tile_n = 128;
  expect_error("128 x 128 as a w tile", "tile_n = 128", [&] { gemm_fp8::gemm(p, e4, p, e4, c, 64, 64, 64, f, f, wt); });
  gemm_fp8::Options swt;
  swt.tile = Tile::SwappedW, swt.tile_n = 96;
  expect_error("swapped 128 x w tile, e5m2 B", "and an e5m2 B",
               [&] { gemm_fp8::gemm(p, e4, p, Fp8::E5M2, c, 64, 64, 64, f, f, swt); });
  swt.tile_n = 100;
  expect_error("swapped 128 x 100", "tile_n = 100", [&] { gemm_fp8::gemm(p, e4, p, e4, c, 64, 64, 64, f, f, swt); });
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

// ---- transpose_fp8 and the gradient layouts (gemm_fp8/transpose.hpp) -------------------------

namespace {

// Random bytes, every one of the 256 codes (the transpose copies bits: NaN and Inf codes too).
std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t w = g();
    for (size_t k = 0; k < 8 && i + k < n; ++k) v[i + k] = static_cast<uint8_t>(w >> (8 * k));
  }
  return v;
}

// rows x cols (row-major) transposed on the host, in 64 x 64 blocks.
template <class T>
std::vector<T> host_transpose(const std::vector<T>& a, int rows, int cols) {
  std::vector<T> t(a.size());
  for (int i0 = 0; i0 < rows; i0 += 64)
    for (int j0 = 0; j0 < cols; j0 += 64)
      for (int i = i0; i < std::min(rows, i0 + 64); ++i)
        for (int j = j0; j < std::min(cols, j0 + 64); ++j) t[size_t(j) * rows + i] = a[size_t(i) * cols + j];
  return t;
}

using check::to_device;
using check::to_host;

// One transpose_fp8 call on fresh random bytes, checked byte for byte. dst sits kGuard bytes into
// its allocation with kGuard more after it: each byte of dst is poisoned with the complement of
// the byte it must receive (one never written fails), the guards with a position-dependent
// pattern that must survive. Returns the device time of `timed` further calls (0 for none).
double check_transpose(int rows, int cols, int timed = 0) {
  constexpr size_t kGuard = 4096;
  const size_t n = size_t(rows) * cols;
  const std::vector<uint8_t> h = random_bytes(n, case_seed(1));
  const std::vector<uint8_t> want = host_transpose(h, rows, cols);
  DevBuf<uint8_t> src(n), buf(n + 2 * kGuard);
  to_device(src.p, h);
  std::vector<uint8_t> init(buf.n);
  const auto guard_byte = [](size_t i) { return static_cast<uint8_t>(0x5a ^ (i * 131) ^ (i >> 8)); };
  for (size_t i = 0; i < kGuard; ++i) init[i] = guard_byte(i), init[kGuard + n + i] = guard_byte(kGuard + n + i);
  for (size_t i = 0; i < n; ++i) init[kGuard + i] = static_cast<uint8_t>(~want[i]);
  to_device(buf.p, init);
  uint8_t* const dst = buf.p + kGuard;
  gemm_fp8::transpose_fp8(src.p, dst, rows, cols);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint8_t> got = to_host(buf.p, buf.n);
  size_t bad = 0, first = n, guard_bad = 0, first_guard = buf.n;
  for (size_t i = 0; i < n; ++i)
    if (got[kGuard + i] != want[i]) {
      if (bad++ == 0) first = i;
    }
  for (size_t i = 0; i < buf.n; ++i) {
    if (i == kGuard) i += n;
    if (got[i] != init[i] && guard_bad++ == 0) first_guard = i;
  }
  std::printf("check transpose_fp8 %dx%d: %zu of %zu bytes wrong, %zu guard bytes changed\n", rows, cols, bad, n,
              guard_bad);
  EXPECT_EQ(bad, 0u) << rows << "x" << cols << ": first wrong byte at dst[" << first / std::max(rows, 1) << ", "
                     << first % std::max(rows, 1) << "] (src[" << first % std::max(rows, 1) << ", "
                     << first / std::max(rows, 1) << "])";
  EXPECT_EQ(guard_bad, 0u) << rows << "x" << cols << ": a byte outside dst changed, at offset "
                           << static_cast<long long>(first_guard) - static_cast<long long>(kGuard)
                           << " from dst (dst is " << n << " bytes)";
  if (timed <= 0) return 0;
  cudaEvent_t e0, e1;
  WEAVE_CUDA_CHECK(cudaEventCreate(&e0));
  WEAVE_CUDA_CHECK(cudaEventCreate(&e1));
  gemm_fp8::transpose_fp8(src.p, dst, rows, cols);  // warm-up
  WEAVE_CUDA_CHECK(cudaEventRecord(e0));
  for (int i = 0; i < timed; ++i) gemm_fp8::transpose_fp8(src.p, dst, rows, cols);
  WEAVE_CUDA_CHECK(cudaEventRecord(e1));
  WEAVE_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  WEAVE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  WEAVE_CUDA_CHECK(cudaEventDestroy(e0));
  WEAVE_CUDA_CHECK(cudaEventDestroy(e1));
  // The timed calls rewrote dst with the same bytes: it must still be the transpose.
  EXPECT_TRUE(to_host(dst, n) == want) << rows << "x" << cols << ": dst changed over the timed calls";
  return 1e-3 * ms / timed;
}

// d_src (rows x cols) transposed on the host into d_out: a reference operand that shares nothing
// with transpose_fp8. Returns the transposed bytes.
std::vector<uint8_t> host_transposed_copy(const uint8_t* d_src, int rows, int cols, uint8_t* d_out) {
  std::vector<uint8_t> t = host_transpose(to_host(d_src, size_t(rows) * cols), rows, cols);
  to_device(d_out, t);
  return t;
}

// transpose_fp8(d_src) into a GEMM operand d_dst, poisoned with 0xFF first (NaN in e4m3 and e5m2:
// a byte the transpose never writes makes the GEMM's output NaN), and its bytes compared with the
// host's transpose so that a failure says which of the two steps broke.
void device_transpose(const uint8_t* d_src, uint8_t* d_dst, int rows, int cols, const std::vector<uint8_t>& want) {
  WEAVE_CUDA_CHECK(cudaMemset(d_dst, 0xff, want.size()));
  gemm_fp8::transpose_fp8(d_src, d_dst, rows, cols);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(to_host(d_dst, want.size()) == want) << "transpose_fp8 of " << rows << "x" << cols
                                                   << " differs from the host transpose";
}

// 256 sampled elements of the bf16 output C (rows x cols) against float64 dot products `dot(i, j,
// acc, sq)` computed from the forward-layout tensors on the host.
template <class Dot>
void check_sampled(const char* what, const bf16* dC, int rows, int cols, check::Bound b, uint64_t seed, Dot dot) {
  const std::vector<bf16> c = to_host(dC, size_t(rows) * cols);
  constexpr int kSamples = 256;
  std::mt19937_64 g(seed);
  std::vector<int> si(kSamples), sj(kSamples);
  std::vector<double> r(kSamples), s(kSamples);
  for (int t = 0; t < kSamples; ++t) {
    si[t] = int(g() % rows), sj[t] = int(g() % cols);
    double acc = 0, sq = 0;
    dot(si[t], sj[t], acc, sq);
    r[t] = acc, s[t] = std::sqrt(sq);
  }
  const check::Report rep = check::compare_host(
      1, kSamples, [&](long long, long long t) { return double(__bfloat162float(c[size_t(si[t]) * cols + sj[t]])); },
      [&](long long, long long t) { return r[t]; }, [&](long long, long long t) { return s[t]; }, b, 1, kSamples);
  std::printf("  %s, 256 float64 samples from the untransposed tensors: %s\n", what, rep.str().c_str());
  EXPECT_TRUE(rep.ok) << what << ", sampled float64 check from the untransposed tensors (column = sample): "
                      << rep.str();
}

// dgrad, dX = dY W: dY M x N_out (e5m2), W N_out x K_in (e4m3, nn.Linear's layout), dX M x K_in.
// transpose_fp8(W) gives W^T (K_in x N_out), the GEMM's B: gemm(dY, W^T) is M x K_in x N_out.
// Per-tensor scales, or block scales: dY's per (row, 128 columns) are scale_a as they are; W's
// 128 x 128 ones, drawn in the forward layout (ceil(N_out/128) x ceil(K_in/128)), transposed.
void check_dgrad(int M, int Nout, int Kin, bool block) {
  Opts o;
  o.ta = Fp8::E5M2, o.tb = Fp8::E4M3, o.block = block;
  if (block) o.scale_lo = 1e-3f, o.scale_hi = 1e3f;
  Fp8Run c(M, Kin, Nout, o);  // A = dY (drawn here), B = W^T (written by transpose_fp8 below)
  const std::string name = "dgrad M " + std::to_string(M) + ", N_out " + std::to_string(Nout) + ", K_in " +
                           std::to_string(Kin) + ": gemm " + c.name();
  SCOPED_TRACE(name);
  DevBuf<uint8_t> W(size_t(Nout) * Kin), Wt_ref(W.n);
  check::fill_fp8_uniform(W.p, false, W.n, case_seed(6), 448.f);
  const std::vector<uint8_t> wt = host_transposed_copy(W.p, Nout, Kin, Wt_ref.p);
  const int ob = (Nout + 127) / 128, ib = (Kin + 127) / 128;
  std::vector<float> sW;  // W's block scales, forward layout: sW[o * ib + i]
  if (block) {
    DevBuf<float> d(size_t(ob) * ib);
    check::fill_log_uniform(d.p, d.n, case_seed(7), o.scale_lo, o.scale_hi);
    sW = to_host(d.p, d.n);
    EXPECT_EQ(c.sb.n, sW.size());
    to_device(c.sb.p, host_transpose(sW, ob, ib));  // W^T's: scale_b[i * ob + o]
  }
  if (block) fp8_gemm_ref().run_block(c.A.p, true, Wt_ref.p, false, M, Kin, Nout, c.sa.p, c.sb.p, c.r.p, c.s.p);
  else fp8_gemm_ref().run(c.A.p, true, Wt_ref.p, false, M, Kin, Nout, c.sa.p, c.sb.p, c.r.p, c.s.p);
  check::sqrt_inplace(c.s.p, size_t(M) * Kin);
  device_transpose(W.p, c.B.p, Nout, Kin, wt);
  c.call(c.A.p);
  const check::Report rep = c.compare();
  std::printf("check gemm_fp8 %s: %s\n", name.c_str(), rep.str().c_str());
  EXPECT_TRUE(rep.ok) << rep.str();
  // dX[i, j] = sum_k sa dY[i, k] sW W[k, j], from dY and W as the forward pass holds them.
  const std::vector<uint8_t> dy = to_host(c.A.p, c.A.n), w = to_host(W.p, W.n);
  const std::vector<float> sa = to_host(c.sa.p, c.sa.n), sb = block ? sW : to_host(c.sb.p, 1);
  check_sampled("dgrad", c.C.p, M, Kin, bound_for(o, Nout), case_seed(8), [&](int i, int j, double& acc, double& sq) {
    for (int k = 0; k < Nout; ++k) {
      const double fa = block ? sa[size_t(k / 128) * M + i] : sa[0];
      const double fb = block ? sW[size_t(k / 128) * ib + j / 128] : sb[0];
      const double p = fa * check::fp8_to_double(dy[size_t(i) * Nout + k], true) * fb *
                       check::fp8_to_double(w[size_t(k) * Kin + j], false);
      acc += p, sq += p * p;
    }
  });
}

// wgrad, dW = dY^T X: dY M x N_out (e5m2), X M x K_in (e4m3), dW N_out x K_in. transpose_fp8 of
// both gives the token-major dY^T (N_out x M) and X^T (K_in x M): gemm(dY^T, X^T) is
// N_out x K_in x M. Per-tensor scales.
void check_wgrad(int M, int Nout, int Kin) {
  Opts o;
  o.ta = Fp8::E5M2, o.tb = Fp8::E4M3;
  Fp8Run c(Nout, Kin, M, o);  // A = dY^T, B = X^T: both written by transpose_fp8 below
  const std::string name = "wgrad M " + std::to_string(M) + ", N_out " + std::to_string(Nout) + ", K_in " +
                           std::to_string(Kin) + ": gemm " + c.name();
  SCOPED_TRACE(name);
  DevBuf<uint8_t> dY(size_t(M) * Nout), X(size_t(M) * Kin), dYt_ref(dY.n), Xt_ref(X.n);
  check::fill_fp8_uniform(dY.p, true, dY.n, case_seed(6), 1000.f);  // beyond e4m3's range: e5m2 keeps it
  check::fill_fp8_uniform(X.p, false, X.n, case_seed(7), 4.f);
  const std::vector<uint8_t> dyt = host_transposed_copy(dY.p, M, Nout, dYt_ref.p);
  const std::vector<uint8_t> xt = host_transposed_copy(X.p, M, Kin, Xt_ref.p);
  fp8_gemm_ref().run(dYt_ref.p, true, Xt_ref.p, false, Nout, Kin, M, c.sa.p, c.sb.p, c.r.p, c.s.p);
  check::sqrt_inplace(c.s.p, size_t(Nout) * Kin);
  device_transpose(dY.p, c.A.p, M, Nout, dyt);
  device_transpose(X.p, c.B.p, M, Kin, xt);
  c.call(c.A.p);
  const check::Report rep = c.compare();
  std::printf("check gemm_fp8 %s: %s\n", name.c_str(), rep.str().c_str());
  EXPECT_TRUE(rep.ok) << rep.str();
  // dW[i, j] = sum_t sa dY[t, i] sb X[t, j], from dY and X as the forward / backward pass holds them.
  const std::vector<uint8_t> dy = to_host(dY.p, dY.n), x = to_host(X.p, X.n);
  const double scale = double(to_host(c.sa.p, 1)[0]) * double(to_host(c.sb.p, 1)[0]);
  check_sampled("wgrad", c.C.p, Nout, Kin, bound_for(o, M), case_seed(8), [&](int i, int j, double& acc, double& sq) {
    for (int t = 0; t < M; ++t) {
      const double p = scale * check::fp8_to_double(dy[size_t(t) * Nout + i], true) *
                       check::fp8_to_double(x[size_t(t) * Kin + j], false);
      acc += p, sq += p * p;
    }
  });
}

}  // namespace

// Byte-exact against the host's transpose: a single 16 x 16 block, skinny shapes in both
// directions (one tile row or column, most of it outside the matrix), sizes that are multiples of
// 16 but not of the 128-byte tile, and 8192 x 8192 (64 MiB; its rate is printed, not checked).
TEST(GemmFp8, Fp8Transpose) {
  const std::pair<int, int> shapes[] = {{16, 16},     {48, 4096},  {4096, 48},    {1040, 528},
                                        {528, 1040},   {144, 272},  {2064, 1040},  {16, 32768},
                                        {32768, 16},   {128, 128},  {1008, 784}};
  for (auto [rows, cols] : shapes)
    for (int rep = 0; rep < 2; ++rep) check_transpose(rows, cols);  // twice: fresh bytes into a re-poisoned dst
  const int big = 8192;
  const double sec = check_transpose(big, big, 20);
  const double bytes = 2.0 * big * big;  // read once, written once
  std::printf("transpose_fp8 %dx%d: %.1f us per call, %.2f TB/s read + write (floor: %.0f MB / the HBM rate, "
              "~28 us at 4.8 TB/s)\n",
              big, big, sec * 1e6, bytes / sec * 1e-12, bytes * 1e-6);
}

// The two gradient GEMMs of a linear layer through transpose_fp8 + gemm_fp8 (transpose.hpp's
// recipe), e5m2 gradients x e4m3 weights / activations, on ragged shapes: N_out and K_in multiples
// of 16 but not of 128 (the GEMM's K, N and the scale blocks cut short), dgrad's M anything (M = 1:
// the decode tile), wgrad's M (its GEMM's K) a multiple of 16.
TEST(GemmFp8, Fp8GradientLayouts) {
  for (Shape s : {Shape{1000, 784, 528}, Shape{1, 4096, 1040}, Shape{130, 1040, 2064}, Shape{2048, 4096, 4096}})
    check_dgrad(s.M, s.N, s.K, false);
  for (Shape s : {Shape{1000, 784, 528}, Shape{256, 2064, 1040}}) check_dgrad(s.M, s.N, s.K, true);
  for (Shape s : {Shape{1008, 784, 528}, Shape{16, 784, 528}, Shape{4096, 1040, 2064}, Shape{8192, 512, 1024}})
    check_wgrad(s.M, s.N, s.K);
}

TEST(GemmFp8, Fp8TransposeRejectsBadInput) {
  DevBuf<uint8_t> p(1 << 20), small(4096);
  const auto expect_error = [](const char* what, const std::string& needle, auto&& fn) {
    const std::string e = check::error_of(fn);
    EXPECT_NE(e, "") << what << " accepted";
    EXPECT_NE(e.find(needle), std::string::npos) << what << ": " << e;
  };
  uint8_t* const a = p.p;
  uint8_t* const b = p.p + (1 << 19);  // a and b: 512 KiB each, 16-byte aligned
  using gemm_fp8::transpose_fp8;
  expect_error("rows = 100", "rows = 100 is not a multiple of 16", [&] { transpose_fp8(a, b, 100, 64); });
  expect_error("cols = 40", "cols = 40 is not a multiple of 16", [&] { transpose_fp8(a, b, 64, 40); });
  expect_error("rows = 0", "must be positive", [&] { transpose_fp8(a, b, 0, 64); });
  expect_error("cols = -16", "must be positive", [&] { transpose_fp8(a, b, 64, -16); });
  expect_error("null src", "null pointer", [&] { transpose_fp8(nullptr, b, 64, 64); });
  expect_error("null dst", "null pointer", [&] { transpose_fp8(a, nullptr, 64, 64); });
  expect_error("misaligned src", "is not 16-byte aligned", [&] { transpose_fp8(a + 8, b, 64, 64); });
  expect_error("misaligned src (named)", "src (", [&] { transpose_fp8(a + 8, b, 64, 64); });
  expect_error("misaligned dst", "is not 16-byte aligned", [&] { transpose_fp8(a, b + 4, 64, 64); });
  expect_error("misaligned dst (named)", "dst (", [&] { transpose_fp8(a, b + 4, 64, 64); });
  expect_error("in place", "overlap", [&] { transpose_fp8(a, a, 64, 64); });
  expect_error("dst inside src", "overlap", [&] { transpose_fp8(a, a + 4080, 64, 64); });  // 16 bytes shared
  expect_error("src inside dst", "overlap", [&] { transpose_fp8(b + 256, b, 64, 64); });
  expect_error("short dst", "dst needs", [&] { transpose_fp8(a, small.p, 128, 64); });  // 8192 bytes into 4096
  expect_error("short src", "src needs", [&] { transpose_fp8(small.p, a, 64, 128); });
  expect_error("src past the allocation's end", "src needs", [&] { transpose_fp8(b + (1 << 19) - 16, a, 16, 16); });
  alignas(16) static uint8_t host[4096];
  expect_error("host src", "not in device memory", [&] { transpose_fp8(host, a, 16, 16); });
  // Adjacent but not overlapping is fine.
  EXPECT_EQ(check::error_of([&] { transpose_fp8(a, a + 4096, 64, 64); }), "");
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
}
