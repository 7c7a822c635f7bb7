// What the TP kernels with the adaptive SM split (gemm_ar v2, gemm_rs v6, ag_gemm v10, and the
// inter-node GEMM + RS / AR's adaptive form, net_tp/net_gemm_rs_adaptive.cuh) share: a block's next
// task from the policy over the call's ledger (sm_split.hpp, sm_ledger.cuh), with the readiness of
// a reduction read from this rank's ready counter, and the accounting of a finished task. Each
// kernel supplies its tiles (compute tasks: every output tile; communication tasks: the tiles this
// rank reduces, or ag_gemm's push units) and the counter index of each of its reductions.
#pragma once
#include <cuda_runtime.h>

#include "tp_common/adaptive_stats.hpp"
#include "tp_common/sm_ledger.cuh"
#include "weave/common/error.hpp"
#include "weave/lcsc.cuh"
#include "weave/memory_order.cuh"
#include "weave/signal.cuh"

namespace weave::tp {

// Host: the statistics a ledger in device memory kept over its launches (a blocking copy on the
// legacy stream, which does not wait for a non-blocking stream: the caller synchronises first).
inline AdaptiveStats read_adaptive_stats(const void* ledger) {
  sm_split::Ledger l{};
  WEAVE_CUDA_CHECK(cudaMemcpy(&l, ledger, sizeof l, cudaMemcpyDeviceToHost));
  return {l.launches, l.early_comm, l.peak_comm};
}

struct AdaptiveState {
  sm_split::Role role = sm_split::Role::Compute;
};

// The split's part of an adaptive kernel's globals (a base of each one's Globals): the call's
// ledger in device memory and the priors of the host's cost model.
struct SplitGlobals {
  sm_split::Ledger* ledger;
  float compute_prior, comm_prior;  // cycles per compute / communication task before one is measured

