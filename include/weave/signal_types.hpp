// Plain data shared by host and device for signals (no device code: host compilers include it).
#pragma once
#include "weave/config.hpp"

namespace weave {

// Written by the first wait that times out; host-mapped so the host can read it after the trap
// has killed the context.
struct WaitRecord {
  int timed_out;  // 0 until a wait expires
  int rank;
  int name_id;  // which signal set (the host keeps the names)
  int index;
  unsigned long long expected;
  unsigned long long observed;
  int block, thread;
  int aborted_by;  // rank + 1 of a peer that rejected a call this rank had launched (0: none)
};

// Device view of a signal set: `count` counters per rank, peer-mapped.
template <int MaxWorld = kMaxWorld>
struct signals_view {
  unsigned long long* ptr[MaxWorld];
  int world;
  int rank;
  int count;
  int name_id;
  unsigned long long timeout_ns;  // 0 = wait forever
  WaitRecord* record;             // host-mapped
  const volatile int* abort;      // host-mapped: a peer's rank + 1 once it rejected a launched call
};
using signals = signals_view<>;

// The round a launch waits for (a multiple of it: counters are never reset). Taken on the host
// when the call is enqueued (`cell` null), or, for a launch that a CUDA graph may replay, read on
// the device from the signal set's round cell, which a one-thread kernel enqueued right before the
// launch advances (SignalSet::next_round): a replay then waits for its own round, not the one of
// the call that was captured. Kernels read it after pdl_enter (the cell is global memory), as
// `g.ready_round * per_round`.
struct Round {
  unsigned long long host;
  const unsigned long long* cell;
#ifdef __CUDACC__
  __host__ __device__ operator unsigned long long() const {
#ifdef __CUDA_ARCH__
    return cell ? *cell : host;
#else
    return host;  // host code only ever sees host rounds (device-round calls compute nothing on it)
#endif
  }
#endif
};

}  // namespace weave
