// The 128 x w tiles (Tile::M128Nw, w in kWideWidths): their launch, instantiated in wide.cu so that
// gemm.cu's translation unit does not grow by sixteen kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gemm/gemm.hpp"

namespace weave::gemm::detail {

// Stages of a 128 x w tile: as many as fit beside the dense staging tile (128 x w bf16), at most
// 6: w = 96-112 get 6, 144-160 5, 176-208 4. A stage is (128 + w) rows of 128 bytes (64 bf16 or
// 128 fp8 of K), so the fp8 GEMM's 128 x w tiles take the same count.
constexpr int wide_stages(int w) {
  const int budget = 227 * 1024 - 2048;  // less the barriers and alignment slack
  const int stages = (budget - 128 * w * 2) / ((128 + w) * 128);
  return stages > 6 ? 6 : stages;
}

// A M x K, B N x K, bf16 C; opt's bias (if any); split.splits > 1 (no bias) splits the last round.
lcsc::Plan run_wide(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K,
                    const Options& opt, int group_m, cudaStream_t stream, const Launch& split);

}  // namespace weave::gemm::detail
