// Memory-order and PTX helpers (primitives layer): every ordered load, store, atomic, fence and
// timer read that weave's cross-GPU code issues is one of these small functions, named for what it
// does and its scope; kernels, the LL/LL128 protocols, tools and tests call them instead of
// writing inline asm. Only what the code uses is here. Each compiles to the instruction it did as
// inline asm where it was written before (same PTX, same SASS qualifiers).
//
// The memory-model facts behind the choices (PTX ISA, "Memory Consistency Model"):
// - Scope is .sys throughout: the other party is another GPU (a peer writing into this GPU's
//   memory over NVLink, or reading it) or the host. A .gpu operation synchronizes only with
//   threads of its own GPU, so it would order nothing against a peer.
// - Only strong operations (.relaxed, .acquire, .release, .volatile, atomics) synchronize, and
//   an aligned strong access of up to 8 bytes is single-copy atomic. The compiler neither
//   caches, merges nor drops them, so a poll on one re-reads memory every time.
// - Release -> acquire: once an acquire read observes a release write (or a strong write
//   after fence.acq_rel, the "release pattern"), every write before the release is visible to
//   every access after the acquire. Release is cumulative: writes the releasing thread has
//   observed (its block's, after a __syncthreads) are covered too. It does not cover bulk copies
//   still in flight: wait for their completion first (store_wait()).
// - Data written by the async proxy (TMA, cp.async.bulk) or read by it is ordered against these
//   generic-proxy accesses only through a proxy fence. Those fences stay in weave/tile/proxy.cuh
//   (tile::fence_proxy_async_shared / _global, included below): the tile substrate and the
//   single-GPU kernels use them too, and the tile layer may not include this one.
// - A .sys release or fence is a MEMBAR.SYS (~0.6 us on H200, measured): where one thread sends
//   several signals, one fence_acq_rel_sys() then relaxed adds costs one, not one per signal.
#pragma once
#include <cuda_runtime.h>

#include "weave/tile/proxy.cuh"

namespace weave {

// ---- 64-bit counters and LL lines ------------------------------------------------------------

// Acquire at system scope: wait()'s poll on a counter. Once it reads a count that a peer's
// release (signal) or release pattern (fence + relaxed add) produced, this thread's later reads
// see everything the peer wrote before it.
__device__ __forceinline__ unsigned long long ld_acquire_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Relaxed at system scope: the LL protocol's 8-byte lines {data, flag}. The flag and its data are
// one aligned 8-byte word, read single-copy atomically: a line with this call's flag carries
// this call's data, and nothing else needs ordering, so no acquire.
__device__ __forceinline__ unsigned long long ld_relaxed_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
// The writer's side of an LL line: one single-copy-atomic store; the line carries its own data,
// so no release.
__device__ __forceinline__ void st_relaxed_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// GPU-scope relaxed load and store of a word that only this GPU's CTAs share (the gathered
// attention's front-of-queue hints: a stale value only costs an unaligned start, never a wrong
// result, so neither order nor system scope is needed).
__device__ __forceinline__ unsigned long long ld_relaxed_gpu(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void st_relaxed_gpu(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Release add at system scope: signal(). The thread's earlier writes (its block's, after a
// __syncthreads) are visible to whoever acquires the count. A red, not an atom: no value comes
// back, so the thread does not wait for the peer's memory to answer.
__device__ __forceinline__ void red_add_release_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Relaxed add at system scope: orders nothing by itself. After fence_acq_rel_sys() it is a
// release (the release pattern): one fence for a batch of adds (signal_all, push, gemm_ar).
__device__ __forceinline__ void red_add_relaxed_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Acquire-release fence at system scope: the fence of the release pattern above (MEMBAR.SYS,
// ~0.6 us: pay it once per batch of signals).
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// ---- 16-byte pieces (LL128) ------------------------------------------------------------------

// Volatile 16-byte vector load/store: one lane's piece of an LL128 line. .volatile counts as
// .relaxed.sys in the memory model, and the compiler keeps it one 16-byte access per lane (the
// line leaves in one warp instruction). Single-copy atomicity is per 4-byte element, not per
// vector: that a reader sees a whole line once its flag arrived comes from NVLink's 128-byte
// writes, not from the model (collectives/ll128.cuh says what the protocol relies on).
__device__ __forceinline__ void st_volatile_v4(uint4* p, const uint4& v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ uint4 ld_volatile_v4(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

// ---- Grid dependency (programmatic dependent launch, weave/pdl.cuh) ----------------------------

// Blocks until the grids this one depends on have completed and their memory operations are
// visible to it: a full visibility guarantee, no fence needed after it.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// Lets the next programmatic launch be scheduled. Orders nothing: that grid's own griddep_wait()
// is what makes this grid's writes visible to it, so issuing this early is safe.
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// ---- Time --------------------------------------------------------------------------------------

// The global nanosecond timer (for timeouts and timed spins). Volatile, so it is read again on
// every call in a loop; not ordered with memory accesses (no memory clobber).
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Stamps for timing memory operations: the global timer and the SM's cycle counter with a memory
// clobber, so that the compiler keeps every memory access on its side of the stamp.
__device__ __forceinline__ unsigned long long globaltimer_stamp() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned long long clock64_stamp() {
  unsigned long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  return c;
}

}  // namespace weave
