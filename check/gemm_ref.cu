#include "check/gemm_ref.hpp"
#include "check/cublas_check.hpp"
#include "weave/common/error.hpp"


namespace weave::check {

namespace {
constexpr size_t kWorkspace = 32ull << 20;

__global__ void square_kernel(__nv_bfloat16* out, const __nv_bfloat16* in, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = __bfloat162float(in[i]);
    out[i] = __float2bfloat16(v * v);
  }
}
__global__ void sqrt_kernel(float* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = sqrtf(p[i]);
}
__global__ void add_kernel(float* r, const __nv_bfloat16* c, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    r[i] += __bfloat162float(c[i]);
}
__global__ void add_abs_kernel(float* s, const __nv_bfloat16* c, float k, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    s[i] += k * fabsf(__bfloat162float(c[i]));
}
__global__ void add_f32_kernel(float* r, const float* c, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    r[i] += c[i];
}
template <class T>
__global__ void add_bias_kernel(float* r, const T* bias, size_t M, size_t N) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < M * N; i += size_t(gridDim.x) * blockDim.x)
    r[i] += static_cast<float>(bias[i % N]);
}
__global__ void to_float_kernel(float* d, const __nv_bfloat16* s, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    d[i] = __bfloat162float(s[i]);
}
}  // namespace

GemmRef::GemmRef() {
  WEAVE_CUBLAS_CHECK(cublasLtCreate(&h_));
  WEAVE_CUDA_CHECK(cudaMalloc(&ws_, kWorkspace));
}

GemmRef& gemm_ref() {
  static GemmRef g;
  return g;
}

GemmRef::~GemmRef() {
  cudaDeviceSynchronize();
  for (auto* p : sq_) cudaFree(p);
  cudaFree(ws_);
  cublasLtDestroy(h_);
}

__nv_bfloat16* GemmRef::squares(int which, const __nv_bfloat16* p, size_t n, cudaStream_t st) {
  if (sq_n_[which] < n) {
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    cudaFree(sq_[which]);
    WEAVE_CUDA_CHECK(cudaMalloc(&sq_[which], n * sizeof(__nv_bfloat16)));
    sq_n_[which] = n;
  }
  square_kernel<<<1024, 256, 0, st>>>(sq_[which], p, n);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  return sq_[which];
}

// Row-major C (M x N) is column-major C^T = B^T A^T: cuBLAS sees m = N, n = M, B first. Row-major
// A (M x K) is column-major A^T (K x M, ld K), taken as is; A stored K x M is column-major A
// (M x K, ld M), which cuBLAS transposes (its second operand, TRANSB = T).
void GemmRef::matmul(const __nv_bfloat16* A, const __nv_bfloat16* B, int M, int N, int K, gemm::ALayout al,
                     gemm::BLayout bl, float* C, bool accumulate, cudaStream_t st) {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  WEAVE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = bl == gemm::BLayout::NK ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = al == gemm::ALayout::KM ? CUBLAS_OP_T : CUBLAS_OP_N;
  WEAVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  WEAVE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (bl == gemm::BLayout::NK)
    WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, N, K));
  else
    WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, N, K, N));
  if (al == gemm::ALayout::KM)
    WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, M, K, M));
  else
    WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, M, K));
  WEAVE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, N));
  WEAVE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspace;
  WEAVE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  WEAVE_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(h_, op, lb, la, lc, lc, pref, 1, &res, &found));
  WEAVE_CHECK(found > 0, "cuBLASLt found no float32-output algorithm for ", M, "x", N, "x", K);
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  WEAVE_CUBLAS_CHECK(cublasLtMatmul(h_, op, &alpha, B, lb, A, la, &beta, C, lc, C, lc, &res.algo, ws_, kWorkspace, st));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
}

void GemmRef::run(const __nv_bfloat16* A, const __nv_bfloat16* B, int M, int N, int K, gemm::BLayout bl, float* r,
                  float* s2, bool accumulate, cudaStream_t st) {
  run(A, B, M, N, K, gemm::ALayout::MK, bl, r, s2, accumulate, st);
}
void GemmRef::run(const __nv_bfloat16* A, const __nv_bfloat16* B, int M, int N, int K, gemm::ALayout al,
                  gemm::BLayout bl, float* r, float* s2, bool accumulate, cudaStream_t st) {
  WEAVE_CHECK(M > 0 && N > 0 && K > 0 && A && B && r, "GemmRef: bad arguments ", M, "x", N, "x", K);
  matmul(A, B, M, N, K, al, bl, r, accumulate, st);
  if (s2) {
    const __nv_bfloat16* a2 = squares(0, A, size_t(M) * K, st);
    const __nv_bfloat16* b2 = squares(1, B, size_t(K) * N, st);
    matmul(a2, b2, M, N, K, al, bl, s2, accumulate, st);
  }
}

void sqrt_inplace(float* s2, size_t n, cudaStream_t st) {
  sqrt_kernel<<<1024, 256, 0, st>>>(s2, n);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}
void add_bf16(float* r, const __nv_bfloat16* c, size_t n, cudaStream_t st) {
  add_kernel<<<1024, 256, 0, st>>>(r, c, n);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}
void add_abs_bf16(float* s, const __nv_bfloat16* c, float k, size_t n, cudaStream_t st) {
  add_abs_kernel<<<1024, 256, 0, st>>>(s, c, k, n);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}
void add_f32(float* r, const float* c, size_t n, cudaStream_t st) {
  add_f32_kernel<<<1024, 256, 0, st>>>(r, c, n);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}
void add_bias(float* r, const void* bias, bool f32, int M, int N, cudaStream_t st) {
  if (f32)
    add_bias_kernel<<<1024, 256, 0, st>>>(r, static_cast<const float*>(bias), size_t(M), size_t(N));
  else
    add_bias_kernel<<<1024, 256, 0, st>>>(r, static_cast<const __nv_bfloat16*>(bias), size_t(M), size_t(N));
  WEAVE_CUDA_CHECK(cudaGetLastError());
}
void to_float(float* d, const __nv_bfloat16* s, size_t n, cudaStream_t st) {
  to_float_kernel<<<1024, 256, 0, st>>>(d, s, n);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace weave::check
