// The fused hierarchical collectives (G > 1 ranks per node, NetCollOptions::fused): one persistent
// kernel per call, its blocks in mKernel's roles (net_coll_fused_schedule.hpp says which item each
// handles and which counter joins two roles):
//   send / recv     (all_gather, reduce_scatter) kernel.cuh's send_role and recv_role, unchanged
//                   on the wire; reduce_scatter's senders and receivers first wait for the node's
//                   partial of their piece (ready), all_gather's receivers copy each arrival into
//                   every node rank's buffer (NVLink: it crossed the network once for the node);
//   ring            (all_reduce) kernel.cuh's ring_role, waiting for the node's sum of an item
//                   before reading it (ready) and raising result once the item's result is kept;
//   node_reduce     the node's sum of each item over NVLink (reads the G node ranks' buffers);
//   node_gather     each item's result (all_reduce) or the own shard's pieces (all_gather) into the
//                   node peers' buffers over NVLink.
// Every role takes its items b, b + blocks, ... in item order; only the ring waits for a rail
// peer, and ring blocks never wait for a node_gather block, so the chain reduce -> ring -> gather
// has no cycle while every block of the grid is resident (the grid is the smallest SM count).
// Framing on the node's signal set (one round per call): `arrive` at the start (block 0), waited
// for before any NVLink access; `done` by every block at its end, even one that gave up, and the
// last block waits for every node rank's (on the timeout only): a kernel ends only when no node
// peer still touches its memory. Every wait has the network waits' timeout and stop (device.cuh), recorded in the
// path's fault record (NetPath::finish throws it): a block that gives up stops this rank's others.
#pragma once
#include "net_collectives/kernel.cuh"
#include "net_collectives/net_coll_fused_schedule.hpp"
#include "net_common/node_device.cuh"
#include "weave/signal.cuh"

