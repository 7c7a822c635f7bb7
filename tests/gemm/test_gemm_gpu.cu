// GEMM against an independent float32 reference (cuBLASLt with fp32 output, check/gemm_ref.hpp)
// element by element, reported per 128 x 128 tile (check/tile_check.hpp), on fresh random inputs
// with outputs poisoned first: ragged shapes, both A and both B layouts, every tile, bf16 and fp32
// outputs, bf16 and fp32 bias, C += (bf16 and fp32), the 64 x 128 decode tile, communicator SMs
// withheld, NaN / Inf inputs (propagated as cuBLAS does), and the rejections. Small cases also check sampled elements against float64 dot
// products computed on the host. Inputs come from WEAVE_TEST_SEED (printed; set it to replay).
//
// Why the bound catches a tile that misses one K step (64 of K): with A, B uniform in [-1, 1)
// every product a*b has variance 1/9, so s = sqrt(sum_k a^2 b^2) ~ sqrt(K)/3 and the missing
// 64-step is a sum of 64 products, of standard deviation 8/3 = s * 8/sqrt(K). The bound for one
// bf16 rounding is 2^-8 |r| + 2^-10 s, about 0.005 s with |r| ~ s. At the largest K tested here
// (8192) the missing step is 0.088 s, ~18 bounds at one standard deviation; a 128 x 128 tile has
// 16384 such elements, so every tile that misses a step fails (and C += adds at most 2^-8 |C0|
// ~ 0.016 here, still far below 8/3 ~ 2.7 at any K). fp32 outputs have a bound without the 2^-8 |r|
// term (check::gemm_f32_bound); a bias (uniform in [-4, 4), fp32 ones not representable in
// bf16) is part of r, so a missing or misplaced bias column is off by ~2 = many bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "check/device_buffer.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "check/gemm_baseline.cuh"

using namespace weave;
using bf16 = __nv_bfloat16;

namespace {

template <class T>
using DevBuf = check::DeviceBuffer<T>;

using check::case_seed;

using check::gemm_ref;

// C = A*B: one bf16 rounding of an fp32 sum. C += A*B: two roundings (of A*B, then of the sum),
// 2^-8 |r| each, plus 2^-8 |C0| through check::add_abs_bf16's term (k = 4 times the bound's 2^-10).
check::Bound bound_for(bool accumulate) {
  check::Bound b = check::gemm_bound();
  if (accumulate) b.rel *= 2;
  return b;
}
constexpr float kC0Weight = 4.f;

float host_bf16(bf16 v) { return __bfloat162float(v); }

float host_val(bf16 v) { return __bfloat162float(v); }
float host_val(float v) { return v; }

// What a case runs: layouts, tile, epilogue.
struct Variant {
  gemm::ALayout al = gemm::ALayout::MK;
  gemm::BLayout bl = gemm::BLayout::KN;
  gemm::Tile tile = gemm::Tile::Auto;
  bool accumulate = false;
  bool f32_out = false;
  gemm::BiasType bias = gemm::BiasType::None;
  int comm = 0;
  bool samples = false;
  int split_k = 0;  // Options::split_k
  int tile_n = 0;   // Options::tile_n (Tile::M128Nw, SwappedW)
  int tile_cluster = 0;  // Options::tile_cluster (SwappedW)
  bool nonfinite = false;  // set_nonfinite(): NaN in A's row 5, +Inf / -Inf in B's columns 9 / 10
};

// NaN at A[5, 17], +Inf at B[40, 9] and -Inf at B[41, 10] (as the layouts store them): C's row 5
// becomes NaN, its columns 9 and 10 +-Inf (NaN where A's element at k = 40 / 41 is 0), as an IEEE
// float32 GEMM gives (the cuBLASLt reference computes the same).
void set_nonfinite(bf16* A, bf16* B, int M, int N, int K, const Variant& v) {
  auto put = [](bf16* p, size_t i, unsigned short bits) {
    WEAVE_CUDA_CHECK(cudaMemcpy(p + i, &bits, sizeof bits, cudaMemcpyHostToDevice));
  };
  const bool a_km = v.al == gemm::ALayout::KM, b_kn = v.bl == gemm::BLayout::KN;
  put(A, a_km ? size_t(17) * M + 5 : size_t(5) * K + 17, 0x7fc0);
  put(B, b_kn ? size_t(40) * N + 9 : size_t(9) * K + 40, 0x7f80);
  put(B, b_kn ? size_t(41) * N + 10 : size_t(10) * K + 41, 0xff80);
}

// Uniform in [-scale, scale) with 24 random bits: almost never a bf16 value, so a kernel that
// rounds an fp32 bias (or reads it as bf16) is caught.
__global__ void fill_f32_kernel(float* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(gemm::ref::mix(seed * 0x9e3779b97f4a7c15ull + i) >> 40) * (1.0f / 16777216.0f);
    p[i] = (2.f * u - 1.f) * scale;
  }
}
void fill_f32(float* p, size_t n, uint64_t seed, float scale) {
  fill_f32_kernel<<<1024, 256>>>(p, n, seed, scale);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

// 256 sampled elements of C against float64 dot products computed here, with the same bound.
// dC0 (C's value before C +=) and dBias may be null.
template <class OutT>
void check_samples(const bf16* dA, const bf16* dB, const OutT* dC, const OutT* dC0, const void* dBias, int M, int N,
                   int K, const Variant& v, check::Bound bound, uint64_t seed) {
  const gemm::BLayout bl = v.bl;
  std::vector<bf16> a(size_t(M) * K), b(size_t(K) * N);
  std::vector<OutT> c(size_t(M) * N), c0;
  std::vector<double> bias(N, 0.0);
  WEAVE_CUDA_CHECK(cudaMemcpy(a.data(), dA, a.size() * 2, cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaMemcpy(b.data(), dB, b.size() * 2, cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaMemcpy(c.data(), dC, c.size() * sizeof(OutT), cudaMemcpyDeviceToHost));
  if (dC0) {
    c0.resize(c.size());
    WEAVE_CUDA_CHECK(cudaMemcpy(c0.data(), dC0, c0.size() * sizeof(OutT), cudaMemcpyDeviceToHost));
  }
  if (v.bias == gemm::BiasType::F32) {
    std::vector<float> h(N);
    WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), dBias, N * sizeof(float), cudaMemcpyDeviceToHost));
    for (int j = 0; j < N; ++j) bias[j] = h[j];
  } else if (v.bias == gemm::BiasType::BF16) {
    std::vector<bf16> h(N);
    WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), dBias, N * sizeof(bf16), cudaMemcpyDeviceToHost));
    for (int j = 0; j < N; ++j) bias[j] = host_bf16(h[j]);
  }
  constexpr int kSamples = 256;
  std::mt19937_64 g(seed);
  std::vector<int> si(kSamples), sj(kSamples);
  std::vector<double> r(kSamples), s(kSamples);
  for (int t = 0; t < kSamples; ++t) {
    const int i = int(g() % M), j = int(g() % N);
    double acc = 0, sq = 0;
    for (int k = 0; k < K; ++k) {
      const double bv = bl == gemm::BLayout::KN ? host_bf16(b[size_t(k) * N + j]) : host_bf16(b[size_t(j) * K + k]);
      const double av = v.al == gemm::ALayout::KM ? host_bf16(a[size_t(k) * M + i]) : host_bf16(a[size_t(i) * K + k]);
      const double p = av * bv;
      acc += p;
      sq += p * p;
    }
    acc += bias[j];
    double sc = std::sqrt(sq);
    if (dC0) {
      const double cv = host_val(c0[size_t(i) * N + j]);
      acc += cv;
      if (!v.f32_out) sc += kC0Weight * std::fabs(cv);
    }
    si[t] = i, sj[t] = j, r[t] = acc, s[t] = sc;
  }
  const check::Report rep = check::compare_host(
      1, kSamples, [&](long long, long long t) { return double(host_val(c[size_t(si[t]) * N + sj[t]])); },
      [&](long long, long long t) { return r[t]; }, [&](long long, long long t) { return s[t]; }, bound, 1,
      kSamples);
  EXPECT_TRUE(rep.ok) << "sampled float64 check (column = sample): " << rep.str();
}

