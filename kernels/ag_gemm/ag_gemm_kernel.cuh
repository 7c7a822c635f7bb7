// AllGather + GEMM: this rank's A shard is pushed into every peer's gathered A (128-row tiles
// cut into byte slices, a ready signal per slice) by communicator blocks (inter-SM, variants 0
// and 1), by the idle producer warps of the compute blocks (variants 2..6, no communicator SM;
// the aux role of weave/lcsc.cuh), or by whichever blocks the adaptive SM split sends to it
// (variant 10, AgAdaptiveKernelT below); the GEMM's loader waits for a peer row tile's ready
// before its first load. The communication is the pushes below and the wait in load(); README.md
// counts the lines.
#pragma once
#include "gemm/gemm_kernel.cuh"
#include "gemm_fp8/gemm_fp8_kernel.cuh"
#include "tp_common/adaptive_split.cuh"
#include "tp_common/schedule.hpp"
#include "tp_common/variants.hpp"
#include "weave/lcsc.cuh"
#include "weave/signal.cuh"
#include "weave/store.cuh"

namespace weave::tp {

// AgVariant::CopyEngine (7): no SM pushes; the host's copy-engine stream (copy_engine.hpp) sets
// the ready counters, one per row tile (P = 1), and the kernel only waits for them. The kernel
// receives the variant as AgGlobals::push (a number: 0..7 and 10 reach it; CopyEngineShardGemms
// (8) and AllGatherGemm (9) are host only, ag_gemm.cu).
constexpr int kAgCopyEngine = static_cast<int>(AgVariant::CopyEngine);

// GG: the GEMM's globals (gemm::GemmGlobals for bf16 inputs, gemm_fp8::Fp8Globals for fp8 with
// per-tensor scales), whose consumer reads them.
template <class GG>
struct AgGlobalsT : GG {
  CUtensorMap asrc[kMaxWorld];  // A rows of owner q as this rank reads them (own: the input)
  CUtensorMap cdst[kMaxWorld];  // C rows of owner q (local output)
  signals ready;                // ready[off[q] + i]: owner q's row tile i is in our gathered A
  signals arrive;               // arrive[0]: ranks that entered this call (buffers free to write)
  const void* shard;       // this rank's rows (contiguous, shard rows x K elements)
  void* gdst[kMaxWorld];   // rank p's gathered A at this rank's first row (push targets)
  Layout L;
  int rank;
  int copy_local;  // the input is not already in place in the gathered buffer
  int push;        // AgVariant's number (tp_common/variants.hpp), 0..7 or 10 (8 and 9 never launch
                   // it). 0: TMA bulk copies by one thread; 1: 16-byte register copies by all
                   // threads; 2: TMA bulk copies by one aux thread of every compute block; 3..6:
                   // register copies by the 64 aux threads of every 2^(push-3)-th compute block; 7:
                   // none (kAgCopyEngine); 10: register copies by the consumer threads of whichever
                   // block takes the unit (AgAdaptiveKernelT)
  int slices;      // P: units per row tile (ag_slices, for v0, v1 and v10, or ag_slices_aux)
  Round ready_round, arrive_round;
};

using AgGlobals = AgGlobalsT<gemm::GemmGlobals>;
using AgGlobalsFp8 = AgGlobalsT<gemm_fp8::Fp8Globals>;

// Gemm: the 128 x 256 GEMM whose loads, consumer and staging this kernel takes: bf16 with B K x N
// (BLayout::KN) or N x K (NK: an nn.Linear weight, read in place), or fp8 e4m3 (B N x K, the
// only layout fp8 wgmma reads; per-tensor scales applied in the epilogue). The push moves bytes:
// an fp8 shard is half of a bf16 one.
template <class Gemm>
struct AgKernelT : Gemm {
  using Base = Gemm;
  using typename Base::Output, typename Base::Stage;
  using Base::BK, Base::BM, Base::BN;
  using Globals = AgGlobalsT<typename Base::Globals>;
  static_assert(BM == kBM && BN == kBN, "the TP schedule's 128 x 256 tiles");
  static constexpr int kCopySlots = 12;  // 16 KB pieces per communicator block (loads run ahead)
  static constexpr int kInFlight = 6;    // of which stores still reading shared memory
  static constexpr uint32_t kBoxBytes = kBM * 64 * 2;
  static constexpr int kAuxSlots = 2;          // the aux push: what fits beside the GEMM's 208 KB
  static constexpr uint32_t kAuxPiece = 8192;  // double-buffered 8 KB pieces
  struct AuxShared {
    alignas(128) uint8_t buf[kAuxSlots * kAuxPiece];
    tile::Mbarrier bar[kAuxSlots];
  };

