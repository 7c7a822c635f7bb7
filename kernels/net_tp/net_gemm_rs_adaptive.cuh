// The inter-node GEMM + ReduceScatter / AllReduce with the adaptive SM split (issue 22, mKernel
// section 3.2), nodes of one rank: net_gemm_rs_kernel.cuh's work without fixed send and receive
// blocks. Every block of the persistent grid starts computing the 128 x 256 tiles of this rank's
// partial product in the same order (rs_item) into the same scratch, counted in per row tile
// (tile_done); at each task boundary its loader asks the split's policy (tp_common/sm_split.hpp
// over the ledger of sm_ledger.cuh) whether it computes the next tile or runs the next
// communication task, layout.hpp's rs_comm_task list, by the block's consumer threads:
//   Send (s, u)    unit u of send_peer(r, s)'s shard: copied from the scratch into the mapped send
//                  buffer, its command queued (the first send task of the call is the send gate's
//                  leader: it waits until the previous calls' commands completed);
//   Reduce (u)     unit u of the own shard: the own partial plus every step's arrival, summed in
//                  fp32 in step order (as the fixed kernel), rounded once into the output; with AR
//                  also staged in the send buffer and queued to every rail peer;
//   Gather (s, u)  AR: the rail peer's reduced unit into the output.
// A task is handed out only once its input is in place (the own row tile complete; the arrivals'
// flags raised), so a block never waits inside a task for another's progress; the policy (eq. 2 on
// the tasks left and their measured cycles) keeps at least one block computing while tiles are
// left, and every block communicates once they are all claimed. The readiness the loader polls
// also ends when the path stopped or when the wait for one task passed the path's timeout (then
// recorded as the fault), so that a lost arrival ends in the diagnostic, not a hang: the task
// then runs on (its waits give up at once, it queues nothing), and finish() throws.
#pragma once
#include "net_tp/net_gemm_rs_kernel.cuh"
#include "tp_common/adaptive_split.cuh"

namespace weave::net::tp_net {

template <class GG>
struct NetRsAdaptiveGlobalsT : NetRsGlobalsT<GG>, weave::tp::SplitGlobals {};

template <class Gemm>
struct NetRsAdaptiveKernelT : NetRsKernelT<Gemm, false>, weave::tp::LedgerHooks<NetRsAdaptiveGlobalsT<typename Gemm::Globals>> {
  using Base = NetRsKernelT<Gemm, false>;
  using Globals = NetRsAdaptiveGlobalsT<typename Gemm::Globals>;
  static constexpr bool kDynamicTasks = true;  // (the lcsc template ignores the communicator inherited)

  // The loader's state: its role, and since when it has polled the readiness of which task.
  struct TaskState {
    weave::tp::AdaptiveState split;
    long long polled = -1;
    unsigned long long since = 0;
    unsigned polls = 0;
  };

  // The flag of step s's arrival of own unit u (Reduce), or of the AR area's unit u from step s.
  static __device__ __forceinline__ uint32_t rs_flag(const Globals& g, int s, int u) {
    return g.flag_base + static_cast<uint32_t>(flag(g.U, s, u));
  }
  static __device__ __forceinline__ uint32_t ar_flag(const Globals& g, int s, int u) {
    return g.flag_base + static_cast<uint32_t>(flags_needed(g.U) + flag(g.U, s, u));
  }
  // Column tiles of row tile `vrow` stored this call.
  static __device__ __forceinline__ unsigned long long tiles_stored(const Globals& g, int vrow) {
    return ld_relaxed_sys(g.tile_done + vrow);
  }
  static __device__ __forceinline__ bool arrived(const Globals& g, uint32_t f) { return weave::net::arrived(g.h, f); }
  static __device__ __forceinline__ int owner_of(const Globals& g, const RsCommTask& t) {
    return comm_owner(g.U, g.rank, t);
  }

  // Task k's input has begun to come (Send, Reduce: its row tile's first column tile is stored;
  // Gather: it arrived) and is in place (the row tile complete; Reduce: also every step's
  // arrival). An empty unit is always in place.
  static __device__ bool begun(const Globals& g, long long k) {
    const RsCommTask t = rs_comm_task(g.U, g.rank, g.all_reduce, k);
    if (t.kind == RsCommKind::Gather) return arrived(g, ar_flag(g, t.s, t.u));
    return tiles_stored(g, g.U.L.off[owner_of(g, t)] + t.u / g.U.P) > 0;
  }
  static __device__ bool in_place(const Globals& g, long long k) {
    const RsCommTask t = rs_comm_task(g.U, g.rank, g.all_reduce, k);
    const int q = owner_of(g, t);
    long long b0, b1;
    unit(g.U, q, t.u, &b0, &b1);
    if (b1 <= b0) return true;
    if (t.kind == RsCommKind::Gather) return arrived(g, ar_flag(g, t.s, t.u));
    if (tiles_stored(g, g.U.L.off[q] + t.u / g.U.P) < static_cast<unsigned long long>(g.U.L.tiles_n)) return false;
    if (t.kind == RsCommKind::Reduce)
      for (int s = 0; s < steps(g.U); ++s)
        if (!arrived(g, rs_flag(g, s, t.u))) return false;
    return true;
  }

