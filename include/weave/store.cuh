// store_async, store_add_async: one thread copies a shared-memory tile to tile coordinates of any
// rank's copy of a pgl with TMA (cp.async.bulk.tensor), plain or reduce-add. The tile in shared
// memory is row-major tile_rows x tile_cols, 128-byte aligned; partial edge tiles are clipped by
// the TMA unit (elements outside the tensor are not written). Threads that wrote the tile with
// ordinary stores call tile::fence_proxy_async_shared() before the barrier preceding the store.
#pragma once
#include "weave/pgl.cuh"
#include "weave/tile/proxy.cuh"
#include "weave/tile/tma.cuh"

namespace weave {

template <class T, int W>
__device__ __forceinline__ void store_async(const pgl<T, W>& dst, int rank, const T* smem_tile, int tile_row,
                                            int tile_col) {
  tile::tma::store_2d(&dst.tma[rank], smem_tile, tile_col * dst.tile_cols, tile_row * dst.tile_rows);
  tile::tma::commit_group();
}

// Element-wise add into the destination (bf16, fp16 or fp32 per the pgl's type), done by the
// memory system of the destination GPU: concurrent store-adds from several ranks are exact.
template <class T, int W>
__device__ __forceinline__ void store_add_async(const pgl<T, W>& dst, int rank, const T* smem_tile, int tile_row,
                                                int tile_col) {
  tile::tma::reduce_add_2d(&dst.tma[rank], smem_tile, tile_col * dst.tile_cols, tile_row * dst.tile_rows);
  tile::tma::commit_group();
}

// The issuing thread's stores are complete in the destination's memory: call before signalling.
__device__ __forceinline__ void store_wait() { tile::tma::wait_group<0>(); }

}  // namespace weave
