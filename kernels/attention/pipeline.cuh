// The FA3-class pipeline both attention forward kernels run, once: the single-GPU kernel
// (attention_kernel.cuh) and the gathered-sequence kernel behind ring and Ulysses attention
// (kernels/gathered_attention/gathered_kernel.cuh). Pipeline<D, BN, Stages, PingPong> holds
//   - Shared: the Q tile, the K and V rings, the O staging tile and their barriers (a kernel's
//     Smem derives from it and adds its own fields after them);
//   - the producer's box loads (load_q, load_k, load_v): which key blocks, in which order, from
//     which tensor map and after which readiness wait stay the kernel's;
//   - the consumer loop (consume): per key block S = Q K^T (wgmma SS), the mask, the online
//     softmax, O += P V (wgmma RS, one block behind), the rescale, and the final O / l. What
//     differs between the kernels is a parameter: the key order (InOrder, Rotated) and the
//     mask (Mask: a consumer's query rows and the keys, by position in the sequence: of the
//     (batch, head) in the single-GPU kernel, of the whole gathered sequence in the other).
//     The epilogue's stores and LSE stay the kernel's (their targets differ); stage_o is shared.
// Everything is force-inlined and compile-time parameterised: each kernel compiles to what its
// own copy of the loop did (SASS compared: same instructions, registers, no spills; see
// mask_block for the one difference).
#pragma once
#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "attention/key_blocks.hpp"
#include "weave/tile/fragment.cuh"
#include "weave/tile/mbarrier.cuh"
#include "weave/tile/proxy.cuh"
#include "weave/tile/softmax.cuh"
#include "weave/tile/tma.cuh"
#include "weave/tile/types.cuh"
#include "weave/tile/warpgroup.cuh"
#include "weave/tile/wgmma.cuh"

namespace weave::attention {

// Key orders: the block visited i-th (i >= 1) given the one before (online softmax does not
// care about the order).
struct InOrder {  // 0, 1, ..., n - 1
  int n;
  __device__ __forceinline__ int first() const { return 0; }
  __device__ __forceinline__ int next(int i, int) const { return i; }
};
struct Rotated {  // start, ..., n - 1, 0, ..., start - 1 (gathered_schedule.hpp, block_at)
  int n, start;
  __device__ __forceinline__ int first() const { return start; }
  __device__ __forceinline__ int next(int, int prev) const { return prev + 1 == n ? 0 : prev + 1; }
};

// What the mask needs of a consumer warpgroup's 64 query rows, in the coordinates its keys are
// numbered in (key block n = keys [BN n, BN n + BN)).
struct Mask {
  int S;        // keys at or past S do not exist
  bool causal;  // key j is visible to row i only when j <= i
  int row0;     // this thread's first row (the other is row0 + 8)
  int row_min;  // the warpgroup's first row
};

template <int D_, int BN_, int Stages_, bool PingPong_>
struct Pipeline {
  using bf16 = tile::bf16;
  static constexpr int D = D_, BM = 128, BN = BN_, kStages = Stages_;
  static constexpr bool kPingPong = PingPong_;
  static constexpr int kThreads = 384;  // warpgroup 0: the producer; 1 and 2: consumers 0 and 1 (run_roles)
  static constexpr int kDBlocks = D / 64;
  static constexpr uint32_t kQBytes = BM * D * 2, kKVBytes = BN * D * 2;
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  static_assert(BN % 16 == 0 && BN <= 256, "key block");

  // No alignment of its own: the kernel's Smem (alignas(1024)) derives from it, so q sits at
  // offset 0 and the kernel's fields follow the barriers with no padding.
  template <int OElems>
  struct Shared {
    bf16 q[BM * D];           // D/64 blocks of BM rows x 128 B (swizzled); per-tile: the O staging tile
    bf16 k[kStages][BN * D];  // D/64 blocks of BN rows x 128 B
    bf16 v[kStages][BN * D];
    bf16 o[OElems];  // persistent: O staging (D/64 blocks of BM rows x 128 B)
    tile::Mbarrier q_full, q_empty;
    tile::Mbarrier k_full[kStages], k_empty[kStages], v_full[kStages], v_empty[kStages];
    tile::Mbarrier sched_full[2], sched_empty[2];
  };
  // Thread 0, before fence_barrier_init.
  template <class S>
  static __device__ __forceinline__ void init_barriers(S& sm) {
    sm.q_full.init(1);
    sm.q_empty.init(8);  // one arrival per consumer warp
    for (int i = 0; i < 2; ++i) {
      sm.sched_full[i].init(1);
      sm.sched_empty[i].init(8);
    }
    for (int i = 0; i < kStages; ++i) {
      sm.k_full[i].init(1);
      sm.v_full[i].init(1);
      sm.k_empty[i].init(8);  // one arrival per consumer warp
      sm.v_empty[i].init(8);
    }
  }

