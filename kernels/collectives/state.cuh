// A Collectives object's call counts, kept on the device. Every count a call waits for (the direct
// path's signal totals, the push ring's steps, the LL call number) is read by the call's kernel
// after pdl_enter and advanced by the same kernel's last block, not fixed on the host when the
// call is enqueued: a CUDA graph replays a launch the host enqueued once, and each replay must
// wait for its own counts. Calls of one object run in issue order (CallOrder), so one kernel's
// advance is seen by the next one's read.
#pragma once
#include "weave/memory_order.cuh"

namespace weave::coll {

struct CallState {
  unsigned long long ll_calls;       // LL and LL128 calls run (they share scratch parity and flags)
  unsigned long long arrived, done;  // the direct path's counters 0 and 1 (their totals)
  unsigned long long push_steps;     // every push counter's total
  unsigned long long restarted;      // the LL restart barrier's counter (its total)
  unsigned int blocks_out;           // blocks of the running call past their last read (the last resets it)
};

#ifdef __CUDACC__
// Called by every thread of every block once the block no longer reads *st: the last block to
// arrive applies the call's increments (`advance(CallState&)`), which the next call reads.
template <class F>
__device__ __forceinline__ void leave(CallState* st, F&& advance) {
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(&st->blocks_out, 1u) != gridDim.x - 1) return;
  __threadfence();
  advance(*st);
  st->blocks_out = 0;
}
#endif

}  // namespace weave::coll