struct Case {
  int M, N, K;
};

std::string case_name(Case cs, const Variant& v) {
  const char* bias = v.bias == gemm::BiasType::F32 ? " bias f32" : v.bias == gemm::BiasType::BF16 ? " bias bf16" : "";
  return std::to_string(cs.M) + "x" + std::to_string(cs.N) + "x" + std::to_string(cs.K) +
         (v.al == gemm::ALayout::KM ? " A KM" : "") + (v.bl == gemm::BLayout::KN ? " KN" : " NK") + " tile " +
         (v.tile == gemm::Tile::M128Nw   ? "128x" + std::to_string(v.tile_n)
          : v.tile == gemm::Tile::SwappedW ? "sw128x" + std::to_string(v.tile_n) + (v.tile_cluster ? "c" + std::to_string(v.tile_cluster) : "")
          : v.tile == gemm::Tile::SwappedW256 ? "sw256x" + std::to_string(v.tile_n)
                                           : std::string(gemm::tile_name(v.tile))) +
         (v.split_k > 1 ? " k" + std::to_string(v.split_k) : "") + (v.f32_out ? " C fp32" : "") + bias + (v.accumulate ? " C+=" : "") + " comm " +
         std::to_string(v.comm);
}

template <class OutT>
void run_typed(Case cs, const Variant& v) {
  constexpr bool f32 = std::is_same_v<OutT, float>;
  const int M = cs.M, N = cs.N, K = cs.K;
  const size_t nc = size_t(M) * N;
  const std::string name = case_name(cs, v);
  SCOPED_TRACE(name);
  DevBuf<bf16> A(size_t(M) * K), B(size_t(K) * N), bias_b(v.bias == gemm::BiasType::BF16 ? N : 0);
  DevBuf<OutT> C(nc), C0(v.accumulate ? nc : 0);
  DevBuf<float> r(nc), s(nc), bias_f(v.bias == gemm::BiasType::F32 ? N : 0);
  gemm::ref::fill_uniform(A.p, A.n, case_seed(1));
  gemm::ref::fill_uniform(B.p, B.n, case_seed(2));
  if (v.nonfinite) set_nonfinite(A.p, B.p, M, N, K, v);
  const void* bias = nullptr;
  if (v.bias == gemm::BiasType::BF16) gemm::ref::fill_uniform(bias_b.p, N, case_seed(5), 4.f), bias = bias_b.p;
  if (v.bias == gemm::BiasType::F32) fill_f32(bias_f.p, N, case_seed(5), 4.f), bias = bias_f.p;
  if (v.accumulate) {
    if constexpr (f32) fill_f32(C.p, nc, case_seed(3), 4.f);
    else gemm::ref::fill_uniform(C.p, nc, case_seed(3), 4.f);
    WEAVE_CUDA_CHECK(cudaMemcpy(C0.p, C.p, nc * sizeof(OutT), cudaMemcpyDeviceToDevice));
  } else {
    check::poison(C.p, nc);
  }
  gemm_ref().run(A.p, B.p, M, N, K, v.al, v.bl, r.p, s.p);
  check::sqrt_inplace(s.p, nc);
  if (bias) check::add_bias(r.p, bias, v.bias == gemm::BiasType::F32, M, N);
  if (v.accumulate) {
    if constexpr (f32) {
      check::add_f32(r.p, C0.p, nc);
    } else {
      check::add_bf16(r.p, C0.p, nc);
      check::add_abs_bf16(s.p, C0.p, kC0Weight, nc);
    }
    WEAVE_CUDA_CHECK(cudaGetLastError());
  }
  gemm::Options o;
  o.tile = v.tile;
  o.accumulate = v.accumulate;
  o.lcsc.num_comm_sms = v.comm;
  o.a_layout = v.al;
  o.bias_type = v.bias;
  o.bias = bias;
  o.split_k = v.split_k;
  o.tile_n = v.tile_n;
  o.tile_cluster = v.tile_cluster;
  gemm::gemm(A.p, B.p, C.p, M, N, K, v.bl, o, nullptr);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  const check::Bound bound = f32 ? check::gemm_f32_bound() : bound_for(v.accumulate);
  const check::Report rep = check::compare({C.p, N}, {r.p, N}, {s.p, N}, M, N, bound);
  std::printf("check gemm %s: %s\n", name.c_str(), rep.str().c_str());
  EXPECT_TRUE(rep.ok) << rep.str();  // non-finite kinds (NaN, +Inf, -Inf) must match the reference's
  if (v.nonfinite) {
    std::vector<OutT> h(nc);
    WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), C.p, nc * sizeof(OutT), cudaMemcpyDeviceToHost));
    int nan_row = 0, inf_cols = 0;
    for (int j = 0; j < N; ++j) nan_row += std::isnan(host_val(h[size_t(5) * N + j]));
    for (int i = 0; i < M; ++i)
      inf_cols += !std::isfinite(host_val(h[size_t(i) * N + 9])) + !std::isfinite(host_val(h[size_t(i) * N + 10]));
    EXPECT_EQ(nan_row, N) << "a NaN in A's row 5 must make all of C's row 5 NaN";
    EXPECT_EQ(inf_cols, 2 * M) << "an Inf in B's columns 9 and 10 must make all of C's columns 9 and 10 Inf or NaN";
  }
  if (v.samples)
    check_samples<OutT>(A.p, B.p, C.p, v.accumulate ? C0.p : nullptr, bias, M, N, K, v, bound, case_seed(4));
}