  // ---- producer (one thread) -----------------------------------------------------------------

  // The Q tile of (b, h) from row `row` of `map`, once the consumers' last QK^T of the previous
  // tile is done.
  template <class S>
  static __device__ __forceinline__ void load_q(S& sm, const CUtensorMap* map, int h, int row, int b,
                                                uint32_t& q_phase) {
    sm.q_empty.wait(q_phase ^ 1);
    q_phase ^= 1;
    sm.q_full.arrive_expect_tx(kQBytes);
#pragma unroll
    for (int j = 0; j < kDBlocks; ++j) tile::tma::load_4d(sm.q + j * BM * 64, map, &sm.q_full, 64 * j, h, row, b);
  }
  // One key block (BN rows from `row` of `map`, kv head hk, batch b) into stage st of a ring.
  static __device__ __forceinline__ void load_block(bf16 (&buf)[kStages][BN * D], tile::Mbarrier (&empty)[kStages],
                                                    tile::Mbarrier (&full)[kStages], const CUtensorMap* map,
                                                    const tile::PipeState<kStages>& st, int hk, int row, int b) {
    empty[st.index].wait(st.phase ^ 1);
    full[st.index].arrive_expect_tx(kKVBytes);
#pragma unroll
    for (int j = 0; j < kDBlocks; ++j)
      tile::tma::load_4d(buf[st.index] + j * BN * 64, map, &full[st.index], 64 * j, hk, row, b);
  }
  template <class S>
  static __device__ __forceinline__ void load_k(S& sm, const CUtensorMap* map, const tile::PipeState<kStages>& st,
                                                int hk, int row, int b) {
    load_block(sm.k, sm.k_empty, sm.k_full, map, st, hk, row, b);
  }
  template <class S>
  static __device__ __forceinline__ void load_v(S& sm, const CUtensorMap* map, const tile::PipeState<kStages>& st,
                                                int hk, int row, int b) {
    load_block(sm.v, sm.v_empty, sm.v_full, map, st, hk, row, b);
  }

  // ---- consumers (two warpgroups of 64 query rows) -------------------------------------------

