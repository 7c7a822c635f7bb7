// The inter-node AllGather + GEMM with the adaptive SM split (issue 22, mKernel section 3.2), nodes
// of one rank: net_ag_gemm_kernel.cuh's work without fixed send and receive blocks, on the split's
// shared machinery (tp_common/adaptive_split.cuh over sm_ledger.cuh's ledger and sm_split.hpp's
// eq. 2 policy, the lcsc template's dynamic tasks). Every block of the persistent grid (every SM;
// cooperative) chooses at each task boundary, in its loader, between
//   a compute task  output tile i in tp::item's order (the own shard first, read from a_shard; then
//                   the shards of r + 1, r + 2, ...), through the block's loader, consumers and
//                   storer as the fixed kernel's compute blocks (its tile_of, load and store);
//   a send task     unit u of this rank's shard: staged into the mapped send buffer (and into the
//                   own rows of the gathered A when the input lies elsewhere), then its command to
//                   every rail peer (stage_unit, post_unit: the fixed send blocks' body);
//   a receive task  step s's unit u of from_peer(r, s)'s shard: copied out of the mapped receive
//                   buffer into the gathered A, its flag consumed, counted in on its row tile's
//                   ready counter (take_unit, count_unit: the fixed receive blocks' body);
// the communication tasks in layout.hpp's ag_comm_task order (every send, then the receives in
// step order). The ledger accumulates each kind's cycles; the policy's target of communicating
// blocks equalises the predicted completion times of the two roles (eq. 2), priors from the launch.
//
// Readiness ("in place"), so that no task waits inside: a tile of a peer's rows once its P units
// were counted in here (own tiles at once); the call's first send once the previous calls'
// commands completed (it then opens the send gate, as the fixed send block 0 does), the other
// sends once the gate is open; a receive once its flag arrived (an empty unit at once). The
// ledger claims a compute task, like a communication one, only once it is in place (sm_ledger.cuh's
// next_task with compute_ready), and a block whose next tile waits communicates instead, past the
// target (sm_split.hpp's next_role, comm_cap).
//
// Deadlock freedom (as AgAdaptiveKernelT's argument in ag_gemm_kernel.cuh, with the network):
// (1) No block waits inside a task: each is handed out with its input in place, so its waits (the
//     gate, the flag, tile_of's count) are acquires that return at once; the rest loads, stores
//     and queues commands (the proxy drains the queue without this kernel). The template's own waits
//     (stage ring, output staging, task ring) depend on the block's own tasks only. So every block
//     comes back to a choice a task's time after it left one.
// (2) A block that claims nothing holds nothing: its polls leave every index to the other blocks.
// (3) Every send of every rank is claimed and runs: its input needs nothing of this call on any
//     rank (the previous calls' completions come from the proxies; the gate from send 0, claimed
//     before every other send). The sends head the communication list, so none waits behind a
//     receive. Suppose one stays unclaimed for good: once its input is in place every choice sees
//     comm_next_ready; the compute head moves only by claims, so it stops after finitely many:
//     every tile claimed (next_role: communicate), or the head's rows missing (communicate, comm_cap
//     admits all B blocks), or the head ready with fewer blocks communicating than the target
//     (at least 1 for B > 1: a block joins; B = 1 computes until the head waits or none is left).
//     Either way the next block at a choice - by (1) blocks keep coming - claims the send.
// (4) So every unit of every rank is posted and arrives everywhere; each receive's flag rises, and
//     by the argument of (3) every receive is claimed in turn and counts its unit in: every peer
//     row tile becomes ready, every tile is claimed and ends, and every block is handed Done. A
//     block polling for a peer's rows never keeps this rank's sends, which that peer waits for,
//     from being claimed.
// The fixed kernel's receive order and the ledger's are the same (step order), and a receive waits
// only for the peer's send, never for a later task of its own rank.
// A lost arrival (a peer that died or never launched) ends as the fixed kernel's waits end: a poll
// of a task's input that saw no progress for the path's timeout, or after the path stopped, records
// the fault (wait_gives_up) and hands the task out anyway; its waits then give up at once, it queues
// nothing, and finish() throws the diagnostic.
#pragma once
#include "net_tp/net_ag_gemm_kernel.cuh"
#include "tp_common/adaptive_split.cuh"