void run_case(Case cs, const Variant& v) {
  if (v.f32_out) run_typed<float>(cs, v);
  else run_typed<bf16>(cs, v);
}

void run_case(Case cs, gemm::BLayout bl, gemm::Tile tile, bool accumulate, int comm, bool samples) {
  Variant v;
  v.bl = bl, v.tile = tile, v.accumulate = accumulate, v.comm = comm, v.samples = samples;
  run_case(cs, v);
}

const gemm::BLayout kLayouts[] = {gemm::BLayout::KN, gemm::BLayout::NK};
const gemm::Tile kTiles[] = {gemm::Tile::M128N256, gemm::Tile::M128N128, gemm::Tile::M128N256S4,
                             gemm::Tile::M128N256C2, gemm::Tile::M64N128, gemm::Tile::M128N192,
                             gemm::Tile::M128N320C2};
// The tiles that take every A layout and epilogue.
const gemm::Tile kMainTiles[] = {gemm::Tile::M128N256, gemm::Tile::M128N128, gemm::Tile::M64N128};
const gemm::ALayout kALayouts[] = {gemm::ALayout::MK, gemm::ALayout::KM};

template <class E, class F>
void expect_error(F&& f, const char* what, const char* needle) {
  try {
    f();
    ADD_FAILURE() << what << " accepted";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
  }
}

}  // namespace

// NaN and +-Inf inputs propagate as in cuBLAS (an IEEE float32 GEMM): the planner's tile and the
// main tiles, both A and both B layouts, fp32 output and C +=, split-K, on ragged shapes.
TEST(Gemm, NonFiniteInputsPropagate) {
  for (gemm::Tile t : {gemm::Tile::Auto, gemm::Tile::M128N256, gemm::Tile::M128N128, gemm::Tile::M64N128})
    for (gemm::ALayout al : kALayouts)
      for (gemm::BLayout bl : kLayouts) {
        Variant v;
        v.tile = t, v.al = al, v.bl = bl, v.nonfinite = true;
        run_case({304, 264, 520}, v);  // M a multiple of 8 (A stored K x M), not of a tile
      }
  Variant f32;
  f32.nonfinite = true, f32.f32_out = true;
  run_case({129, 136, 1032}, f32);
  Variant acc;
  acc.nonfinite = true, acc.accumulate = true, acc.bl = gemm::BLayout::NK;
  run_case({200, 520, 264}, acc);
  Variant split;
  split.nonfinite = true, split.split_k = 4, split.bl = gemm::BLayout::NK;
  run_case({16, 1032, 4096}, split);
  Variant decode;
  decode.nonfinite = true, decode.bl = gemm::BLayout::NK;
  run_case({8, 4096, 1024}, decode);
}

TEST(Gemm, RaggedShapesBothLayoutsBothTiles) {
  const Case cases[] = {{1000, 776, 520}, {8, 8, 8}, {1, 8, 64}, {129, 264, 72}, {128, 256, 64},
                        {255, 520, 1032}, {777, 1032, 136}, {2048, 2048, 2048}, {3000, 136, 4104}};
  for (Case c : cases)
    for (auto bl : kLayouts)
      for (auto t : kTiles) run_case(c, bl, t, false, 0, c.M * double(c.N) * c.K < 1e9);
}

TEST(Gemm, RandomShapes) {
  std::mt19937 g(static_cast<unsigned>(case_seed(0)));
  for (int i = 0; i < 12; ++i) {
    const Case c{1 + int(g() % 2000), 8 * (1 + int(g() % 250)), 8 * (1 + int(g() % 250))};
    run_case(c, kLayouts[i % 2], gemm::Tile::Auto, false, 0, false);
  }
}

TEST(Gemm, Accumulate) {
  for (auto bl : kLayouts)
    for (auto t : kTiles) run_case({1000, 776, 520}, bl, t, true, 0, true);
  run_case({4096, 4096, 1024}, gemm::BLayout::NK, gemm::Tile::Auto, true, 0, false);
  run_case({1000, 1032, 8200}, gemm::BLayout::KN, gemm::Tile::Auto, true, 0, false);  // ragged, long K
}

TEST(Gemm, WithCommunicatorSms) {
  for (int comm : {1, 8, 16, 32}) run_case({2048, 3072, 1024}, gemm::BLayout::KN, gemm::Tile::Auto, false, comm, false);
  for (int comm : {2, 16}) run_case({2048, 3072, 1024}, gemm::BLayout::NK, gemm::Tile::M128N256C2, false, comm, false);
  for (int comm : {2, 16}) run_case({2048, 3072, 1024}, gemm::BLayout::KN, gemm::Tile::M128N320C2, false, comm, false);
}

