// Inter-node GEMM + ReduceScatter (and + AllReduce) in one persistent kernel (mKernel's SM roles;
// layout.hpp says where each byte goes). Two forms of one kernel: nodes of one rank (Hier = false,
// readiness in device counters of this rank) and nodes of G >= 1 ranks (Hier = true, on the node
// communicator: the partial products lie in the node's heap, the node peers read them over NVLink,
// readiness in node signal sets):
//   compute blocks  the 128 x 256 GEMM of this rank's partial product, owner after owner in
//                   layout.hpp's rs_item order (remote nodes in step order, the own shard last);
//                   each output tile goes by TMA into the scratch (M x N, bf16), and once it has
//                   landed (store_wait) the storer counts it in on its row tile's counter
//                   (release): here (Hier = false), or on the tile owner's collector, the node
//                   rank of the owner's local index (ready[vrow], G x tiles_n per call). Hier: the
//                   storer first waits until every node rank entered this call (its previous call
//                   no longer reads this scratch).
//   send blocks     (communicator blocks 0 .. send_blocks - 1; block 0 first signals this rank's
//                   arrival on the node): after the call's send gate, for each (step s, unit u) of
//                   rail peer send_peer(r, s)'s shard, wait until the unit's row tile is complete
//                   in every node rank's partial, sum the G partials in fp32 (node rank 0, 1, ...,
//                   G - 1), round once into the mapped send buffer (the node's partial crosses the
//                   network once) and queue its command to that peer;
//   receive blocks  (the rest): for each unit of this rank's own shard, wait until its row tile is
//                   complete on every node rank and every rail peer's node partial arrived, then
//                   sum in fp32: the node ranks' partials (0 .. G - 1), then the arrivals in step
//                   order (nodes n + 1, n + 2, ...): the same order on every rank, so the result is
//                   deterministic; round once into the output.
//                   GEMM + AllReduce (all_reduce set): each reduced unit also goes into every node
//                   rank's output (NVLink), into the send buffer and to every rail peer (layout.hpp's
//                   ar_* areas); once a block's own units are done it takes the rail peers' reduced
//                   units, in step order, into every node rank's output. Hier: a unit written into
//                   a node peer's output is signalled there (landed[vrow], P per row tile of every
//                   owner of another local index), and each block ends after waiting for its share
//                   of those row tiles on this rank (no row of the output is still in flight when
//                   the kernel ends).
// Every wait watches the path: once it stopped (a peer or the proxy failed, or a block of this
// rank gave up) the waiting block gives up and the host's finish() throws the diagnostic. A
// receive block that gives up in an all-reduce raises every landed counter of every node rank past
// any expectation, so no node peer waits for rows that will not come; a storer whose wait gave up
// stores and signals anyway (the outputs are garbage, the call fails), so no collector waits.
#pragma once
#include "gemm/gemm_kernel.cuh"
#include "net_common/node_device.cuh"
#include "net_tp/layout.hpp"
#include "tp_common/schedule.hpp"
#include "weave/memory_order.cuh"
#include "weave/net/device.cuh"
#include "weave/signal.cuh"
#include "weave/store.cuh"

namespace weave::net::tp_net {

template <class GG>
struct NetRsGlobalsT : GG {
  CUtensorMap sc[kMaxWorld];       // owner q's rows of this rank's scratch, 128 x 64 boxes
  const __nv_bfloat16* scratch;    // M x N: this rank's partial product
  __nv_bfloat16* out;              // RS: this rank's shard rows x N; AR: M x N
  unsigned long long* tile_done;   // Hier = false: per virtual row tile, column tiles stored this call
  NetHandle h;
  UnitPlan U;
  uint64_t call, commands_before, recv_base;
  uint32_t flag_base;
  int rank, send_blocks;
  int all_reduce;
  // Hier = true: the node communicator's signal sets (rank = local index) and the node's buffers.
  signals ready;                        // ready[vrow] on the collector: G x tiles_n stores per call
  signals arrive;                       // arrive[0]: node ranks that entered this call
  signals landed;                       // AR: landed[vrow]: units a node peer wrote into this output
  Round ready_round, arrive_round, landed_round;
  const char* node_scratch[kMaxWorld];  // node rank d's partial product, as mapped here
  char* node_out[kMaxWorld];            // AR: node rank d's output, as mapped here
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

template <class Gemm, bool Hier>
struct NetRsKernelT : Gemm {
  using Base = Gemm;
  using typename Base::Output, typename Base::Stage;
  using Base::BK, Base::BM, Base::BN;
  using Globals = NetRsGlobalsT<typename Base::Globals>;
  static_assert(BM == weave::tp::kBM && BN == weave::tp::kBN, "the TP schedule's 128 x 256 tiles");

