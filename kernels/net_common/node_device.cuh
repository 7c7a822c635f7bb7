// Device pieces of the hierarchical fused kernels (nodes of G > 1 ranks: net_tp's AG+GEMM, the
// ring attention) on the node communicator: the call's node arrival, the release of every node
// rank's readiness counters by a block that gives up, and the NVLink fan-out of one unit into the
// same offset of every node rank's buffer.
#pragma once
#include <cstdint>

#include "weave/memory_order.cuh"
#include "weave/net/device.cuh"
#include "weave/signal.cuh"

namespace weave::net {

// One thread: until *c reaches `want` (acquire, system scope: node peers release into it); false
// once the path stopped. No timeout of its own: what it waits for is another block's progress here
// or on a node peer, and every way that stops (a failed peer, a network wait that timed out) stops
// the path.
__device__ inline bool wait_count(const NetHandle& h, const unsigned long long* c, unsigned long long want) {
  for (uint32_t i = 1; ld_acquire_sys(c) < want; ++i)
    if ((i & 1023) == 0 && stopped(h)) return false;
  return true;
}

// One thread, then the verdict in every thread of the block (`word`: an int of its shared
// memory): every node rank entered this call (`arrive` counter 0 gets one signal per node rank
// and call), so no node peer still reads a buffer this call writes into. False once the path
// stopped.
__device__ inline bool wait_node_arrivals(const NetHandle& h, const signals& arrive, unsigned long long round, int G,
                                          int* word) {
  const unsigned long long want = round * static_cast<unsigned long long>(G);
  return block_agree(threadIdx.x == 0 ? wait_count(h, arrive.ptr[arrive.rank], want) : true, word);
}

// Counters [0, n) of `ready` on every node rank far past any expectation: a block that gives up
// calls it, so no compute block waits for data that will not come (the outputs are then garbage
// and finish() throws the diagnostic).
__device__ inline void release_node(const signals& ready, int n) {
  for (int d = 0; d < ready.world; ++d)
    for (int i = threadIdx.x; i < n; i += blockDim.x) red_add_release_sys(ready.ptr[d] + i, 1ull << 40);
}

// The block copies `bytes` (a multiple of 16) from `src` to offset `off` of node[d] for every node
// rank d < G except `skip` (-1: none), reading each 16 bytes once: from the mapped receive buffer
// (Mapped: volatile loads, the proxy wrote it) or from device memory read once (streaming loads).
template <bool Mapped>
__device__ inline void copy_to_node(char* const* node, int G, int skip, long long off, const char* src,
                                    long long bytes) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  for (long long i = threadIdx.x; i < bytes / 16; i += blockDim.x) {
    const uint4 v = Mapped ? ld_volatile_v4(s + i) : __ldcs(s + i);
    for (int d = 0; d < G; ++d)
      if (d != skip) reinterpret_cast<uint4*>(node[d] + off)[i] = v;
  }
}

}  // namespace weave::net
