// The swapped decode GEMM kernel (schedule and K order: swapped_schedule.hpp). No shared-memory
// pipeline: each lane's loads for a chunk go straight into the mma's registers, and the warps of
// all resident blocks keep the weight bytes in flight (the regime is DRAM-bound: a 1 x 11008 x 4096
// GEMM reads 90 MB of weights for 90 MFLOP).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "gemm/swapped_schedule.hpp"
#include "weave/tile/mma.cuh"

namespace weave::gemm::swapped {

struct Params {
  const void* x;           // M x K, row-major (the tokens), Op's type
  const void* w;           // N x K, row-major (nn.Linear's weight), Op's type
  void* c;                 // M x N, row-major, bf16 or fp32 (the kernel's OutT)
  const void* bias;        // N values or null
  int bias_f32;            // bias is fp32 (else bf16)
  int accumulate;          // C += instead of C =
  int M, N, K;
  const float* scale_x = nullptr;  // per-tensor scales (fp8): C = *scale_x * *scale_w * X W^T
  const float* scale_w = nullptr;
};

// The multiply: its element size and instruction (A: the weights, B: the tokens).
struct Bf16Op {
  static constexpr int kBytes = 2;
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    tile::mma::m16n8k16_bf16(d, a, b);
  }
};
template <bool kWE5M2, bool kXE5M2>
struct Fp8Op {
  static constexpr int kBytes = 1;
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    tile::mma::m16n8k32_fp8<kWE5M2, kXE5M2>(d, a, b);
  }
};

// NB: n8 token blocks (M <= 8 NB). kS: 16-row strips per block; a warp multiplies each token
// fragment it loads with all kS strips (X bytes per weight byte: M / (16 kS)). kWarps: warps per
// block splitting K. kDepth: chunks whose loads a warp issues before their multiplies.
template <class Op, int NB, int kS, class OutT, int kWarps, int kDepth = 1>
__global__ void __launch_bounds__(kWarps * 32) swapped_kernel(Params p) {
  constexpr int kTokens = 8 * NB;
  constexpr int kBlockRows = kS * kRows;
  __shared__ float red[kWarps][kTokens][kBlockRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int row0 = blockIdx.x * kBlockRows;
  const long long K = static_cast<long long>(p.K) * Op::kBytes;  // row bytes
  // Rows past N and tokens past M read row N - 1 and token M - 1 instead (valid memory, no
  // predicate in the loop; a token row read by all 8 lane groups is one broadcast) and are never
  // stored. Lane row r of the block: strip r / 2, row g (+ 8 for odd r).
  const char* wrow[2 * kS];
#pragma unroll
  for (int r = 0; r < 2 * kS; ++r) {
    const int row = row0 + (r / 2) * kRows + g + 8 * (r % 2);
    wrow[r] = static_cast<const char*>(p.w) + (row < p.N ? row : p.N - 1) * K;
  }
  const char* xrow[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) xrow[b] = static_cast<const char*>(p.x) + (8 * b + g < p.M ? 8 * b + g : p.M - 1) * K;
  float acc[kS][NB][4] = {};
  // kD chunks starting at ch, kWarps apart: all loads first, then the multiplies. kCheck: chunks
  // may end past the row (its bytes are a multiple of 16: each vector is wholly in or out).
  auto step = [&](auto depth, auto check, int ch) {
    constexpr int kD = decltype(depth)::value;
    constexpr bool kCheck = decltype(check)::value;
    uint4 wv[kD][2 * kS][kVectors], xv[kD][NB][kVectors];
#pragma unroll
    for (int d = 0; d < kD; ++d)
#pragma unroll
      for (int j = 0; j < kVectors; ++j) {
        const long long k = static_cast<long long>(ch + d * kWarps) * kChunkBytes + chunk_byte(c, 2 * j);
        const bool in = !kCheck || k < K;
#pragma unroll
        for (int r = 0; r < 2 * kS; ++r) wv[d][r][j] = in ? tile::mma::ld_stream_v4(wrow[r] + k) : uint4{};
#pragma unroll
        for (int b = 0; b < NB; ++b) xv[d][b][j] = in ? __ldg(reinterpret_cast<const uint4*>(xrow[b] + k)) : uint4{};
      }
#pragma unroll
    for (int d = 0; d < kD; ++d)
#pragma unroll
      for (int j = 0; j < kVectors; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int st = 0; st < kS; ++st) {
            // Bytes 8h..8h+7 of a vector are its words 2h, 2h+1: the first and second half of the
            // lane's k in multiply 2j + h (swapped_schedule.hpp, logical_k).
            const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&wv[d][2 * st][j]);
            const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&wv[d][2 * st + 1][j]);
            const uint32_t a[4] = {w0[2 * h], w1[2 * h], w0[2 * h + 1], w1[2 * h + 1]};
#pragma unroll
            for (int b = 0; b < NB; ++b) {
              const uint32_t* xw = reinterpret_cast<const uint32_t*>(&xv[d][b][j]);
              const uint32_t bb[2] = {xw[2 * h], xw[2 * h + 1]};
              Op::mma(acc[st][b], a, bb);
            }
          }
  };
  // Whole chunks kDepth at a time without bounds checks, then this warp's rest one at a time.
  const int n_full = static_cast<int>(K / kChunkBytes), n_chunks = chunks(p.K, Op::kBytes);
  int ch = warp;
  for (; ch + (kDepth - 1) * kWarps < n_full; ch += kDepth * kWarps)
    step(std::integral_constant<int, kDepth>{}, std::false_type{}, ch);
  for (; ch < n_chunks; ch += kWarps) step(std::integral_constant<int, 1>{}, std::true_type{}, ch);
  // acc[st][b][0..1]: strip st's row g, tokens 8b + 2c, +1; acc[st][b][2..3]: its row g + 8.
#pragma unroll
  for (int st = 0; st < kS; ++st)
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        red[warp][8 * b + 2 * c + (e & 1)][st * kRows + g + 8 * (e >> 1)] = acc[st][b][e];
  __syncthreads();
  for (int i = threadIdx.x; i < kTokens * kBlockRows; i += kWarps * 32) {
    const int tok = i / kBlockRows, row = i % kBlockRows, n = row0 + row;
    if (tok >= p.M || n >= p.N) continue;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += red[w][tok][row];
    if (p.scale_x) s *= *p.scale_x * *p.scale_w;
    if (p.bias)
      s += p.bias_f32 ? static_cast<const float*>(p.bias)[n]
                      : __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[n]);
    OutT* out = static_cast<OutT*>(p.c) + size_t(tok) * p.N + n;
    if constexpr (std::is_same_v<OutT, float>) {
      *out = p.accumulate ? *out + s : s;
    } else {
      *out = __float2bfloat16_rn(p.accumulate ? __bfloat162float(*out) + s : s);
    }
  }
}

}  // namespace weave::gemm::swapped
