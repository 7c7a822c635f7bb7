// The fp8 GEMM's decode path: the bf16 GEMM's swapped kernel (kernels/gemm/swapped_schedule.hpp)
// with fp8 multiplies and per-tensor scales. gemm() routes Tile::Swapped here after validating.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gemm_fp8/gemm_fp8.hpp"
#include "weave/lcsc.cuh"

namespace weave::gemm_fp8 {

// C = *scale_a * *scale_b * A B^T for M <= 16 (gemm::swapped::kMaxTokens), in the configuration
// swapped::config(M, N, sm_count) picks. Returns the blocks launched.
lcsc::Plan launch_swapped(Fp8 ta, Fp8 tb, const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K,
                          const float* scale_a, const float* scale_b, int sm_count, cudaStream_t stream);

}  // namespace weave::gemm_fp8