  static __device__ __forceinline__ int node_ranks(const Globals& g) { return Hier ? g.U.G : 1; }
  // Node rank d's partial product (Hier = false: this rank's, d = 0).
  static __device__ __forceinline__ const char* part(const Globals& g, int d) {
    if constexpr (Hier) return g.node_scratch[d];
    else return reinterpret_cast<const char*>(g.scratch);
  }
  // Where node rank d's all-reduced output starts (Hier = false: this rank's, d = 0).
  static __device__ __forceinline__ char* out_of(const Globals& g, int d) {
    if constexpr (Hier) return g.node_out[d];
    else return reinterpret_cast<char*>(g.out);
  }

  static __host__ __device__ int num_work(const Globals& g) { return g.U.L.work(); }
  static __device__ __forceinline__ void prologue(const Globals& g) {
    tile::tma::prefetch(&g.a);
    tile::tma::prefetch(&g.b);
  }
  struct LoadTile {
    int a_row, n;
  };
  static __device__ __forceinline__ LoadTile tile_of(const Globals& g, int w) {
    const weave::tp::Item t = rs_item(g.U, g.rank, w);
    return {t.a_row, t.n};
  }
  static __device__ __forceinline__ void load(const Globals& g, Stage& s, tile::Mbarrier& full, const LoadTile& t,
                                              int it) {
    const int k0 = it * BK;
    tile::tma::load_2d(s.a, &g.a, &full, k0, t.a_row);
    Base::load_b(&g.b, s, full, k0, t.n);
  }
  // The tile into the scratch; once it has landed (store_wait), count it in (release) where its
  // row tile is reduced.
  static __device__ __forceinline__ void store(const Globals& g, Output& o, int w, int) {
    const weave::tp::Item t = rs_item(g.U, g.rank, w);
    // Every node rank entered this call, so none still reads this scratch for its previous call.
    // Once the path stopped this goes on: the call fails at finish(), and no collector waits.
    if constexpr (Hier) (void)wait_count(g.h, g.arrive.ptr[g.arrive.rank], g.arrive_round * g.U.G);
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) {
      const int n = t.n * BN + 64 * j;
      if (n >= g.N) break;
      tile::tma::store_2d(&g.sc[t.owner], o.c + j * BM * 64, n, t.i * BM);
    }
    tile::tma::commit_group();
    store_wait();
    if constexpr (Hier) signal(g.ready, collector(g.U, t.owner), t.vrow);
    else red_add_release_sys(g.tile_done + t.vrow, 1ull);
  }

  // One thread: until row tile `vrow` is complete in every node rank's partial.
  static __device__ bool wait_tile(const Globals& g, int vrow) {
    if constexpr (Hier)
      return wait_count(g.h, g.ready.ptr[g.ready.rank] + vrow,
                        g.ready_round * static_cast<unsigned long long>(g.U.G * g.U.L.tiles_n));
    else return wait_count(g.h, g.tile_done + vrow, static_cast<unsigned long long>(g.U.L.tiles_n));
  }

  // All threads: the sum (fp32, node rank order) of the node's partials of bytes [off, off + bytes)
  // of the scratch, rounded once into dst (the mapped send buffer).
  static __device__ void sum_partials(const Globals& g, uint4* dst, long long off, long long bytes) {
    for (long long i = threadIdx.x; i < bytes / 16; i += blockDim.x) {
      float acc[8] = {};
      for (int d = 0; d < node_ranks(g); ++d)
        add_bf16x8(acc, __ldcg(reinterpret_cast<const uint4*>(part(g, d) + off) + i));
      dst[i] = pack_bf16x8(acc);
    }
  }

