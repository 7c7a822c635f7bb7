// The shared ledger of the adaptive SM split (sm_split.hpp) and the claim protocol over it: what one
// thread of each block of a persistent kernel calls at a task boundary to learn its next task. The
// same __host__ __device__ code runs in a kernel and in the CPU tests' threads
// (tests/tp/test_sm_ledger_cpu.cu, which run it as the blocks of several ranks of GEMM + all-reduce
// and of AG + GEMM).
//
// The ledger is one call's, in this GPU's global memory, zero when a launch starts: the last block
// out zeroes it for the next launch on the stream (so it needs no round number, and a graph replay
// finds it zeroed too), all but three statistics words kept across launches. Only this GPU's
// blocks touch it: device-scope atomics, relaxed.
//
// The guarantees (whatever the policy decides, and however stale the snapshot it decides on):
// - every compute task 0..compute_tasks-1 and every communication task 0..comm_tasks-1 is handed to
//   exactly one block (compute: fetch-and-add on the claim counter; communication: compare-and-swap
//   of the claim counter from the index the block read, so that no block holds an index another
//   could run while it decides);
// - while a compute task is unclaimed, at most B - 1 blocks are in the communication role (a block
//   joins with a fetch-and-add that it undoes when the count had reached the target, which
//   target_comm_blocks bounds by B - 1 while compute is left), so some block computes and a block
//   waiting for a communication task's input, produced by compute here or on a peer, cannot stall
//   the compute: no deadlock;
// - a block is handed Done only when every task of both kinds is claimed.
// Compute tasks with an input (the next_task below that takes `compute_ready`; AG + GEMM, whose
// tiles of a peer's rows wait for that peer's pushes) are claimed like communication tasks instead:
// by compare-and-swap from the index read, and only once that task's input is in place (until then
// the block polls and decides again, holding no index). So no block ever waits inside a task of
// either kind, and a stalled compute role may hand every block to the communication (sm_split.hpp's
// comm_cap); the argument that this cannot deadlock is ag_gemm_kernel.cuh's (AgAdaptiveKernelT).
#pragma once
#include <type_traits>

#include "tp_common/sm_split.hpp"

#ifdef __CUDA_ARCH__
#include "weave/memory_order.cuh"
#else
#include <atomic>
#include <thread>
#endif

#ifdef __CUDACC__
#define WEAVE_LEDGER_HD __host__ __device__ __forceinline__
#else
#define WEAVE_LEDGER_HD inline
#endif

namespace weave::tp::sm_split {

// One call's counters (zero at a launch's start), then statistics kept across launches (never
// zeroed: what weave-bench and the tests read to see whether blocks changed role mid-compute).
struct Ledger {
  unsigned long long compute_claimed, compute_done, compute_cycles;
  unsigned long long comm_claimed, comm_done, comm_cycles;
  unsigned long long comm_blocks;  // blocks in the communication role now
  unsigned long long exited;       // blocks that left the kernel
  unsigned long long launches;     // statistics: launches ended (counted by the last block out)
  unsigned long long early_comm;   //   communication tasks handed out while a compute task was unclaimed
  unsigned long long peak_comm;    //   the most blocks in the communication role while one was
};

// A launch's constants: the grid and the task counts, and the cost priors (cycles per task) the
// policy uses before a task of that kind has been measured.
struct LedgerParams {
  int blocks = 0;
  long long compute_tasks = 0, comm_tasks = 0;
  double compute_prior = 1.0, comm_prior = 1.0;
};

struct Task {
  Role role = Role::Done;
  long long index = -1;  // the compute or communication task's index; -1 for Done
};

namespace ledger_detail {

WEAVE_LEDGER_HD unsigned long long load(const unsigned long long* p) {
#ifdef __CUDA_ARCH__
  return ld_relaxed_gpu(p);
#else
  return std::atomic_ref<unsigned long long>(*const_cast<unsigned long long*>(p)).load(std::memory_order_relaxed);
#endif
}

WEAVE_LEDGER_HD void store(unsigned long long* p, unsigned long long v) {
#ifdef __CUDA_ARCH__
  st_relaxed_gpu(p, v);
#else
  std::atomic_ref<unsigned long long>(*p).store(v, std::memory_order_relaxed);
#endif
}

WEAVE_LEDGER_HD void store_max(unsigned long long* p, unsigned long long v) {
#ifdef __CUDA_ARCH__
  atomicMax(p, v);
#else
  std::atomic_ref<unsigned long long> a(*p);
  unsigned long long cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
#endif
}

// Between two polls of a communication task's input.
WEAVE_LEDGER_HD void poll_pause() {
#ifdef __CUDA_ARCH__
  __nanosleep(128);
#else
  std::this_thread::yield();
#endif
}

// Returns the value before the add (v may be ~0ull: minus one).
WEAVE_LEDGER_HD unsigned long long fetch_add(unsigned long long* p, unsigned long long v) {
#ifdef __CUDA_ARCH__
  return atomicAdd(p, v);
#else
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v, std::memory_order_relaxed);
#endif
}

WEAVE_LEDGER_HD bool compare_exchange(unsigned long long* p, unsigned long long expected, unsigned long long desired) {
#ifdef __CUDA_ARCH__
  return atomicCAS(p, expected, desired) == expected;
#else
  return std::atomic_ref<unsigned long long>(*p).compare_exchange_strong(expected, desired, std::memory_order_relaxed);
#endif
}

// The exit count orders every block's ledger updates before the last block's zeroing.
WEAVE_LEDGER_HD unsigned long long exit_add(unsigned long long* p) {
#ifdef __CUDA_ARCH__
  __threadfence();
  const unsigned long long old = atomicAdd(p, 1ull);
  __threadfence();
  return old;
#else
  return std::atomic_ref<unsigned long long>(*p).fetch_add(1, std::memory_order_acq_rel);
#endif
}

}  // namespace ledger_detail