TEST(Gemm, LargeSquare) {
  for (auto bl : kLayouts) run_case({8192, 8192, 8192}, bl, gemm::Tile::Auto, false, 0, false);
  for (auto bl : kLayouts) run_case({8192, 8192, 8192}, bl, gemm::Tile::M128N256C2, false, 0, false);
  // The 320-column pair on misaligned pitches: N = 8200 leaves 200 columns in the last tile (its
  // second output part 8 of 128), 8184 a last tile of 184 (the second part empty).
  for (auto bl : kLayouts) run_case({8191, 8200, 8200}, bl, gemm::Tile::M128N320C2, false, 0, false);
  run_case({10029, 8184, 4104}, gemm::BLayout::NK, gemm::Tile::M128N320C2, false, 0, false);
  run_case({8191, 8200, 8200}, gemm::BLayout::NK, gemm::Tile::Auto, false, 0, false);  // ragged in every dimension
}

// A stored K x M (the weight gradient dY^T X): ragged shapes (M a multiple of 8, as it must be),
// M below one 64-row box, both B layouts, the main tiles, the 2-CTA cluster tile (odd tile-row
// counts: 40, 136 + 128, 3000 rows) and Auto.
TEST(Gemm, TransposedA) {
  const Case cases[] = {{1000, 776, 520}, {8, 8, 8},       {40, 8, 64},      {136, 264, 72},  {128, 256, 64},
                        {256, 520, 1032}, {776, 1032, 136}, {2048, 2048, 2048}, {3000, 136, 4104}, {264, 776, 1032}};
  for (Case c : cases)
    for (auto bl : kLayouts)
      for (auto t : {gemm::Tile::M128N256, gemm::Tile::M128N128, gemm::Tile::M64N128, gemm::Tile::M128N256C2,
                     gemm::Tile::M128N320C2, gemm::Tile::Auto}) {
        Variant v;
        v.al = gemm::ALayout::KM, v.bl = bl, v.tile = t, v.samples = c.M * double(c.N) * c.K < 1e9;
        run_case(c, v);
      }
}

TEST(Gemm, TransposedARandomShapes) {
  std::mt19937 g(static_cast<unsigned>(case_seed(0)));
  for (int i = 0; i < 8; ++i) {
    const Case c{8 * (1 + int(g() % 250)), 8 * (1 + int(g() % 250)), 8 * (1 + int(g() % 250))};
    Variant v;
    v.al = gemm::ALayout::KM, v.bl = kLayouts[i % 2];
    run_case(c, v);
  }
}

// Weight-gradient shapes: M = out, N = in, K = tokens (long K), B = X as K x N; and C += for
// gradient accumulation across micro-batches, into bf16 and fp32.
TEST(Gemm, TransposedALarge) {
  Variant v;
  v.al = gemm::ALayout::KM;
  run_case({4096, 4096, 8192}, v);
  run_case({4104, 1032, 8200}, v);  // ragged: every pitch off the 128-byte grid (Auto: the cluster tile)
  v.tile = gemm::Tile::M128N256C2;
  run_case({4152, 2056, 1032}, v);
  v.tile = gemm::Tile::M128N320C2;
  run_case({4152, 2056, 1032}, v);
  v.accumulate = true;
  run_case({4104, 1032, 8200}, v);
  v.accumulate = false;
  v.tile = gemm::Tile::Auto;
  v.accumulate = true;
  run_case({2048, 4096, 4096}, v);
  v.f32_out = true;
  run_case({2048, 4096, 4096}, v);
  v.bl = gemm::BLayout::NK;
  run_case({4096, 4096, 8192}, v);
}

// C in fp32, both A and B layouts, both main tiles, ragged (the last 32-column staging block of
// a row cut by N), with and without C +=.
TEST(Gemm, Fp32Output) {
  const Case cases[] = {{1000, 776, 520}, {8, 8, 8}, {136, 264, 72}, {256, 520, 1032}, {2048, 2048, 2048}};
  for (Case c : cases)
    for (auto al : kALayouts)
      for (auto bl : kLayouts)
        for (auto t : kMainTiles)
          for (bool acc : {false, true}) {
            Variant v;
            v.al = al, v.bl = bl, v.tile = t, v.f32_out = true, v.accumulate = acc;
            v.samples = c.M * double(c.N) * c.K < 1e9;
            run_case(c, v);
          }
  Variant v;
  v.f32_out = true, v.bl = gemm::BLayout::NK;
  run_case({1, 8, 64}, v);  // M = 1, A M x K
  run_case({8191, 8200, 8200}, v);
}

// Bias (bf16 and fp32) into bf16 and fp32 outputs, with and without C +=, both A layouts and B
// layouts, both main tiles; ragged N so that the last tile column holds fewer bias values.
TEST(Gemm, Bias) {
  const Case cases[] = {{1000, 776, 520}, {136, 264, 72}, {520, 1032, 136}};
  for (Case c : cases)
    for (auto bias : {gemm::BiasType::BF16, gemm::BiasType::F32})
      for (bool f32 : {false, true})
        for (auto al : kALayouts)
          for (auto bl : kLayouts)
            for (auto t : kMainTiles) {
              Variant v;
              v.al = al, v.bl = bl, v.tile = t, v.f32_out = f32, v.bias = bias, v.samples = true;
              v.accumulate = (static_cast<int>(al) + static_cast<int>(bl) + static_cast<int>(t)) % 2 == 1;
              run_case(c, v);
            }
  Variant v;
  v.bias = gemm::BiasType::F32, v.f32_out = true, v.al = gemm::ALayout::KM;
  run_case({4096, 4096, 4096}, v);
  v.f32_out = false, v.bias = gemm::BiasType::BF16, v.al = gemm::ALayout::MK, v.bl = gemm::BLayout::NK;
  run_case({4096, 4096, 4096}, v);
}

