// Inter-node GEMM + ReduceScatter in one persistent kernel (mKernel's SM roles; layout.hpp says
// where each byte goes):
//   compute blocks  the 128 x 256 GEMM of this rank's partial product, owner after owner in step
//                   order (tp::rs_chain_item: owner r - 1 first, the own rows last); each output
//                   tile goes by TMA into a local scratch (M x N, bf16), and once it has landed the
//                   storer counts it in on its row tile's counter (device memory, zeroed per call);
//   send blocks     (communicator blocks 0 .. send_blocks - 1): after the call's send gate, for
//                   each (step s, unit u) of peer send_peer(r, s)'s shard, wait until the unit's row
//                   tile is complete in the scratch, copy it into the mapped send buffer and queue
//                   its command to that peer;
//   receive blocks  (the rest): for each unit of this rank's own shard, wait until its own row
//                   tile is complete and every peer's partial of it arrived, then sum the own
//                   partial and the N - 1 arrivals in fp32 (own first, then senders r + 1, r + 2,
//                   ...: the same order on every rank), round once to bf16 into the output.
//                   GEMM + AllReduce (all_reduce set): each reduced unit also goes into the send
//                   buffer and to every peer (layout.hpp's ar_* areas), and once the own units
//                   are done the blocks take the peers' reduced units, in step order, into their
//                   rows of the output (M x N on every rank).
// Every wait watches the path: once it stopped (a peer or the proxy failed, or a receive block
// timed out) the waiting block gives up and the host's finish() throws the diagnostic.
#pragma once
#include "gemm/gemm_kernel.cuh"
#include "net_tp/layout.hpp"
#include "tp_common/schedule.hpp"
#include "weave/memory_order.cuh"
#include "weave/net/device.cuh"
#include "weave/store.cuh"

namespace weave::net::tp_net {

template <class GG>
struct NetRsGlobalsT : GG {
  CUtensorMap sc[kMaxWorld];       // owner q's rows of the local scratch, 128 x 64 boxes
  const __nv_bfloat16* scratch;    // M x N: this rank's partial product
  __nv_bfloat16* out;              // RS: this rank's shard rows x N; AR: M x N
  unsigned long long* tile_done;   // per virtual row tile: column tiles stored this call
  NetHandle h;
  UnitPlan U;
  uint64_t call, commands_before, recv_base;
  uint32_t flag_base;
  int rank, send_blocks;
  int all_reduce;
};

// 16-byte groups of 8 bf16 values in fp32.
__device__ __forceinline__ void add_bf16x8(float (&acc)[8], const uint4& v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc[2 * i] += __uint_as_float(w[i] << 16);
    acc[2 * i + 1] += __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 pack_bf16x8(const float (&acc)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * i]))) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(acc[2 * i + 1]))) << 16);
  return {w[0], w[1], w[2], w[3]};
}

template <class Gemm>
struct NetRsKernelT : Gemm {
  using Base = Gemm;
  using typename Base::Output, typename Base::Stage;
  using Base::BK, Base::BM, Base::BN;
  using Globals = NetRsGlobalsT<typename Base::Globals>;
  static_assert(BM == weave::tp::kBM && BN == weave::tp::kBN, "the TP schedule's 128 x 256 tiles");