  static __host__ __device__ int num_work(const Globals& g) { return g.L.work(); }
  // Whether this launch runs variant v (the globals carry its number in `push`).
  static __device__ __forceinline__ bool is(const Globals& g, AgVariant v) { return g.push == to_int(v); }
  // This rank's shard rows in bytes (the push's unit boundaries).
  static __device__ __forceinline__ long long row_bytes(const Globals& g) {
    return static_cast<long long>(Base::kInBytes) * g.K;
  }

  static __device__ __forceinline__ void prologue(const Globals& g) { tile::tma::prefetch(&g.b); }

  // A peer's row tile is loaded once it has arrived (per-row-tile readiness).
  struct LoadTile {
    int owner, i, n;
  };
  static __device__ __forceinline__ LoadTile tile_of(const Globals& g, int w) {
    const Item t = item(g.L, g.rank, w);
    if (t.owner != g.rank) {
      wait(g.ready, t.vrow, g.ready_round * ag_ready_expected(g.slices));
      tile::fence_proxy_async_global();  // TMA reads what the peer's TMA wrote
    }
    return {t.owner, t.i, t.n};
  }
  static __device__ __forceinline__ void load(const Globals& g, Stage& s, tile::Mbarrier& full, const LoadTile& t,
                                              int it) {
    const int k0 = it * BK;
    tile::tma::load_2d(s.a, &g.asrc[t.owner], &full, k0, t.i * BM);
    Base::load_b(&g.b, s, full, k0, t.n);
  }

  static __device__ __forceinline__ void store(const Globals& g, Output& o, int w, int) {
    const Item t = item(g.L, g.rank, w);
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) {
      const int n = t.n * BN + 64 * j;
      if (n >= g.N) break;
      tile::tma::store_2d(&g.cdst[t.owner], o.c + j * BM * 64, n, t.i * BM);
    }
  }

  // Register push (variants 1, 3..6 and 10): threads t of nt (the whole communicator block, the 64
  // aux threads of a compute block, or v10's consumer threads) copy 16-byte vectors of unit u
  // (local loads, peer stores); stores need no completion wait per piece, only the barrier `sync`
  // and the signal's release after the unit.
  template <int U, class Sync>
  static __device__ __forceinline__ void push_unit(const Globals& g, int u, int t, int nt, Sync&& sync) {
    const int P = g.slices;
    const int4* src = reinterpret_cast<const int4*>(g.shard);
    long long b0, b1;
    ag_unit_bytes(g.L, g.rank, row_bytes(g), P, u, &b0, &b1);
    const long long v0 = b0 / 16, v1 = b1 / 16;
    for (long long v = v0 + t; v < v1; v += U * nt) {
      int4 x[U];
#pragma unroll
      for (int k = 0; k < U; ++k)
        if (v + k * nt < v1) x[k] = __ldcs(src + v + k * nt);
      for (int d = 0; d < g.L.W; ++d) {
        if (d == g.rank && !g.copy_local) continue;
        int4* dst = reinterpret_cast<int4*>(g.gdst[d]);
#pragma unroll
        for (int k = 0; k < U; ++k)
          if (v + k * nt < v1) dst[v + k * nt] = x[k];
      }
    }
    sync();
    if (t == 0)
      for (int d = 0; d < g.L.W; ++d)
        if (d != g.rank) signal(g.ready, d, g.L.off[g.rank] + u / P);
  }
  // Units c, c + nc, ... after the arrival handshake (pusher 0 announces this rank's entry).
  template <int U, class Sync>
  static __device__ __forceinline__ void push_registers(const Globals& g, int c, int nc, int t, int nt, Sync&& sync) {
    if (t == 0) {
      if (c == 0) signal_all(g.arrive, 0);
      wait(g.arrive, 0, g.arrive_round * g.L.W);
    }
    sync();
    const int units = ag_units(g.L, g.rank, g.slices);
    for (int u = c; u < units; u += nc) push_unit<U>(g, u, t, nt, sync);
  }

