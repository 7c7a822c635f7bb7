// Thread-block clusters: rank, cluster-wide barrier, and arrivals on a peer CTA's mbarrier
// (distributed shared memory), as the 2-CTA multicast GEMM needs them.
#pragma once
#include <cstdint>

#include "weave/tile/mbarrier.cuh"

namespace weave::tile::cluster {

__device__ __forceinline__ uint32_t ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster arrives; release/acquire orders shared-memory work
// (barrier initialisation before first remote use; last remote arrival before exit).
__device__ __forceinline__ void sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// Arrive on the barrier at the same shared-memory offset in CTA `rank` of this cluster.
// Default (CTA-scope) semantics on purpose: `.release.cluster` compiles to MEMBAR.ALL.GPU plus
// cache invalidation on every call, which cut the 2-CTA GEMM to 0.68x (perf-notes.md). The
// releases this carries are "my wgmma reads of the stage are done" (already ordered by
// wgmma.wait_group), which needs no memory fence.
__device__ __forceinline__ void arrive_remote(const Mbarrier& bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar.addr()), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

}  // namespace weave::tile::cluster
