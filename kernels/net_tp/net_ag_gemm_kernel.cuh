// Inter-node AllGather + GEMM in one persistent kernel (mKernel's SM roles): the single-node
// ag_gemm's compute blocks (tp::AgKernelT: the 128 x 256 GEMM over owner shards, own rows first)
// beside two kinds of communicator blocks on the network path (layout.hpp says where each
// byte goes):
//   send blocks     (communicator blocks 0 .. send_blocks - 1): wait at the call's send gate (the
//                   previous calls' commands no longer read the send buffer), then for each unit
//                   of this rank's shard copy it from device memory into the mapped send buffer
//                   (and into this rank's rows of the gathered A when the input is elsewhere) and
//                   queue one command per rail peer;
//   receive blocks  (the rest): for each (step, unit) of the peer shards, in the GEMM's order,
//                   wait for its flag, copy the unit out of the mapped receive buffer into the
//                   gathered A (device memory), consume the flag and count the unit in on its
//                   row tile's ready counter (device memory, zeroed before the launch).
// The loader waits for a peer row tile's P units before its first TMA load of it, watching the
// path: once the path stopped (a peer or the proxy failed, or a receive block timed out) it
// stops waiting, the tile computes garbage and the host's finish() throws the diagnostic.
#pragma once
#include "ag_gemm/ag_gemm_kernel.cuh"
#include "net_tp/layout.hpp"
#include "weave/memory_order.cuh"
#include "weave/net/device.cuh"

namespace weave::net::tp_net {

template <class GG>
struct NetAgGlobalsT : weave::tp::AgGlobalsT<GG> {
  NetHandle h;
  UnitPlan A;
  unsigned long long* tile_ready;  // per virtual row tile: units arrived this call (zeroed per call)
  char* gathered;                  // this rank's gathered A, device memory
  uint64_t call, commands_before, recv_base;
  uint32_t flag_base;
  int send_blocks;
};

// A send's body, shared by the send blocks below and the adaptive split's send task
// (net_ag_adaptive_kernel.cuh). Threads t, t + n, ...: bytes [b0, b1) of this rank's shard read
// once from device memory into the mapped send buffer at their shard offset (and into `own`, this
// rank's rows of its gathered A, unless null). Units are 16-byte aligned and sized.
template <class Gl>
__device__ __forceinline__ void stage_unit(const Gl& g, long long b0, long long b1, char* own, int t, int n) {
  const char* shard = static_cast<const char*>(g.shard);
  for (long long i = t; i < (b1 - b0) / 16; i += n) {
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(shard + b0) + i);
    reinterpret_cast<uint4*>(g.h.send + b0)[i] = v;
    if (own) reinterpret_cast<uint4*>(own + b0)[i] = v;
  }
}
// One thread, after a barrier over the unit's staging: its command to every rail peer (step s to
// send_peer(r, s)). False once the proxy failed (recorded).
template <class Gl>
__device__ __forceinline__ bool post_unit(const Gl& g, Producer& prod, int u, long long b0, long long b1) {
  const UnitPlan& A = g.A;
  bool ok = true;
  for (int s = 0; ok && s < steps(A); ++s)
    ok = push(g.h, prod,
              Command{static_cast<uint64_t>(b0), g.recv_base + static_cast<uint64_t>(slot_off(A, s, b0)),
                      static_cast<uint64_t>(b1 - b0), 1, g.flag_base + static_cast<uint32_t>(flag(A, s, u)),
                      static_cast<uint16_t>(send_peer(A, g.rank, s)), kNotify, 0});
  return ok;
}

// Send blocks of both AG kernels (this one and the hierarchical one): after the call's send gate,
// each non-empty unit of this rank's shard is staged (stage_unit), then one command per rail peer.
template <class Gl>
__device__ void send_units(const Gl& g, int c, int nc, int* word, char* own) {
  const NetHandle& h = g.h;
  const UnitPlan& A = g.A;
  if (!open_send_gate(h, g.call, g.commands_before, c == 0, word)) return;
  Producer prod{h.queue};
  for (int u = c; u < units(A, g.rank); u += nc) {
    long long b0, b1;
    unit(A, g.rank, u, &b0, &b1);
    if (b1 <= b0) continue;  // the receivers count empty units in without a command
    stage_unit(g, b0, b1, own, threadIdx.x, blockDim.x);
    __syncthreads();
    if (!block_agree(threadIdx.x == 0 ? post_unit(g, prod, u, b0, b1) : true, word)) return;
  }
}

