#include <cuda_fp8.h>

#include "check/gemm_fp8_ref.hpp"
#include "check/gemm_fp8_baseline.cuh"
#include "weave/common/error.hpp"

namespace weave::check {

namespace {
constexpr size_t kWorkspace = 32ull << 20;

__device__ __forceinline__ uint64_t hash64(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dull;
  return x ^ (x >> 33);
}
// Uniform in [0, 1) from the element index and the seed.
__device__ __forceinline__ float uniform01(uint64_t seed, size_t i) {
  return static_cast<float>(hash64(seed * 0x9e3779b97f4a7c15ull + i + 1) >> 40) * (1.0f / 16777216.0f);
}

__device__ __forceinline__ float decode(uint8_t code, bool e5m2) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), e5m2 ? __NV_E5M2 : __NV_E4M3);
  return __half2float(__half(h));
}

// out (rows x K, float) = decoded fp8 times its scale. Per tensor: scale[0]. Per block, A:
// scale[(k / 128) * rows + row]; B: scale[(row / 128) * kb + k / 128].
__global__ void dequant_kernel(float* out, const uint8_t* in, bool e5m2, int rows, int K, const float* scale,
                               int mode /*0 tensor, 1 block A, 2 block B*/) {
  const size_t n = size_t(rows) * K;
  const int kb = (K + 127) / 128;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int row = static_cast<int>(i / K), k = static_cast<int>(i % K);
    float s = scale[0];
    if (mode == 1) s = scale[size_t(k / 128) * rows + row];
    if (mode == 2) s = scale[size_t(row / 128) * kb + k / 128];
    out[i] = decode(in[i], e5m2) * s;
  }
}
__global__ void square_kernel(float* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = p[i] * p[i];
}
__global__ void fill_fp8_kernel(uint8_t* p, bool e5m2, size_t n, uint64_t seed, float range) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = (2.f * uniform01(seed, i) - 1.f) * range;
    p[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
  }
}
__global__ void fill_subnormal_kernel(uint8_t* p, bool e5m2, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t h = hash64(seed * 0x9e3779b97f4a7c15ull + i + 1);
    const uint8_t mant = e5m2 ? uint8_t(1 + h % 3) : uint8_t(1 + h % 7);  // exponent field 0
    p[i] = uint8_t(((h >> 8) & 1) << 7) | mant;
  }
}
__global__ void fill_log_uniform_kernel(float* p, size_t n, uint64_t seed, float llo, float lhi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = expf(llo + (lhi - llo) * uniform01(seed, i));
}
}  // namespace

Fp8GemmRef& fp8_gemm_ref() {
  static Fp8GemmRef r;
  return r;
}

Fp8GemmRef::Fp8GemmRef() : lt_(std::make_unique<gemm_fp8::ref::Lt>(kWorkspace)) {}
Fp8GemmRef::~Fp8GemmRef() {
  cudaDeviceSynchronize();
  for (auto* p : buf_) cudaFree(p);
}

float* Fp8GemmRef::buffer(int which, size_t n, cudaStream_t st) {
  if (buf_n_[which] < n) {
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    cudaFree(buf_[which]);
    buf_[which] = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&buf_[which], n * sizeof(float)));
    buf_n_[which] = n;
  }
  return buf_[which];
}

void Fp8GemmRef::run_impl(const void* A, bool a_e5m2, const void* B, bool b_e5m2, int M, int N, int K, const float* sa,
                          const float* sb, bool block, float* r, float* s2, cudaStream_t st) {
  WEAVE_CHECK(M > 0 && N > 0 && K > 0 && A && B && sa && sb && r, "Fp8GemmRef: bad arguments ", M, "x", N, "x", K);
  const size_t na = size_t(M) * K, nb = size_t(N) * K;
  float* af = buffer(0, na, st);
  float* bf = buffer(1, nb, st);
  dequant_kernel<<<1024, 256, 0, st>>>(af, static_cast<const uint8_t*>(A), a_e5m2, M, K, sa, block ? 1 : 0);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  dequant_kernel<<<1024, 256, 0, st>>>(bf, static_cast<const uint8_t*>(B), b_e5m2, N, K, sb, block ? 2 : 0);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  // float32 in and out, no scales (the dequantisation applied them), no fast accumulation.
  const gemm_fp8::ref::TnMatmul mm(*lt_, M, N, K, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F);
  WEAVE_CHECK(mm.ok(), "cuBLASLt found no float32 algorithm for ", M, "x", N, "x", K, " (heuristic status ",
              static_cast<int>(mm.status()), ")");
  mm.run(af, bf, r, st);
  if (s2) {
    square_kernel<<<1024, 256, 0, st>>>(af, na);
    square_kernel<<<1024, 256, 0, st>>>(bf, nb);
    WEAVE_CUDA_CHECK(cudaGetLastError());
    mm.run(af, bf, s2, st);
  }
}

void Fp8GemmRef::run(const void* A, bool a_e5m2, const void* B, bool b_e5m2, int M, int N, int K, const float* sa,
                     const float* sb, float* r, float* s2, cudaStream_t st) {
  run_impl(A, a_e5m2, B, b_e5m2, M, N, K, sa, sb, false, r, s2, st);
}
void Fp8GemmRef::run_block(const void* A, bool a_e5m2, const void* B, bool b_e5m2, int M, int N, int K, const float* sa,
                           const float* sb, float* r, float* s2, cudaStream_t st) {
  run_impl(A, a_e5m2, B, b_e5m2, M, N, K, sa, sb, true, r, s2, st);
}

void fill_fp8_uniform(void* p, bool e5m2, size_t n, uint64_t seed, float range, cudaStream_t st) {
  fill_fp8_kernel<<<1024, 256, 0, st>>>(static_cast<uint8_t*>(p), e5m2, n, seed, range);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}
void fill_fp8_subnormal(void* p, bool e5m2, size_t n, uint64_t seed, cudaStream_t st) {
  fill_subnormal_kernel<<<1024, 256, 0, st>>>(static_cast<uint8_t*>(p), e5m2, n, seed);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}
void fill_log_uniform(float* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t st) {
  fill_log_uniform_kernel<<<1024, 256, 0, st>>>(p, n, seed, std::log(lo), std::log(hi));
  WEAVE_CUDA_CHECK(cudaGetLastError());
}
void set_fp8(void* p, size_t i, uint8_t code, cudaStream_t st) {
  WEAVE_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(p) + i, &code, 1, cudaMemcpyHostToDevice, st));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));  // `code` lives on this stack frame
}

// From the bit fields, not through cuda_fp8.h, so that the float64 spot checks share nothing
// with the device decode. e4m3 (OCP "fn"): bias 7, no Inf, S.1111.111 is NaN. e5m2: bias 15,
// IEEE-like (exponent 31: Inf or NaN).
double fp8_to_double(uint8_t code, bool e5m2) {
  const int sign = code >> 7;
  const int mbits = e5m2 ? 2 : 3;
  const int exp = (code & 0x7f) >> mbits;
  const int man = code & ((1 << mbits) - 1);
  const int bias = e5m2 ? 15 : 7;
  double v;
  if (e5m2 && exp == 31) v = man ? NAN : INFINITY;
  else if (!e5m2 && exp == 15 && man == 7) v = NAN;
  else if (exp == 0) v = std::ldexp(double(man), 1 - bias - mbits);
  else v = std::ldexp(double((1 << mbits) + man), exp - bias - mbits);
  return sign ? -v : v;
}

}  // namespace weave::check
