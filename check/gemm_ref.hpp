// The float32 GEMM reference: cuBLASLt (bf16 inputs, fp32 accumulate and fp32 output), independent
// of weave's GEMM, plus each output element's dot-product scale s_ij = sqrt(sum_k a_ik^2 b_kj^2)
// for tile_check's bound. Row-major A (M x K, or K x M with gemm::ALayout::KM), B as gemm::BLayout
// says, outputs M x N row-major.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "check/tile_check.hpp"
#include "gemm/layout.hpp"

namespace weave::check {

class GemmRef {
 public:
  GemmRef();
  ~GemmRef();
  GemmRef(const GemmRef&) = delete;
  GemmRef& operator=(const GemmRef&) = delete;

  // r = A*B and s2 = (A.^2)*(B.^2) (sums of squared products), or both += when accumulate (a K
  // split across ranks or calls adds up exactly like one longer K). s2 may be null.
  void run(const __nv_bfloat16* A, const __nv_bfloat16* B, int M, int N, int K, gemm::BLayout bl, float* r, float* s2,
           bool accumulate = false, cudaStream_t st = nullptr);
  // The same with A stored as `al` says (KM: K x M row-major, cuBLAS's transposed operand).
  void run(const __nv_bfloat16* A, const __nv_bfloat16* B, int M, int N, int K, gemm::ALayout al, gemm::BLayout bl,
           float* r, float* s2, bool accumulate = false, cudaStream_t st = nullptr);

 private:
  void matmul(const __nv_bfloat16* A, const __nv_bfloat16* B, int M, int N, int K, gemm::ALayout al, gemm::BLayout bl,
              float* C, bool accumulate, cudaStream_t st);
  __nv_bfloat16* squares(int which, const __nv_bfloat16* p, size_t n, cudaStream_t st);
  cublasLtHandle_t h_{};
  void* ws_ = nullptr;
  __nv_bfloat16* sq_[2] = {nullptr, nullptr};
  size_t sq_n_[2] = {0, 0};
};

// The process's reference, created on first use on the then current device (a test process uses
// one device; its scratch grows to the largest problem and stays).
GemmRef& gemm_ref();

// s = sqrt(s2) in place (n elements): the scale argument of check::compare.
void sqrt_inplace(float* s2, size_t n, cudaStream_t st = nullptr);
// r[i] += c[i] (the C += epilogue's input, bf16 or fp32).
void add_bf16(float* r, const __nv_bfloat16* c, size_t n, cudaStream_t st = nullptr);
void add_f32(float* r, const float* c, size_t n, cudaStream_t st = nullptr);
// s[i] += k |c[i]|: the C += check's scale term. The epilogue rounds A*B to bf16 before adding
// it to C0, and |A*B| <= |r| + |C0|, so the bound needs a term in |C0| as well as |r|.
void add_abs_bf16(float* s, const __nv_bfloat16* c, float k, size_t n, cudaStream_t st = nullptr);
// r[i][j] += bias[j] for an M x N row-major r; bias is N floats (f32) or N bf16 values.
void add_bias(float* r, const void* bias, bool f32, int M, int N, cudaStream_t st = nullptr);
// Copies a bf16 matrix into float (e.g. a baseline's own output as a reference for a test of the
// checker itself).
void to_float(float* dst, const __nv_bfloat16* src, size_t n, cudaStream_t st = nullptr);

// Bounds for bf16 outputs of float32-accumulated dot products (see tile_check.hpp):
// - one final bf16 rounding (GEMM, AG+GEMM): 2^-8 |r|, plus 2^-10 s for the fp32 accumulation
//   order of two different kernels;
// - sums of W bf16-rounded partials (GEMM+RS, GEMM+AR): each rounding adds up to 2^-8 of a
//   partial, and a partial is of the order of s.
inline Bound gemm_bound() { return Bound{kBf16Round, kBf16Round / 4, 0}; }
// fp32 outputs: no output rounding worth a bf16 term, only the two kernels' summation orders
// (2^-10 s, as above) and fp32 roundings of the result (2^-20 |r|, generous for 2^-24 each).
inline Bound gemm_f32_bound() { return Bound{1.0 / (1 << 20), kBf16Round / 4, 0}; }
inline Bound partial_sum_bound(int world) { return Bound{2 * kBf16Round, 4.0 * world * kBf16Round, 0}; }

}  // namespace weave::check
