// The fp8 GEMM's 128 x w tiles (Tile::M128Nw) and swapped 128 x w tiles (Tile::SwappedW), per-tensor
// scales, B (the weights) e4m3 and A (the tokens) `ta`: e4m3, or e5m2 for gradients; instantiated in
// wide_fp8.cu and swapped_wide_fp8.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gemm_fp8/gemm_fp8.hpp"

namespace weave::gemm_fp8::detail {

// split.width picks the tile; split.splits > 1 splits the last partial round.
lcsc::Plan run_wide(Fp8 ta, const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K, const float* sa,
                    const float* sb, const Options& opt, int group_m, cudaStream_t stream, const Launch& split);
// A: the tokens (M x K), B: the weights (N x K); the kernel runs on B A^T and stores it transposed
// (kernels/gemm/README.md, "The swapped 128 x w tile"). Single CTAs (no cluster on any pitch).
lcsc::Plan run_swapped_wide(Fp8 ta, const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K,
                            const float* sa, const float* sb, const Options& opt, int group_m, cudaStream_t stream,
                            const Launch& split);

}  // namespace weave::gemm_fp8::detail
