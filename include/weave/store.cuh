// store_async, store_add_async: one thread copies a shared-memory tile to tile coordinates of any
// rank's copy of a pgl with TMA (cp.async.bulk.tensor), plain or reduce-add. The tile in shared
// memory is row-major tile_rows x tile_cols, 128-byte aligned; partial edge tiles are clipped by
// the TMA unit (elements outside the tensor are not written).
#pragma once
#include <cstdint>

#include "weave/pgl.cuh"

namespace weave {

namespace detail {
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
}  // namespace detail

// Makes the calling thread's ordinary shared-memory writes visible to the TMA (async proxy).
// Every writing thread calls it before the barrier that precedes store_async.
__device__ __forceinline__ void fence_smem_for_tma() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

template <class T, int W>
__device__ __forceinline__ void store_async(const pgl<T, W>& dst, int rank, const T* smem_tile, int tile_row,
                                            int tile_col) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(&dst.tma[rank]),
      "r"(tile_col * dst.tile_cols), "r"(tile_row * dst.tile_rows), "r"(detail::smem_u32(smem_tile))
      : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Element-wise add into the destination (bf16, fp16 or fp32 per the pgl's type), done by the
// memory system of the destination GPU: concurrent store-adds from several ranks are exact.
template <class T, int W>
__device__ __forceinline__ void store_add_async(const pgl<T, W>& dst, int rank, const T* smem_tile, int tile_row,
                                                int tile_col) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
          &dst.tma[rank]),
      "r"(tile_col * dst.tile_cols), "r"(tile_row * dst.tile_rows), "r"(detail::smem_u32(smem_tile))
      : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// The issuing thread's stores are complete in the destination's memory: call before signalling.
__device__ __forceinline__ void store_wait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// At most `N` store groups still read their shared-memory source: the buffer of older ones is free.
template <int N>
__device__ __forceinline__ void store_read_wait() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

}  // namespace weave