  // One thread: units c, c + nc, ... of this rank's shard, each a contiguous byte range (the
  // shard's rows are contiguous at the source and in every destination, so the push is a memcpy
  // in long NVLink writes, not 128-byte rows) moved in Piece-byte 1-D bulk copies
  // (tile::tma::bulk_load / bulk_store) through Slots shared-memory slots (loads run ahead, InFlight stores
  // may still be reading), each piece loaded once and stored to every destination; after a
  // unit, store_wait() and its ready signal to every peer.
  template <int Slots, int InFlight, uint32_t Piece>
  static __device__ __forceinline__ void push_tma(const Globals& g, uint8_t* buf, tile::Mbarrier* bar, int c,
                                                  int nc) {
    for (int s = 0; s < Slots; ++s) bar[s].init(1);
    tile::fence_barrier_init();
    if (c == 0) signal_all(g.arrive, 0);
    wait(g.arrive, 0, g.arrive_round * g.L.W);  // every peer's previous call is over
    tile::fence_proxy_async_global();
    const int P = g.slices, units = ag_units(g.L, g.rank, P);
    auto range = [&](int u, long long* b0, long long* b1) { ag_unit_bytes(g.L, g.rank, row_bytes(g), P, u, b0, b1); };
    auto signal_unit = [&](int u) {
      for (int d = 0; d < g.L.W; ++d)
        if (d != g.rank) signal(g.ready, d, g.L.off[g.rank] + u / P);
    };
    // Load and store cursors walk the same pieces: units c, c + nc, ..., Piece bytes at a time.
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
      const uint32_t n = static_cast<uint32_t>(end_load - off_load < Piece ? end_load - off_load : Piece);
      const int s = static_cast<int>(issued % Slots);
      bar[s].arrive_expect_tx(n);
      tile::tma::bulk_load(buf + s * Piece, reinterpret_cast<const uint8_t*>(g.shard) + off_load, n, &bar[s]);
      ++issued;
      if ((off_load += n) >= end_load) advance_load();
    };
    advance_load();
    advance_store();
    while (issued < Slots && u_load < units) next_load();
    while (done < issued) {
      const int s = static_cast<int>(done % Slots);
      bar[s].wait(static_cast<uint32_t>((done / Slots) & 1));
      const uint32_t n = static_cast<uint32_t>(end_store - off_store < Piece ? end_store - off_store : Piece);
      for (int d = 0; d < g.L.W; ++d)
        if (d != g.rank || g.copy_local)
          tile::tma::bulk_store(reinterpret_cast<uint8_t*>(g.gdst[d]) + off_store, buf + s * Piece, n);
      tile::tma::commit_group();
      ++done;
      if ((off_store += n) >= end_store) {  // the unit is complete everywhere: tell each peer
        store_wait();
        signal_unit(u_store);
        advance_store();
      }
      // Refill the slot of the oldest piece whose stores may still be reading shared memory.
      const long long y = done - InFlight;
      if (y >= 0 && issued == y + Slots && u_load < units) {
        tile::tma::wait_group_read<InFlight - 1>();
        next_load();
      }
    }
    store_wait();
  }

  static __device__ __forceinline__ void communicator(const Globals& g, void* smem, int c, int nc) {
    if (is(g, AgVariant::CommRegisterPush))
      return push_registers<4>(g, c, nc, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x),
                               [] { __syncthreads(); });
    if (threadIdx.x != 0) return;
    uint8_t* buf = static_cast<uint8_t*>(smem);
    push_tma<kCopySlots, kInFlight, kBoxBytes>(g, buf, reinterpret_cast<tile::Mbarrier*>(buf + kCopySlots * kBoxBytes),
                                               c, nc);
  }

  // Variants 2..6: the producer's idle warps of compute blocks push units while the blocks
  // compute (their own rows come first): v2 by one thread of every block with bulk copies; v3+s
  // by the 64 threads of every 2^s-th block with register copies (no TMA, no shared memory;
  // fewer pushers spread the same bytes over more of the kernel).
  static __device__ __forceinline__ void aux(const Globals& g, AuxShared& a, int compute_blocks, int t) {
    const int b = static_cast<int>(blockIdx.x);
    if (is(g, AgVariant::AuxTmaPush) && t == 0) push_tma<kAuxSlots, 1, kAuxPiece>(g, a.buf, a.bar, b, compute_blocks);
    if (g.push >= to_int(AgVariant::AuxRegisterPush1) && g.push <= to_int(AgVariant::AuxRegisterPush8)) {
      const int stride = ag_aux_stride(g.push);
      if (b % stride == 0)
        push_registers<4>(g, b / stride, ag_aux_pushers(compute_blocks, g.push), t, 64,
                          [] { tile::named_barrier_sync(1, 64); });
    }
  }
};

