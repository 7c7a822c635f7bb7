// Test and benchmark support for the fp8 GEMM: cuBLASLt's "TN" matmul, row-major C (M x N) =
// A (M x K) B^T (B N x K), both operands K-major as gemm_fp8 takes them. The float32 reference
// (check/gemm_fp8_ref.cu: float operands, float out) and the cuBLASLt fp8 baseline of weave-bench
// gemm_fp8 (fp8 operands with per-tensor scale pointers, bf16 out) both run through it. Include
// from .cu files that link CUDA::cublasLt; the library itself does not use it (as check/gemm_baseline.cuh).
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "check/cublas_check.hpp"
#include "weave/common/error.hpp"

namespace weave::gemm_fp8::ref {

// A cuBLASLt handle and its workspace.
class Lt {
 public:
  explicit Lt(size_t workspace_bytes) : ws_bytes_(workspace_bytes) {
    WEAVE_CUBLAS_CHECK(cublasLtCreate(&h_));
    WEAVE_CUDA_CHECK(cudaMalloc(&ws_, ws_bytes_));
  }
  ~Lt() {
    cudaFree(ws_);
    cublasLtDestroy(h_);
  }
  Lt(const Lt&) = delete;
  Lt& operator=(const Lt&) = delete;
  cublasLtHandle_t handle() const { return h_; }
  void* workspace() const { return ws_; }
  size_t workspace_bytes() const { return ws_bytes_; }

 private:
  cublasLtHandle_t h_{};
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
};

// Per-tensor scale pointers of A and B (device floats; both null: no scales).
struct Scales {
  const float* a = nullptr;
  const float* b = nullptr;
};

// One shape and type combination of C = A B^T, fp32 compute, with the heuristic's first algorithm.
// Row-major C = A B^T is column-major C^T = B A^T: cuBLAS's first operand is our B (N x K
// row-major = K x N column-major, transposed: "T"), its second our A (K x M column-major, "N"), so
// its A scale is our scale_b. One descriptor per scale pair, so that run() sets nothing on the host.
class TnMatmul {
 public:
  TnMatmul(const Lt& lt, int M, int N, int K, cudaDataType_t a_type, cudaDataType_t b_type, cudaDataType_t c_type,
           bool fast_accum = false, const std::vector<Scales>& scales = {Scales{}})
      : lt_(lt) {
    WEAVE_CHECK(!scales.empty(), "TnMatmul: at least one scale pair (null pointers: no scales)");
    WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb_, b_type, K, N, K));
    WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la_, a_type, K, M, K));
    WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc_, c_type, N, M, N));
    for (const Scales& s : scales) {
      cublasLtMatmulDesc_t op = nullptr;
      WEAVE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      ops_.push_back(op);
      const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
      WEAVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
      WEAVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
      if (fast_accum) {
        const int8_t f = 1;
        WEAVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &f, sizeof f));
      }
      if (s.a || s.b) {
        const float* pa = s.b;  // cuBLAS's A is our B
        const float* pb = s.a;
        WEAVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof pa));
        WEAVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof pb));
      }
    }
    cublasLtMatmulPreference_t pref = nullptr;
    WEAVE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = lt.workspace_bytes();
    WEAVE_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    status_ = cublasLtMatmulAlgoGetHeuristic(lt.handle(), ops_[0], lb_, la_, lc_, lc_, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    ok_ = status_ == CUBLAS_STATUS_SUCCESS && found > 0;
    algo_ = res.algo;
  }
  ~TnMatmul() {
    for (auto op : ops_) cublasLtMatmulDescDestroy(op);
    cublasLtMatrixLayoutDestroy(la_);
    cublasLtMatrixLayoutDestroy(lb_);
    cublasLtMatrixLayoutDestroy(lc_);
  }
  TnMatmul(const TnMatmul&) = delete;
  TnMatmul& operator=(const TnMatmul&) = delete;

  // false: cuBLASLt's heuristic failed (status()) or found no algorithm for this shape and types.
  bool ok() const { return ok_; }
  cublasStatus_t status() const { return status_; }
  // C = A B^T with scale pair `which` (as given to the constructor). Needs ok().
  void run(const void* A, const void* B, void* C, cudaStream_t st, int which = 0) const {
    WEAVE_CHECK(ok_, "TnMatmul: no cuBLASLt algorithm for this shape (heuristic status ", static_cast<int>(status_),
                ")");
    const float alpha = 1.f, beta = 0.f;
    WEAVE_CUBLAS_CHECK(cublasLtMatmul(lt_.handle(), ops_.at(which), &alpha, B, lb_, A, la_, &beta, C, lc_, C, lc_,
                                      &algo_, lt_.workspace(), lt_.workspace_bytes(), st));
  }

 private:
  const Lt& lt_;
  std::vector<cublasLtMatmulDesc_t> ops_;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  cublasStatus_t status_ = CUBLAS_STATUS_NOT_INITIALIZED;
  bool ok_ = false;
};

}  // namespace weave::gemm_fp8::ref
