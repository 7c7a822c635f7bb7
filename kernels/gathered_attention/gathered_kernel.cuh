// Attention over a gathered sequence with readiness waits: the one kernel behind ring attention
// and Ulysses attention (kernels/ring_attention, kernels/ulysses; schedule in
// gathered_schedule.hpp).
//
// One persistent launch, grid = SM count, one CTA per SM:
//   - CTAs [0, num_comm) are communicators: one thread per CTA pushes this rank's rows of K and
//     V (ring) or of Q, K and V restricted to each destination's heads (Ulysses) into every
//     rank's gathered buffers (global row order), with TMA box loads into a ring of shared-
//     memory slots and TMA box stores to the destination, then per (batch, head group, slice)
//     store_wait and a release signal to the destination's readiness counter. Then they join
//     the compute, taking tiles from the same counter.
//   - the other CTAs run the FA3-class pipeline of attention_kernel.cuh (its GEMM, mask and
//     softmax pieces are reused as they are): a query tile iterates its visible key blocks of
//     the gathered K/V in global order, and the producer thread waits (acquire, with the
//     weave timeout) for the counter of each slice before the slice's first load. Masks are
//     decided by global positions (query chunks need not start at a block boundary). A
//     non-causal tile starts where the CTAs already on its head are (aligned_start), so they
//     share each K/V block through L2 however far apart their tiles began.
//   - O goes to the tile's own chunk (ring, with LSE) or, tile half by tile half, to every rank
//     owning some of its rows (Ulysses; a TMA map per owner clips to exactly its rows); owners
//     then count the stores they received ("o_done") and CTA 0 waits for them at its end, so
//     when the kernel ends on a rank its output is complete.
// The single-GPU kernel is not built from this file: it stays as measured.
#pragma once
#include "attention/attention_kernel.cuh"
#include "gathered_attention/gathered.hpp"
#include "gathered_attention/gathered_schedule.hpp"
#include "weave/signal.cuh"
#include "weave/store.cuh"

namespace weave::attention {

template <int D_, bool PingPong_>
struct GatheredKernel {
  using Base = AttnKernel<D_, 128, 2, PingPong_, true>;
  using bf16 = tile::bf16;
  static constexpr int D = D_, BM = Base::BM, BN = Base::BN, kStages = Base::kStages, kDBlocks = Base::kDBlocks;
  static constexpr int kThreads = Base::kThreads;
  // Register split (setmaxnreg): the consumers need ~190 (SASS), so 224 leaves them room, and the
  // producer gets 56 instead of the single-GPU kernel's 24, where its readiness bookkeeping
  // (slice cache, rotated key order, per-chunk Q maps) spilled the per-key-block loop's state to
  // local memory. Together exactly the 168 x 384 registers the launch allocates.
  static constexpr int kProducerRegs = 56, kConsumerRegs = 224;
  static_assert((kProducerRegs + 2 * kConsumerRegs) * 128 == 168 * kThreads, "register split");
  static constexpr uint32_t kQBytes = Base::kQBytes, kKVBytes = Base::kKVBytes;
  static_assert(BM == gathered::kBlockRows && BN == gathered::kBlockRows, "tiles and key blocks are 128 rows");

  // A slice once seen ready stays ready for the rest of the launch: the producer remembers, per
  // (batch, head group), up to which slice it has seen, so later tiles of the same heads skip
  // the system-scope polls (one per slice and tile otherwise: 256 per tile at S = 128K).
  static constexpr int kWaitCache = 512;
  struct alignas(1024) Smem {
    bf16 q[BM * D];
    bf16 k[kStages][BN * D];
    bf16 v[kStages][BN * D];
    bf16 o[BM * D];
    tile::Mbarrier q_full, q_empty;
    tile::Mbarrier k_full[kStages], k_empty[kStages], v_full[kStages], v_empty[kStages];
    tile::Mbarrier sched_full[2], sched_empty[2];
    int tile_id[2], tile_start[2];
    int ocount[2][kMaxWorld];  // O stores per owner, per consumer
    int waited[kWaitCache];    // producer: slices of counter row (b, group) already seen ready
  };
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;
  // Communicator copy ring: 16 KB boxes in the space of the tile buffers.
  static constexpr uint32_t kBoxMax = 16384;
  static constexpr int kSlots = (BM * D + 2 * kStages * BN * D + BM * D) * 2 / kBoxMax;
  // Loads (local HBM) run at most kAhead boxes ahead of the stores; the other slots hold stores
  // still reading shared memory (for a peer-bound store, until NVLink has taken the data).
  // A third, a half and three quarters for loads measured within run-to-run noise (README).
  static constexpr int kAhead = kSlots / 3;
  static_assert(kSlots >= 4, "copy ring");