// What the policy reads: the ledger's counters (each read on its own, relaxed: a snapshot that
// may be slightly stale, which the claims above tolerate), the claim counters capped at the task
// counts (a fetch-and-add past the end leaves them above).
WEAVE_LEDGER_HD View snapshot(const Ledger& l, const LedgerParams& p) {
  using ledger_detail::load;
  View v;
  v.blocks = p.blocks;
  v.comm_blocks = static_cast<int>(load(&l.comm_blocks));
  v.compute_tasks = p.compute_tasks;
  v.compute_claimed = static_cast<long long>(load(&l.compute_claimed));
  if (v.compute_claimed > p.compute_tasks) v.compute_claimed = p.compute_tasks;
  v.compute_done = static_cast<long long>(load(&l.compute_done));
  v.compute_cycles = static_cast<double>(load(&l.compute_cycles));
  v.comm_tasks = p.comm_tasks;
  v.comm_claimed = static_cast<long long>(load(&l.comm_claimed));
  v.comm_done = static_cast<long long>(load(&l.comm_done));
  v.comm_cycles = static_cast<double>(load(&l.comm_cycles));
  v.compute_prior = p.compute_prior;
  v.comm_prior = p.comm_prior;
  return v;
}

// A compute block enters the communication role, which `v` (its snapshot) says is below its target:
// the count is raised, and lowered again if it had reached the target meanwhile (blocks decide on
// snapshots that may not show each other's joins) while compute is left; then it returns false.
WEAVE_LEDGER_HD bool join_comm(Ledger& l, const View& v) {
  using ledger_detail::fetch_add;
  const long long old = static_cast<long long>(fetch_add(&l.comm_blocks, 1ull));
  if (v.compute_claimed < v.compute_tasks && old >= comm_cap(v)) {
    fetch_add(&l.comm_blocks, ~0ull);
    return false;
  }
  if (v.compute_claimed < v.compute_tasks) ledger_detail::store_max(&l.peak_comm, static_cast<unsigned long long>(old + 1));
  return true;
}

