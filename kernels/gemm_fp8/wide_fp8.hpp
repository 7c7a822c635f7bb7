// The fp8 GEMM's 128 x w tiles (Tile::M128Nw, e4m3 x e4m3, per-tensor scales), instantiated in
// wide_fp8.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gemm_fp8/gemm_fp8.hpp"

namespace weave::gemm_fp8::detail {

// split.width picks the tile; split.splits > 1 splits the last partial round.
lcsc::Plan run_wide(const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K, const float* sa,
                    const float* sb, const Options& opt, int group_m, cudaStream_t stream, const Launch& split);

}  // namespace weave::gemm_fp8::detail