  struct Tile {
    int ci, mb, b, h;
    int qb, qe;  // global rows [qb, qe) of the tile that exist
  };
  static __device__ __forceinline__ Tile tile_at(const GatheredGlobals& g, int id) {
    const int heads = g.B * g.H, G = g.heads_per_section, per = G * g.m_blocks;
    const int sec = id / per, r = id - sec * per;
    const int in_sec = min(G, heads - sec * G);
    int mb = r / in_sec;
    const int bh = sec * G + (r - mb * in_sec);
    if (g.causal) mb = g.m_blocks - 1 - mb;  // the latest rows (longest tiles) first
    Tile t;
    t.ci = mb >= g.q_mblocks[0] ? 1 : 0;
    t.mb = mb - (t.ci ? g.q_mblocks[0] : 0);
    t.b = bh / g.H;
    t.h = bh - t.b * g.H;
    t.qb = g.q_begin[t.ci] + t.mb * BM;
    t.qe = min(t.qb + BM, g.q_begin[t.ci] + g.q_rows[t.ci]);
    return t;
  }
  static __device__ __forceinline__ int kv_head(const GatheredGlobals& g, int h) {
    return (g.head_base + h) / g.group - g.kv_base;
  }
  // Blocks until slice s of (b, kv head group) is in the gathered buffers (a CTA's first tile of
  // each (b, group) only: see produce_tile).
  static __device__ __forceinline__ void wait_slice(const GatheredGlobals& g, int ctr0, int s) {
    const int own = g.skip_self ? gathered::own_chunks_in_slice(g.S, g.n_chunks, s, g.mine, g.n_mine) : 0;
    wait(g.ready, ctr0 + s, g.ready_round * (gathered::chunks_in_slice(g.S, g.n_chunks, s) - own));
    tile::fence_proxy_async_global();  // TMA reads what the peers' TMA wrote
  }

  // Key block n of K or V (one of the two rings) into stage st (K and V advance together: one
  // state serves both rings): from the gathered buffer, or from the local input where block n
  // is a row block of an own chunk read in place.
  static __device__ __forceinline__ void load_block(const CUtensorMap* map, const CUtensorMap* own,
                                                    bf16 (&buf)[kStages][BN * D], tile::Mbarrier (&empty)[kStages],
                                                    tile::Mbarrier (&full)[kStages], const GatheredGlobals& g,
                                                    const tile::PipeState<kStages>& st, int hk, int n, int b) {
    int row = n * BN;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (i < g.n_own && n >= g.own_b0[i] && n < g.own_b1[i]) {
        map = own + i;
        row -= g.own_row0[i];
      }
    empty[st.index].wait(st.phase ^ 1);
    full[st.index].arrive_expect_tx(kKVBytes);
#pragma unroll
    for (int j = 0; j < kDBlocks; ++j)
      tile::tma::load_4d(buf[st.index] + j * BN * 64, map, &full[st.index], 64 * j, hk, row, b);
  }
  static __device__ __forceinline__ void load_k(const GatheredGlobals& g, Smem& sm, const tile::PipeState<kStages>& st,
                                                int hk, int n, int b) {
    load_block(&g.k, g.k_own, sm.k, sm.k_empty, sm.k_full, g, st, hk, n, b);
  }
  static __device__ __forceinline__ void load_v(const GatheredGlobals& g, Smem& sm, const tile::PipeState<kStages>& st,
                                                int hk, int n, int b) {
    load_block(&g.v, g.v_own, sm.v, sm.v_empty, sm.v_full, g, st, hk, n, b);
  }