// The 64 x 128 tile on decode shapes (M <= 64: one tile row, consumers splitting N), every A
// and B layout and epilogue; larger M is in the ragged and accumulate tests.
TEST(Gemm, DecodeTile) {
  const Case cases[] = {{1, 4096, 4096}, {16, 11008, 4096}, {64, 5120, 13824}, {7, 14344, 4104}, {64, 136, 72}};
  for (Case c : cases)
    for (auto bl : kLayouts) {
      Variant v;
      v.bl = bl, v.tile = gemm::Tile::M64N128, v.samples = true;
      run_case(c, v);
      if (c.M % 8 == 0) {
        v.al = gemm::ALayout::KM;
        run_case(c, v);
      }
      v.f32_out = true, v.bias = gemm::BiasType::F32, v.accumulate = true;
      run_case(c, v);
      v.f32_out = false, v.bias = gemm::BiasType::BF16;
      run_case(c, v);
    }
  Variant v;
  v.tile = gemm::Tile::M64N128;
  for (int comm : {1, 16}) {
    v.comm = comm;
    run_case({64, 8192, 2048}, v);
  }
}

// The swapped decode tile (W as N x K on the mma's M side, M <= 16 tokens): token counts around
// its 8-token blocks, N around its 16-row strips (8, 392, 11000: a half strip; 392 with two
// strips per block leaves one wholly past N), K around its 128-wide chunks (8: one vector of one
// lane; 72; 264 with two chunks in flight and one past K), every launch configuration on a
// 132-SM H200 (swapped::config: 1 token block at 16, 8, 4 and 8 warps for many strips; 2 token
// blocks with 1 strip at 16 and 8 warps and 2 strips at 4 and 8), every epilogue; and the
// planner's choice on a decode shape.
TEST(Gemm, SwappedTile) {
  const Case cases[] = {{1, 4104, 4104},  {3, 8, 72},       {8, 136, 8},      {2, 5000, 136},
                        {5, 11000, 1032}, {3, 25352, 72},   {9, 4096, 1032},  {16, 11008, 4096},
                        {12, 7176, 264},  {13, 2056, 520},  {16, 392, 8200},  {10, 16904, 264}};
  for (Case c : cases) {
    Variant v;
    v.bl = gemm::BLayout::NK, v.tile = gemm::Tile::Swapped, v.samples = true;
    run_case(c, v);
    v.f32_out = true, v.bias = gemm::BiasType::F32, v.accumulate = true;
    run_case(c, v);
    v.f32_out = false, v.bias = gemm::BiasType::BF16;
    run_case(c, v);
    v.accumulate = false, v.f32_out = true, v.bias = gemm::BiasType::None;
    run_case(c, v);
  }
  Variant v;
  v.bl = gemm::BLayout::NK;
  run_case({4, 14336, 4096}, v);
}

// The bf16-output epilogues a tile with A M x K takes, on variant v's tile: plain, fp32 bias with
// C +=, bf16 bias, and split-K 2 and 3 of the last partial round.
void run_bf16_epilogues(Case c, Variant v) {
  v.samples = true;
  run_case(c, v);
  v.bias = gemm::BiasType::F32, v.accumulate = true;
  run_case(c, v);
  v.bias = gemm::BiasType::BF16, v.accumulate = false;
  run_case(c, v);
  v.bias = gemm::BiasType::None;
  for (int s : {2, 3}) {
    v.split_k = s;
    run_case(c, v);
  }
}

// The 128 x 192 tile (A M x K, bf16 output): ragged N around its 192-column edge, both B layouts
// (rows the planner may pick it for).
TEST(Gemm, MidTile) {
  const Case cases[] = {{200, 4104, 1032}, {129, 392, 520}, {1000, 776, 4104}, {256, 14336, 520}};
  for (Case c : cases)
    for (auto bl : kLayouts) {
      Variant v;
      v.bl = bl, v.tile = gemm::Tile::M128N192;
      run_bf16_epilogues(c, v);
    }
}

// The 128 x w tiles (A M x K, B N x K, bf16 output; dense staging when w is off the 64-column
// grid): every width on shapes ragged in M, N and K, N not a multiple of w.
TEST(Gemm, WideTiles) {
  const Case cases[] = {{200, 1000, 1032}, {129, 392, 520}, {256, 14336, 520}};
  for (int w : gemm::kWideWidths)
    for (Case c : cases) {
      Variant v;
      v.bl = gemm::BLayout::NK, v.tile = gemm::Tile::M128Nw, v.tile_n = w;
      run_bf16_epilogues(c, v);
    }
}

// The swapped 128 x w tile of width w forced on one case: plain, C +=, split-K 2 and 3 (C += on 3).
void run_swapped_epilogues(Case c, gemm::BLayout bl, int w) {
  Variant v;
  v.bl = bl, v.tile = gemm::Tile::SwappedW, v.tile_n = w, v.samples = true;
  run_case(c, v);
  v.accumulate = true;
  run_case(c, v);
  for (int s : {2, 3}) {
    v.split_k = s, v.accumulate = s == 3;
    run_case(c, v);
  }
}

