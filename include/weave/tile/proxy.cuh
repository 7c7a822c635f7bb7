// Ordering between the generic proxy (ordinary loads/stores, stmatrix) and the async proxy
// (TMA, wgmma operand reads).
#pragma once

namespace weave::tile {

// Each thread that wrote shared memory with ordinary stores executes this before the barrier
// that hands the buffer to a TMA store or a wgmma.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Before a TMA read of global data that ordinary (or peer) writes produced.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

}  // namespace weave::tile