// Adaptive (AgVariant::Adaptive, bf16; issue 22, mKernel section 3.2): v0/v1's tasks without a
// fixed split, as gemm_rs v6 and gemm_ar v2 (tp_common/adaptive_split.cuh over sm_ledger.cuh's
// ledger and sm_split.hpp's policy). Every block of the persistent grid (every SM; cooperative)
// chooses at each task boundary, in its loader, between
// - a compute task: output tile i in item()'s order (the own shard first, read from a_shard; then
//   owners rank + 1, rank + 2, ...), through the block's loader, consumers and storer as in v0;
// - a communication task: v0/v1's push unit u (P = ag_slices(row bytes) units per row tile; unit u
//   is row tile u / P, slice u % P), copied by the block's 256 consumer threads with v1's 16-byte
//   register copies into every peer's gathered A (and the own one when the input is not in place),
//   then ready[off[rank] + u / P] on every peer.
// The units, counters, expectation (round * P, on signal sets shared with v0/v1 of the same P) and
// arrival handshake are v0/v1's, so tile_of's wait is unchanged; block 0's loader announces this
// rank's entry (arrive[0] on every rank) in its prologue, before its first choice, whatever its role.
//
// What differs from GEMM + RS / AR: a push has no input but the arrival (the shard is local), while
// a tile of a peer's rows needs that PEER's pushes. So the ledger claims compute tasks the way it
// claims communication ones (sm_ledger.cuh's next_task with compute_ready): tile i only once its
// rows are in place here (ready[vrow] >= round P; own tiles at once), push unit k only once every
// rank entered the call; until then the block polls and decides again, holding no index. A block
// whose next tile waits pushes instead, whatever the target (sm_split.hpp's next_role, comm_cap).
//
// Deadlock freedom:
// (1) No block waits inside a task: a tile is handed out with its rows in place (tile_of's wait
//     returns at once: it is the acquire), a push once every rank entered (its wait is the
//     acquire), and the push itself loads the local shard, stores and signals. The template's own
//     waits (stage ring, output staging, task ring) depend on the block's own roles only. So every
//     block comes back to next_task a task's time after it left it.
// (2) A block that claims nothing holds nothing: its polls leave every index to the others.
// (3) The arrival completes: each rank's block 0 signals it before any choice, and every block is
//     resident, so once every rank launched the call arrive[0] reaches round W on every rank.
// (4) Every push unit of this rank is claimed: suppose one stays unclaimed for good. After the
//     arrival every choice sees comm_next_ready. The compute head moves only by claims, so after
//     finitely many it stops: either every tile is claimed (next_role: communicate) or the head's
//     rows do not arrive (compute_next_ready false: communicate, and comm_cap admits all B
//     blocks). Either way the next block at a choice - by (1) blocks keep coming - claims the unit:
//     a contradiction. A claimed push ends, by (1).
// (5) So every rank's units all land, every peer row tile's counter reaches round P on every rank,
//     every compute head becomes ready in turn, every tile is claimed and ends (1), and every block
//     is handed Done. A block waiting for a peer's rows (polling) never keeps this rank's own
//     pushes, which that peer may be waiting for, from being claimed, by it or by another block.
// With blocking claims instead (tiles claimed by fetch-and-add in order and waited for in tile_of,
// as v0's compute blocks do), every block of a rank could sit on a peer's tile while its own
// pushes are unclaimed (each past its few own tiles before the arrival showed), and each peer
// likewise: tests/tp/test_sm_split_cpu.cu's event simulation shows that deadlock
// (AgModel.BlockingClaimsCanDeadlock) beside this rule's runs for W = 2..8 with slow and late peers,
// and tests/tp/test_sm_ledger_cpu.cu runs these claims in threads as the blocks of W ranks.
// A lost signal (a peer that died, or never launched) ends as weave's waits do: a poll that saw no
// progress for the set's timeout (or after a peer's abort) hands the task out anyway
// (AdaptivePoll), and the task's own wait reports it.
struct AgAdaptiveGlobals : AgGlobals, SplitGlobals {};  // priors: cycles per tile and per push unit

