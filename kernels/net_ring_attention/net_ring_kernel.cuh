// Inter-node ring attention in one persistent kernel: the single-node gathered attention kernel
// (gathered_attention/gathered_kernel.cuh: the FA3-class pipeline over the gathered K/V, waiting
// per (batch, slice) readiness counter) with its NVLink communicators replaced by the network
// path's roles (layout.hpp says where each byte goes):
//   send blocks     (CTAs 0 .. send_blocks - 1): after the call's send gate, each unit of this
//                   rank's K and V rows is copied from device memory into the mapped send buffer
//                   and posted to every peer (two commands per peer: its K rows, its V rows);
//   receive blocks  (the next recv_blocks CTAs): per (step, unit) from peer r + s + 1, wait for
//                   both flags, copy the rows into the gathered K and V (device memory, global
//                   row order), consume the flags and count the unit in on its slice's counter
//                   (device memory, zeroed before the launch): the counter the compute's producer
//                   waits for, exactly as for a peer's NVLink push.
// Both then join the compute (the kernel's tile counter), as the NVLink communicators do. A
// receive block that gives up (the path stopped, or its wait timed out: recorded) first raises
// every slice counter past any expectation, so no producer waits for data that will not come;
// the output is then garbage and the host's finish() throws the diagnostic.
#pragma once
#include "gathered_attention/gathered_kernel.cuh"
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

// 16-byte copies (row bytes are multiples of 128).
__device__ __forceinline__ void copy16(char* dst, const char* src, long long bytes) {
  for (long long i = threadIdx.x; i < bytes / 16; i += blockDim.x)
    reinterpret_cast<uint4*>(dst)[i] = __ldcs(reinterpret_cast<const uint4*>(src) + i);
}

template <int D>
struct NetRingKernel : attention::GatheredKernel<D, true> {
  static __device__ __noinline__ void send_role(const NetRingGlobals& g, int c, int nc) {
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
  static __device__ void release_all(const NetRingGlobals& g) {
    for (int i = threadIdx.x; i < g.R.B * g.R.slices; i += blockDim.x)
      red_add_release_sys(g.slice_ready + i, 1ull << 40);
  }

  static __device__ __noinline__ void recv_role(const NetRingGlobals& g, int b, int nb) {
    const NetHandle& h = g.h;
    const RingPlan& R = g.R;
    const long long items = static_cast<long long>(steps(R)) * units(R);
    for (long long j = b; j < items; j += nb) {
      const int s = static_cast<int>(j / units(R)), u = static_cast<int>(j % units(R));
      const UnitBytes x = unit(R, from_peer(R, g.rank, s), u);
      if (x.bytes == 0) continue;
      const uint32_t fk = g.flag_base + static_cast<uint32_t>(flag(R, s, u, 0)), fv = fk + 1;
      if (!block_agree(threadIdx.x == 0 ? wait_arrival(h, fk) && wait_arrival(h, fv) : true)) {
        release_all(g);
        return;
      }
      const long long dst = (x.b * R.S + x.rows.begin) * R.row_bytes;
      block_copy_in(g.gk + dst, h.recv + g.recv_base + recv_off(R, s, 0, x.off), static_cast<uint64_t>(x.bytes));
      block_copy_in(g.gv + dst, h.recv + g.recv_base + recv_off(R, s, 1, x.off), static_cast<uint64_t>(x.bytes));
      __syncthreads();
      if (threadIdx.x == 0) {
        consume(h, fk);
        consume(h, fv);
        // Release (cumulative over the block's copies, ordered by the barrier) to the producers,
        // which acquire and then fence the async proxy before their TMA loads.
        red_add_release_sys(g.slice_ready + attention::gathered::counter_index(x.b, 0, x.slice, 1, R.slices), 1ull);
      }
    }
  }

  static __device__ __noinline__ void communicator(const NetRingGlobals& g, uint8_t*, int c, int nc) {
    if (c < g.send_blocks)
      send_role(g, c, g.send_blocks);
    else
      recv_role(g, c - g.send_blocks, nc - g.send_blocks);
  }
  static __device__ __forceinline__ void retire_communicator(uint8_t*) {}  // no copy ring was set up
};

}  // namespace weave::net::ring_net
