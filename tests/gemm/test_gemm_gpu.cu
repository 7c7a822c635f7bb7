// GEMM against an independent float32 reference (cuBLASLt with fp32 output, check/gemm_ref.hpp)
// element by element, reported per 128 x 128 tile (check/tile_check.hpp), on fresh random inputs
// with outputs poisoned first: ragged shapes, both B layouts, every tile, C +=, communicator SMs
// withheld, and the rejections. Small cases also check sampled elements against float64 dot
// products computed on the host. Inputs come from WEAVE_TEST_SEED (printed; set it to replay).
//
// Why the bound catches a tile that misses one K step (64 of K): with A, B uniform in [-1, 1)
// every product a*b has variance 1/9, so s = sqrt(sum_k a^2 b^2) ~ sqrt(K)/3 and the missing
// 64-step is a sum of 64 products, of standard deviation 8/3 = s * 8/sqrt(K). The bound for one
// bf16 rounding is 2^-8 |r| + 2^-10 s, about 0.005 s with |r| ~ s. At the largest K tested here
// (8192) the missing step is 0.088 s, ~18 bounds at one standard deviation; a 128 x 128 tile has
// 16384 such elements, so every tile that misses a step fails (and C += adds at most 2^-8 |C0|
// ~ 0.016 here, still far below 8/3 ~ 2.7 at any K).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "gemm/reference.cuh"

using namespace weave;
using bf16 = __nv_bfloat16;

namespace {

template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { WEAVE_CUDA_CHECK(cudaMalloc(&p, (count ? count : 1) * sizeof(T))); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

// Inputs of the n-th case of this process, replayable from WEAVE_TEST_SEED.
uint64_t case_seed(uint64_t what) {
  static uint64_t n = 0;
  return check::derive(check::test_seed(), n++, what);
}

check::GemmRef& gemm_ref() {
  static check::GemmRef g;
  return g;
}

// s += k |c0|: C += rounds A*B to bf16 before adding it to C0 (the epilogue's reduce-add store
// adds bf16 tiles), and |A*B| <= |r| + |C0|, so the bound needs a term in |C0| as well as |r|.
__global__ void add_abs_kernel(float* s, const bf16* c0, float k, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    s[i] += k * fabsf(__bfloat162float(c0[i]));
}

// C = A*B: one bf16 rounding of an fp32 sum. C += A*B: two roundings (of A*B, then of the sum),
// 2^-8 |r| each, plus 2^-8 |C0| through add_abs_kernel's term (k = 4 times the bound's 2^-10).
check::Bound bound_for(bool accumulate) {
  check::Bound b = check::gemm_bound();
  if (accumulate) b.rel *= 2;
  return b;
}
constexpr float kC0Weight = 4.f;

float host_bf16(bf16 v) { return __bfloat162float(v); }

// 256 sampled elements of C against float64 dot products computed here, with the same bound.
void check_samples(const bf16* dA, const bf16* dB, const bf16* dC, const bf16* dC0, int M, int N, int K,
                   gemm::BLayout bl, uint64_t seed) {
  std::vector<bf16> a(size_t(M) * K), b(size_t(K) * N), c(size_t(M) * N), c0;
  WEAVE_CUDA_CHECK(cudaMemcpy(a.data(), dA, a.size() * 2, cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaMemcpy(b.data(), dB, b.size() * 2, cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaMemcpy(c.data(), dC, c.size() * 2, cudaMemcpyDeviceToHost));
  if (dC0) {
    c0.resize(c.size());
    WEAVE_CUDA_CHECK(cudaMemcpy(c0.data(), dC0, c0.size() * 2, cudaMemcpyDeviceToHost));
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
      const double p = double(host_bf16(a[size_t(i) * K + k])) * bv;
      acc += p;
      sq += p * p;
    }
    double sc = std::sqrt(sq);
    if (dC0) {
      const double cv = host_bf16(c0[size_t(i) * N + j]);
      acc += cv;
      sc += kC0Weight * std::fabs(cv);
    }
    si[t] = i, sj[t] = j, r[t] = acc, s[t] = sc;
  }
  const check::Report rep = check::compare_host(
      1, kSamples, [&](long long, long long t) { return double(host_bf16(c[size_t(si[t]) * N + sj[t]])); },
      [&](long long, long long t) { return r[t]; }, [&](long long, long long t) { return s[t]; },
      bound_for(dC0 != nullptr), 1, kSamples);
  EXPECT_TRUE(rep.ok) << "sampled float64 check (column = sample): " << rep.str();
}

struct Case {
  int M, N, K;
};

void run_case(Case cs, gemm::BLayout bl, gemm::Tile tile, bool accumulate, int comm, bool samples) {
  const int M = cs.M, N = cs.N, K = cs.K;
  const size_t nc = size_t(M) * N;
  std::string name = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                     (bl == gemm::BLayout::KN ? " KN" : " NK") + " tile " + gemm::tile_name(tile) +
                     (accumulate ? " C+=" : "") + " comm " + std::to_string(comm);
  SCOPED_TRACE(name);
  DevBuf<bf16> A(size_t(M) * K), B(size_t(K) * N), C(nc), C0(accumulate ? nc : 0);
  DevBuf<float> r(nc), s(nc);
  gemm::ref::fill_uniform(A.p, A.n, case_seed(1));
  gemm::ref::fill_uniform(B.p, B.n, case_seed(2));
  if (accumulate) {
    gemm::ref::fill_uniform(C.p, nc, case_seed(3), 4.f);
    WEAVE_CUDA_CHECK(cudaMemcpy(C0.p, C.p, nc * 2, cudaMemcpyDeviceToDevice));
  } else {
    check::poison(C.p, nc);
  }
  gemm_ref().run(A.p, B.p, M, N, K, bl, r.p, s.p);
  check::sqrt_inplace(s.p, nc);
  if (accumulate) {
    check::add_bf16(r.p, C0.p, nc);
    add_abs_kernel<<<1024, 256>>>(s.p, C0.p, kC0Weight, nc);
    WEAVE_CUDA_CHECK(cudaGetLastError());
  }
  gemm::Options o;
  o.tile = tile;
  o.accumulate = accumulate;
  o.lcsc.num_comm_sms = comm;
  gemm::gemm(A.p, B.p, C.p, M, N, K, bl, o, nullptr);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  const check::Report rep = check::compare({C.p, N}, {r.p, N}, {s.p, N}, M, N, bound_for(accumulate));
  std::printf("check gemm %s: %s\n", name.c_str(), rep.str().c_str());
  EXPECT_TRUE(rep.ok) << rep.str();
  if (samples) check_samples(A.p, B.p, C.p, accumulate ? C0.p : nullptr, M, N, K, bl, case_seed(4));
}

const gemm::BLayout kLayouts[] = {gemm::BLayout::KN, gemm::BLayout::NK};
const gemm::Tile kTiles[] = {gemm::Tile::M128N256, gemm::Tile::M128N128, gemm::Tile::M128N256S4,
                             gemm::Tile::M128N256C2};

}  // namespace

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
}

TEST(Gemm, LargeSquare) {
  for (auto bl : kLayouts) run_case({8192, 8192, 8192}, bl, gemm::Tile::Auto, false, 0, false);
  for (auto bl : kLayouts) run_case({8192, 8192, 8192}, bl, gemm::Tile::M128N256C2, false, 0, false);
  run_case({8191, 8200, 8200}, gemm::BLayout::NK, gemm::Tile::Auto, false, 0, false);  // ragged in every dimension
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
  cudaFree(p);
}