namespace weave::net::tp_net {

template <class GG>
struct NetAgAdaptiveGlobalsT : NetAgGlobalsT<GG>, weave::tp::SplitGlobals {};

// A readiness one choice polls, ended as the network path's waits end: true once `ok`; true also
// once the path stopped, or once `observed` has not moved for the path's timeout while polling `key`
// (recorded as the fault with chunk(), ~0u for none, and the count `want` it waited for; asked
// only then): the task is then handed out and fails fast. Reset (key -1) at each choice, so that
// the clock counts one unbroken poll.
struct NetAdaptivePoll {
  long long key = -1;
  unsigned long long seen = 0, since = 0;
  unsigned polls = 0;
  template <class Chunk>
  __device__ __forceinline__ bool operator()(const NetHandle& h, long long k, unsigned long long observed,
                                             unsigned long long want, Chunk&& chunk) {
    const bool ok = observed >= want;
    if (ok) return true;
    if (k != key || observed != seen) {
      key = k, seen = observed, since = globaltimer(), polls = 0;
      return false;
    }
    return (++polls & 31) == 0 && wait_gives_up(h, chunk(), want, seen, since);
  }
};

template <class Gemm>
struct NetAgAdaptiveKernelT : NetAgKernelT<Gemm>, weave::tp::LedgerHooks<NetAgAdaptiveGlobalsT<typename Gemm::Globals>> {
  using Base = NetAgKernelT<Gemm>;
  using Globals = NetAgAdaptiveGlobalsT<typename Gemm::Globals>;
  static constexpr bool kDynamicTasks = true;  // (the lcsc template ignores the communicator inherited)

  // The loader's state between choices: its role, and its polls of a tile's rows and of a
  // communication task's input.
  struct TaskState {
    weave::tp::AdaptiveState split;
    NetAdaptivePoll rows, comm;
  };

  static __device__ __forceinline__ uint32_t flag_of(const Globals& g, int s, int u) {
    return g.flag_base + static_cast<uint32_t>(flag(g.A, s, u));
  }
  static __device__ __forceinline__ unsigned long long units_in(const Globals& g, int vrow) {
    return ld_relaxed_sys(g.tile_ready + vrow);
  }
  // The send gate's state as seen here: the previous calls' completions (before the call's first
  // send opens the gate) or the gate itself (once the gate is open the other sends may stage).
  static __device__ __forceinline__ unsigned long long completions(const Globals& g) {
    return ld_acquire_sys(reinterpret_cast<const unsigned long long*>(g.h.queue.completed));
  }
  static __device__ __forceinline__ unsigned long long gate(const Globals& g) {
    return ld_acquire_sys(reinterpret_cast<const unsigned long long*>(g.h.words + kWordGate));
  }

  // Communication task k's input, as a count that moves toward `want`: the completions (the first
  // send), the gate (the other sends), the arrival flag (a receive). An empty receive: always in.
  struct Input {
    unsigned long long seen, want;
    uint32_t chunk;  // what a timeout reports: the arrival's flag, ~0u for the gate
  };
  static __device__ Input input(const Globals& g, long long k) {
    const AgCommTask t = ag_comm_task(g.A, g.rank, k);
    if (t.kind == AgCommKind::Send)
      return k == 0 ? Input{completions(g), g.commands_before, ~0u} : Input{gate(g), g.call + 1, ~0u};
    long long b0, b1;
    unit(g.A, t.peer, t.u, &b0, &b1);
    if (b1 <= b0) return {1, 1, ~0u};
    const uint32_t f = flag_of(g, t.s, t.u);
    return {ld_acquire_sys(reinterpret_cast<const unsigned long long*>(g.h.flags + f)), 1, f};
  }

