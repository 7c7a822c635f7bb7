// The LSE merge of an unfused ring attention (weave-bench net_ring's weave-unfused and nccl rows):
// the partial outputs of one query chunk against several key chunks, each (O_p, LSE_p) from weave's
// single-GPU attention, combined into the chunk's rows of the whole output,
//   lse = log sum_p exp(lse_p),  O = sum_p exp(lse_p - lse) O_p,
// in fp32 with one bf16 rounding at the end (what an unfused ring merges; bench/torch_sp.py's too).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "weave/common/error.hpp"

namespace weave::bench {

constexpr int kMaxMergeParts = 16;  // 2 chunks per rank x 8 ranks (weave::kMaxWorld)

struct MergeArgs {
  const __nv_bfloat16* o[kMaxMergeParts];  // (B, Lc, Hq, D) each
  const float* lse[kMaxMergeParts];        // (B, Hq, Lc) each
  int parts = 0;
  __nv_bfloat16* out;  // (B, L, Hq, D): the chunk's rows from local row row0
  float* out_lse;      // (B, Hq, L) or null
  int B, Lc, L, row0, Hq, D;
};

// One thread per 8 elements of one (batch, row, head): 16-byte loads and stores (D is 64 or 128).
__global__ void lse_merge_kernel(const __grid_constant__ MergeArgs a) {
  const int groups = a.D / 8;
  const long long total = static_cast<long long>(a.B) * a.Lc * a.Hq * groups;
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int g = static_cast<int>(i % groups);
  long long t = i / groups;
  const int h = static_cast<int>(t % a.Hq);
  t /= a.Hq;
  const int r = static_cast<int>(t % a.Lc);
  const int b = static_cast<int>(t / a.Lc);
  float l[kMaxMergeParts];
  float m = -INFINITY;
#pragma unroll
  for (int p = 0; p < kMaxMergeParts; ++p)
    if (p < a.parts) {
      l[p] = a.lse[p][(static_cast<long long>(b) * a.Hq + h) * a.Lc + r];
      m = fmaxf(m, l[p]);
    }
  float sum = 0.f;
#pragma unroll
  for (int p = 0; p < kMaxMergeParts; ++p)
    if (p < a.parts) sum += expf(l[p] - m);
  const float lse = m + logf(sum);
  float acc[8] = {};
  const long long in = ((static_cast<long long>(b) * a.Lc + r) * a.Hq + h) * a.D + g * 8;
#pragma unroll
  for (int p = 0; p < kMaxMergeParts; ++p)
    if (p < a.parts) {
      const float w = expf(l[p] - lse);
      const uint4 raw = *reinterpret_cast<const uint4*>(a.o[p] + in);
      const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(x[e]);
        acc[2 * e] += w * f.x;
        acc[2 * e + 1] += w * f.y;
      }
    }
  uint4 packed;
  __nv_bfloat162* y = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int e = 0; e < 4; ++e) y[e] = __floats2bfloat162_rn(acc[2 * e], acc[2 * e + 1]);
  const long long out = ((static_cast<long long>(b) * a.L + a.row0 + r) * a.Hq + h) * a.D + g * 8;
  *reinterpret_cast<uint4*>(a.out + out) = packed;
  if (g == 0 && a.out_lse) a.out_lse[(static_cast<long long>(b) * a.Hq + h) * a.L + a.row0 + r] = lse;
}

inline void lse_merge(const MergeArgs& a, cudaStream_t st) {
  WEAVE_CHECK(a.parts >= 1 && a.parts <= kMaxMergeParts, "lse_merge: ", a.parts, " parts (1 to ", kMaxMergeParts, ")");
  WEAVE_CHECK(a.D % 8 == 0, "lse_merge: D = ", a.D, " is not a multiple of 8");
  const long long total = static_cast<long long>(a.B) * a.Lc * a.Hq * (a.D / 8);
  const int threads = 256;
  lse_merge_kernel<<<static_cast<unsigned>((total + threads - 1) / threads), threads, 0, st>>>(a);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace weave::bench
