// The float32 reference of the fp8 GEMMs, independent of weave's kernels: a plain kernel decodes
// the fp8 operands to float and applies their scales (per tensor, or per block as DeepSeek-V3's
// format says), then cuBLASLt multiplies the float matrices in float32 (CUBLAS_COMPUTE_32F: no
// TF32, no fp8 tensor core). It also gives each element's dot-product scale
// s2 = sum_k (a'_mk b'_nk)^2 of the decoded, scaled operands, for tile_check's bound; plus random
// fp8 and scale fills for the tests and the bench.
//
// Layouts as weave::gemm_fp8 (kernels/gemm_fp8/gemm_fp8.hpp): A M x K and B N x K row-major bytes
// (e4m3 or e5m2), outputs M x N row-major float. Block scales: scale_a is ceil(K/128) x M
// (scale_a[kb * M + m]), scale_b is ceil(N/128) x ceil(K/128).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "check/tile_check.hpp"

namespace weave::gemm_fp8::ref {
class Lt;  // check/gemm_fp8_baseline.cuh: the cuBLASLt handle and workspace the matmuls run with
}

namespace weave::check {

class Fp8GemmRef {
 public:
  Fp8GemmRef();
  ~Fp8GemmRef();
  Fp8GemmRef(const Fp8GemmRef&) = delete;
  Fp8GemmRef& operator=(const Fp8GemmRef&) = delete;

  // Per-tensor scales (device pointers to one float each): r = sa sb A B^T; s2 may be null.
  void run(const void* A, bool a_e5m2, const void* B, bool b_e5m2, int M, int N, int K, const float* scale_a,
           const float* scale_b, float* r, float* s2, cudaStream_t st = nullptr);
  // Block scales: r[m, n] = sum_k (scale_a[k/128, m] A[m, k]) (scale_b[n/128, k/128] B[n, k]).
  void run_block(const void* A, bool a_e5m2, const void* B, bool b_e5m2, int M, int N, int K, const float* scale_a,
                 const float* scale_b, float* r, float* s2, cudaStream_t st = nullptr);

 private:
  void run_impl(const void* A, bool a_e5m2, const void* B, bool b_e5m2, int M, int N, int K, const float* sa,
                const float* sb, bool block, float* r, float* s2, cudaStream_t st);
  float* buffer(int which, size_t n, cudaStream_t st);
  std::unique_ptr<gemm_fp8::ref::Lt> lt_;
  float* buf_[2] = {nullptr, nullptr};
  size_t buf_n_[2] = {0, 0};
};

// The process's reference, created on first use (as check::gemm_ref()).
Fp8GemmRef& fp8_gemm_ref();

// Random fp8 values: floats uniform in [-range, range) rounded to the format (saturating to its
// largest finite value). Tests that need special codes (NaN, Inf) write them with set_fp8.
void fill_fp8_uniform(void* p, bool e5m2, size_t n, uint64_t seed, float range, cudaStream_t st = nullptr);
// Subnormal codes only (exponent field 0, mantissa != 0, random sign): e4m3 magnitudes
// 2^-9 .. 7 * 2^-9, e5m2 2^-16 .. 3 * 2^-16.
void fill_fp8_subnormal(void* p, bool e5m2, size_t n, uint64_t seed, cudaStream_t st = nullptr);
// Floats log-uniform in [lo, hi] (positive), e.g. block scales spanning 1e-3 .. 1e3.
void fill_log_uniform(float* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t st = nullptr);
// One raw byte at p[i] (a NaN or an Inf code, for the propagation tests).
void set_fp8(void* p, size_t i, uint8_t code, cudaStream_t st = nullptr);
// The float value of one fp8 code, on the host (for float64 spot checks).
double fp8_to_double(uint8_t code, bool e5m2);

// Bounds (tile_check.hpp: |x - r| <= rel |r| + scale s + abs), for bf16 outputs of fp8 GEMMs.
//
// Both kernels round once to bf16 at the end: 2^-8 |r|, plus 2^-10 s for two fp32 summation
// orders, as check::gemm_bound. The fp8 products are exact in the tensor core, but its fp8
// accumulator keeps 13 mantissa bits and truncates (Hopper's FP8 path; the reason DeepSeek-V3
// promotes partial sums to fp32): each m64nNk32 instruction adds 32 products to the running sum
// and loses less than one unit of its 13th bit, i.e. below 2^-13 |running sum| (the products'
// own alignment losses have random signs and stay far smaller). Truncation goes towards zero, so
// these losses share the running sum's sign and add up linearly over the T = K / 32 instructions:
// below 2^-13 T max_t |sum_t|. For a sum of random-sign products the running sum is a random walk
// whose final size is about s, and whose largest excursion on the way exceeds s (its mean is about
// 1.25 s, its tail past 2 s); where the products drift one way it approaches |r|. The bound takes
// 2 s and |r|:
//
// - Per-tensor (all of K in the tensor core, like cuBLASLt's FP8 fast accumulation):
//   rel = 2^-8 + 2^-14 T, scale = 2^-10 + 2^-12 T. (The mean loss is about half a unit, and the
//   running sum is below its maximum for most of the loop, so a correct kernel sits at a fraction
//   of this.) With s instead of 2 s (2^-13 T), one element of 256 x 14336 x 528 broke the bound by
//   7 %, bit for bit the same from the 128 x 96 and the 128 x 128 tile (docs/perf-notes.md,
//   2026-12-02g). A tile that misses one 128-K block loses sqrt(128 / K) s of random sign: at
//   K = 8192, 0.125 s against a bound of ~0.083 s where |r| ~ s (about half the elements break it).
// - Block scales (promotion every 128 of K): the tensor core's sum spans 4 instructions, below
//   4 x 2^-13 of one block's scaled partial; the K / 128 partials have random signs, so these add
//   as a random walk to below 2^-11 s. scale = 2^-10 + 2^-9 (four times that, for headroom); one
//   missing block (sqrt(128 / K) s, >= 0.088 s up to K = 16384) is > 29 bounds.
inline Bound fp8_tensor_core_bound(int K) {
  const double T = K / 32.0;
  return Bound{kBf16Round + std::ldexp(T, -14), 1.0 / 1024 + std::ldexp(T, -12), 0};
}
inline Bound fp8_promoted_bound() { return Bound{kBf16Round, 3.0 / 1024, 0}; }

}  // namespace weave::check
