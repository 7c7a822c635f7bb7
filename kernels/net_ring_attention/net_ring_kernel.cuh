// Inter-node ring attention in one persistent kernel: the single-node gathered attention kernel
// (gathered_attention/gathered_kernel.cuh: the FA3-class pipeline over the gathered K/V, waiting
// per (batch, slice) readiness counter) with its NVLink communicators replaced by the network
// path's roles (layout.hpp says where each byte goes):
//   send blocks     (CTAs 0 .. send_blocks - 1): after the call's send gate, each unit of this
//                   rank's K and V rows is copied from device memory into the mapped send buffer
//                   and posted to every rail peer (two commands per peer: its K rows, its V rows);
//   receive blocks  (the next recv_blocks CTAs): per (step, unit) from rail peer (n + s + 1, l),
//                   wait for both flags, copy the rows into the gathered K and V (global row
//                   order), consume the flags and count the unit in on its slice's counter: the
//                   counter the compute's producer waits for, exactly as for a peer's NVLink push.
//                   G = 1: this rank's buffers and counters (device memory, zeroed before the
//                   launch). G > 1 (Hier): every node rank's gathered K and V (NVLink stores: the
//                   unit crossed the network once, for the whole node) and its counter on every
//                   node rank (the node communicator's signal set);
//   push blocks     (G > 1 only, the rest): this rank's own units into every node peer's gathered
//                   K and V over NVLink, each counted in on that peer; then they wait until every
//                   unit of this call has landed here (so nothing writes into this rank's gathered
//                   buffers once its kernel ended).
// All then join the compute (the kernel's tile counter), as the NVLink communicators do. Every
// rank receives one count per non-empty unit of every other rank per call (from its own receive
// blocks, a node peer's receive blocks or the owner's push blocks): the single-node expectation.
// Push and receive blocks write a node peer's buffers only after every node rank entered the call
// (push block 0 signals this rank's arrival once). A receive block that gives up (the path
// stopped, or its wait timed out: recorded) first raises every slice counter (G > 1: of every node
// rank) past any expectation, so no producer waits for data that will not come; the output is then
// garbage and the host's finish() throws the diagnostic.
#pragma once
#include <type_traits>

#include "gathered_attention/gathered_kernel.cuh"
#include "net_common/node_device.cuh"
#include "net_ring_attention/layout.hpp"
#include "weave/memory_order.cuh"
#include "weave/net/device.cuh"