// A receive's body at G = 1, shared by the receive blocks below and the adaptive split's receive
// task. Threads t, t + n, ...: step s's arrived bytes [b0, b1) of owner q's shard out of the mapped
// receive buffer (volatile reads: device.cuh's order) into the gathered A.
template <class Gl>
__device__ __forceinline__ void take_unit(const Gl& g, int s, int q, long long b0, long long b1, int t, int n) {
  const uint4* src = reinterpret_cast<const uint4*>(g.h.recv + g.recv_base + slot_off(g.A, s, b0));
  uint4* dst = reinterpret_cast<uint4*>(g.gathered + shard_byte(g.A, q) + b0);
  for (long long i = t; i < (b1 - b0) / 16; i += n) dst[i] = ld_volatile_v4(src + i);
}
// One thread, after a barrier over take_unit's copies: the flag consumed (a unit with bytes) and
// the unit counted in on its row tile (release, cumulative over the group's copies, which the
// barrier ordered before it) for the loader.
template <class Gl>
__device__ __forceinline__ void count_unit(const Gl& g, uint32_t f, int q, int u, bool bytes) {
  if (bytes) consume(g.h, f);
  red_add_release_sys(g.tile_ready + g.A.L.off[q] + u / g.A.P, 1ull);
}

template <class Gemm>
struct NetAgKernelT : weave::tp::AgKernelT<Gemm> {
  using Base = weave::tp::AgKernelT<Gemm>;
  using Globals = NetAgGlobalsT<typename Gemm::Globals>;
  using typename Base::LoadTile;

  static __device__ __forceinline__ LoadTile tile_of(const Globals& g, int w) {
    const weave::tp::Item t = weave::tp::item(g.L, g.rank, w);
    if (t.owner != g.rank) {
      const unsigned long long* c = g.tile_ready + t.vrow;
      const unsigned long long want = static_cast<unsigned long long>(g.A.P);
      for (uint32_t i = 1; ld_acquire_sys(c) < want; ++i)
        if ((i & 1023) == 0 && stopped(g.h)) break;  // the call fails at finish(); no hang here
      tile::fence_proxy_async_global();            // TMA reads what generic stores wrote
    }
    return {t.owner, t.i, t.n};
  }

  static __device__ __noinline__ void send_role(const Globals& g, int c, int nc, int* word) {
    send_units(g, c, nc, word, g.copy_local ? g.gathered + shard_byte(g.A, g.rank) : nullptr);
  }

  static __device__ __noinline__ void recv_role(const Globals& g, int b, int nb, int* word) {
    const NetHandle& h = g.h;
    const UnitPlan& A = g.A;
    const long long items = step_units(A, g.rank, true);
    for (long long j = b; j < items; j += nb) {
      const auto [s, u, q, b0, b1] = step_unit(A, g.rank, true, j);
      const uint32_t f = g.flag_base + static_cast<uint32_t>(flag(A, s, u));
      if (b1 > b0) {
        if (!block_agree(threadIdx.x == 0 ? wait_arrival(h, f) : true, word)) return;
        take_unit(g, s, q, b0, b1, threadIdx.x, blockDim.x);
        __syncthreads();
      }
      if (threadIdx.x == 0) count_unit(g, f, q, u, b1 > b0);
    }
  }

  // The block's shared word for its agreements is the first of the dynamic shared memory, which
  // communicator blocks do not otherwise use (a static one would not fit beside it).
  static __device__ __forceinline__ void communicator(const Globals& g, void* smem, int c, int nc) {
    int* word = static_cast<int*>(smem);
    if (c < g.send_blocks)
      send_role(g, c, g.send_blocks, word);
    else
      recv_role(g, c - g.send_blocks, nc - g.send_blocks, word);
  }
};

using NetAgKernelNK = NetAgKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::NK, 3>>;
using NetAgKernelKN = NetAgKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::KN, 3>>;

}  // namespace weave::net::tp_net
