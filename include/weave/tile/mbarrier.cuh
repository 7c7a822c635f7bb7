// mbarrier pipelines with explicit phase tracking. A ring of S stages uses two barriers per
// stage: `full` (the loader's arrive.expect_tx plus the TMA bytes complete it) and `empty`
// (every consumer arrival completes it). The parity a waiter asks for flips each time the ring
// wraps. A freshly initialised barrier reports the phase "before 0" (parity 1) as complete,
// which is why producers wait on `phase ^ 1`: the first pass over the ring does not block.
#pragma once
#include <cstdint>

namespace weave::tile {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

struct alignas(8) Mbarrier {
  uint64_t word;

  __device__ __forceinline__ uint32_t addr() const { return smem_u32(&word); }

  __device__ __forceinline__ void init(uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(addr()), "r"(count) : "memory");
  }
  // Before the barrier's memory serves another purpose (including another barrier).
  __device__ __forceinline__ void inval() {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(addr()) : "memory");
  }
  __device__ __forceinline__ void arrive() {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(addr()) : "memory");
  }
  // One arrival that also announces `bytes` of asynchronous (TMA) traffic for this phase.
  __device__ __forceinline__ void arrive_expect_tx(uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(addr()), "r"(bytes)
                 : "memory");
  }
  __device__ __forceinline__ bool test(uint32_t parity) const {
    uint32_t ok;
    asm volatile(
        "{\n .reg .pred p;\n"
        " mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}"
        : "=r"(ok)
        : "r"(addr()), "r"(parity)
        : "memory");
    return ok != 0;
  }
  // Blocks until the phase with this parity has completed (try_wait sleeps in hardware for a
  // bounded time per attempt, so the loop is not a hot spin).
  __device__ __forceinline__ void wait(uint32_t parity) const {
    while (!test(parity)) {
    }
  }
};

// Makes barrier initialisation visible to the async proxy (TMA) and to the other threads;
// follow it with a block-wide barrier before any use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Position in a ring of `Stages` slots and the parity of the current pass.
template <int Stages>
struct PipeState {
  uint32_t index = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == Stages) {
      index = 0;
      phase ^= 1;
    }
  }
};

}  // namespace weave::tile