// The swapped 128 x w tiles (weights on the wgmma's M side, the tile stored transposed; A M x K,
// B N x K, bf16 output without bias): every width on token counts below, at and above it (more
// than one token tile), N off the 128- and 64-row grids (a half-empty second staging block, an
// odd count of weight panels for the clusters), K ragged and aligned (2-CTA clusters and single
// CTAs); plain, C +=, split-K 2 and 3 (also with C +=), communicator SMs; the rejected epilogues;
// two to eight token tiles, forced clusters both ways, split 3 and 4 (104 and 120, which run in
// single CTAs only, on a misaligned pitch too); and the planner's choice on forward rows of 1-1000
// tokens (300 x 4096 x 14336: two token tiles split twice; 300 x 5120 x 13824: 3 x 104; 101 tokens on
// a misaligned pitch: 112 in clusters, not 104; 1-16 tokens on 32-64 weight panels).
TEST(Gemm, SwappedWideTiles) {
  for (int w : gemm::kSwappedWidths) {
    // K off the 64 grid runs in 2-CTA clusters (the token tile multicast), K on it in single CTAs.
    const Case cases[] = {{w > 32 ? w - 15 : 17, 14344, 1032}, {w, 392, 512}, {w + 9 <= 192 ? w + 9 : 192, 1000, 4104},
                          {w - 3, 4104, 2048}};
    for (Case c : cases) {
      run_swapped_epilogues(c, gemm::BLayout::NK, w);
      Variant v;
      v.bl = gemm::BLayout::NK, v.tile = gemm::Tile::SwappedW, v.tile_n = w, v.samples = true, v.comm = 8;
      run_case(c, v);
    }
  }
  bf16* p = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&p, 1 << 22));
  gemm::Options o;
  o.tile = gemm::Tile::SwappedW, o.tile_n = 96;
  o.tile_cluster = 3;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 577, 128, 64, gemm::BLayout::NK, o); }, "tile_cluster 3",
                      "tile_cluster must be 0, 1, 2 or 4");
  o.tile_cluster = 0;
  expect_error<Error>([&] { gemm::gemm(p, p, reinterpret_cast<float*>(p), 64, 128, 64, gemm::BLayout::NK, o); },
                      "fp32 output", "an fp32 output");
  o.bias_type = gemm::BiasType::BF16, o.bias = p;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 64, 128, 64, gemm::BLayout::NK, o); }, "bias", "a bias");
  o.bias_type = gemm::BiasType::None, o.bias = nullptr, o.tile_n = 100;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 64, 128, 64, gemm::BLayout::NK, o); }, "tile_n 100", "tile_n = 100");
  o.tile_n = 104, o.tile_cluster = 2;  // half of 104 token rows is not whole 8-row swizzle atoms
  expect_error<Error>([&] { gemm::gemm(p, p, p, 64, 128, 1032, gemm::BLayout::NK, o); }, "clusters at 104",
                      "single CTAs only");
  WEAVE_CUDA_CHECK(cudaFree(p));
  // Two to eight token tiles (257-1500 tokens), forced and as the planner picks them, single CTAs and
  // 2-CTA clusters (cluster 0: as the pitch decides; 1 and 2 forced either way).
  struct Forced {
    Case c;
    int w;
    int cluster;
  };
  for (Forced f : {Forced{{300, 14344, 1032}, 160, 0}, Forced{{257, 392, 4104}, 160, 0},
                   Forced{{320, 1000, 2048}, 160, 0}, Forced{{288, 4104, 1032}, 96, 0},
                   Forced{{401, 1000, 2048}, 160, 0}, Forced{{576, 392, 520}, 192, 0},
                   Forced{{521, 1000, 2048}, 176, 0}, Forced{{1001, 392, 1032}, 144, 2},
                   Forced{{1100, 4104, 1032}, 160, 1}, Forced{{1497, 1000, 520}, 192, 0},
                   Forced{{300, 5120, 1032}, 104, 0}, Forced{{239, 1000, 2048}, 120, 0}}) {
    Variant v;
    v.bl = gemm::BLayout::NK, v.tile = gemm::Tile::SwappedW, v.tile_n = f.w, v.samples = true;
    v.tile_cluster = f.cluster;
    run_case(f.c, v);
    v.accumulate = true;
    run_case(f.c, v);
    for (int s : {3, 4}) {  // the last partial round's items over several token tiles split (C += too)
      v.split_k = s;
      run_case(f.c, v);
    }
  }
  for (Case c : {Case{17, 14336, 4096}, Case{77, 14344, 4104}, Case{128, 8192, 2048}, Case{200, 4104, 1032},
                 Case{256, 14336, 520}, Case{300, 14336, 4096}, Case{288, 14344, 4104}, Case{288, 5120, 13824},
                 Case{448, 11008, 4096}, Case{140, 8192, 2048}, Case{170, 14336, 4096}, Case{520, 14336, 4096},
                 Case{900, 11008, 4096}, Case{1000, 13832, 5128}, Case{136, 5120, 13824}, Case{300, 4096, 14336},
                 Case{800, 4096, 14336}, Case{300, 5120, 13824}, Case{112, 14336, 4096}, Case{232, 8192, 8192},
                 Case{101, 14344, 4104},
                 // 1-16 decode tokens on either side of the sm_count / 3 panels rule (on an H100 or
                 // H200 44 panels take the 128 x 32 tile and 32 keep the mma.sync tile).
                 Case{12, 5632, 4096}, Case{16, 8192, 2048}, Case{9, 7168, 1024}, Case{16, 4096, 2048},
                 Case{1, 8192, 2048}, Case{3, 5632, 1032}, Case{8, 7168, 4096}, Case{5, 4096, 2048}}) {
    Variant v;
    v.bl = gemm::BLayout::NK;
    run_case(c, v);
  }
}

// The swapped 128 x w tiles in 4-CTA clusters (each CTA loads a quarter of the token tile and
// multicasts it), forced at every width that has them: token counts that leave the last quarters of
// the token tile wholly past M, a weight panel count that is not a multiple of 4 (the cluster's last
// CTAs past the weights), two token tiles, pitches on and off the 128-byte grid; plain, C +=,
// split-K 2 and 3, communicator SMs; and the rejected combinations.
TEST(Gemm, SwappedWideTilesQuads) {
  for (int w : gemm::kSwappedWidths) {
    if (!gemm::swapped_width_quads(w)) continue;
    const Case cases[] = {{w > 32 ? w - 29 : 3, 14344, 1032}, {w, 392, 4104}, {w + 9, 1000, 2048}, {w - 5, 5128, 1096}};
    for (Case c : cases) {
      Variant v;
      v.bl = gemm::BLayout::NK, v.tile = gemm::Tile::SwappedW, v.tile_n = w, v.tile_cluster = 4, v.samples = true;
      run_case(c, v);
      v.accumulate = true;
      run_case(c, v);
      for (int sp : {2, 3}) {  // split items of clusters of 4 (C += on 3)
        v.split_k = sp, v.accumulate = sp == 3;
        run_case(c, v);
      }
      v.split_k = 0, v.accumulate = false, v.comm = 8;
      run_case(c, v);
    }
  }
  bf16* p = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&p, 1 << 22));
  gemm::Options o;
  o.tile = gemm::Tile::SwappedW, o.tile_n = 112, o.tile_cluster = 4;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 64, 128, 1032, gemm::BLayout::NK, o); }, "quads at 112",
                      "a width that is a multiple of 32");
  o.tile_n = 96;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 64, 128, 1032, gemm::BLayout::KN, o); }, "quads K x N", "B as N x K");
  o.lcsc.num_comm_sms = 2;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 64, 128, 1032, gemm::BLayout::NK, o); }, "quads comm 2",
                      "num_comm_sms a multiple of 4");
  WEAVE_CUDA_CHECK(cudaFree(p));
}