  // The command of step s's unit u of owner p (bytes [b0, b1) of p's shard, staged in the send
  // buffer's slot s) to p: its receive slot s and arrival flag.
  static __device__ __forceinline__ Command send_command(const Globals& g, int s, int u, int p, long long b0,
                                                         long long b1) {
    const UnitPlan& U = g.U;
    return Command{static_cast<uint64_t>(slot_off(U, s, b0)), g.recv_base + static_cast<uint64_t>(slot_off(U, s, b0)),
                   static_cast<uint64_t>(b1 - b0), 1, g.flag_base + static_cast<uint32_t>(flag(U, s, u)),
                   static_cast<uint16_t>(p), kNotify, 0};
  }
  // AR: the command of this rank's reduced unit u (bytes [b0, b1) of its shard, staged after RS's
  // slots) to its step-s rail peer, into that peer's AR receive area.
  static __device__ __forceinline__ Command ar_command(const Globals& g, int s, int u, long long b0, long long b1) {
    const UnitPlan& U = g.U;
    return Command{static_cast<uint64_t>(rs_send_needed(U) + b0),
                   g.recv_base + static_cast<uint64_t>(recv_needed(U) + slot_off(U, s, b0)),
                   static_cast<uint64_t>(b1 - b0), 1, g.flag_base + static_cast<uint32_t>(flags_needed(U) + flag(U, s, u)),
                   static_cast<uint16_t>(send_peer(U, g.rank, s)), kNotify, 0};
  }
  // Threads t, t + n, ... of bytes [b0, b1) of this rank's shard: the node's partials and every
  // step's arrival summed in fp32 (in that order), rounded once into the output (AR: every node
  // rank's, and the stage after RS's slots in the send buffer).
  static __device__ __forceinline__ void reduce_unit(const Globals& g, long long b0, long long b1, int t, int n) {
    const NetHandle& h = g.h;
    const UnitPlan& U = g.U;
    const long long own = shard_byte(U, g.rank);
    uint4* stage = g.all_reduce ? reinterpret_cast<uint4*>(h.send + rs_send_needed(U) + b0) : nullptr;
    for (long long i = t; i < (b1 - b0) / 16; i += n) {
      float acc[8] = {};
      for (int d = 0; d < node_ranks(g); ++d)
        add_bf16x8(acc, __ldcg(reinterpret_cast<const uint4*>(part(g, d) + own + b0) + i));
      for (int s = 0; s < steps(U); ++s)
        add_bf16x8(acc, ld_volatile_v4(reinterpret_cast<const uint4*>(h.recv + g.recv_base + slot_off(U, s, b0)) + i));
      const uint4 v = pack_bf16x8(acc);
      if (!stage) {
        reinterpret_cast<uint4*>(reinterpret_cast<char*>(g.out) + b0)[i] = v;
        continue;
      }
      for (int d = 0; d < node_ranks(g); ++d) reinterpret_cast<uint4*>(out_of(g, d) + own + b0)[i] = v;
      stage[i] = v;
    }
  }
  // AR, threads t, t + n, ...: the step-s rail peer q's reduced bytes [b0, b1) of its shard, from
  // the AR receive area into every node rank's output.
  static __device__ __forceinline__ void gather_unit(const Globals& g, int s, int q, long long b0, long long b1, int t,
                                                     int n) {
    const UnitPlan& U = g.U;
    const uint4* src = reinterpret_cast<const uint4*>(g.h.recv + g.recv_base + recv_needed(U) + slot_off(U, s, b0));
    const long long off = shard_byte(U, q) + b0;
    for (long long i = t; i < (b1 - b0) / 16; i += n) {
      const uint4 v = ld_volatile_v4(src + i);
      for (int d = 0; d < node_ranks(g); ++d) reinterpret_cast<uint4*>(out_of(g, d) + off)[i] = v;
    }
  }

  static __device__ __noinline__ void send_role(const Globals& g, int c, int nc, int* word) {
    const NetHandle& h = g.h;
    const UnitPlan& U = g.U;
    if constexpr (Hier)
      if (c == 0 && threadIdx.x == 0) signal_all(g.arrive, 0);  // once per rank and call, before any wait
    if (!open_send_gate(h, g.call, g.commands_before, c == 0, word)) return;
    Producer prod{h.queue};
    const long long items = step_units(U, g.rank, false);
    for (long long j = c; j < items; j += nc) {
      const auto [s, u, p, b0, b1] = step_unit(U, g.rank, false, j);
      if (b1 <= b0) continue;  // the receiver counts empty units in without a command
      if (!block_agree(threadIdx.x == 0 ? wait_tile(g, U.L.off[p] + u / U.P) : true, word)) return;
      sum_partials(g, reinterpret_cast<uint4*>(h.send + slot_off(U, s, b0)), shard_byte(U, p) + b0, b1 - b0);
      __syncthreads();
      bool ok = true;
      if (threadIdx.x == 0) ok = push(h, prod, send_command(g, s, u, p, b0, b1));
      if (!block_agree(ok, word)) return;
    }
  }

  // AR, one thread: unit u of owner q is in every node peer's output.
  static __device__ void signal_landed(const Globals& g, int q, int u) {
    if constexpr (Hier)
      for (int d = 0; d < g.U.G; ++d)
        if (d != g.landed.rank) signal(g.landed, d, g.U.L.off[q] + u / g.U.P);
  }
  // AR, a receive block that gives up: every landed counter of every node rank past any
  // expectation, so that no node peer waits for rows this block will not write.
  static __device__ void release_node(const Globals& g) {
    if constexpr (Hier)
      if (g.all_reduce) net::release_node(g.landed, g.U.L.row_tiles());
  }

