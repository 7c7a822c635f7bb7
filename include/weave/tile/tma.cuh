// Device side of TMA: tile loads that complete on an mbarrier, tile stores and reduce-adds
// from shared memory, 1-D bulk copies, and the bulk-group waits. One thread issues each of these.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "weave/tile/mbarrier.cuh"

namespace weave::tile::tma {

__device__ __forceinline__ void prefetch(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Coordinates are in elements, innermost first (column, row).
__device__ __forceinline__ void load_2d(void* dst, const CUtensorMap* map, Mbarrier* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar->addr()), "r"(c0), "r"(c1)
      : "memory");
}

// The same box lands at the same shared-memory offset in every CTA of `cta_mask`, and
// completes bytes on the barrier at the same offset in each of them.
__device__ __forceinline__ void load_2d_multicast(void* dst, const CUtensorMap* map, Mbarrier* bar, int c0, int c1,
                                                  uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%3, %4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar->addr()), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

// 3-D boxes (coordinates innermost first), e.g. {k, n, expert} of E stacked matrices: a box
// never crosses into the next matrix, and overhangs of the two inner dimensions zero-fill.
__device__ __forceinline__ void load_3d(void* dst, const CUtensorMap* map, Mbarrier* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar->addr()), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// 4-D boxes (coordinates innermost first), e.g. {d, head, sequence, batch} of a (B, S, H, D)
// tensor: one (batch, head) slice of rows, zero-filled past the sequence end on load, clipped
// there on store.
__device__ __forceinline__ void load_4d(void* dst, const CUtensorMap* map, Mbarrier* bar, int c0, int c1, int c2,
                                        int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
      "%6}], [%2];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar->addr()), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void store_4d(const CUtensorMap* map, const void* src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

__device__ __forceinline__ void store_2d(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1)
               : "memory");
}

// Element-wise add into global memory (performed at L2; bf16/fp16/fp32).
__device__ __forceinline__ void reduce_add_2d(const CUtensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1)
               : "memory");
}

// 1-D bulk copies (cp.async.bulk, no tensor map): `bytes` contiguous bytes (a multiple of 16;
// 16-byte aligned addresses), e.g. a piece that is one byte range at its source and its
// destination, moved in long writes instead of tensor boxes. A load completes its bytes on `bar`
// (arrive_expect_tx them first); a store joins the bulk group like the tensor stores.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, Mbarrier* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(bar->addr())
               : "memory");
}
// With an L2 cache hint: `policy` from createpolicy, e.g. evict_first_policy().
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, Mbarrier* bar,
                                          uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(bar->addr()), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_u32(src)), "r"(bytes)
               : "memory");
}
// An L2 policy for data read once (it should not displace data other CTAs still share).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

__device__ __forceinline__ void commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// At most N committed groups still reading their shared-memory source (the buffer may then be
// overwritten; the global writes may still be in flight).
template <int N>
__device__ __forceinline__ void wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
// At most N committed groups whose global writes are incomplete: what must precede a signal
// that tells another agent the data is there.
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace weave::tile::tma
