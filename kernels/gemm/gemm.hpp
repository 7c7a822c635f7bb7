// Host entry point of the single-GPU bf16 GEMM (kernels/gemm/README.md has the numbers).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gemm/layout.hpp"
#include "weave/lcsc.cuh"

namespace weave::gemm {

// M128N256S4: 128x256 with 4 stages and the output staged in two halves (more stages, a short
// consumer wait between the halves).
// M128N256C2: 128x256 in 2-CTA clusters along M that share B through TMA multicast.
enum class Tile : int { Auto = 0, M128N256 = 1, M128N128 = 2, M128N256S4 = 3, M128N256C2 = 4 };

struct Options {
  bool accumulate = false;  // C += A * B instead of C = A * B
  Tile tile = Tile::Auto;
  int group_m = 0;  // tile rows per raster group; 0 = default
  lcsc::Config lcsc;  // num_comm_sms, grid limits
};

// C (M x N, row-major, ldc = N) = A (M x K, row-major) * B. Throws weave::Error for shapes TMA
// cannot address (K and N must be multiples of 8, pointers 16-byte aligned), for an operand whose
// device allocation is shorter than the shape needs (weave/common/extent.hpp), or a bad config.
// Returns the grid it launched.
lcsc::Plan gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K, BLayout b,
                const Options& opt = {}, cudaStream_t stream = nullptr);

// Pure functions (CPU-tested).
void validate_shape(int M, int N, int K);
Tile choose_tile(int M, int N, int K, int sm_count);
int default_group_m(Tile t, int K);
const char* tile_name(Tile t);

}  // namespace weave::gemm