  // S (64 x BN) = Q_c K^T: D/16 k-steps, each along 32 bytes of a 128-byte swizzled row.
  static __device__ __forceinline__ void issue_qk(float (&s)[BN / 2], uint32_t q_addr, uint32_t k_addr) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t da =
          tile::wgmma::make_desc(q_addr + (kk / 4) * BM * 128 + (kk % 4) * 32, 16, 1024, tile::Swizzle::B128);
      const uint64_t db =
          tile::wgmma::make_desc(k_addr + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024, tile::Swizzle::B128);
      tile::wgmma::mma_ss<bf16, BN, 0>(s, da, db, kk > 0 ? 1 : 0);
    }
  }
  // O (64 x D) += P (64 x BN, registers) V (BN x D, rows of D: N-major, 64-column blocks BN*128
  // bytes apart).
  static __device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&p)[BN / 4], uint32_t v_addr) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
      const uint64_t db = tile::wgmma::make_desc(v_addr + kk * 16 * 128, BN * 128, 1024, tile::Swizzle::B128);
      tile::wgmma::mma_rs<bf16, D, 1>(o, a, db, 1);
    }
  }

  static __device__ __forceinline__ void release(tile::Mbarrier& bar) {
    __syncwarp();
    if (tile::lane_id() == 0) bar.arrive();
  }

  // Columns at or past S, or (causal) past the row, to -inf. row0: this thread's first row.
  static __device__ __forceinline__ void mask(float (&s)[BN / 2], int col0, int row0, int S, bool causal) {
    const int t = tile::lane_id() % 4;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = col0 + 8 * j + 2 * t + e;
          const int row = row0 + 8 * r;
          if (col >= S || (causal && col > row)) s[4 * j + 2 * r + e] = -INFINITY;
        }
  }
  // Key block n of a warpgroup's rows: masked where some key is hidden from some row. (The
  // single-GPU kernel's own copy tested this through a by-reference lambda, which compiled to a
  // materialised bool: 3-5 more uniform instructions per key block than this form, which the
  // gathered kernel had.)
  static __device__ __forceinline__ void mask_block(float (&s)[BN / 2], const Mask& mk, int n) {
    if (block_needs_mask<BN>(mk.S, n, mk.row_min, mk.causal)) mask(s, n * BN, mk.row0, mk.S, mk.causal);
  }

  // m <- max(m, rowmax(s)); s <- exp2((s - m) * scale_log2); rs = this thread's part of the
  // row sums; corr = exp2((m_old - m_new) * scale_log2).
  static __device__ __forceinline__ void softmax(float (&s)[BN / 2], float (&m)[2], float (&rs)[2], float (&corr)[2],
                                                 float sl2) {
    float mx[2];
    tile::row_max(s, mx);
    float ms[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float mn = fmaxf(m[r], mx[r]);
      ms[r] = mn == -INFINITY ? 0.f : mn;  // a row with nothing visible yet stays at zero weight
      corr[r] = tile::exp2_approx((m[r] - ms[r]) * sl2);
      m[r] = mn;
    }
    tile::exp2_rows(s, ms, sl2);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float v = 0.f;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) v += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
      rs[r] = v;
    }
  }

  // Writes P only after the register fence that follows wgmma.wait_group (the P.V wgmma in
  // flight reads the previous P from these registers).
  static __device__ __forceinline__ void pack(uint32_t (&p)[BN / 4], const float (&s)[BN / 2]) {
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) asm volatile("" : "+r"(p[i])::"memory");
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) p[i] = tile::pack2<bf16>(s[2 * i], s[2 * i + 1]);
  }

  // Ping-pong: named barriers 2 and 3 make the two consumers take turns issuing their GEMMs.
  static __device__ __forceinline__ void turn_wait(int c) {
    if constexpr (kPingPong) tile::named_barrier_sync(2 + c, 256);
  }
  static __device__ __forceinline__ void turn_pass(int c) {
    if constexpr (kPingPong) tile::named_barrier_arrive(2 + (1 - c), 256);
  }
  static __device__ __forceinline__ void turns_begin(int c) {
    if constexpr (kPingPong)
      if (c == 1) tile::named_barrier_arrive(2, 256);  // consumer 0 issues first
  }
  static __device__ __forceinline__ void turns_end(int c) {
    if constexpr (kPingPong)
      if (c == 0) tile::named_barrier_sync(2, 256);  // consumer 1's last pass
  }

  // A value the producer wrote to shared memory, broadcast from lane 0: a value the compiler
  // knows is warp-uniform keeps the tile's coordinates, key-block count, stage indices and wgmma
  // descriptors in uniform registers. A plain shared-memory load made them per-thread: an R2UR
  // per descriptor between the HGMMAs and ~5 % more instructions per key block on the softmax's
  // critical path (SASS; the gathered kernel measured +3 % from the change, perf-notes).
  static __device__ __forceinline__ int uniform(int& x) {
    return __shfl_sync(0xffffffff, *static_cast<volatile int*>(&x), 0);
  }

  // A turn with one GEMM (the first QK^T, the last P.V): wait for its stage, issue it in turn,
  // wait for it, release the stage.
  template <int R, class Issue>
  static __device__ __forceinline__ void gemm_alone(tile::Mbarrier (&full)[kStages], tile::Mbarrier (&empty)[kStages],
                                                    tile::PipeState<kStages>& st, int c, float (&acc)[R], Issue issue) {
    full[st.index].wait(st.phase);
    turn_wait(c);
    tile::wgmma::fence();
    issue(st.index);
    tile::wgmma::commit_group();
    turn_pass(c);
    tile::wgmma::wait_group<0>();
    tile::wgmma::fence_operands(acc);
    release(empty[st.index]);
    st.advance();
  }

  // One query tile of consumer c: Q (after q_full), every key block of `order` from the K and V
  // rings, leaving O / l in o, the row maxima in m and the full row sums in l (for the LSE:
  // m * scale + log(l)). K_n is released as soon as S is done, V_{n-1} once P.V is done, Q after
  // the last QK^T.
  template <class S, class Order>
  static __device__ __forceinline__ void consume(S& sm, int c, const Order& order, const Mask& mk, float sl2,
                                                 tile::PipeState<kStages>& ks, tile::PipeState<kStages>& vs,
                                                 uint32_t& q_phase, float (&o)[D / 2], float (&m)[2], float (&l)[2]) {
    const uint32_t q_addr = tile::smem_u32(sm.q) + c * 64 * 128;
    float s[BN / 2];
    uint32_t p[BN / 4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;

    sm.q_full.wait(q_phase);
    q_phase ^= 1;

    // First key block: S only.
    int n = order.first();
    gemm_alone(sm.k_full, sm.k_empty, ks, c, s, [&](uint32_t st) { issue_qk(s, q_addr, tile::smem_u32(sm.k[st])); });
    {
      mask_block(s, mk, n);
      float rs[2], corr[2];
      softmax(s, m, rs, corr, sl2);
      l[0] = rs[0];
      l[1] = rs[1];
      pack(p, s);
    }

    for (int i = 1; i < order.n; ++i) {
      n = order.next(i, n);
      sm.k_full[ks.index].wait(ks.phase);
      sm.v_full[vs.index].wait(vs.phase);
      turn_wait(c);
      tile::wgmma::fence();
      issue_qk(s, q_addr, tile::smem_u32(sm.k[ks.index]));
      tile::wgmma::commit_group();
      issue_pv(o, p, tile::smem_u32(sm.v[vs.index]));
      tile::wgmma::commit_group();
      turn_pass(c);
      tile::wgmma::wait_group<1>();  // S is done; P.V may still run
      tile::wgmma::fence_operands(s);
      release(sm.k_empty[ks.index]);
      ks.advance();
      mask_block(s, mk, n);
      float rs[2], corr[2];
      softmax(s, m, rs, corr, sl2);
      tile::wgmma::wait_group<0>();
      tile::wgmma::fence_operands(o);
      release(sm.v_empty[vs.index]);
      vs.advance();
#pragma unroll
      for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + rs[r];
      scale_rows(o, corr);
      pack(p, s);
    }

    release(sm.q_empty);  // every QK^T of this tile is done: the next Q may land

    // Last P.V.
    gemm_alone(sm.v_full, sm.v_empty, vs, c, o, [&](uint32_t st) { issue_pv(o, p, tile::smem_u32(sm.v[st])); });

    // O / l (a row with no visible key stays zero).
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] = tile::quad_sum(l[r]);
      inv[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;
    }
    scale_rows(o, inv);
  }
  // o's row r (elements 4j + 2r, 4j + 2r + 1) times f[r].
  static __device__ __forceinline__ void scale_rows(float (&o)[D / 2], const float (&f)[2]) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        o[4 * j + 2 * r] *= f[r];
        o[4 * j + 2 * r + 1] *= f[r];
      }
  }

  // O to bf16 in consumer c's 64 rows of `stage` (stmatrix, swizzled for the TMA store), visible
  // to the async proxy when it returns. kReused: the stage outlives the tile (persistent O
  // buffer), so first wait until this warpgroup's previous store has read it (its thread 0
  // waited for that before reaching the barrier).
  template <bool kReused>
  static __device__ __forceinline__ void stage_o(bf16* stage, int c, const float (&o)[D / 2]) {
    if constexpr (kReused) tile::named_barrier_sync(4 + c, 128);
    tile::store_accumulator_swizzled<bf16, D>(stage, BM, c * 64, o);
    tile::fence_proxy_async_shared();
    tile::named_barrier_sync(4 + c, 128);
  }
};

// Warp specialisation of both kernels: warpgroup 0 gives registers back and one of its threads
// runs K::producer; warpgroups 1 and 2 take them and run K::consumer as consumers 0 and 1.
template <class K, class G, class S>
__device__ __forceinline__ void run_roles(const G& g, S& sm) {
  const int wg = tile::warpgroup_index();
  if (wg == 0) {
    tile::warpgroup_reg_dealloc<K::kProducerRegs>();
    if (tile::warp_in_warpgroup() == 0 && tile::lane_id() == 0) K::producer(g, sm);
  } else {
    tile::warpgroup_reg_alloc<K::kConsumerRegs>();
    K::consumer(g, sm, wg - 1);
  }
}

}  // namespace weave::attention