  // For the diagnostic of a task whose input is late: the chunk (flag) it waits for, ~0u when it
  // waits for this rank's own GEMM.
  static __device__ uint32_t awaited(const Globals& g, long long k) {
    const RsCommTask t = rs_comm_task(g.U, g.rank, g.all_reduce, k);
    if (t.kind == RsCommKind::Gather) return ar_flag(g, t.s, t.u);
    if (t.kind == RsCommKind::Reduce)
      for (int s = 0; s < steps(g.U); ++s)
        if (!arrived(g, rs_flag(g, s, t.u))) return rs_flag(g, s, t.u);
    return ~0u;
  }

  static __device__ __forceinline__ lcsc::Task next_task(const Globals& g, TaskState& st, int blocks) {
    const weave::tp::sm_split::LedgerParams p =
        g.params(blocks, g.U.L.work(), rs_comm_tasks(g.U, g.rank, g.all_reduce));
    // The timeout counts one unbroken poll within this choice, not the time since the block first
    // saw the task and went back to computing.
    st.polled = -1;
    return weave::tp::adaptive_task(
        *g.ledger, p, st.split, [&](long long k) { return begun(g, k); },
        [&](long long k) {
          if (in_place(g, k)) return true;
          // Not yet: after the path stopped, or once this task's input is later than the path's
          // timeout (recorded, as a wait of the fixed kernel records it), the task is handed out
          // anyway and fails fast.
          if (st.polled != k) {
            st.polled = k;
            st.since = globaltimer();
            st.polls = 0;
            return false;
          }
          // Every loader without a tile polls the same task's flags across PCIe: slower than the
          // fixed kernel's receive blocks (one each per unit), so that the polls leave the link to
          // the data; the stop and the timeout every 32nd poll, as the fixed kernel's waits do.
          __nanosleep(256);
          return (++st.polls & 31) == 0 && wait_gives_up(g.h, awaited(g, k), 1, 0, st.since);
        });
  }

  // Communication task k by the consumer threads t = 0..n-1: thread 0 waits (the input is in place
  // when the task is handed out: the waits are the acquires, or give up at once after a failure),
  // the group moves the bytes, thread 0 queues the commands. Returns the task's cycles.
  static __device__ unsigned long long other_task(const Globals& g, int k, int t, int n) {
    const NetHandle& h = g.h;
    const UnitPlan& U = g.U;
    const int r = g.rank;
    const RsCommTask task = rs_comm_task(U, r, g.all_reduce, k);
    const int q = owner_of(g, task);
    long long b0, b1;
    unit(U, q, task.u, &b0, &b1);
    const bool bytes = b1 > b0;
    const int vrow = U.L.off[q] + task.u / U.P;
    bool ok = true;  // thread 0's
    if (t == 0) {
      if (task.kind == RsCommKind::Send) {
        ok = pass_send_gate(h, g.call, g.commands_before, k == 0);  // task 0 is the call's first send
        ok = ok && (!bytes || Base::wait_tile(g, vrow));
      } else if (task.kind == RsCommKind::Reduce) {
        if (g.all_reduce) ok = pass_send_gate(h, g.call, g.commands_before, false);
        if (bytes) {
          ok = ok && Base::wait_tile(g, vrow);
          for (int s = 0; ok && s < steps(U); ++s) ok = wait_arrival(h, rs_flag(g, s, task.u));
        }
      } else if (bytes) {
        ok = wait_arrival(h, ar_flag(g, task.s, task.u));
      }
    }
    lcsc::consumers_sync<NetRsAdaptiveKernelT>();
    const long long t0 = clock64();
    if (task.kind == RsCommKind::Send) {
      // One partial (one rank per node): copied as it is, where the fixed kernel's send blocks sum a node's.
      const uint4* src = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(g.scratch) + shard_byte(U, q) + b0);
      uint4* dst = reinterpret_cast<uint4*>(h.send + slot_off(U, task.s, b0));
      for (long long i = t; i < (b1 - b0) / 16; i += n) dst[i] = __ldcg(src + i);
    } else if (task.kind == RsCommKind::Reduce) {
      Base::reduce_unit(g, b0, b1, t, n);
    } else {
      Base::gather_unit(g, task.s, q, b0, b1, t, n);
    }
    lcsc::consumers_sync<NetRsAdaptiveKernelT>();  // the group's reads and writes, then the commands
    if (t == 0 && ok && bytes) {
      Producer prod{h.queue};
      if (task.kind == RsCommKind::Send) {
        (void)push(h, prod, Base::send_command(g, task.s, task.u, q, b0, b1));
      } else if (task.kind == RsCommKind::Reduce) {
        for (int s = 0; s < steps(U); ++s) consume(h, rs_flag(g, s, task.u));
        for (int s = 0; ok && g.all_reduce && s < steps(U); ++s) ok = push(h, prod, Base::ar_command(g, s, task.u, b0, b1));
      } else {
        consume(h, ar_flag(g, task.s, task.u));
      }
    }
    return static_cast<unsigned long long>(clock64() - t0);
  }
  // task_finished, block_exit: weave::tp::LedgerHooks' (the ledger's cycles; the last block out
  // zeroes its call counters for the next launch).
};

using NetRsAdaptiveKernelNK = NetRsAdaptiveKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::NK, 3>>;
using NetRsAdaptiveKernelKN = NetRsAdaptiveKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::KN, 3>>;

}  // namespace weave::net::tp_net
