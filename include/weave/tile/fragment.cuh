// Register fragment -> shared tile moves with stmatrix (8x8 16-bit matrices; each thread passes
// the address of one 16-byte row: lanes 8i..8i+7 address matrix i).
#pragma once
#include <cstdint>

#include "weave/tile/mbarrier.cuh"
#include "weave/tile/swizzle.hpp"
#include "weave/tile/types.cuh"

namespace weave::tile {

__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// One thread's plain shared stores (an fp32 pair; one 16-bit value), at a shared-window address.
__device__ __forceinline__ void st_shared_v2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void st_shared_b16(uint32_t addr, unsigned short v) {
  asm volatile("st.shared.b16 [%0], %1;" ::"r"(addr), "h"(v) : "memory");
}

// Writes one warpgroup's 64xN fp32 accumulator (wgmma layout) as 16-bit T into a shared tile
// stored as N/64 column blocks, each `block_rows` rows of 128 bytes with the 128B swizzle (the
// layout a TMA store with a {64, block_rows} box and SWIZZLE_128B reads). `row0` is the
// warpgroup's first row inside the block. The swizzle makes the eight 16-byte rows of each
// stmatrix land in eight different bank groups.
// Columns [C0, C0 + CN) of the accumulator go to the tile's blocks 0 .. CN/64 - 1.
template <class T, int N, int C0 = 0, int CN = N>
__device__ __forceinline__ void store_accumulator_swizzled(void* tile, int block_rows, int row0, const float (&d)[N / 2]) {
  static_assert(C0 % 64 == 0 && CN % 64 == 0 && C0 + CN <= N, "column blocks of 64");
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x / 32) % 4;
  const int mat = lane / 8;  // which of the 4 matrices this lane addresses
  const int row = row0 + warp * 16 + (mat & 1) * 8 + (lane & 7);
  const uint32_t base = smem_u32(tile);
#pragma unroll
  for (int j = C0 / 8; j < (C0 + CN) / 8; j += 2) {  // two 8-column blocks per stmatrix.x4
    const int col = 8 * (j + (mat >> 1)) - C0;
    const uint32_t blk = static_cast<uint32_t>(col / 64) * static_cast<uint32_t>(block_rows) * 128u;
    const uint32_t off = swizzled_offset(Swizzle::B128, row, (col % 64) * 2);
    stmatrix_x4(base + blk + off, pack2<T>(d[4 * j + 0], d[4 * j + 1]), pack2<T>(d[4 * j + 2], d[4 * j + 3]),
                pack2<T>(d[4 * j + 4], d[4 * j + 5]), pack2<T>(d[4 * j + 6], d[4 * j + 7]));
  }
}

// The same into a dense row-major tile of `pitch` elements per row, no swizzle (what a TMA store
// with a {pitch, rows} box and no swizzle reads): for tile widths that are not whole 64-column
// blocks. A pitch of 2w bytes puts an stmatrix's eight 16-byte rows on 2 or 4 bank groups
// (2- to 4-way conflicts), which the epilogue of a tile of >= 16 K steps hardly notices.
template <class T, int N>
__device__ __forceinline__ void store_accumulator_dense(void* tile, int pitch, int row0, const float (&d)[N / 2]) {
  static_assert(N % 16 == 0, "two 8-column blocks per stmatrix.x4");
  const int lane = threadIdx.x & 31;
  const int warp = (threadIdx.x / 32) % 4;
  const int mat = lane / 8;
  const int row = row0 + warp * 16 + (mat & 1) * 8 + (lane & 7);
  const uint32_t base = smem_u32(tile) + static_cast<uint32_t>(row * pitch) * sizeof(T);
#pragma unroll
  for (int j = 0; j < N / 8; j += 2) {
    const uint32_t col = 8 * (j + (mat >> 1));
    stmatrix_x4(base + col * sizeof(T), pack2<T>(d[4 * j + 0], d[4 * j + 1]), pack2<T>(d[4 * j + 2], d[4 * j + 3]),
                pack2<T>(d[4 * j + 4], d[4 * j + 5]), pack2<T>(d[4 * j + 6], d[4 * j + 7]));
  }
}

}  // namespace weave::tile
