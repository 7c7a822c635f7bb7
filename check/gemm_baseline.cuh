// Test and benchmark support for the GEMM: random fills and the cuBLASLt baseline (bf16 in/out,
// fp32 compute). Include from .cu files that link CUDA::cublasLt; the library itself does not use
// it. Poisoning and correctness checks are check/'s (tile_check, gemm_ref).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "check/cublas_check.hpp"
#include "gemm/layout.hpp"
#include "weave/common/error.hpp"

namespace weave::gemm::ref {

// The kernels are static: every translation unit that includes this header gets its own copy.

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

static __global__ void fill_uniform_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(mix(seed * 0x9e3779b97f4a7c15ull + i) >> 40) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16((2.f * u - 1.f) * scale);
  }
}

inline void fill_uniform(__nv_bfloat16* p, size_t n, uint64_t seed, float scale = 1.f, cudaStream_t st = nullptr) {
  fill_uniform_kernel<<<1024, 256, 0, st>>>(p, n, seed, scale);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

// C (M x N row-major) = A * B (+ C), through cuBLASLt. Row-major C is column-major C^T = B^T A^T,
// so cuBLAS sees m = N, n = M with B as its first operand; A stored K x M (ALayout::KM) is its
// second operand transposed.
class CublasLt {
 public:
  CublasLt() {
    WEAVE_CUBLAS_CHECK(cublasLtCreate(&h_));
    WEAVE_CUDA_CHECK(cudaMalloc(&ws_, kWorkspace));
  }
  ~CublasLt() {
    release();
    cudaFree(ws_);
    cublasLtDestroy(h_);
  }
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  void run(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K, BLayout bl,
           bool accumulate, cudaStream_t st) {
    run(A, B, C, M, N, K, ALayout::MK, bl, accumulate, st);
  }
  void run(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K, ALayout al,
           BLayout bl, bool accumulate, cudaStream_t st) {
    prepare(M, N, K, al, bl);
    const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
    WEAVE_CUBLAS_CHECK(cublasLtMatmul(h_, op_, &alpha, B, lb_, A, la_, &beta, C, lc_, C, lc_, &algo_, ws_, kWorkspace,
                                      st));
  }

  // The configuration cuBLASLt's heuristic chose for the last shape run (its enum values: tile
  // cublasLtMatmulTile_t, stages cublasLtMatmulStages_t, cluster cublasLtClusterShape_t), so that
  // a benchmark row says which tile and split-K the baseline used.
  std::string algo() const {
    if (!op_) return "";
    auto get = [&](cublasLtMatmulAlgoConfigAttributes_t a) {
      uint32_t v = 0;
      size_t w = 0;
      if (cublasLtMatmulAlgoConfigGetAttribute(&algo_, a, &v, sizeof v, &w) != CUBLAS_STATUS_SUCCESS) return -1L;
      return static_cast<long>(v);
    };
    return "id" + std::to_string(get(CUBLASLT_ALGO_CONFIG_ID)) + " tile" + std::to_string(get(CUBLASLT_ALGO_CONFIG_TILE_ID)) +
           " stages" + std::to_string(get(CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " splitk" +
           std::to_string(get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + " red" +
           std::to_string(get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)) + " swz" +
           std::to_string(get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)) + " cluster" +
           std::to_string(get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)) + " inner" +
           std::to_string(get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID));
  }

 private:
  void prepare(int M, int N, int K, ALayout al, BLayout bl) {
    if (op_ && M == M_ && N == N_ && K == K_ && bl == bl_ && al == al_) return;
    release();
    M_ = M, N_ = N, K_ = K, bl_ = bl, al_ = al;
    WEAVE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = bl == BLayout::NK ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = al == ALayout::KM ? CUBLAS_OP_T : CUBLAS_OP_N;
    WEAVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    WEAVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (bl == BLayout::NK)
      WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb_, CUDA_R_16BF, K, N, K));  // stored N x K row-major
    else
      WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb_, CUDA_R_16BF, N, K, N));
    if (al == ALayout::KM)
      WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la_, CUDA_R_16BF, M, K, M));  // stored K x M row-major
    else
      WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la_, CUDA_R_16BF, K, M, K));
    WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc_, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref;
    WEAVE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspace;
    WEAVE_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    WEAVE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(h_, op_, lb_, la_, lc_, lc_, pref, 1, &res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    WEAVE_CHECK(found > 0, "cuBLASLt found no algorithm for ", M, "x", N, "x", K);
    algo_ = res.algo;
  }
  void release() {
    if (op_) cublasLtMatmulDescDestroy(op_);
    if (la_) cublasLtMatrixLayoutDestroy(la_);
    if (lb_) cublasLtMatrixLayoutDestroy(lb_);
    if (lc_) cublasLtMatrixLayoutDestroy(lc_);
    op_ = nullptr, la_ = lb_ = lc_ = nullptr;
  }
  static constexpr size_t kWorkspace = 64ull << 20;
  cublasLtHandle_t h_{};
  void* ws_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  int M_ = 0, N_ = 0, K_ = 0;
  BLayout bl_ = BLayout::KN;
  ALayout al_ = ALayout::MK;
};

}  // namespace weave::gemm::ref
