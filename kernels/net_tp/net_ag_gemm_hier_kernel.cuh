// Inter-node AllGather + GEMM at G > 1 ranks per node (mKernel's hierarchy): one persistent kernel
// with the single-node ag_gemm's compute blocks (tp::AgKernelT, waiting on the node
// communicator's per-row-tile ready signals, as for an NVLink push) and three communicator roles
// (layout.hpp says where each network byte goes):
//   send blocks     each unit of this rank's shard into the mapped send buffer, one command per
//                   rail peer (the same local index on every other node);
//   receive blocks  per (step, unit) from rail peer (n + s + 1, l), wait for the flag, then copy
//                   the unit from the mapped receive buffer into this rank's gathered A and every
//                   node peer's (NVLink stores: it crossed the network once, for the whole node),
//                   and signal the unit on every rank of the node;
//   push blocks     this rank's shard into every node peer's gathered A (and its own, when the
//                   input lies elsewhere), unit by unit, each signalled on those peers.
// Every rank of the node receives P signals per row tile of every owner: from the owner's push
// blocks (a node peer), its own receive blocks (a rail peer's shard) or a node peer's receive
// blocks (the other remote shards). Before writing a node peer's gathered A, push and receive
// blocks wait for every node rank's arrival in this call (its previous call no longer reads it).
// A receive or push block that gives up (the path stopped, or a network wait timed out: recorded)
// raises every row tile's counter on every rank of the node far past any expectation, so no loader waits for
// rows that will not come; the outputs are then garbage and finish() throws the diagnostic.
#pragma once
#include "ag_gemm/ag_gemm_kernel.cuh"
#include "net_common/node_device.cuh"
#include "net_tp/net_ag_gemm_kernel.cuh"
#include "net_tp/layout.hpp"
#include "weave/memory_order.cuh"
#include "weave/net/device.cuh"
#include "weave/signal.cuh"

namespace weave::net::tp_net {

template <class GG>
struct NetHierAgGlobalsT : weave::tp::AgGlobalsT<GG> {
  NetHandle h;
  UnitPlan A;
  char* node_gathered[kMaxWorld];    // node rank d's gathered A, as mapped here (this rank's: d = ready.rank)
  uint64_t call, commands_before, recv_base;
  uint32_t flag_base;
  int send_blocks, recv_blocks;
};

template <class Gemm>
struct NetHierAgKernelT : weave::tp::AgKernelT<Gemm> {
  using Base = weave::tp::AgKernelT<Gemm>;
  using Globals = NetHierAgGlobalsT<typename Gemm::Globals>;

  static __device__ __noinline__ void send_role(const Globals& g, int c, int nc, int* word) {
    send_units(g, c, nc, word, nullptr);  // the push blocks put the own rows in place
  }

  // Every row tile's counter on every node rank past any expectation (see above).
  static __device__ void release_node(const Globals& g) { net::release_node(g.ready, g.L.row_tiles()); }

  static __device__ __noinline__ void recv_role(const Globals& g, int b, int nb, int* word) {
    const NetHandle& h = g.h;
    const UnitPlan& A = g.A;
    // Every node rank entered this call (its gathered A is free); false once the path stopped.
    if (!wait_node_arrivals(h, g.arrive, g.arrive_round, A.G, word)) return release_node(g);
    const long long items = step_units(A, g.rank, true);
    for (long long j = b; j < items; j += nb) {
      const auto [s, u, q, b0, b1] = step_unit(A, g.rank, true, j);
      const uint32_t f = g.flag_base + static_cast<uint32_t>(flag(A, s, u));
      if (b1 > b0) {
        if (!block_agree(threadIdx.x == 0 ? wait_arrival(h, f) : true, word)) {
          release_node(g);
          return;
        }
        copy_to_node<true>(g.node_gathered, A.G, -1, shard_byte(A, q) + b0, h.recv + g.recv_base + slot_off(A, s, b0),
                           b1 - b0);
        __syncthreads();
        if (threadIdx.x == 0) consume(h, f);
      }
      if (threadIdx.x == 0)
        for (int d = 0; d < g.A.G; ++d) signal(g.ready, d, g.L.off[q] + u / A.P);
    }
  }

  static __device__ __noinline__ void push_role(const Globals& g, int c, int nc, int* word) {
    const UnitPlan& A = g.A;
    if (c == 0 && threadIdx.x == 0) signal_all(g.arrive, 0);  // once per rank and call
    if (!wait_node_arrivals(g.h, g.arrive, g.arrive_round, A.G, word)) return release_node(g);
    const char* shard = static_cast<const char*>(g.shard);
    const long long base = shard_byte(A, g.rank);
    for (int u = c; u < units(A, g.rank); u += nc) {
      long long b0, b1;
      unit(A, g.rank, u, &b0, &b1);
      copy_to_node<false>(g.node_gathered, A.G, g.copy_local ? -1 : g.ready.rank, base + b0, shard + b0, b1 - b0);
      __syncthreads();
      if (threadIdx.x == 0)
        for (int d = 0; d < g.A.G; ++d)
          if (d != g.ready.rank) signal(g.ready, d, g.L.off[g.rank] + u / A.P);
    }
  }

  // The block's shared word for its agreements is the first of the dynamic shared memory, which
  // communicator blocks do not otherwise use (a static one would not fit beside it).
  static __device__ __forceinline__ void communicator(const Globals& g, void* smem, int c, int nc) {
    int* word = static_cast<int*>(smem);
    const int push0 = g.send_blocks + g.recv_blocks;
    if (c < g.send_blocks)
      send_role(g, c, g.send_blocks, word);
    else if (c < push0)
      recv_role(g, c - g.send_blocks, g.recv_blocks, word);
    else
      push_role(g, c - push0, nc - push0, word);
  }
};

using NetHierAgKernelNK = NetHierAgKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::NK, 3>>;
using NetHierAgKernelKN = NetHierAgKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::KN, 3>>;

}  // namespace weave::net::tp_net