  static __device__ __forceinline__ lcsc::Task next_task(const Globals& g, TaskState& st, int blocks) {
    const weave::tp::sm_split::LedgerParams p = g.params(blocks, g.L.work(), ag_comm_tasks(g.A, g.rank));
    st.rows.key = st.comm.key = -1;  // the timeouts count one unbroken poll within this choice
    const unsigned long long rows_in = static_cast<unsigned long long>(g.A.P);
    return weave::tp::adaptive_task(
        *g.ledger, p, st.split,
        [&](long long i) {
          const weave::tp::Item t = weave::tp::item(g.L, g.rank, static_cast<int>(i));
          if (t.owner == g.rank) return true;
          const unsigned long long n = units_in(g, t.vrow);
          // A timeout here reports the oldest arrival not yet taken: the receives before it all
          // arrived (they are claimed in order), so the missing rows are at or after it.
          return st.rows(g.h, i, n, rows_in, [&] { return awaited(g); });
        },
        [&](long long k) {
          const Input in = input(g, k);
          return in.seen >= in.want;
        },
        [&](long long k) {
          const Input in = input(g, k);
          if (in.seen >= in.want) return true;
          __nanosleep(256);  // the polls read host memory: leave the link to the data
          return st.comm(g.h, k, in.seen, in.want, [&] { return in.chunk; });
        });
  }

  // The flag of the first unclaimed communication task if it is a receive, else ~0u.
  static __device__ uint32_t awaited(const Globals& g) {
    const long long k = static_cast<long long>(ld_relaxed_gpu(&g.ledger->comm_claimed));
    if (k >= ag_comm_tasks(g.A, g.rank)) return ~0u;
    const AgCommTask t = ag_comm_task(g.A, g.rank, k);
    return t.kind == AgCommKind::Receive ? flag_of(g, t.s, t.u) : ~0u;
  }

  // Communication task k by the consumer threads t = 0..n-1: thread 0 acquires the input (in place
  // when the task was handed out: the gate and the flag waits return at once, or give up at once
  // after a failure), the group moves the bytes, thread 0 queues the commands or counts the unit
  // in. The bodies are the fixed kernel's. Returns the task's cycles.
  static __device__ unsigned long long other_task(const Globals& g, int k, int t, int n) {
    const AgCommTask task = ag_comm_task(g.A, g.rank, k);
    long long b0, b1;
    unit(g.A, task.peer, task.u, &b0, &b1);
    const bool bytes = b1 > b0;
    const bool send = task.kind == AgCommKind::Send;
    const uint32_t f = send ? 0 : flag_of(g, task.s, task.u);
    bool ok = true;  // thread 0's
    if (t == 0) ok = send ? pass_send_gate(g.h, g.call, g.commands_before, k == 0) : !bytes || wait_arrival(g.h, f);
    lcsc::consumers_sync<NetAgAdaptiveKernelT>();
    const long long t0 = clock64();
    // After a failure the group still copies (garbage: the call fails), thread 0 queues nothing.
    if (send) stage_unit(g, b0, b1, g.copy_local ? g.gathered + shard_byte(g.A, g.rank) : nullptr, t, n);
    else take_unit(g, task.s, task.peer, b0, b1, t, n);
    lcsc::consumers_sync<NetAgAdaptiveKernelT>();  // the group's copies, then the commands or the count
    if (t == 0 && ok) {
      if (send && bytes) {
        Producer prod{g.h.queue};
        (void)post_unit(g, prod, task.u, b0, b1);
      } else if (!send) {
        count_unit(g, f, task.peer, task.u, bytes);
      }
    }
    return static_cast<unsigned long long>(clock64() - t0);
  }
  // task_finished, block_exit: weave::tp::LedgerHooks' (the ledger's cycles; the last block out
  // zeroes its call counters for the next launch).
};

using NetAgAdaptiveKernelNK = NetAgAdaptiveKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::NK, 3>>;
using NetAgAdaptiveKernelKN = NetAgAdaptiveKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::KN, 3>>;

}  // namespace weave::net::tp_net
