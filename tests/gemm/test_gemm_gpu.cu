// GEMM against cuBLASLt on fresh random inputs (and sampled elements against a float64 CPU
// dot product), outputs poisoned first: ragged shapes, both B layouts, both tiles, C +=,
// communicator SMs withheld, and the rejections.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gemm/gemm.hpp"
#include "gemm/reference.cuh"

using namespace weave;
using bf16 = __nv_bfloat16;

namespace {

struct Buffers {
  bf16 *a = nullptr, *b = nullptr, *c = nullptr, *r = nullptr;
  Buffers(size_t na, size_t nb, size_t nc) {
    WEAVE_CUDA_CHECK(cudaMalloc(&a, na * 2));
    WEAVE_CUDA_CHECK(cudaMalloc(&b, nb * 2));
    WEAVE_CUDA_CHECK(cudaMalloc(&c, nc * 2));
    WEAVE_CUDA_CHECK(cudaMalloc(&r, nc * 2));
  }
  ~Buffers() {
    cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(r);
  }
};

uint64_t fresh_seed() {
  static std::mt19937_64 g(std::chrono::steady_clock::now().time_since_epoch().count());
  return g();
}

float host_bf16(bf16 v) { return __bfloat162float(v); }

// Checks 256 sampled elements of C against float64 dot products computed here.
void check_samples(const Buffers& d, int M, int N, int K, gemm::BLayout bl, const std::vector<bf16>& c0,
                   bool accumulate) {
  std::vector<bf16> a(size_t(M) * K), b(size_t(K) * N), c(size_t(M) * N);
  WEAVE_CUDA_CHECK(cudaMemcpy(a.data(), d.a, a.size() * 2, cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaMemcpy(b.data(), d.b, b.size() * 2, cudaMemcpyDeviceToHost));
  WEAVE_CUDA_CHECK(cudaMemcpy(c.data(), d.c, c.size() * 2, cudaMemcpyDeviceToHost));
  std::mt19937 g(M * 131 + N * 7 + K);
  double err = 0, ref = 0;
  for (int s = 0; s < 256; ++s) {
    const int i = g() % M, j = g() % N;
    double acc = accumulate ? host_bf16(c0[size_t(i) * N + j]) : 0.0;
    for (int k = 0; k < K; ++k) {
      const double bv = bl == gemm::BLayout::KN ? host_bf16(b[size_t(k) * N + j]) : host_bf16(b[size_t(j) * K + k]);
      acc += double(host_bf16(a[size_t(i) * K + k])) * bv;
    }
    const double x = host_bf16(c[size_t(i) * N + j]);
    ASSERT_TRUE(std::isfinite(x)) << "C[" << i << "," << j << "] not written";
    err += (x - acc) * (x - acc);
    ref += acc * acc;
  }
  EXPECT_LT(std::sqrt(err / ref), 1e-2) << "sampled float64 check " << M << "x" << N << "x" << K;
}

struct Case {
  int M, N, K;
};

void run_case(gemm::ref::CublasLt& lt, Case cs, gemm::BLayout bl, gemm::Tile tile, bool accumulate, int comm,
              bool samples) {
  const int M = cs.M, N = cs.N, K = cs.K;
  SCOPED_TRACE(testing::Message() << M << "x" << N << "x" << K << (bl == gemm::BLayout::KN ? " KN" : " NK") << " tile "
                                  << gemm::tile_name(tile) << (accumulate ? " C+=" : "") << " comm " << comm);
  Buffers d(size_t(M) * K, size_t(K) * N, size_t(M) * N);
  gemm::ref::fill_uniform(d.a, size_t(M) * K, fresh_seed());
  gemm::ref::fill_uniform(d.b, size_t(K) * N, fresh_seed());
  std::vector<bf16> c0;
  if (accumulate) {
    gemm::ref::fill_uniform(d.c, size_t(M) * N, fresh_seed(), 4.f);
    WEAVE_CUDA_CHECK(cudaMemcpy(d.r, d.c, size_t(M) * N * 2, cudaMemcpyDeviceToDevice));
    if (samples) {
      c0.resize(size_t(M) * N);
      WEAVE_CUDA_CHECK(cudaMemcpy(c0.data(), d.c, c0.size() * 2, cudaMemcpyDeviceToHost));
    }
  } else {
    gemm::ref::poison(d.c, size_t(M) * N);
    gemm::ref::poison(d.r, size_t(M) * N);
  }
  lt.run(d.a, d.b, d.r, M, N, K, bl, accumulate, nullptr);
  gemm::Options o;
  o.tile = tile;
  o.accumulate = accumulate;
  o.lcsc.num_comm_sms = comm;
  gemm::gemm(d.a, d.b, d.c, M, N, K, bl, o, nullptr);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  const double e = gemm::ref::rel_error(d.c, d.r, size_t(M) * N);
  EXPECT_TRUE(std::isfinite(e)) << "unwritten (poisoned) or non-finite outputs";
  EXPECT_LT(e, accumulate ? 1e-2 : 6e-3) << "relative Frobenius error vs cuBLAS";
  if (samples) check_samples(d, M, N, K, bl, c0, accumulate);
}

const gemm::BLayout kLayouts[] = {gemm::BLayout::KN, gemm::BLayout::NK};
const gemm::Tile kTiles[] = {gemm::Tile::M128N256, gemm::Tile::M128N128, gemm::Tile::M128N256S4,
                             gemm::Tile::M128N256C2};

}  // namespace

TEST(Gemm, RaggedShapesBothLayoutsBothTiles) {
  gemm::ref::CublasLt lt;
  const Case cases[] = {{1000, 776, 520}, {8, 8, 8}, {1, 8, 64}, {129, 264, 72}, {128, 256, 64},
                        {255, 520, 1032}, {777, 1032, 136}, {2048, 2048, 2048}, {3000, 136, 4104}};
  for (Case c : cases)
    for (auto bl : kLayouts)
      for (auto t : kTiles) run_case(lt, c, bl, t, false, 0, c.M * double(c.N) * c.K < 1e9);
}

TEST(Gemm, RandomShapes) {
  gemm::ref::CublasLt lt;
  std::mt19937 g(static_cast<unsigned>(fresh_seed()));
  for (int i = 0; i < 12; ++i) {
    const Case c{1 + int(g() % 2000), 8 * (1 + int(g() % 250)), 8 * (1 + int(g() % 250))};
    run_case(lt, c, kLayouts[i % 2], gemm::Tile::Auto, false, 0, false);
  }
}

TEST(Gemm, Accumulate) {
  gemm::ref::CublasLt lt;
  for (auto bl : kLayouts)
    for (auto t : kTiles) run_case(lt, {1000, 776, 520}, bl, t, true, 0, true);
  run_case(lt, {4096, 4096, 1024}, gemm::BLayout::NK, gemm::Tile::Auto, true, 0, false);
}

TEST(Gemm, WithCommunicatorSms) {
  gemm::ref::CublasLt lt;
  for (int comm : {1, 8, 16, 32}) run_case(lt, {2048, 3072, 1024}, gemm::BLayout::KN, gemm::Tile::Auto, false, comm, false);
  for (int comm : {2, 16}) run_case(lt, {2048, 3072, 1024}, gemm::BLayout::NK, gemm::Tile::M128N256C2, false, comm, false);
}

TEST(Gemm, LargeSquare) {
  gemm::ref::CublasLt lt;
  for (auto bl : kLayouts) run_case(lt, {8192, 8192, 8192}, bl, gemm::Tile::Auto, false, 0, false);
  for (auto bl : kLayouts) run_case(lt, {8192, 8192, 8192}, bl, gemm::Tile::M128N256C2, false, 0, false);
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
  cudaFree(p);
}