  // The key block a tile visits first: its own first block, or (non-causal) the front of the
  // CTAs already on its head (gathered_schedule.hpp, aligned_start).
  static __device__ __forceinline__ int tile_start(const GatheredGlobals& g, const Tile& t) {
    const int n_max = gathered::visible_blocks(g.S, t.qe, g.causal != 0);
    const int own = gathered::first_block(g.start_row[t.ci], n_max);
    if (g.front == nullptr) return own;
    unsigned long long w;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];"
                 : "=l"(w)
                 : "l"(g.front + t.b * g.front_heads + kv_head(g, t.h)));
    return gathered::aligned_start(w, g.front_tag, n_max, own);
  }
  static __device__ __forceinline__ void record_front(unsigned long long* p, unsigned long long w) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
  }

  // One tile's loads: the first key block, Q, then the rest in rotated order. Slices are waited
  // for at their first visited block only while some slice of the tile is not yet known ready
  // (a CTA's first tile of a (batch, group)); the other tiles run a loop with no readiness code.
  static __device__ __forceinline__ void produce_tile(const GatheredGlobals& g, Smem& sm, const Tile& t, int start,
                                                      tile::PipeState<kStages>& st, uint32_t& q_phase) {
    const int hk = kv_head(g, t.h);
    const int row = t.b * g.groups + hk / g.group_heads;
    const int n_max = gathered::visible_blocks(g.S, t.qe, g.causal != 0);
    unsigned long long* front = g.front ? g.front + t.b * g.front_heads + hk : nullptr;
    const unsigned long long tag = gathered::front_word(g.front_tag, 0);
    const bool cached = row < kWaitCache;
    const int ready = cached ? sm.waited[row] : -1;  // slices [0, ready] are known ready
    const int last = gathered::slice_of_block(n_max - 1);
    if (gathered::slice_of_block(start) > ready) wait_slice(g, row * g.slices, gathered::slice_of_block(start));
    load_k(g, sm, st, hk, start, t.b);
    const int qs = t.qb / gathered::kSliceRows;
    if (g.wait_q && qs > ready) wait_slice(g, row * g.slices, qs);
    sm.q_empty.wait(q_phase ^ 1);
    q_phase ^= 1;
    sm.q_full.arrive_expect_tx(kQBytes);
#pragma unroll
    for (int j = 0; j < kDBlocks; ++j)
      tile::tma::load_4d(sm.q + j * BM * 64, &g.q[t.ci], &sm.q_full, 64 * j, t.h, t.mb * BM, t.b);
    load_v(g, sm, st, hk, start, t.b);
    st.advance();
    int n = start + 1 == n_max ? 0 : start + 1;
    if (last <= ready) {
      for (int i = 1; i < n_max; ++i) {
        if (front && n % gathered::kSliceBlocks == 0) record_front(front, tag | static_cast<unsigned>(n));
        load_k(g, sm, st, hk, n, t.b);
        load_v(g, sm, st, hk, n, t.b);
        st.advance();
        if (++n == n_max) n = 0;
      }
    } else {
      for (int i = 1; i < n_max; ++i) {
        // A block starting a slice (slice(start) is polled again after the wrap; it is ready).
        if (n % gathered::kSliceBlocks == 0 && gathered::slice_of_block(n) > ready)
          wait_slice(g, row * g.slices, gathered::slice_of_block(n));
        if (front && n % gathered::kSliceBlocks == 0) record_front(front, tag | static_cast<unsigned>(n));
        load_k(g, sm, st, hk, n, t.b);
        load_v(g, sm, st, hk, n, t.b);
        st.advance();
        if (++n == n_max) n = 0;
      }
      // Every visible block's slice was seen ready by now.
      if (cached) sm.waited[row] = last;
    }
  }

  static __device__ __forceinline__ void producer(const GatheredGlobals& g, Smem& sm) {
    tile::tma::prefetch(&g.k);
    tile::tma::prefetch(&g.v);
    for (int i = 0; i < g.n_own; ++i) {
      tile::tma::prefetch(&g.k_own[i]);
      tile::tma::prefetch(&g.v_own[i]);
    }
    tile::PipeState<kStages> st;
    tile::PipeState<2> sched;
    uint32_t q_phase = 0;
    const int compute = static_cast<int>(gridDim.x) - g.num_comm;
    // A communicator CTA computes once its pushes are done, taking its first tile from the
    // counter like every later one.
    int id = static_cast<int>(blockIdx.x) < g.num_comm ? compute + atomicAdd(g.counter, 1)
                                                       : static_cast<int>(blockIdx.x) - g.num_comm;
    while (true) {
      Tile t{};
      int start = 0;
      if (id < g.total_tiles) {
        t = tile_at(g, id);
        start = tile_start(g, t);
      }
      sm.sched_empty[sched.index].wait(sched.phase ^ 1);
      sm.tile_id[sched.index] = id;
      sm.tile_start[sched.index] = start;
      sm.sched_full[sched.index].arrive();
      sched.advance();
      if (id >= g.total_tiles) break;
      produce_tile(g, sm, t, start, st, q_phase);
      id = compute + atomicAdd(g.counter, 1);
    }
  }

  static __device__ __forceinline__ void consume_tile(const GatheredGlobals& g, Smem& sm, int c, const Tile& t, int start,
                                                      tile::PipeState<kStages>& ks, tile::PipeState<kStages>& vs,
                                                      uint32_t& q_phase) {
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int row0 = t.qb + c * 64 + warp * 16 + lane / 4;  // global rows row0, row0 + 8
    const int wg_row_min = t.qb + c * 64;
    const bool causal = g.causal != 0;
    const int n_max = gathered::visible_blocks(g.S, t.qe, causal);
    const float sl2 = g.scale_log2;
    const uint32_t q_addr = tile::smem_u32(sm.q) + c * 64 * 128;

    float s[BN / 2], o[D / 2];
    uint32_t p[BN / 4];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] = 0.f;

    sm.q_full.wait(q_phase);
    q_phase ^= 1;

    sm.k_full[ks.index].wait(ks.phase);
    Base::turn_wait(c);
    tile::wgmma::fence();
    Base::issue_qk(s, q_addr, tile::smem_u32(sm.k[ks.index]));
    tile::wgmma::commit_group();
    Base::turn_pass(c);
    tile::wgmma::wait_group<0>();
    tile::wgmma::fence_operands(s);
    Base::release(sm.k_empty[ks.index]);
    ks.advance();
    {
      if (gathered::block_needs_mask(g.S, start, wg_row_min, causal)) Base::mask(s, start * BN, row0, g.S, causal);
      float rs[2], corr[2];
      Base::softmax(s, m, rs, corr, sl2);
      l[0] = rs[0];
      l[1] = rs[1];
      Base::pack(p, s);
    }

    int n = start;  // gathered::block_at(i, start, n_max), kept incrementally
    for (int i = 1; i < n_max; ++i) {
      if (++n == n_max) n = 0;
      sm.k_full[ks.index].wait(ks.phase);
      sm.v_full[vs.index].wait(vs.phase);
      Base::turn_wait(c);
      tile::wgmma::fence();
      Base::issue_qk(s, q_addr, tile::smem_u32(sm.k[ks.index]));
      tile::wgmma::commit_group();
      Base::issue_pv(o, p, tile::smem_u32(sm.v[vs.index]));
      tile::wgmma::commit_group();
      Base::turn_pass(c);
      tile::wgmma::wait_group<1>();
      tile::wgmma::fence_operands(s);
      Base::release(sm.k_empty[ks.index]);
      ks.advance();
      if (gathered::block_needs_mask(g.S, n, wg_row_min, causal)) Base::mask(s, n * BN, row0, g.S, causal);
      float rs[2], corr[2];
      Base::softmax(s, m, rs, corr, sl2);
      tile::wgmma::wait_group<0>();
      tile::wgmma::fence_operands(o);
      Base::release(sm.v_empty[vs.index]);
      vs.advance();
#pragma unroll
      for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + rs[r];
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          o[4 * j + 2 * r] *= corr[r];
          o[4 * j + 2 * r + 1] *= corr[r];
        }
      Base::pack(p, s);
    }

    Base::release(sm.q_empty);

    sm.v_full[vs.index].wait(vs.phase);
    Base::turn_wait(c);
    tile::wgmma::fence();
    Base::issue_pv(o, p, tile::smem_u32(sm.v[vs.index]));
    tile::wgmma::commit_group();
    Base::turn_pass(c);
    tile::wgmma::wait_group<0>();
    tile::wgmma::fence_operands(o);
    Base::release(sm.v_empty[vs.index]);
    vs.advance();

    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] = tile::quad_sum(l[r]);
      inv[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        o[4 * j + 2 * r] *= inv[r];
        o[4 * j + 2 * r + 1] *= inv[r];
      }
    tile::named_barrier_sync(4 + c, 128);  // this warpgroup's previous store has read the staging tile
    tile::store_accumulator_swizzled<bf16, D>(sm.o, BM, c * 64, o);
    tile::fence_proxy_async_shared();
    tile::named_barrier_sync(4 + c, 128);
    const int hi = min(wg_row_min + 64, t.qe);
    if (tid == 0 && wg_row_min < hi) {
      for (int x = 0; x < g.n_otargets; ++x) {
        if (!g.o_by_owner && x != t.ci) continue;
        if (g.o_begin[x] >= hi || g.o_begin[x] + g.o_rows[x] <= wg_row_min) continue;
        // The target holding the half's first row takes a TMA store (rows past its end are
        // clipped by its map); a target starting inside the half is written from registers
        // below (a TMA box cannot start before a tensor's first row).
        if (g.o_begin[x] <= wg_row_min) {
#pragma unroll
          for (int j = 0; j < kDBlocks; ++j)
            tile::tma::store_4d(&g.o[x], sm.o + j * BM * 64 + c * 64 * 64, 64 * j, g.head_base + t.h,
                                wg_row_min - g.o_begin[x], t.b);
        }
        if (g.count_o) ++sm.ocount[c][x];
      }
      tile::tma::commit_group();
    }
    if (g.o_by_owner) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        if (row >= hi) continue;
        for (int x = 0; x < g.n_otargets; ++x) {
          if (g.o_begin[x] <= wg_row_min || row < g.o_begin[x] || row >= g.o_begin[x] + g.o_rows[x]) continue;
          bf16* dst = g.o_ptr[x] +
                      ((static_cast<size_t>(t.b) * g.o_rows[x] + (row - g.o_begin[x])) * g.o_heads + g.head_base + t.h) * D +
                      2 * (lane % 4);
#pragma unroll
          for (int j = 0; j < D / 8; ++j)
            *reinterpret_cast<uint32_t*>(dst + 8 * j) = tile::pack2<bf16>(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
        }
      }
    }
    if (g.lse != nullptr && lane % 4 == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        if (row < t.qe)
          g.lse[(static_cast<size_t>(t.b) * g.H + t.h) * g.lse_rows + g.q_lse_off[t.ci] + (row - g.q_begin[t.ci])] =
              m[r] * g.scale + logf(l[r]);
      }
    }
    if (tid == 0 && wg_row_min < hi) tile::tma::wait_group_read<0>();
  }

  static __device__ __forceinline__ void consumer(const GatheredGlobals& g, Smem& sm, int c) {
    tile::PipeState<kStages> ks, vs;
    tile::PipeState<2> sched;
    uint32_t q_phase = 0;
    if constexpr (PingPong_)
      if (c == 1) tile::named_barrier_arrive(2, 256);
    while (true) {
      sm.sched_full[sched.index].wait(sched.phase);
      // Broadcast from lane 0 so the compiler knows the id is warp-uniform: the tile's
      // coordinates, key-block count, stage indices and wgmma descriptors then stay in uniform
      // registers, as in the per-tile single-GPU kernel. A plain shared-memory load made them
      // per-thread: an R2UR per descriptor between the HGMMAs and ~5 % more instructions per key
      // block on the softmax's critical path (SASS, perf-notes).
      const int id = __shfl_sync(0xffffffff, *static_cast<volatile int*>(&sm.tile_id[sched.index]), 0);
      const int start = __shfl_sync(0xffffffff, *static_cast<volatile int*>(&sm.tile_start[sched.index]), 0);
      Base::release(sm.sched_empty[sched.index]);
      sched.advance();
      if (id >= g.total_tiles) break;
      consume_tile(g, sm, c, tile_at(g, id), start, ks, vs, q_phase);
    }
    if constexpr (PingPong_)
      if (c == 0) tile::named_barrier_sync(2, 256);
    if (g.count_o) tile::named_barrier_sync(4 + c, 128);  // the warpgroup's register-path O stores are issued
    if (g.count_o && threadIdx.x % 128 == 0) {
      store_wait();  // the O stores are in the owners' memory before they are counted
      for (int x = 0; x < g.n_otargets; ++x)
        if (sm.ocount[c][x] > 0) signal(g.odone, x, 0, static_cast<unsigned long long>(sm.ocount[c][x]));
      // Every owner-bound O tile of every rank has landed here before this CTA (so the kernel)
      // ends: one waiter per rank, after its own signals (the other consumer's come regardless).
      if (blockIdx.x == 0 && c == 0) wait(g.odone, 0, g.odone_expected);
    }
  }

  // 1-D bulk copies (no tensor map): a contiguous piece moves in long NVLink writes.
  // The rows a communicator reads to push are read once, long before the compute needs them,
  // so the loads are marked evict-first: they should not displace the K/V blocks the compute
  // CTAs share (ring 16K +1.3 %, 8K and 128K unchanged; the same hint on the peer-bound stores
  // measured no different, perf-notes session 9).
  static __device__ __forceinline__ uint64_t evict_first_policy() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
  }
  static __device__ __forceinline__ void bulk_load(void* dst, const uint8_t* src, uint32_t bytes, tile::Mbarrier* bar,
                                                   uint64_t policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            tile::smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(bar->addr()), "l"(policy)
        : "memory");
  }
  static __device__ __forceinline__ void bulk_store(uint8_t* dst, const void* src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(tile::smem_u32(src)),
                 "r"(bytes)
                 : "memory");
  }

  // One thread: units c, c + nc, ... of the push plan; per unit every (tensor, destination,
  // head box, row box) is loaded into a slot and stored to the destination, then the unit's
  // counter is signalled on every destination.
  static __device__ __noinline__ void communicator(const GatheredGlobals& g, uint8_t* buf, int c, int nc) {
    if (threadIdx.x != 0) return;
    tile::Mbarrier* bar = reinterpret_cast<tile::Mbarrier*>(buf + kSlots * kBoxMax);
    for (int i = 0; i < kSlots; ++i) bar[i].init(1);
    tile::fence_barrier_init();
    if (c == 0) signal_all(g.arrive, 0);
    wait(g.arrive, 0, g.arrive_round * static_cast<unsigned long long>(g.world));  // all ranks left the previous call
    tile::fence_proxy_async_global();
    const int units = gathered::num_units(g.B, g.groups, g.slices, g.n_mine);
    const int j0 = g.skip_self ? 1 : 0;  // destinations rank + j0, ..., rank + W - 1 (mod W)
    long long loads = 0, stores = 0;
    const uint64_t policy = evict_first_policy();
    for (int u = c; u < units; u += nc) {
      const gathered::Unit x = gathered::unit_at(u, g.groups, g.slices, g.n_mine);
      const gathered::Rows pc = gathered::piece(g.S, g.n_chunks, g.mine[x.i], x.s);
      if (pc.rows == 0) continue;
      const int r_lo = static_cast<int>(pc.begin - gathered::split(g.S, g.n_chunks, g.mine[x.i]).begin);
      const int r_hi = r_lo + static_cast<int>(pc.rows);
      const int h_lo = x.g * g.group_heads;
      // Box mode: (tensor t, destination j, head box h, row box r). Contiguous mode (the piece
      // is one byte range in source and destination): r is a byte offset, h unused.
      struct Cursor {
        int t, j, h;
        long long r;
      };
      auto dest = [&](const Cursor& k) { return (g.rank + k.j) % g.world; };
      auto h_end = [&](const Cursor& k) { return min(g.push[k.t].heads[dest(k)], h_lo + g.group_heads); };
      const long long c_bytes = static_cast<long long>(r_hi - r_lo) * g.row_bytes;
      auto c_off = [&](const Cursor& k, long long bstride) { return x.b * bstride + r_lo * g.row_bytes + k.r; };
      auto c_len = [&](const Cursor& k) { return static_cast<uint32_t>(min(static_cast<long long>(kBoxMax), c_bytes - k.r)); };
      auto next = [&](Cursor& k) {
        if (g.contig) {
          k.r += kBoxMax;
          if (k.r < c_bytes) return;
          k.r = 0;
        } else {
          k.r += g.push[k.t].box_rows;
          if (k.r < r_hi) return;
          k.r = r_lo;
          k.h += g.push[k.t].box_heads;
          if (k.h < h_end(k)) return;
          k.h = h_lo;
        }
        if (++k.j == g.world) {
          k.j = j0;
          ++k.t;
        }
      };
      const long long r0 = g.contig ? 0 : r_lo;
      Cursor ld{0, j0, h_lo, r0}, st{0, j0, h_lo, r0};
      while (st.t < g.n_push && j0 < g.world) {
        while (ld.t < g.n_push && loads < stores + kAhead) {
          tile::tma::wait_group_read<kSlots - kAhead - 1>();  // the slot's previous store has read it
          const int slot = static_cast<int>(loads % kSlots);
          const PushTensor& pt = g.push[ld.t];
          if (g.contig) {
            const uint32_t n = c_len(ld);
            bar[slot].arrive_expect_tx(n);
            bulk_load(buf + slot * kBoxMax, pt.src_ptr[x.i] + c_off(ld, g.src_bstride), n, &bar[slot], policy);
          } else {
            bar[slot].arrive_expect_tx(pt.box_bytes);
            tile::tma::load_4d(buf + slot * kBoxMax, &pt.src[x.i], &bar[slot], 0, pt.head0[dest(ld)] + ld.h,
                               static_cast<int>(ld.r), x.b);
          }
          ++loads;
          next(ld);
        }
        const int slot = static_cast<int>(stores % kSlots);
        bar[slot].wait(static_cast<uint32_t>((stores / kSlots) & 1));
        if (g.contig)
          bulk_store(g.push[st.t].dst_ptr[dest(st)][x.i] + c_off(st, g.dst_bstride), buf + slot * kBoxMax, c_len(st));
        else
          tile::tma::store_4d(&g.push[st.t].dst[dest(st)][x.i], buf + slot * kBoxMax, 0, st.h, static_cast<int>(st.r),
                              x.b);
        tile::tma::commit_group();
        ++stores;
        next(st);
      }
      store_wait();
      const int ctr = gathered::counter_index(x.b, x.g, x.s, g.groups, g.slices);
      for (int j = j0; j < g.world; ++j) signal(g.ready, (g.rank + j) % g.world, ctr);
    }
    store_wait();
  }
  // The copy ring's barriers, before the compute role reuses their memory.
  static __device__ __forceinline__ void retire_communicator(uint8_t* buf) {
    if (threadIdx.x != 0) return;
    tile::Mbarrier* bar = reinterpret_cast<tile::Mbarrier*>(buf + kSlots * kBoxMax);
    for (int i = 0; i < kSlots; ++i) bar[i].inval();
  }
};

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1) gathered_attention_kernel(const __grid_constant__ GatheredGlobals g) {
  extern __shared__ __align__(16) uint8_t gathered_smem[];
  const uintptr_t a = reinterpret_cast<uintptr_t>(gathered_smem);
  uint8_t* base = reinterpret_cast<uint8_t*>((a + 1023) & ~uintptr_t(1023));
  if (static_cast<int>(blockIdx.x) < g.num_comm) {
    // Communicators push first, then join the compute: at long sequences the pushes take a few
    // percent of the kernel and the SMs would otherwise idle for the rest.
    K::communicator(g, base, static_cast<int>(blockIdx.x), g.num_comm);
    __syncthreads();
    K::retire_communicator(base);
    __syncthreads();
  }
  auto& sm = *reinterpret_cast<typename K::Smem*>(base);
  if (threadIdx.x == 0) {
    sm.q_full.init(1);
    sm.q_empty.init(8);
    for (int i = 0; i < 2; ++i) {
      sm.sched_full[i].init(1);
      sm.sched_empty[i].init(8);
    }
    for (int i = 0; i < K::kStages; ++i) {
      sm.k_full[i].init(1);
      sm.v_full[i].init(1);
      sm.k_empty[i].init(8);
      sm.v_empty[i].init(8);
    }
    for (int c = 0; c < 2; ++c)
      for (int x = 0; x < kMaxWorld; ++x) sm.ocount[c][x] = 0;
    for (int i = 0; i < K::kWaitCache; ++i) sm.waited[i] = -1;
    tile::fence_barrier_init();
  }
  __syncthreads();
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