template <class Gemm>
struct AgAdaptiveKernelT : AgKernelT<Gemm>, LedgerHooks<AgAdaptiveGlobals> {
  using Base = AgKernelT<Gemm>;
  using Globals = AgAdaptiveGlobals;
  static_assert(std::is_same_v<typename Base::Globals, AgGlobals>, "the adaptive split is built for bf16 inputs");
  static constexpr bool kDynamicTasks = true;  // (the lcsc template ignores the aux and communicator inherited)
  // The loader's state between choices: its role, and its polls of a tile's rows and of the arrival.
  struct TaskState {
    AdaptiveState split;
    AdaptivePoll rows, arrival;
  };

  static __device__ __forceinline__ void prologue(const Globals& g) {
    Base::prologue(g);
    if (blockIdx.x == 0) signal_all(g.arrive, 0);  // this rank entered the call
  }

  static __device__ __forceinline__ lcsc::Task next_task(const Globals& g, TaskState& st, int blocks) {
    const sm_split::LedgerParams p = g.params(blocks, g.L.work(), ag_units(g.L, g.rank, g.slices));
    const unsigned long long* ready = g.ready.ptr[g.rank];
    const unsigned long long rows_in = g.ready_round * ag_ready_expected(g.slices);
    const unsigned long long entered = g.arrive_round * static_cast<unsigned long long>(g.L.W);
    st.rows.key = st.arrival.key = -1;  // the timeouts count one unbroken poll within this choice
    const auto arrived = [&](long long) {
      const unsigned long long n = ld_relaxed_sys(g.arrive.ptr[g.rank]);
      return st.arrival(g.arrive, 0, n, n >= entered);
    };
    return adaptive_task(
        *g.ledger, p, st.split,
        [&](long long i) {
          const Item t = item(g.L, g.rank, static_cast<int>(i));
          if (t.owner == g.rank) return true;
          const unsigned long long n = ld_relaxed_sys(ready + t.vrow);
          return st.rows(g.ready, t.vrow, n, n >= rows_in);
        },
        arrived, arrived);
  }

  // Push unit u by the consumer threads t = 0..n-1: thread 0 acquires the arrival (complete when
  // the unit was handed out), then v1's register copies of the unit and its ready signals.
  static __device__ __forceinline__ unsigned long long other_task(const Globals& g, int u, int t, int n) {
    if (t == 0) wait(g.arrive, 0, g.arrive_round * g.L.W);
    lcsc::consumers_sync<AgAdaptiveKernelT>();
    const long long t0 = clock64();
    Base::template push_unit<4>(g, u, t, n, [] { lcsc::consumers_sync<AgAdaptiveKernelT>(); });
    return static_cast<unsigned long long>(clock64() - t0);
  }
  // task_finished, block_exit: LedgerHooks'. Nothing else ends the call (as v0: the next call's
  // pushes wait for every rank's arrival in it).
};

using AgKernel = AgKernelT<gemm::GemmKernel<kBN, gemm::BLayout::KN, 3>>;
using AgKernelNK = AgKernelT<gemm::GemmKernel<kBN, gemm::BLayout::NK, 3>>;
using AgKernelFp8 = AgKernelT<gemm_fp8::GemmFp8Kernel<tile::fp8e4m3, tile::fp8e4m3, kBN, 3>>;
using AgAdaptiveKernel = AgAdaptiveKernelT<gemm::GemmKernel<kBN, gemm::BLayout::KN, 3>>;
using AgAdaptiveKernelNK = AgAdaptiveKernelT<gemm::GemmKernel<kBN, gemm::BLayout::NK, 3>>;
// The fp8 kernel's launch, in its own translation unit (ag_gemm_fp8.cu): the build compiles it
// beside the bf16 ones.
lcsc::Plan launch_ag_fp8(const AgGlobalsFp8& g, const lcsc::Config& cfg, cudaStream_t s);

static_assert(AgKernel::kCopySlots * AgKernel::kBoxBytes + AgKernel::kCopySlots * sizeof(tile::Mbarrier) <=
                  sizeof(lcsc::SharedStorage<AgKernel>),
              "the communicator's copy ring must fit in the kernel's shared memory");
static_assert(sizeof(lcsc::SharedStorage<AgKernelNK>) == sizeof(lcsc::SharedStorage<AgKernel>) &&
                  sizeof(lcsc::SharedStorage<AgKernelFp8>) == sizeof(lcsc::SharedStorage<AgKernel>),
              "both layouts and both input types stage the same bytes");

}  // namespace weave::tp