// The swapped 128 x w tiles on an input gradient dY W (B = W stored K x N: the kernel reads the
// weights M-major): every width below and above one token tile, N off the 64-column grid (a pitch
// off the 128-byte grid: 2-CTA clusters) and on it (single CTAs), plain, C +=, split-K 2 and 3, NaN /
// Inf; several token tiles forced; and the planner's choice on input-gradient rows of 16-1000 tokens.
TEST(Gemm, SwappedWideTilesInputGradient) {
  for (int w : gemm::kSwappedWidths) {
    const Case cases[] = {{w > 32 ? w - 15 : 17, 14344, 1032}, {w - 3, 4096, 2048}, {w + 9 <= 192 ? w + 9 : 192, 1000, 520}};
    for (Case c : cases) run_swapped_epilogues(c, gemm::BLayout::KN, w);
    Variant n;
    n.bl = gemm::BLayout::KN, n.tile = gemm::Tile::SwappedW, n.tile_n = w, n.nonfinite = true;
    run_case({w > 32 ? w - 7 : 20, 264, 1040}, n);
  }
  for (auto [c, w] : {std::pair{Case{300, 14344, 1032}, 160}, std::pair{Case{521, 4096, 2048}, 176},
                      std::pair{Case{1001, 392, 1032}, 144}}) {
    Variant v;
    v.bl = gemm::BLayout::KN, v.tile = gemm::Tile::SwappedW, v.tile_n = w, v.samples = true;
    run_case(c, v);
    v.split_k = 3;
    run_case(c, v);
  }
  for (Case c : {Case{16, 8192, 2048}, Case{77, 14336, 4096}, Case{200, 4104, 11016}, Case{300, 14336, 4096},
                 Case{520, 4096, 14336}, Case{792, 4096, 14336}, Case{1000, 11008, 4096}}) {
    Variant v;
    v.bl = gemm::BLayout::KN, v.samples = true;
    run_case(c, v);
  }
}

// The swapped 256 x w tiles (two m64 accumulators per consumer, the transposed output in two parts):
// every width over one and several token tiles, N off the 256-, 128- and 64-row grids (a tile whose
// second consumer or second part lies past N), K ragged and aligned, plain and C +=, more tiles than
// SMs (with communicator SMs); the rejected options.
TEST(Gemm, Swapped256Tiles) {
  for (int w : gemm::kSwapped256Widths)
    for (Case c : {Case{w - 5, 14344, 1032}, Case{3 * w + 7, 392, 4104}, Case{1000, 1000, 2048}, Case{w, 200, 520}}) {
      Variant v;
      v.bl = gemm::BLayout::NK, v.tile = gemm::Tile::SwappedW256, v.tile_n = w, v.samples = true;
      run_case(c, v);
      v.accumulate = true;
      run_case(c, v);
    }
  // More tiles than SMs (each CTA runs several: the two-part store, then the next tile's first
  // part; d1 restarts), with C += and with communicator SMs taking blocks away.
  for (int w : gemm::kSwapped256Widths) {
    Variant v;
    v.bl = gemm::BLayout::NK, v.tile = gemm::Tile::SwappedW256, v.tile_n = w, v.samples = true;
    const Case c{1001, 14344, 1032};  // 57 weight tiles x 6-8 token tiles
    run_case(c, v);
    v.accumulate = true, v.comm = 8;
    run_case(c, v);
  }
  bf16* p = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&p, 1 << 22));
  gemm::Options o;
  o.tile = gemm::Tile::SwappedW256, o.tile_n = 192;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 64, 128, 64, gemm::BLayout::NK, o); }, "tile_n 192", "tile_n = 192");
  o.tile_n = 144, o.split_k = 2;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 64, 128, 64, gemm::BLayout::NK, o); }, "split", "no split-K");
  o.split_k = 0, o.tile_cluster = 2;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 64, 128, 64, gemm::BLayout::NK, o); }, "cluster", "single CTAs");
  o.tile_cluster = 0;
  o.bias_type = gemm::BiasType::BF16, o.bias = p;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 64, 128, 64, gemm::BLayout::NK, o); }, "bias", "a bias");
  WEAVE_CUDA_CHECK(cudaFree(p));
}

// The 128 x 128 tile's epilogues and split-K (A M x K, bf16 output): shapes with fewer tiles than
// SMs (every tile split), ragged in M, N and K, both B layouts.
TEST(Gemm, SmallTileSplitK) {
  const Case cases[] = {{200, 4104, 1032}, {129, 392, 2056}, {256, 1000, 4104}};
  for (Case c : cases)
    for (auto bl : kLayouts) {
      Variant v;
      v.bl = bl, v.tile = gemm::Tile::M128N128;
      run_bf16_epilogues(c, v);
    }
}

