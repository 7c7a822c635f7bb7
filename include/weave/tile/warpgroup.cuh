// Warpgroup helpers: role index, register reallocation between roles, named barriers.
#pragma once
#include <cstdint>

namespace weave::tile {

constexpr int kWarpgroupThreads = 128;

// Warp-uniform (the shuffle tells the compiler so, which keeps role branches uniform).
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffff, threadIdx.x / kWarpgroupThreads, 0); }
__device__ __forceinline__ int warp_in_warpgroup() { return __shfl_sync(0xffffffff, (threadIdx.x / 32) % 4, 0); }
__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
// The lanes below this one (bit i for lane i < lane_id()): a lane's rank among the set bits of a ballot.
__device__ __forceinline__ unsigned lanemask_lt() {
  unsigned m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// setmaxnreg: every warp of the warpgroup executes it; counts are multiples of 8 in [24, 256].
// The producer gives registers back so that the consumers' 64xN fp32 accumulators fit.
template <int Regs>
__device__ __forceinline__ void warpgroup_reg_dealloc() {
  static_assert(Regs % 8 == 0 && Regs >= 24 && Regs <= 256, "setmaxnreg count");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Regs));
}
template <int Regs>
__device__ __forceinline__ void warpgroup_reg_alloc() {
  static_assert(Regs % 8 == 0 && Regs >= 24 && Regs <= 256, "setmaxnreg count");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Regs));
}

// Named barrier over `threads` threads (a multiple of 32); id 0 is __syncthreads.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace weave::tile
