// The swapped tiles' epilogue (gemm_kernel.cuh and gemm_fp8_kernel.cuh with TransOut): a consumer's
// 64 x BN fp32 accumulator (64 weight rows x BN tokens, wgmma.cuh's layout) into its staging
// block, BN token rows of 128 bytes (C's 64 columns) with the 128B swizzle, which one TMA box
// {64, BN} stores.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "weave/tile/fragment.cuh"
#include "weave/tile/mbarrier.cuh"
#include "weave/tile/tma.cuh"
#include "weave/tile/swizzle.hpp"
#include "weave/tile/types.cuh"

namespace weave::gemm {

// A store instruction's lanes write 8 weight rows (16 bytes) of 4 tokens 2 apart, which the
// swizzle puts on 4 different 16-byte chunks: no bank conflict.
template <int BN>
__device__ __forceinline__ void store_accumulator_transposed(tile::bf16* block, const float (&d)[BN / 2]) {
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x / 32) % 4;
  const uint32_t r = static_cast<uint32_t>(16 * warp + lane / 4);
  const uint32_t base = tile::smem_u32(block);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const uint32_t t = static_cast<uint32_t>(8 * j + 2 * (lane & 3));
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t row = t + (e & 1), byte = 2 * (r + 8 * (e >> 1));
      const uint32_t a = base + tile::swizzled_offset(tile::Swizzle::B128, row, byte);
      const tile::bf16 v = __float2bfloat16_rn(d[4 * j + e]);
      tile::st_shared_b16(a, __bfloat16_as_ushort(v));
    }
  }
}

// A staging block (64 weight rows, C's columns n.., of BN tokens from token m0) to C: a TMA store, or
// a reduce-add one for C +=. Blocks past the weights' `rows` are not stored.
template <int BN>
__device__ __forceinline__ void store_transposed_block(const CUtensorMap* c, const tile::bf16* block, int n, int m0,
                                                       int rows, bool accumulate) {
  if (n >= rows) return;
  if (accumulate)
    tile::tma::reduce_add_2d(c, block, n, m0);
  else
    tile::tma::store_2d(c, block, n, m0);
}

}  // namespace weave::gemm
