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
//   - the other CTAs run the FA3-class pipeline of the single-GPU kernel, the same code
//     (attention/pipeline.cuh: its loads and its consumer loop, with the key order Rotated): a
//     query tile iterates its visible key blocks of the gathered K/V in global order, and the
//     producer thread waits (acquire, with the weave timeout) for the counter of each slice
//     before the slice's first load. Masks are decided by global positions (query chunks need
//     not start at a block boundary). A non-causal tile starts where the CTAs already on its
//     head are (aligned_start), so they share each K/V block through L2 however far apart their
//     tiles began.
//   - O goes to the tile's own chunk (ring, with LSE) or, tile half by tile half, to every rank
//     owning some of its rows (Ulysses; a TMA map per owner clips to exactly its rows); owners
//     then count the stores they received ("o_done") and CTA 0 waits for them at its end, so
//     when the kernel ends on a rank its output is complete.
// What differs from the single-GPU kernel is here: which key blocks in which order, from which
// map, after which readiness wait; the tile order; the O targets; the communicators.
#pragma once
#include "attention/pipeline.cuh"
#include "gathered_attention/gathered.hpp"
#include "gathered_attention/gathered_schedule.hpp"
#include "weave/signal.cuh"
#include "weave/store.cuh"

namespace weave::attention {

template <int D_, bool PingPong_>
struct GatheredKernel {
  using P = Pipeline<D_, gathered::kBlockRows, 2, PingPong_>;  // the loads, the consumer loop (pipeline.cuh)
  using bf16 = tile::bf16;
  static constexpr int D = D_, BM = P::BM, BN = P::BN, kStages = P::kStages, kDBlocks = P::kDBlocks;
  static constexpr int kThreads = P::kThreads;
  // Register split (setmaxnreg): the consumers need ~190 (SASS), so 224 leaves them room, and the
  // producer gets 56 instead of the single-GPU kernel's 24, where its readiness bookkeeping
  // (slice cache, rotated key order, per-chunk Q maps) spilled the per-key-block loop's state to
  // local memory. Together exactly the 168 x 384 registers the launch allocates.
  static constexpr int kProducerRegs = 56, kConsumerRegs = 224;
  static_assert((kProducerRegs + 2 * kConsumerRegs) * 128 == 168 * kThreads, "register split");
  static_assert(BM == gathered::kBlockRows && BN == gathered::kBlockRows, "tiles and key blocks are 128 rows");

  // A slice once seen ready stays ready for the rest of the launch: the producer remembers, per
  // (batch, head group), up to which slice it has seen, so later tiles of the same heads skip
  // the system-scope polls (one per slice and tile otherwise: 256 per tile at S = 128K).
  static constexpr int kWaitCache = 512;
  struct alignas(1024) Smem : P::template Shared<BM * D> {  // o: the O staging tile
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
    const unsigned long long round = g.ready_round;
    wait(g.ready, ctr0 + s, round * (gathered::chunks_in_slice(g.S, g.n_chunks, s) - own));
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
    P::load_block(buf, empty, full, map, st, hk, row, b);
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
    const unsigned long long w = ld_relaxed_gpu(g.front + t.b * g.front_heads + kv_head(g, t.h));
    return gathered::aligned_start(w, g.front_tag, n_max, own);
  }
  static __device__ __forceinline__ void record_front(unsigned long long* p, unsigned long long w) {
    st_relaxed_gpu(p, w);
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
    P::load_q(sm, &g.q[t.ci], t.h, t.mb * BM, t.b, q_phase);
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
    float o[D / 2], m[2], l[2];
    P::consume(sm, c, Rotated{gathered::visible_blocks(g.S, t.qe, causal), start},
               Mask{g.S, causal, row0, wg_row_min}, g.scale_log2, ks, vs, q_phase, o, m, l);

    P::template stage_o<true>(sm.o, c, o);  // once this warpgroup's previous store has read it
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
    P::turns_begin(c);
    while (true) {
      sm.sched_full[sched.index].wait(sched.phase);
      const int id = P::uniform(sm.tile_id[sched.index]);  // broadcast from lane 0: warp-uniform
      const int start = P::uniform(sm.tile_start[sched.index]);
      P::release(sm.sched_empty[sched.index]);
      sched.advance();
      if (id >= g.total_tiles) break;
      consume_tile(g, sm, c, tile_at(g, id), start, ks, vs, q_phase);
    }
    P::turns_end(c);
    if (g.count_o) tile::named_barrier_sync(4 + c, 128);  // the warpgroup's register-path O stores are issued
    if (g.count_o && threadIdx.x % 128 == 0) {
      store_wait();  // the O stores are in the owners' memory before they are counted
      for (int x = 0; x < g.n_otargets; ++x)
        if (sm.ocount[c][x] > 0) signal(g.odone, x, 0, static_cast<unsigned long long>(sm.ocount[c][x]));
      // Every owner-bound O tile of every rank has landed here before this CTA (so the kernel)
      // ends: one waiter per rank, after its own signals (the other consumer's come regardless).
      if (blockIdx.x == 0 && c == 0) wait(g.odone, 0, static_cast<unsigned long long>(g.odone_round) * g.odone_per);
    }
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
    wait(g.arrive, 0, static_cast<unsigned long long>(g.arrive_round) * g.world);  // all ranks left the previous call
    tile::fence_proxy_async_global();
    const int units = gathered::num_units(g.B, g.groups, g.slices, g.n_mine);
    const int j0 = g.skip_self ? 1 : 0;  // destinations rank + j0, ..., rank + W - 1 (mod W)
    long long loads = 0, stores = 0;
    // Contiguous mode moves each piece by 1-D bulk copies (tile::tma::bulk_load / bulk_store:
    // long NVLink writes). The rows a communicator reads to push are read once, long before the
    // compute needs them, so the loads are marked evict-first: they should not displace the K/V
    // blocks the compute CTAs share (ring 16K +1.3 %, 8K and 128K unchanged; the same hint on the
    // peer-bound stores measured no different, perf-notes session 9).
    const uint64_t policy = tile::tma::evict_first_policy();
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
            tile::tma::bulk_load(buf + slot * kBoxMax, pt.src_ptr[x.i] + c_off(ld, g.src_bstride), n, &bar[slot],
                                 policy);
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
          tile::tma::bulk_store(g.push[st.t].dst_ptr[dest(st)][x.i] + c_off(st, g.dst_bstride), buf + slot * kBoxMax,
                                c_len(st));
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

// G: GatheredGlobals, or a kernel's extension of it whose communicator (K::communicator and
// K::retire_communicator) needs more (the inter-node ring's network roles).
template <class K, class G = GatheredGlobals>
__global__ void __launch_bounds__(K::kThreads, 1) gathered_attention_kernel(const __grid_constant__ G g) {
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
    K::P::init_barriers(sm);
    for (int c = 0; c < 2; ++c)
      for (int x = 0; x < kMaxWorld; ++x) sm.ocount[c][x] = 0;
    for (int i = 0; i < K::kWaitCache; ++i) sm.waited[i] = -1;
    tile::fence_barrier_init();
  }
  __syncthreads();
  run_roles<K>(g, sm);
}

}  // namespace weave::attention
