// AllGather + GEMM, inter-SM push: communicator blocks TMA-copy this rank's A shard into every
// peer's gathered A (128-row tiles cut into K slices, a ready signal per slice); the GEMM's
// loader waits for a peer row tile's ready before its first load. The communication is the
// communicator below and the wait in load(); README.md counts the lines.
#pragma once
#include "gemm/gemm_kernel.cuh"
#include "tp_common/schedule.hpp"
#include "weave/signal.cuh"
#include "weave/store.cuh"

namespace weave::tp {

struct AgGlobals : gemm::GemmGlobals {
  CUtensorMap asrc[kMaxWorld];  // A rows of owner q as this rank reads them (own: the input)
  CUtensorMap cdst[kMaxWorld];  // C rows of owner q (local output)
  CUtensorMap gdst[kMaxWorld];  // rank p's gathered A, this rank's shard rows (push targets)
  signals ready;                // ready[off[q] + i]: owner q's row tile i is in our gathered A
  signals arrive;               // arrive[0]: ranks that entered this call (buffers free to write)
  Layout L;
  int rank;
  int copy_local;  // the input is not already in place in the gathered buffer
  unsigned long long ready_round, arrive_round;
};

struct AgKernel : gemm::GemmKernel<256, gemm::BLayout::KN, 3> {
  using Base = gemm::GemmKernel<256, gemm::BLayout::KN, 3>;
  using Globals = AgGlobals;
  static constexpr int kCopySlots = 8;            // 16 KB boxes in flight per communicator block
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

  // One thread per communicator block: row tiles c, c + n, ... of this rank's shard, 128 x 64
  // boxes through a ring of shared-memory slots, each box stored to every destination.
  static __device__ __forceinline__ void communicator(const AgGlobals& g, void* smem, int c, int nc) {
    if (threadIdx.x != 0) return;
    uint8_t* buf = static_cast<uint8_t*>(smem);
    tile::Mbarrier* bar = reinterpret_cast<tile::Mbarrier*>(buf + kCopySlots * kBoxBytes);
    for (int s = 0; s < kCopySlots; ++s) bar[s].init(1);
    tile::fence_barrier_init();
    if (c == 0) signal_all(g.arrive, 0);
    wait(g.arrive, 0, g.arrive_round * g.L.W);  // every peer's previous call is over
    tile::fence_proxy_async_global();
    const int kc = (g.K + 63) / 64, P = ag_slices(g.K), per = kc / P;  // boxes per unit
    const int units = ag_units(g.L, g.rank, g.K);
    const int mine = units > c ? (units - c + nc - 1) / nc : 0;
    const long long total = static_cast<long long>(mine) * per;
    // Box x of this block: unit c + nc * (x / per), box (x % per) of the unit's K slice.
    auto row_of = [&](long long x) { return (c + nc * static_cast<int>(x / per)) / P; };
    auto col_of = [&](long long x) { return ((c + nc * static_cast<int>(x / per)) % P) * per + static_cast<int>(x % per); };
    auto issue = [&](long long x) {
      const int s = static_cast<int>(x % kCopySlots);
      bar[s].arrive_expect_tx(kBoxBytes);
      tile::tma::load_2d(buf + s * kBoxBytes, &g.asrc[g.rank], &bar[s], col_of(x) * 64, row_of(x) * kBM);
    };
    for (long long x = 0; x < total && x < kCopySlots; ++x) issue(x);
    for (long long x = 0; x < total; ++x) {
      const int s = static_cast<int>(x % kCopySlots), i = row_of(x), k = col_of(x);
      bar[s].wait(static_cast<uint32_t>((x / kCopySlots) & 1));
      for (int d = 0; d < g.L.W; ++d)
        if (d != g.rank || g.copy_local) tile::tma::store_2d(&g.gdst[d], buf + s * kBoxBytes, k * 64, i * kBM);
      tile::tma::commit_group();
      if (x % per == per - 1) {  // the unit is complete everywhere: tell each peer
        store_wait();
        for (int d = 0; d < g.L.W; ++d)
          if (d != g.rank) signal(g.ready, d, g.L.off[g.rank] + i);
      }
      if (x >= 1 && x - 1 + kCopySlots < total) {  // slot of box x-1 is read: refill it
        tile::tma::wait_group_read<1>();
        issue(x - 1 + kCopySlots);
      }
    }
    store_wait();
  }
};

}  // namespace weave::tp