TEST(Gemm, RejectsBadInput) {
  bf16* p = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&p, 1 << 20));
  try {
    gemm::gemm(p, p, p, 128, 128, 100, gemm::BLayout::KN);
    FAIL() << "K = 100 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K = 100 is not a multiple of 8"), std::string::npos) << e.what();
  }
  try {
    gemm::Options o;
    o.lcsc.num_comm_sms = 100000;
    gemm::gemm(p, p, p, 128, 128, 128, gemm::BLayout::KN, o);
    FAIL() << "num_comm_sms = 100000 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_comm_sms"), std::string::npos) << e.what();
  }
  // Each operand in turn shorter than the shape needs (p's 1 MiB holds 512 x 1024 bf16; every
  // operand here needs more), the others long enough: the short one is named.
  const int M = 520, N = 1024, K = 1024;
  const char* names[] = {"A needs", "B needs", "C needs"};
  for (int which = 0; which < 3; ++which) {
    bf16* big = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&big, size_t(1024) * 1024 * sizeof(bf16)));
    try {
      gemm::gemm(which == 0 ? p : big, which == 1 ? p : big, which == 2 ? p : big, M, N, K, gemm::BLayout::KN);
      ADD_FAILURE() << "short operand " << which << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(names[which]), std::string::npos) << e.what();
    }
    cudaFree(big);
  }
  // A K x M needs M % 8 == 0 (its row pitch); a bias type needs a pointer and the reverse;
  // misaligned pointers are named; the experimental tiles take only the defaults.
  float* pf = reinterpret_cast<float*>(p);
  gemm::Options km;
  km.a_layout = gemm::ALayout::KM;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 100, 128, 128, gemm::BLayout::KN, km); }, "A KM with M = 100",
                      "M = 100 is not a multiple of 8");
  expect_error<Error>([&] { gemm::gemm(p, p, pf, 100, 128, 128, gemm::BLayout::KN, km); }, "A KM with M = 100, fp32",
                      "M = 100 is not a multiple of 8");
  gemm::Options nb;
  nb.bias_type = gemm::BiasType::BF16;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 128, 128, 128, gemm::BLayout::KN, nb); }, "null bf16 bias",
                      "needs a bias pointer");
  nb.bias_type = gemm::BiasType::F32;
  expect_error<Error>([&] { gemm::gemm(p, p, pf, 128, 128, 128, gemm::BLayout::NK, nb); }, "null fp32 bias",
                      "needs a bias pointer");
  gemm::Options nt;
  nt.bias = p;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 128, 128, 128, gemm::BLayout::KN, nt); }, "bias without a type",
                      "bias_type None");
  gemm::Options mb;
  mb.bias_type = gemm::BiasType::BF16;
  mb.bias = p + 1;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 128, 128, 128, gemm::BLayout::KN, mb); }, "misaligned bias",
                      "bias (");
  expect_error<Error>([&] { gemm::gemm(p + 1, p, p, 128, 128, 128, gemm::BLayout::KN); }, "misaligned A",
                      "A (");
  expect_error<Error>([&] { gemm::gemm(p, p + 4, p, 128, 128, 128, gemm::BLayout::KN); }, "misaligned B",
                      "B (");
  expect_error<Error>([&] { gemm::gemm(p, p, pf + 1, 128, 128, 128, gemm::BLayout::KN); }, "misaligned fp32 C",
                      "C (");
  gemm::Options ex;
  ex.tile = gemm::Tile::M128N256C2;
  expect_error<Error>([&] { gemm::gemm(p, p, pf, 128, 128, 128, gemm::BLayout::KN, ex); }, "C2 tile with fp32 C",
                      "supports only");
  ex.bias_type = gemm::BiasType::BF16, ex.bias = p;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 128, 128, 128, gemm::BLayout::KN, ex); }, "C2 tile with bias",
                      "supports only");
  ex.bias_type = gemm::BiasType::None, ex.bias = nullptr;
  ex.tile = gemm::Tile::M128N320C2;
  expect_error<Error>([&] { gemm::gemm(p, p, pf, 128, 128, 128, gemm::BLayout::KN, ex); }, "320 C2 tile with fp32 C",
                      "supports only");
  ex.tile = gemm::Tile::M128N256S4;
  ex.a_layout = gemm::ALayout::KM;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 128, 128, 128, gemm::BLayout::KN, ex); }, "S4 tile with A KM",
                      "supports only");
  // The swapped tile: W as N x K, A as M x K, at most 16 tokens, no communicator SMs.
  gemm::Options sw;
  sw.tile = gemm::Tile::Swapped;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 16, 128, 128, gemm::BLayout::KN, sw); }, "swapped tile, B K x N",
                      "the swapped tile takes");
  expect_error<Error>([&] { gemm::gemm(p, p, p, 17, 128, 128, gemm::BLayout::NK, sw); }, "swapped tile, M = 17",
                      "got M = 17");
  sw.lcsc.num_comm_sms = 8;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 16, 128, 128, gemm::BLayout::NK, sw); },
                      "swapped tile with communicator SMs", "num_comm_sms = 8");
  // The 128 x w tile: a width it has, B as N x K, A as M x K, a bf16 output.
  gemm::Options wt;
  wt.tile = gemm::Tile::M128Nw;
  wt.tile_n = 100;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 128, 128, 128, gemm::BLayout::NK, wt); }, "128 x 100 tile",
                      "tile_n = 100");
  wt.tile_n = 144;
  expect_error<Error>([&] { gemm::gemm(p, p, p, 128, 128, 128, gemm::BLayout::KN, wt); }, "128 x w tile, B K x N",
                      "takes B as N x K");
  expect_error<Error>([&] { gemm::gemm(p, p, pf, 128, 128, 128, gemm::BLayout::NK, wt); }, "128 x w tile, fp32 C",
                      "an fp32 output");
  // fp32 C and the bias are checked against their allocations too (p holds 1 MiB).
  expect_error<Error>([&] { gemm::gemm(p, p, pf, 512, 1024, 8, gemm::BLayout::KN); }, "short fp32 C", "C needs");
  {
    bf16* big = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&big, size_t(1) << 24));
    gemm::Options sb;
    sb.bias_type = gemm::BiasType::F32;
    sb.bias = p + (1 << 19) - 8;  // the last 16 bytes of p: 4 floats of N = 1024
    expect_error<Error>([&] { gemm::gemm(big, big, big, 128, 1024, 128, gemm::BLayout::KN, sb); }, "short bias",
                        "bias needs");
    cudaFree(big);
  }
  cudaFree(p);
}