namespace weave::net::ring_net {

struct NetRingGlobals : attention::GatheredGlobals {
  NetHandle h;
  RingPlan R;
  unsigned long long* slice_ready;  // B x slices, zeroed per call (what g.ready's view points at)
  char *gk, *gv;                    // the gathered K and V, device memory
  const char *k, *v;                // this rank's K and V rows
  uint64_t call, commands_before, recv_base;
  uint32_t flag_base;
  int send_blocks;
};

// G > 1: each node rank's gathered K and V as mapped here (this rank's at ready.rank), and the
// receive blocks' count (the push blocks are the rest of num_comm).
struct NetRingHierGlobals : NetRingGlobals {
  char *node_gk[kMaxWorld], *node_gv[kMaxWorld];
  int recv_blocks;
};

// 16-byte copies (row bytes are multiples of 128).
__device__ __forceinline__ void copy16(char* dst, const char* src, long long bytes) {
  for (long long i = threadIdx.x; i < bytes / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(dst)[i] = __ldcs(reinterpret_cast<const uint4*>(src) + i);
}

template <int D, bool Hier>
struct NetRingKernelT : attention::GatheredKernel<D, true> {
  using Globals = std::conditional_t<Hier, NetRingHierGlobals, NetRingGlobals>;

  static __device__ __noinline__ void send_role(const Globals& g, int c, int nc) {
    const NetHandle& h = g.h;
    const RingPlan& R = g.R;
    if (!open_send_gate(h, g.call, g.commands_before, c == 0)) return;
    Producer prod{h.queue};
    for (int u = c; u < units(R); u += nc) {
      const UnitBytes x = unit(R, g.rank, u);
      if (x.bytes == 0) continue;  // no piece, no count: the receivers skip it too
      copy16(h.send + send_off(R, 0, x.off), g.k + x.off, x.bytes);
      copy16(h.send + send_off(R, 1, x.off), g.v + x.off, x.bytes);
      __syncthreads();
      bool ok = true;
      if (threadIdx.x == 0)
        for (int s = 0; ok && s < steps(R); ++s)
          for (int t = 0; ok && t < 2; ++t)
            ok = push(h, prod,
                      Command{static_cast<uint64_t>(send_off(R, t, x.off)),
                              g.recv_base + static_cast<uint64_t>(recv_off(R, s, t, x.off)),
                              static_cast<uint64_t>(x.bytes), 1, g.flag_base + static_cast<uint32_t>(flag(R, s, u, t)),
                              static_cast<uint16_t>(send_peer(R, g.rank, s)), kNotify, 0});
      if (!block_agree(ok)) return;
    }
  }

  // Every slice counter past any expectation: the producers stop waiting (see above).
  static __device__ void release_all(const Globals& g) {
    if constexpr (Hier) {
      release_node(g.ready, g.R.B * g.R.slices);
    } else {
      for (int i = threadIdx.x; i < g.R.B * g.R.slices; i += blockDim.x)
        red_add_release_sys(g.slice_ready + i, 1ull << 40);
    }
  }

  static __device__ __forceinline__ int counter(const RingPlan& R, const UnitBytes& x) {
    return attention::gathered::counter_index(x.b, 0, x.slice, 1, R.slices);
  }

  static __device__ __noinline__ void recv_role(const Globals& g, int b, int nb, int* word) {
    const NetHandle& h = g.h;
    const RingPlan& R = g.R;
    if constexpr (Hier)
      if (!wait_node_arrivals(h, g.arrive, g.arrive_round, R.G, word)) return release_all(g);
    const long long items = static_cast<long long>(steps(R)) * units(R);
    for (long long j = b; j < items; j += nb) {
      const int s = static_cast<int>(j / units(R)), u = static_cast<int>(j % units(R));
      const UnitBytes x = unit(R, from_peer(R, g.rank, s), u);
      if (x.bytes == 0) continue;
      const uint32_t fk = g.flag_base + static_cast<uint32_t>(flag(R, s, u, 0)), fv = fk + 1;
      const bool arrived = threadIdx.x == 0 ? wait_arrival(h, fk) && wait_arrival(h, fv) : true;
      bool ok;
      if constexpr (Hier)
        ok = block_agree(arrived, word);
      else
        ok = block_agree(arrived);
      if (!ok) {
        release_all(g);
        return;
      }
      const long long dst = gathered_off(R, x);
      const char* src_k = h.recv + g.recv_base + recv_off(R, s, 0, x.off);
      const char* src_v = h.recv + g.recv_base + recv_off(R, s, 1, x.off);
      if constexpr (Hier) {
        copy_to_node<true>(g.node_gk, R.G, -1, dst, src_k, x.bytes);
        copy_to_node<true>(g.node_gv, R.G, -1, dst, src_v, x.bytes);
      } else {
        block_copy_in(g.gk + dst, src_k, static_cast<uint64_t>(x.bytes));
        block_copy_in(g.gv + dst, src_v, static_cast<uint64_t>(x.bytes));
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        consume(h, fk);
        consume(h, fv);
        // Release (cumulative over the block's copies, ordered by the barrier) to the producers,
        // which acquire and then fence the async proxy before their TMA loads.
        if constexpr (Hier) {
          for (int d = 0; d < R.G; ++d) signal(g.ready, d, counter(R, x));
        } else {
          red_add_release_sys(g.slice_ready + counter(R, x), 1ull);
        }
      }
    }
  }

  // G > 1: this rank's own units into every node peer's gathered K and V (NVLink stores), each
  // counted in there. Its own buffers hold its rows already (read in place, or copied before the
  // launch), as at G = 1.
  static __device__ __noinline__ void push_role(const Globals& g, int c, int nc, int* word) {
    const RingPlan& R = g.R;
    const int self = g.ready.rank;
    if (c == 0 && threadIdx.x == 0) signal_all(g.arrive, 0);  // once per rank and call
    if (!wait_node_arrivals(g.h, g.arrive, g.arrive_round, R.G, word)) return release_all(g);
    for (int u = c; u < units(R); u += nc) {
      const UnitBytes x = unit(R, g.rank, u);
      if (x.bytes == 0) continue;  // no rows, no count (as the expectation)
      copy_to_node<false>(g.node_gk, R.G, self, gathered_off(R, x), g.k + x.off, x.bytes);
      copy_to_node<false>(g.node_gv, R.G, self, gathered_off(R, x), g.v + x.off, x.bytes);
      __syncthreads();
      if (threadIdx.x == 0)
        for (int d = 0; d < R.G; ++d)
          if (d != self) signal(g.ready, d, counter(R, x));
    }
    // Then every other rank's rows of this call have landed here before the kernel ends (the push
    // blocks share the counters): a causal tile never waits for the keys after its rows, so
    // without this a node peer's write could still be in flight when this rank's next call (or
    // its reader of the gathered K/V) begins. Once the path stopped it gives up (finish() throws).
    if (threadIdx.x == 0) {
      const unsigned long long round = g.ready_round;
      for (int i = c; i < R.B * R.slices; i += nc) {
        const int sl = i % R.slices;
        const int want = attention::gathered::chunks_in_slice(R.S, R.n_chunks, sl) -
                         attention::gathered::own_chunks_in_slice(R.S, R.n_chunks, sl, g.mine, g.n_mine);
        if (!wait_count(g.h, g.ready.ptr[self] + i, round * static_cast<unsigned long long>(want))) break;
      }
    }
  }

  // G > 1: the agreements' shared word is the first of the dynamic shared memory, which these
  // roles do not otherwise use (as net_tp's AG kernels).
  static __device__ __noinline__ void communicator(const Globals& g, uint8_t* smem, int c, int nc) {
    if constexpr (Hier) {
      int* word = reinterpret_cast<int*>(smem);
      const int push0 = g.send_blocks + g.recv_blocks;
      if (c < g.send_blocks)
        send_role(g, c, g.send_blocks);
      else if (c < push0)
        recv_role(g, c - g.send_blocks, g.recv_blocks, word);
      else
        push_role(g, c - push0, nc - push0, word);
    } else {
      if (c < g.send_blocks)
        send_role(g, c, g.send_blocks);
      else
        recv_role(g, c - g.send_blocks, nc - g.send_blocks, nullptr);
    }
  }
  static __device__ __forceinline__ void retire_communicator(uint8_t*) {}  // no copy ring was set up
};

template <int D>
using NetRingKernel = NetRingKernelT<D, false>;      // one rank per node
template <int D>
using NetRingHierKernel = NetRingKernelT<D, true>;  // nodes of G > 1 ranks

}  // namespace weave::net::ring_net