// A block's next task. `role` is the block's present role (Compute at its start; the call updates
// it); `begun(k)` says whether communication task k's input has begun to arrive, `in_place(k)`
// whether it is complete (the kernel reads its ready count against one and all ranks' signals).
// A communication task is claimed only once its input is in place (the block polls until then,
// deciding again at each poll): no block holds an index another could run, and a handed-out
// reduction never waits (the simulation's kept rule; claiming at `begun` and waiting met the 5 %
// target in fewer scenarios, perf-notes 2026-12-04 fourth session). A block handed Done has left
// the communication role; it calls block_exit.
// `compute_ready(i)`: whether compute task i's input is in place (the overload without it: compute
// tasks need none, NoComputeInput). With one, compute task i is claimed only once it is (by
// compare-and-swap from the index read, as a communication task; the block polls until then), and
// a block whose next compute task waits communicates instead (sm_split.hpp's next_role).
struct NoComputeInput {
  WEAVE_LEDGER_HD bool operator()(long long) const { return true; }
};
template <class ComputeReady, class Begun, class InPlace>
WEAVE_LEDGER_HD Task next_task(Ledger& l, const LedgerParams& p, Role& role, ComputeReady&& compute_ready, Begun&& begun,
                               InPlace&& in_place) {
  using namespace ledger_detail;
  constexpr bool kComputeInput = !std::is_same_v<std::decay_t<ComputeReady>, NoComputeInput>;
  for (;;) {
    View v = snapshot(l, p);
    v.comm_next_ready = v.comm_claimed < v.comm_tasks && begun(v.comm_claimed);
    if constexpr (kComputeInput)
      v.compute_next_ready = v.compute_claimed < v.compute_tasks && compute_ready(v.compute_claimed);
    Role want = next_role(v, role);
    if (want == Role::Comm && role != Role::Comm) {
      if (join_comm(l, v)) role = Role::Comm;
      else want = Role::Compute;
    }
    if (want != Role::Comm && role == Role::Comm) fetch_add(&l.comm_blocks, ~0ull);
    if (want == Role::Done) {
      role = Role::Done;
      return {};
    }
    role = want;
    if (want == Role::Compute) {
      if constexpr (kComputeInput) {
        const long long i = v.compute_claimed;  // < compute_tasks: next_role saw compute left
        if (!v.compute_next_ready) {            // its input is not in place: poll, holding nothing
          poll_pause();
          continue;
        }
        if (compare_exchange(&l.compute_claimed, static_cast<unsigned long long>(i),
                             static_cast<unsigned long long>(i + 1)))
          return {Role::Compute, i};
        continue;  // another block took i: decide again on a fresh snapshot
      } else {
        const long long i = static_cast<long long>(fetch_add(&l.compute_claimed, 1ull));
        if (i < p.compute_tasks) return {Role::Compute, i};
        continue;  // the last one went to another block: decide again
      }
    }
    const long long k = v.comm_claimed;
    if (k < p.comm_tasks && !in_place(k)) {
      poll_pause();
      continue;
    }
    if (k < p.comm_tasks && compare_exchange(&l.comm_claimed, static_cast<unsigned long long>(k),
                                             static_cast<unsigned long long>(k + 1))) {
      if (v.compute_claimed < v.compute_tasks) fetch_add(&l.early_comm, 1ull);
      return {Role::Comm, k};
    }
    // Another block took k (or it was the last): decide again on a fresh snapshot.
  }
}

template <class Begun, class InPlace>
WEAVE_LEDGER_HD Task next_task(Ledger& l, const LedgerParams& p, Role& role, Begun&& begun, InPlace&& in_place) {
  return next_task(l, p, role, NoComputeInput{}, begun, in_place);
}

// A task finished after `cycles` (the block's clock): the costs the policy averages.
WEAVE_LEDGER_HD void task_done(Ledger& l, Role r, unsigned long long cycles) {
  using ledger_detail::fetch_add;
  if (r == Role::Compute) {
    fetch_add(&l.compute_cycles, cycles);
    fetch_add(&l.compute_done, 1ull);
  } else {
    fetch_add(&l.comm_cycles, cycles);
    fetch_add(&l.comm_done, 1ull);
  }
}

// A block leaves the kernel (after its Done). The last of `blocks` zeroes the call's counters for
// the next launch (not the statistics) and returns true.
WEAVE_LEDGER_HD bool block_exit(Ledger& l, int blocks) {
  using namespace ledger_detail;
  if (exit_add(&l.exited) != static_cast<unsigned long long>(blocks - 1)) return false;
  fetch_add(&l.launches, 1ull);
  store(&l.compute_claimed, 0);
  store(&l.compute_done, 0);
  store(&l.compute_cycles, 0);
  store(&l.comm_claimed, 0);
  store(&l.comm_done, 0);
  store(&l.comm_cycles, 0);
  store(&l.comm_blocks, 0);
  store(&l.exited, 0);
  return true;
}

}  // namespace weave::tp::sm_split

#undef WEAVE_LEDGER_HD
