// signal, signal_all, wait, barrier: one-way release/acquire signalling on monotonic 64-bit
// counters in the symmetric heap. Counters are never reset: a launch waits for
// `round * per_round` where the host advances `round` (SignalSet, runtime/communicator.hpp).
#pragma once
#include <cstdint>

#include "weave/memory_order.cuh"
#include "weave/signal_types.hpp"

namespace weave {

// Adds `value` to counter `index` on rank `dst`. Release at system scope: every write this thread
// made before (and, after a __syncthreads, its block's) is visible to whoever acquires the count.
// After TMA stores, call store_wait() first: the release does not cover in-flight bulk copies.
__device__ __forceinline__ void signal(const signals& s, int dst, int index, unsigned long long value = 1) {
  red_add_release_sys(s.ptr[dst] + index, value);
}

__device__ __forceinline__ void signal_all(const signals& s, int index, unsigned long long value = 1) {
  fence_acq_rel_sys();  // one MEMBAR.SYS for the world's adds (the release pattern)
  for (int r = 0; r < s.world; ++r) red_add_relaxed_sys(s.ptr[r] + index, value);
}

namespace detail {
// A wait that ends the kernel: a peer rejected a call this rank had launched
// (Communicator::agree_call; it will never feed this wait), then the host reads who and why from
// its mailbox; or the wait timed out, and the first waiter to expire records who waited for what.
// Every such waiter traps; the host turns the record into an error (Communicator::sync).
__device__ __noinline__ inline void wait_expired(const signals& s, int index, unsigned long long expected,
                                                 unsigned long long observed) {
  if (s.abort)
    if (const int by = *s.abort) {
      atomicCAS(&s.record->aborted_by, 0, by);
      __threadfence_system();
      __trap();
    }
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

// A stalled wait reads the abort word (host memory, a bus round trip) after this long without
// progress: only while it idles anyway.
constexpr unsigned long long kStallNs = 1'000'000;
__device__ __forceinline__ bool aborted(const signals& s) { return s.abort && *s.abort != 0; }

// Spins on `ready()`, which returns whether the awaited value arrived; once the observed value
// has not changed for the set's timeout, reports (index, expected, observed()) and traps. The
// clock restarts whenever the observed value moves: a wait that counts the work of a whole
// kernel (e.g. output tiles landing for seconds) is progress, not a hang. A wait stalled for
// kStallNs also ends once a peer has written this rank's abort word.
template <class Ready, class Observed>
__device__ __forceinline__ void poll(const signals& s, int index, unsigned long long expected, Ready&& ready,
                                     Observed&& observed) {
  if (ready()) return;
  unsigned long long t0 = globaltimer();
  auto last = observed();
  for (unsigned spins = 1;; ++spins) {
    if (ready()) return;
    if ((spins & 255) == 0) {
      const unsigned long long now = globaltimer();
      const auto seen = observed();
      if (seen != last) {
        last = seen;
        t0 = now;
      } else if ((s.timeout_ns && now - t0 > s.timeout_ns) || (now - t0 > kStallNs && aborted(s))) {
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
      s, index, expected, [&] { return (v = ld_acquire_sys(p)) >= expected; }, [&] { return v; });
}

// All ranks meet at counter `index`: each signals every rank once, then waits until all `world`
// signals of this round arrived. `round` is 1 for the first barrier on this counter, then 2, ...
// One thread per block calls it; the caller synchronizes its block around it.
__device__ __forceinline__ void barrier(const signals& s, int index, unsigned long long round) {
  signal_all(s, index);
  wait(s, index, round * static_cast<unsigned long long>(s.world));
}

}  // namespace weave
