// The 128 x w tiles (Tile::M128Nw, w in kWideWidths): their launch, instantiated in wide.cu so that
// gemm.cu's translation unit does not grow by sixteen kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gemm/gemm.hpp"

namespace weave::gemm::detail {

// A M x K, B N x K, bf16 C; opt's bias (if any); split.splits > 1 (no bias) splits the last round.
lcsc::Plan run_wide(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K,
                    const Options& opt, int group_m, cudaStream_t stream, const Launch& split);

}  // namespace weave::gemm::detail
