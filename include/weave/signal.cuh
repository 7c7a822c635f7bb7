// signal, signal_all, wait, barrier: one-way release/acquire signalling on monotonic 64-bit
// counters in the symmetric heap. Counters are never reset: a launch waits for
// `round * per_round` where the host advances `round` (see runtime/signals.hpp).
#pragma once
#include <cstdint>

#include "weave/signal_types.hpp"

namespace weave {

namespace detail {
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned long long ld_acquire_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_sys_add(unsigned long long* p, unsigned long long v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void red_relaxed_sys_add(unsigned long long* p, unsigned long long v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// A system-scope release costs a MEMBAR.SYS (~0.6 us on H200, measured): pay it once per batch.
__device__ __forceinline__ void fence_release_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
}  // namespace detail

// Adds `value` to counter `index` on rank `dst`. Release at system scope: every write this thread
// made before (and, after a __syncthreads, its block's) is visible to whoever acquires the count.
// After TMA stores, call store_wait() first: the release does not cover in-flight bulk copies.
__device__ __forceinline__ void signal(const signals& s, int dst, int index, unsigned long long value = 1) {
  detail::red_release_sys_add(s.ptr[dst] + index, value);
}

__device__ __forceinline__ void signal_all(const signals& s, int index, unsigned long long value = 1) {
  detail::fence_release_sys();
  for (int r = 0; r < s.world; ++r) detail::red_relaxed_sys_add(s.ptr[r] + index, value);
}

namespace detail {
// The first waiter to expire records who waited for what; every expired waiter traps. The host
// turns the record into an error (Communicator::sync).
__device__ __noinline__ inline void wait_expired(const signals& s, int index, unsigned long long expected,
                                                 unsigned long long observed) {
  if (atomicCAS(&s.record->timed_out, 0, 1) == 0) {
    s.record->rank = s.rank;
    s.record->name_id = s.name_id;
    s.record->index = index;
    s.record->expected = expected;
    s.record->observed = observed;
    s.record->block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    s.record->thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    __threadfence_system();
  }
  __trap();
}

// Spins on `ready()`, which returns whether the awaited value arrived; once the observed value
// has not changed for the set's timeout, reports (index, expected, observed()) and traps. The
// clock restarts whenever the observed value moves: a wait that counts the work of a whole
// kernel (e.g. output tiles landing for seconds) is progress, not a hang.
template <class Ready, class Observed>
__device__ __forceinline__ void poll(const signals& s, int index, unsigned long long expected, Ready&& ready,
                                     Observed&& observed) {
  if (ready()) return;
  unsigned long long t0 = globaltimer();
  auto last = observed();
  for (unsigned spins = 1;; ++spins) {
    if (ready()) return;
    if (s.timeout_ns && (spins & 255) == 0) {
      const unsigned long long now = globaltimer();
      const auto seen = observed();
      if (seen != last) {
        last = seen;
        t0 = now;
      } else if (now - t0 > s.timeout_ns) {
        wait_expired(s, index, expected, seen);
      }
    }
  }
}
}  // namespace detail

// Polls this rank's counter `index` until it is >= expected (acquire, system scope). On timeout
// records who waited for what and traps; the host turns the record into an error.
__device__ __forceinline__ void wait(const signals& s, int index, unsigned long long expected) {
  const unsigned long long* p = s.ptr[s.rank] + index;
  unsigned long long v = 0;
  detail::poll(
      s, index, expected, [&] { return (v = detail::ld_acquire_sys(p)) >= expected; }, [&] { return v; });
}

// All ranks meet at counter `index`: each signals every rank once, then waits until all `world`
// signals of this round arrived. `round` is 1 for the first barrier on this counter, then 2, ...
// One thread per block calls it; the caller synchronizes its block around it.
__device__ __forceinline__ void barrier(const signals& s, int index, unsigned long long round) {
  signal_all(s, index);
  wait(s, index, round * static_cast<unsigned long long>(s.world));
}

}  // namespace weave