  __host__ void set_split(sm_split::Ledger* l, double compute, double comm) {
    ledger = l;
    compute_prior = static_cast<float>(compute);
    comm_prior = static_cast<float>(comm);
  }
  // The policy's constants of a choice by one of `blocks` blocks among these task counts.
  __device__ __forceinline__ sm_split::LedgerParams params(int blocks, long long compute_tasks,
                                                           long long comm_tasks) const {
    sm_split::LedgerParams p;
    p.blocks = blocks;
    p.compute_tasks = compute_tasks;
    p.comm_tasks = comm_tasks;
    p.compute_prior = compute_prior;
    p.comm_prior = comm_prior;
    return p;
  }
};

// A reduction split's inputs of one launch: the kernel's split globals, the task counts, and this
// rank's ready counters (of `ready_set`, whose timeout and abort word end a poll that sees no
// progress), of which a reduction's reaches `round * per_round` once every rank's partial is in.
struct AdaptiveTasks {
  const SplitGlobals* split;
  long long compute_tasks, comm_tasks;
  const signals* ready_set;
  const unsigned long long* ready;
  unsigned long long round, per_round;
};

// The policy's next task over `l` for any readiness of the communication tasks: begun(k), in_place(k)
// as sm_ledger.cuh's next_task reads them; with compute_ready(i), compute tasks that have an input
// too (ag_gemm v10: a peer's rows), claimed only once it is in place.
template <class ComputeReady, class Begun, class InPlace>
__device__ __forceinline__ lcsc::Task adaptive_task(sm_split::Ledger& l, const sm_split::LedgerParams& p,
                                                    AdaptiveState& st, ComputeReady&& compute_ready, Begun&& begun,
                                                    InPlace&& in_place) {
  const sm_split::Task t = sm_split::next_task(l, p, st.role, compute_ready, begun, in_place);
  if (t.role == sm_split::Role::Done) return {};
  return {t.role == sm_split::Role::Compute ? lcsc::TaskKind::Work : lcsc::TaskKind::Other, static_cast<int>(t.index)};
}
template <class Begun, class InPlace>
__device__ __forceinline__ lcsc::Task adaptive_task(sm_split::Ledger& l, const sm_split::LedgerParams& p,
                                                    AdaptiveState& st, Begun&& begun, InPlace&& in_place) {
  return adaptive_task(l, p, st, sm_split::NoComputeInput{}, begun, in_place);
}

// A readiness that next_task polls, ended as weave's waits end (signal.cuh's detail::poll): it
// answers true once `ok`, or once the observed count of the polled task (`key`) has not moved for
// the signal set's timeout, or for kStallNs after a peer rejected a call this rank launched (the
// abort word, read every 32nd poll: host memory). The task is then handed out as if in place and
// its own wait() records the diagnostic or traps: a lost signal ends in weave's diagnostic, not a
// hang. One per polled readiness, reset (key -1) at each choice: the clock counts one unbroken poll.
struct AdaptivePoll {
  long long key = -1;
  unsigned long long seen = 0, since = 0;
  unsigned polls = 0;
  __device__ __forceinline__ bool operator()(const signals& s, long long k, unsigned long long observed, bool ok) {
    if (ok) return true;
    const unsigned long long now = globaltimer();
    if (k != key || observed != seen) {
      key = k, seen = observed, since = now, polls = 0;
      return false;
    }
    const unsigned long long idle = now - since;
    if (s.timeout_ns && idle > s.timeout_ns) return true;
    return idle > weave::detail::kStallNs && (++polls & 31) == 0 && weave::detail::aborted(s);
  }
};

// The loader's state of gemm_rs v6 and gemm_ar v2: its role, and its poll of a reduction's input.
struct AdaptiveReductionState {
  AdaptiveState split;
  AdaptivePoll in_place;
};

// ready_index(k): communication task k's counter. A reduction is begun once some rank's partial
// arrived this round, in place once all did (sm_ledger.cuh claims it only then). A poll of a
// reduction's input that sees no progress for the ready set's timeout (a peer that never made this
// call) hands the task out anyway, and its wait in adaptive_reduction reports it (AdaptivePoll).
template <class ReadyIndex>
__device__ __forceinline__ lcsc::Task adaptive_next_task(const AdaptiveTasks& a, AdaptiveReductionState& st,
                                                         int blocks, ReadyIndex&& ready_index) {
  const sm_split::LedgerParams p = a.split->params(blocks, a.compute_tasks, a.comm_tasks);
  const unsigned long long all = a.round * a.per_round, before = all - a.per_round;
  const auto count = [&](long long k) { return ld_relaxed_sys(a.ready + ready_index(k)); };
  st.in_place.key = -1;  // the timeout counts one unbroken poll within this choice
  return adaptive_task(
      *a.split->ledger, p, st.split, [&](long long k) { return count(k) > before; },
      [&](long long k) {
        const unsigned long long n = count(k);
        return st.in_place(*a.ready_set, k, n, n >= all);
      });
}

// A reduction as kernel K's other task, by its consumer threads t = 0..n-1: thread 0 acquires the
// input (in place when the task was handed out: the wait is the acquire), the group runs
// reduce(), then thread 0 tells every rank (`done` counter 0). Returns the reduction's cycles.
template <class K, class Reduce>
__device__ __forceinline__ unsigned long long adaptive_reduction(const signals& ready, int index,
                                                                 unsigned long long expected, const signals& done, int t,
                                                                 Reduce&& reduce) {
  if (t == 0) wait(ready, index, expected);
  lcsc::consumers_sync<K>();
  const long long t0 = clock64();
  reduce();
  lcsc::consumers_sync<K>();
  if (t == 0) signal_all(done, 0);
  return static_cast<unsigned long long>(clock64() - t0);
}

__device__ __forceinline__ void adaptive_task_finished(sm_split::Ledger& l, lcsc::Task t, unsigned long long cycles) {
  sm_split::task_done(l, t.kind == lcsc::TaskKind::Work ? sm_split::Role::Compute : sm_split::Role::Comm, cycles);
}

// The lcsc hooks of a split whose call ends with the split itself (ag_gemm v10, the inter-node
// AG+GEMM and GEMM+RS / AR; a base of their kernels): each task's cycles into the ledger, and the
// last block out zeroes the ledger's call counters for the next launch. gemm_rs v6 and gemm_ar v2
// also wait for their done signals there, and write their own.
template <class Globals>
struct LedgerHooks {
  static __device__ __forceinline__ void task_finished(const Globals& g, lcsc::Task t, unsigned long long cycles) {
    adaptive_task_finished(*g.ledger, t, cycles);
  }
  static __device__ __forceinline__ void block_exit(const Globals& g, int blocks) {
    (void)sm_split::block_exit(*g.ledger, blocks);
  }
};

}  // namespace weave::tp
