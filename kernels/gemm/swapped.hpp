// Host side of the swapped decode GEMM (swapped_schedule.hpp, swapped_kernel.cuh): gemm() routes
// Tile::Swapped here after validating the arguments.
#pragma once
#include <cuda_runtime.h>

#include "gemm/swapped_kernel.cuh"
#include "weave/lcsc.cuh"

namespace weave::gemm::swapped {

// bf16 inputs: launches config(M, N, sm_count). Throws weave::Error for M outside 1..kMaxTokens;
// the rest of the arguments are the caller's to check. Returns the blocks launched.
lcsc::Plan launch(const Params& p, bool c_f32, int sm_count, cudaStream_t stream);

}  // namespace weave::gemm::swapped