namespace weave::net::coll {

struct FusedArgs {
  KernelArgs net;                // the network roles' (src: the node scratch for reduce_scatter)
  char* node[kMaxWorld];         // node rank d's buffer, as mapped here (this rank's: d = local)
  char* scratch;                 // reduce_scatter's node partials, this rank's
  unsigned long long* counters;  // fused_counters(L), zeroed before the launch
  signals sig;                   // the node's counters: 0 arrive, 1 done
  unsigned long long round;      // this call's round of `sig`
  FusedRoles roles;
  int G, local;
};

// What the fused kernel's own waits put in DeviceFault::chunk (the path's diagnostic prints it as
// the chunk waited for): a node rank's arrival, the node ranks' done, an item counter of this rank.
constexpr uint32_t kWaitNodeArrive = ~0u - 1, kWaitNodeDone = ~0u - 2, kWaitItem = ~0u - 3;

// One thread: until *c >= want (acquire, system scope: node peers and this rank's blocks release
// into it). False once the path stopped or the wait outlasted the path's timeout (recorded).
__device__ inline bool wait_at_least(const NetHandle& h, const unsigned long long* c, unsigned long long want,
                                     uint32_t tag) {
  if (ld_acquire_sys(c) >= want) return true;
  const unsigned long long t0 = globaltimer();
  for (uint32_t i = 1;; ++i) {
    const unsigned long long v = ld_acquire_sys(c);
    if (v >= want) return true;
    if ((i & 63) == 0 && wait_gives_up(h, tag, want, v, t0)) return false;
  }
}

// All threads: the node's sum of `bytes` at offset `off` of every node rank's buffer, in local-rank
// order, fp32, rounded once (the single-node collectives' order), into dst.
template <class T>
__device__ void node_sum(char* const* node, int G, long long off, char* dst, long long bytes) {
  constexpr int kV = Vec<T>::n;
  const long long groups = bytes / 16;
  for (long long g = threadIdx.x; g < groups; g += blockDim.x) {
    float acc[kV], x[kV];
    Vec<T>::load(__ldcg(reinterpret_cast<const uint4*>(node[0] + off) + g), acc);
    for (int d = 1; d < G; ++d) {
      Vec<T>::load(__ldcg(reinterpret_cast<const uint4*>(node[d] + off) + g), x);
      for (int i = 0; i < kV; ++i) acc[i] += x[i];
    }
    reinterpret_cast<uint4*>(dst)[g] = Vec<T>::store(acc);
  }
  const long long n = bytes / static_cast<long long>(sizeof(T));
  for (long long i = groups * kV + threadIdx.x; i < n; i += blockDim.x) {
    float acc = Vec<T>::to_float(__ldcg(reinterpret_cast<const T*>(node[0] + off) + i));
    for (int d = 1; d < G; ++d) acc += Vec<T>::to_float(__ldcg(reinterpret_cast<const T*>(node[d] + off) + i));
    reinterpret_cast<T*>(dst)[i] = Vec<T>::from_float(acc);
  }
}

// node_device.cuh's copy_to_node for any byte count: the whole 16-byte units there, the trailing
// partial unit (the last rank's) byte by byte.
template <bool Mapped>
__device__ void copy_to_node_bytes(char* const* node, int G, int skip, long long off, const char* src,
                                   long long bytes) {
  const long long whole = bytes / 16 * 16;
  copy_to_node<Mapped>(node, G, skip, off, src, whole);
  for (long long i = whole + threadIdx.x; i < bytes; i += blockDim.x) {
    const char v = Mapped ? static_cast<const volatile char*>(src)[i] : src[i];
    for (int d = 0; d < G; ++d)
      if (d != skip) node[d][off + i] = v;
  }
}

// Every thread: thread 0's wait for counter c to reach want.
__device__ inline bool block_wait(const NetHandle& h, const unsigned long long* c, unsigned long long want,
                                  uint32_t tag) {
  return block_agree(threadIdx.x == 0 ? wait_at_least(h, c, want, tag) : true);
}
__device__ inline bool node_arrived(const FusedArgs& f) {
  return block_wait(f.net.h, f.sig.ptr[f.sig.rank], f.round * static_cast<unsigned long long>(f.G), kWaitNodeArrive);
}

// Network block b of roles.net() (grid blocks from roles.reduce on). Nothing to send with one node.
template <class T>
__device__ void fused_network(const FusedArgs& f, int b) {
  const KernelArgs& a = f.net;
  const Layout& L = a.L;
  const FusedRoles& R = f.roles;
  if (L.plan.topo.nodes == 1 && L.plan.coll != Coll::reduce_scatter) return;
  const auto ready = [&](long long j) { return wait_at_least(a.h, f.counters + ready_counter(L, j), 1, kWaitItem); };
  if (L.plan.coll == Coll::all_reduce) {
    ring_role<T>(a, b, R.ring, ready,
                 [&](long long j) { red_add_release_sys(f.counters + result_counter(L, j), 1); });
  } else if (b < R.send) {
    if (L.plan.topo.nodes > 1) {
      if (L.plan.coll == Coll::reduce_scatter) send_role<T>(a, b, R.send, ready);
      else send_role<T>(a, b, R.send);
    }
  } else if (L.plan.coll == Coll::reduce_scatter) {
    recv_role<T>(a, b - R.send, R.recv, CopyIn{a.buf},
                 [&](int p) { return ready(own_item(L, a.h.rank, p)); });
  } else if (node_arrived(f)) {
    recv_role<T>(a, b - R.send, R.recv, [&](long long off, const char* in, long long bytes) {
      copy_to_node_bytes<true>(f.node, f.G, -1, off, in, bytes);
    });
  }
}

// node_reduce block b of `blocks`.
template <class T>
__device__ void node_reduce(const FusedArgs& f, int b, int blocks) {
  const Layout& L = f.net.L;
  const int r = f.net.h.rank;
  if (!node_arrived(f)) return;
  char* dst = L.plan.coll == Coll::all_reduce ? f.net.buf : f.scratch;
  for (long long j = b; j < fused_items(L, r); j += blocks) {
    const FusedItem it = fused_item(L, r, j);
    node_sum<T>(f.node, f.G, it.src.off, dst + it.dst, it.src.size);
    __syncthreads();
    if (threadIdx.x == 0) red_add_release_sys(f.counters + ready_counter(L, j), 1);
  }
}

// node_gather block b of `blocks`: all_reduce's results once kept (with one node, once summed),
// all_gather's own pieces at once.
__device__ inline void node_gather(const FusedArgs& f, int b, int blocks) {
  const Layout& L = f.net.L;
  const int r = f.net.h.rank;
  if (!node_arrived(f)) return;
  for (long long j = b; j < fused_items(L, r); j += blocks) {
    const FusedItem it = fused_item(L, r, j);
    if (L.plan.coll == Coll::all_reduce) {
      const int c = L.plan.topo.nodes > 1 ? result_counter(L, j) : ready_counter(L, j);
      if (!block_wait(f.net.h, f.counters + c, 1, kWaitItem)) return;
    }
    copy_to_node_bytes<false>(f.node, f.G, f.local, it.src.off, f.net.buf + it.src.off, it.src.size);
  }
}

// One thread: the node's done count, giving up on the path's timeout only. Not on a stop: a
// rank that failed must not end its kernel (and let its buffer be reused) while node peers'
// blocks may still write into it; they give up on the stop too and then signal done.
__device__ inline void wait_node_done(const FusedArgs& f, unsigned long long want) {
  const unsigned long long* c = f.sig.ptr[f.sig.rank] + 1;
  const NetHandle& h = f.net.h;
  const unsigned long long t0 = globaltimer();
  for (uint32_t i = 0;; ++i) {
    const unsigned long long v = ld_acquire_sys(c);
    if (v >= want) return;
    if ((i & 63) == 63 && h.timeout_ns && globaltimer() - t0 > h.timeout_ns) {
      record_fault(h, kFaultTimeout, kWaitNodeDone, want, v, globaltimer() - t0);
      return;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(256) net_coll_fused_kernel(const __grid_constant__ FusedArgs f) {
  const FusedRoles& R = f.roles;
  const int b = static_cast<int>(blockIdx.x);
  if (b == 0 && threadIdx.x == 0) signal_all(f.sig, 0);  // arrive: once per rank and call
  if (b < R.reduce) node_reduce<T>(f, b, R.reduce);  // fused_roles' order: reduce, network, gather
  else if (b < R.reduce + R.net()) fused_network<T>(f, b - R.reduce);
  else node_gather(f, b - R.reduce - R.net(), R.gather);
  __syncthreads();
  if (threadIdx.x != 0) return;
  signal_all(f.sig, 1);  // done, whether the block finished or gave up: no node peer waits forever
  if (b == static_cast<int>(gridDim.x) - 1) wait_node_done(f, done_expected(f.round, f.G, static_cast<int>(gridDim.x)));
}

}  // namespace weave::net::coll
