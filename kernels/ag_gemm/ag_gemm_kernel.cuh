// AllGather + GEMM, inter-SM push: communicator blocks TMA-copy this rank's A shard into every
// peer's gathered A (128-row tiles cut into K slices, a ready signal per slice); the GEMM's
// loader waits for a peer row tile's ready before its first load. The communication is the
// communicator below and the wait in load(); README.md counts the lines.
#pragma once
#include "gemm/gemm_kernel.cuh"
#include "weave/lcsc.cuh"
#include "tp_common/schedule.hpp"
#include "weave/signal.cuh"
#include "weave/store.cuh"

namespace weave::tp {

struct AgGlobals : gemm::GemmGlobals {
  CUtensorMap asrc[kMaxWorld];  // A rows of owner q as this rank reads them (own: the input)
  CUtensorMap cdst[kMaxWorld];  // C rows of owner q (local output)
  signals ready;                // ready[off[q] + i]: owner q's row tile i is in our gathered A
  signals arrive;               // arrive[0]: ranks that entered this call (buffers free to write)
  const __nv_bfloat16* shard;           // this rank's rows (contiguous, shard rows x K)
  __nv_bfloat16* gdst[kMaxWorld];       // rank p's gathered A at this rank's first row (push targets)
  Layout L;
  int rank;
  int copy_local;  // the input is not already in place in the gathered buffer
  int push;        // 0: TMA bulk copies by one thread; 1: 16-byte register copies by all threads
  unsigned long long ready_round, arrive_round;
};

struct AgKernel : gemm::GemmKernel<256, gemm::BLayout::KN, 3> {
  using Base = gemm::GemmKernel<256, gemm::BLayout::KN, 3>;
  using Globals = AgGlobals;
  static constexpr int kCopySlots = 12;  // 16 KB boxes per communicator block (loads run ahead)
  static constexpr int kInFlight = 6;    // of which stores still reading shared memory
  static constexpr uint32_t kBoxBytes = kBM * 64 * 2;

  static __host__ __device__ int num_work(const AgGlobals& g) { return g.L.work(); }

  static __device__ __forceinline__ void prologue(const AgGlobals& g) { tile::tma::prefetch(&g.b); }

  static __device__ __forceinline__ void load(const AgGlobals& g, Stage& s, tile::Mbarrier& full, int w, int it) {
    const Item t = item(g.L, g.rank, w);
    if (it == 0 && t.owner != g.rank) {
      wait(g.ready, t.vrow, g.ready_round * ag_ready_expected(g.K));
      tile::fence_proxy_async_global();  // TMA reads what the peer's TMA wrote
    }
    const int k0 = it * BK;
    tile::tma::load_2d(s.a, &g.asrc[t.owner], &full, k0, t.i * BM);
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) tile::tma::load_2d(s.b + j * 64 * BK, &g.b, &full, t.n * BN + 64 * j, k0);
  }