  static __device__ __noinline__ void recv_role(const Globals& g, int b, int nb, int* word) {
    const NetHandle& h = g.h;
    const UnitPlan& U = g.U;
    const int r = g.rank;
    // AR: the reduced units are staged in the send buffer, which the previous calls' commands may
    // still read until send block 0 opens this call's gate; Hier: also written into the node
    // peers' outputs, which their previous calls may still use until they entered this one.
    if (g.all_reduce) {
      bool ok = open_send_gate(h, g.call, g.commands_before, false, word);
      if constexpr (Hier)
        ok = ok && block_agree(threadIdx.x == 0 ? wait_count(h, g.arrive.ptr[g.arrive.rank],
                                                             g.arrive_round * static_cast<unsigned long long>(U.G))
                                                : true,
                               word);
      if (!ok) return release_node(g);
    }
    const long long own = shard_byte(U, r);
    Producer prod{h.queue};
    for (int u = b; u < units(U, r); u += nb) {
      long long b0, b1;
      unit(U, r, u, &b0, &b1);
      if (b1 > b0) {
        bool ok = true;
        if (threadIdx.x == 0) {
          ok = wait_tile(g, U.L.off[r] + u / U.P);
          for (int s = 0; ok && s < steps(U); ++s)
            ok = wait_arrival(h, g.flag_base + static_cast<uint32_t>(flag(U, s, u)));
        }
        if (!block_agree(ok, word)) return release_node(g);
        reduce_unit(g, b0, b1, threadIdx.x, blockDim.x);
        __syncthreads();
        if (threadIdx.x == 0) {
          for (int s = 0; s < steps(U); ++s) consume(h, g.flag_base + static_cast<uint32_t>(flag(U, s, u)));
          for (int s = 0; ok && g.all_reduce && s < steps(U); ++s) ok = push(h, prod, ar_command(g, s, u, b0, b1));
        }
        if (!block_agree(ok, word)) return release_node(g);
      }
      if (g.all_reduce && threadIdx.x == 0) signal_landed(g, r, u);
    }
    if (!g.all_reduce) return;
    // AR's gather: the rail peers' reduced units into every node rank's output, in step order. A
    // block's own units above come first: they never wait for these.
    const long long items = step_units(U, r, true);
    for (long long j = b; j < items; j += nb) {
      const auto [s, u, q, b0, b1] = step_unit(U, r, true, j);
      if (b1 > b0) {
        const uint32_t f = g.flag_base + static_cast<uint32_t>(flags_needed(U) + flag(U, s, u));
        if (!block_agree(threadIdx.x == 0 ? wait_arrival(h, f) : true, word)) return release_node(g);
        gather_unit(g, s, q, b0, b1, threadIdx.x, blockDim.x);
        __syncthreads();
        if (threadIdx.x == 0) consume(h, f);
      }
      if (threadIdx.x == 0) signal_landed(g, q, u);
    }
    if constexpr (Hier) wait_landed(g, b, nb, word);
  }

  // AR, Hier: this block's share of the row tiles the node peers write into this rank's output
  // (owners of another local index), P units each; the kernel ends only after they landed.
  static __device__ void wait_landed(const Globals& g, int b, int nb, int* word) {
    const UnitPlan& U = g.U;
    bool ok = true;
    if (threadIdx.x == 0)
      for (int q = 0; ok && q < U.L.W; ++q) {
        if (collector(U, q) == g.landed.rank) continue;  // this rank writes those rows itself
        for (int v = U.L.off[q]; ok && v < U.L.off[q + 1]; ++v)
          if (v % nb == b)
            ok = wait_count(g.h, g.landed.ptr[g.landed.rank] + v,
                            g.landed_round * static_cast<unsigned long long>(U.P));
      }
    (void)block_agree(ok, word);
  }

  // The block's shared word for its agreements is the first of the dynamic shared memory, which
  // communicator blocks do not otherwise use (a static one might not fit beside it).
  static __device__ __forceinline__ void communicator(const Globals& g, void* smem, int c, int nc) {
    int* word = static_cast<int*>(smem);
    if (c < g.send_blocks)
      send_role(g, c, g.send_blocks, word);
    else
      recv_role(g, c - g.send_blocks, nc - g.send_blocks, word);
  }
};

using NetRsKernelNK = NetRsKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::NK, 3>, false>;
using NetRsKernelKN = NetRsKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::KN, 3>, false>;
using NetHierRsKernelNK = NetRsKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::NK, 3>, true>;
using NetHierRsKernelKN = NetRsKernelT<gemm::GemmKernel<weave::tp::kBN, gemm::BLayout::KN, 3>, true>;

}  // namespace weave::net::tp_net