  static __host__ __device__ int num_work(const Globals& g) { return g.U.L.work(); }
  static __device__ __forceinline__ void prologue(const Globals& g) {
    tile::tma::prefetch(&g.a);
    tile::tma::prefetch(&g.b);
  }
  struct LoadTile {
    int a_row, n;
  };
  static __device__ __forceinline__ LoadTile tile_of(const Globals& g, int w) {
    const weave::tp::Item t = weave::tp::rs_chain_item(g.U.L, g.rank, w);
    return {t.a_row, t.n};
  }
  static __device__ __forceinline__ void load(const Globals& g, Stage& s, tile::Mbarrier& full, const LoadTile& t,
                                              int it) {
    const int k0 = it * BK;
    tile::tma::load_2d(s.a, &g.a, &full, k0, t.a_row);
    Base::load_b(&g.b, s, full, k0, t.n);
  }
  // The tile into the scratch; once it has landed (store_wait), count it in (release).
  static __device__ __forceinline__ void store(const Globals& g, Output& o, int w, int) {
    const weave::tp::Item t = weave::tp::rs_chain_item(g.U.L, g.rank, w);
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) {
      const int n = t.n * BN + 64 * j;
      if (n >= g.N) break;
      tile::tma::store_2d(&g.sc[t.owner], o.c + j * BM * 64, n, t.i * BM);
    }
    tile::tma::commit_group();
    store_wait();
    red_add_release_sys(g.tile_done + t.vrow, 1ull);
  }

  // One thread: until row tile `vrow` of the scratch is complete; false once the path stopped.
  static __device__ bool wait_tile(const Globals& g, int vrow) {
    const unsigned long long* c = g.tile_done + vrow;
    const unsigned long long want = static_cast<unsigned long long>(g.U.L.tiles_n);
    for (uint32_t i = 1; ld_acquire_sys(c) < want; ++i)
      if ((i & 1023) == 0 && stopped(g.h)) return false;
    return true;
  }

  static __device__ __noinline__ void send_role(const Globals& g, int c, int nc) {
    const NetHandle& h = g.h;
    const UnitPlan& U = g.U;
    if (!open_send_gate(h, g.call, g.commands_before, c == 0)) return;
    Producer prod{h.queue};
    const long long items = step_units(U, g.rank, false);
    for (long long j = c; j < items; j += nc) {
      int s = 0, u = 0;
      nth_unit(U, g.rank, false, j, &s, &u);
      const int p = send_peer(U, g.rank, s);
      long long b0, b1;
      unit(U, p, u, &b0, &b1);
      if (b1 <= b0) continue;  // the receiver counts empty units in without a command
      if (!block_agree(threadIdx.x == 0 ? wait_tile(g, U.L.off[p] + u / U.P) : true)) return;
      const uint4* src = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(g.scratch) + shard_byte(U, p) + b0);
      uint4* dst = reinterpret_cast<uint4*>(h.send + slot_off(U, s, b0));
      for (long long i = threadIdx.x; i < (b1 - b0) / 16; i += blockDim.x) dst[i] = __ldcg(src + i);  // L2: TMA wrote it
      __syncthreads();
      bool ok = true;
      if (threadIdx.x == 0)
        ok = push(h, prod,
                  Command{static_cast<uint64_t>(slot_off(U, s, b0)), g.recv_base + static_cast<uint64_t>(slot_off(U, s, b0)),
                          static_cast<uint64_t>(b1 - b0), 1, g.flag_base + static_cast<uint32_t>(flag(U, s, u)),
                          static_cast<uint16_t>(p), kNotify, 0});
      if (!block_agree(ok)) return;
    }
  }

  static __device__ __noinline__ void recv_role(const Globals& g, int b, int nb) {
    const NetHandle& h = g.h;
    const UnitPlan& U = g.U;
    const int r = g.rank;
    // AR: the reduced units are staged in the send buffer, which the previous calls' commands may
    // still read until send block 0 opens this call's gate.
    if (g.all_reduce && !open_send_gate(h, g.call, g.commands_before, false)) return;
    char* const own_out = reinterpret_cast<char*>(g.out) + (g.all_reduce ? shard_byte(U, r) : 0);
    Producer prod{h.queue};
    for (int u = b; u < units(U, r); u += nb) {
      long long b0, b1;
      unit(U, r, u, &b0, &b1);
      if (b1 <= b0) continue;
      bool ok = true;
      if (threadIdx.x == 0) {
        ok = wait_tile(g, U.L.off[r] + u / U.P);
        for (int s = 0; ok && s < steps(U); ++s) ok = wait_arrival(h, g.flag_base + static_cast<uint32_t>(flag(U, s, u)));
      }
      if (!block_agree(ok)) return;
      const uint4* own = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(g.scratch) + shard_byte(U, r) + b0);
      uint4* out = reinterpret_cast<uint4*>(own_out + b0);
      uint4* stage = g.all_reduce ? reinterpret_cast<uint4*>(h.send + rs_send_needed(U) + b0) : nullptr;
      for (long long i = threadIdx.x; i < (b1 - b0) / 16; i += blockDim.x) {
        float acc[8] = {};
        add_bf16x8(acc, __ldcg(own + i));
        for (int s = 0; s < steps(U); ++s)
          add_bf16x8(acc, ld_volatile_v4(reinterpret_cast<const uint4*>(h.recv + g.recv_base + slot_off(U, s, b0)) + i));
        const uint4 v = pack_bf16x8(acc);
        out[i] = v;
        if (stage) stage[i] = v;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int s = 0; s < steps(U); ++s) consume(h, g.flag_base + static_cast<uint32_t>(flag(U, s, u)));
        for (int s = 0; ok && g.all_reduce && s < steps(U); ++s)
          ok = push(h, prod,
                    Command{static_cast<uint64_t>(rs_send_needed(U) + b0),
                            g.recv_base + static_cast<uint64_t>(recv_needed(U) + slot_off(U, s, b0)),
                            static_cast<uint64_t>(b1 - b0), 1,
                            g.flag_base + static_cast<uint32_t>(flags_needed(U) + flag(U, s, u)),
                            static_cast<uint16_t>(send_peer(U, r, s)), kNotify, 0});
      }
      if (!block_agree(ok)) return;
    }
    if (!g.all_reduce) return;
    // AR's gather: the peers' reduced units into their rows of the output, in step order. A
    // block's own units above come first: they never wait for these.
    const long long items = step_units(U, r, true);
    for (long long j = b; j < items; j += nb) {
      int s = 0, u = 0;
      nth_unit(U, r, true, j, &s, &u);
      const int q = from_peer(U, r, s);
      long long b0, b1;
      unit(U, q, u, &b0, &b1);
      if (b1 <= b0) continue;
      const uint32_t f = g.flag_base + static_cast<uint32_t>(flags_needed(U) + flag(U, s, u));
      if (!block_agree(threadIdx.x == 0 ? wait_arrival(h, f) : true)) return;
      block_copy_in(reinterpret_cast<char*>(g.out) + shard_byte(U, q) + b0,
                    h.recv + g.recv_base + recv_needed(U) + slot_off(U, s, b0), static_cast<uint64_t>(b1 - b0));
      __syncthreads();
      if (threadIdx.x == 0) consume(h, f);
    }
  }

  static __device__ __forceinline__ void communicator(const Globals& g, void*, int c, int nc) {
    if (c < g.send_blocks)
      send_role(g, c, g.send_blocks);
    else
      recv_role(g, c - g.send_blocks, nc - g.send_blocks);
  }
};

using NetRsKernelNK = NetRsKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::NK, 3>>;
using NetRsKernelKN = NetRsKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::KN, 3>>;

}  // namespace weave::net::tp_net