  static __device__ __forceinline__ void store(const AgGlobals& g, Output& o, int w, int) {
    const Item t = item(g.L, g.rank, w);
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) {
      const int n = t.n * BN + 64 * j;
      if (n >= g.N) break;
      tile::tma::store_2d(&g.cdst[t.owner], o.c + j * BM * 64, n, t.i * BM);
    }
  }

  // 1-D bulk copies (cp.async.bulk): the shard's rows are contiguous at the source and in every
  // destination, so the push is a memcpy in 16 KB pieces (long NVLink writes, not 128-byte rows).
  static __device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, tile::Mbarrier* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     tile::smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(bar->addr())
                 : "memory");
  }
  static __device__ __forceinline__ void bulk_store(void* dst, const void* src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(tile::smem_u32(src)),
                 "r"(bytes)
                 : "memory");
  }

  // One thread per communicator block: units c, c + n, ... of this rank's shard (unit = a K-slice
  // of a 128-row tile, i.e. a contiguous byte range split into 16 KB pieces), each piece loaded
  // once and stored to every destination; after a unit, its ready signal to every peer.
  // Variant 1: every thread copies 16-byte vectors (local loads, peer stores); stores need no
  // completion wait per piece, only the block barrier and the signal's release after each unit.
  static __device__ __forceinline__ void push_registers(const AgGlobals& g, int c, int nc) {
    if (threadIdx.x == 0) {
      if (c == 0) signal_all(g.arrive, 0);
      wait(g.arrive, 0, g.arrive_round * g.L.W);
    }
    __syncthreads();
    constexpr int U = 4;
    const int units = ag_units(g.L, g.rank, g.K), P = ag_slices(g.K);
    const int4* src = reinterpret_cast<const int4*>(g.shard);
    for (int u = c; u < units; u += nc) {
      long long b0, b1;
      ag_unit_bytes(g.L, g.rank, g.K, u, &b0, &b1);
      const long long v0 = b0 / 16, v1 = b1 / 16;
      for (long long v = v0 + threadIdx.x; v < v1; v += U * blockDim.x) {
        int4 x[U];
#pragma unroll
        for (int k = 0; k < U; ++k)
          if (v + k * blockDim.x < v1) x[k] = __ldcs(src + v + k * blockDim.x);
        for (int d = 0; d < g.L.W; ++d) {
          if (d == g.rank && !g.copy_local) continue;
          int4* dst = reinterpret_cast<int4*>(g.gdst[d]);
#pragma unroll
          for (int k = 0; k < U; ++k)
            if (v + k * blockDim.x < v1) dst[v + k * blockDim.x] = x[k];
        }
      }
      __syncthreads();
      if (threadIdx.x == 0)
        for (int d = 0; d < g.L.W; ++d)
          if (d != g.rank) signal(g.ready, d, g.L.off[g.rank] + u / P);
    }
  }

  static __device__ __forceinline__ void communicator(const AgGlobals& g, void* smem, int c, int nc) {
    if (g.push == 1) return push_registers(g, c, nc);
    if (threadIdx.x != 0) return;
    uint8_t* buf = static_cast<uint8_t*>(smem);
    tile::Mbarrier* bar = reinterpret_cast<tile::Mbarrier*>(buf + kCopySlots * kBoxBytes);
    for (int s = 0; s < kCopySlots; ++s) bar[s].init(1);
    tile::fence_barrier_init();
    if (c == 0) signal_all(g.arrive, 0);
    wait(g.arrive, 0, g.arrive_round * g.L.W);  // every peer's previous call is over
    tile::fence_proxy_async_global();
    const int P = ag_slices(g.K), units = ag_units(g.L, g.rank, g.K);
    auto range = [&](int u, long long* b0, long long* b1) { ag_unit_bytes(g.L, g.rank, g.K, u, b0, b1); };
    auto signal_unit = [&](int u) {
      for (int d = 0; d < g.L.W; ++d)
        if (d != g.rank) signal(g.ready, d, g.L.off[g.rank] + u / P);
    };
    // Load and store cursors walk the same pieces: units c, c + nc, ..., 16 KB at a time.
    int u_load = c - nc, u_store = c - nc;
    long long off_load = 0, end_load = 0, off_store = 0, end_store = 0;
    auto advance_load = [&]() {
      for (u_load += nc; u_load < units; u_load += nc) {
        range(u_load, &off_load, &end_load);
        if (end_load > off_load) return;
      }
    };
    auto advance_store = [&]() {  // empty units (short last row tile) are signalled at once
      for (u_store += nc; u_store < units; u_store += nc) {
        range(u_store, &off_store, &end_store);
        if (end_store > off_store) return;
        signal_unit(u_store);
      }
    };
    long long issued = 0, done = 0;
    auto next_load = [&]() {
      if (u_load >= units) return;
      const uint32_t n = static_cast<uint32_t>(end_load - off_load < kBoxBytes ? end_load - off_load : kBoxBytes);
      const int s = static_cast<int>(issued % kCopySlots);
      bar[s].arrive_expect_tx(n);
      bulk_load(buf + s * kBoxBytes, reinterpret_cast<const uint8_t*>(g.shard) + off_load, n, &bar[s]);
      ++issued;
      if ((off_load += n) >= end_load) advance_load();
    };
    advance_load();
    advance_store();
    while (issued < kCopySlots && u_load < units) next_load();
    while (done < issued) {
      const int s = static_cast<int>(done % kCopySlots);
      bar[s].wait(static_cast<uint32_t>((done / kCopySlots) & 1));
      const uint32_t n = static_cast<uint32_t>(end_store - off_store < kBoxBytes ? end_store - off_store : kBoxBytes);
      for (int d = 0; d < g.L.W; ++d)
        if (d != g.rank || g.copy_local)
          bulk_store(reinterpret_cast<uint8_t*>(g.gdst[d]) + off_store, buf + s * kBoxBytes, n);
      tile::tma::commit_group();
      ++done;
      if ((off_store += n) >= end_store) {  // the unit is complete everywhere: tell each peer
        store_wait();
        signal_unit(u_store);
        advance_store();
      }
      // Refill the slot of the oldest piece whose stores may still be reading shared memory.
      const long long y = done - kInFlight;
      if (y >= 0 && issued == y + kCopySlots && u_load < units) {
        tile::tma::wait_group_read<kInFlight - 1>();
        next_load();
      }
    }
    store_wait();
  }
};

static_assert(AgKernel::kCopySlots * AgKernel::kBoxBytes + AgKernel::kCopySlots * sizeof(tile::Mbarrier) <=
                  sizeof(lcsc::SharedStorage<AgKernel>),
              "the communicator's copy ring must fit in the kernel's shared memory");

}  // namespace weave::tp
