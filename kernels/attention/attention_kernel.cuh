// FA3-class attention forward on the tile substrate (sm_90a).
//
// One CTA = one (batch, q-head, 128-row query block); 3 warpgroups:
//   producer (warpgroup 0, 24 registers): one thread loads Q once, then streams K_n and V_n
//     through two separate `Stages`-deep rings by TMA (4-D maps over (B, S, H, D), so rows
//     past S read as zero and a block never crosses a batch or head);
//   consumers 1 and 2 (240 registers): 64 query rows each.
// Per key block n a consumer issues S = Q K_n^T (wgmma SS, B = K rows: "NK") and
// O += P_{n-1} V_{n-1} (wgmma RS: P from registers, B = V rows: N-major, transposed), waits for
// S only, runs the online softmax (exp2 with the scale folded into one FFMA) while the P.V
// wgmma still runs, then waits for it, rescales O and packs P_n to bf16 in registers (for
// 16-bit types the accumulator layout is the A-operand layout). With `PingPong`, named
// barriers make the two consumers take turns issuing, so one's softmax runs under the other's
// GEMMs. K_n is released as soon as S is done, V_{n-1} once P.V is done.
//
// Causal: key blocks past the query block's last row are never loaded; blocks that cross the
// diagonal (and the ragged last block) are masked to -inf. Epilogue: O / l to bf16, stmatrix
// into the (no longer needed) Q tile, one TMA store per 64-column block and warpgroup; LSE
// from registers.
//
// The loads, the consumer loop and its pieces are pipeline.cuh's (Pipeline, with the key order
// InOrder): the gathered kernel behind ring and Ulysses attention runs the same code.
#pragma once
#include <cuda.h>

#include <cmath>

#include "attention/pipeline.cuh"

namespace weave::attention {

struct AttnGlobals {
  CUtensorMap q, k, v;  // {D, H, S, B}; boxes {64, 1, BM or BN, 1}, 128-byte swizzle
  CUtensorMap o;        // {D, Hq, S, B}; box {64, 1, 64, 1}
  float* lse;           // (B, Hq, S) or null
  int B, S, Hq, Hkv, group;
  int m_blocks;
  int heads_per_section;  // tile order: sections of this many (b, h) heads, query blocks slowest
  float scale, scale_log2;
  int causal;
  int total_tiles;  // m_blocks * B * Hq
  int* counter;     // persistent: tiles handed out past the first gridDim.x (zeroed before launch)
};

template <int D_, int BN_, int Stages_, bool PingPong_, bool Persistent_>
struct AttnKernel {
  using P = Pipeline<D_, BN_, Stages_, PingPong_>;  // the loads, the consumer loop (pipeline.cuh)
  using bf16 = tile::bf16;
  static constexpr int D = D_, BM = P::BM, BN = BN_, kStages = Stages_;
  static constexpr bool kPingPong = PingPong_;
  // Persistent: one CTA per SM takes tiles from an atomic counter; O is staged in its own
  // buffer so the next tile's Q (and first K) load while this tile's last P.V and epilogue run.
  static constexpr bool kPersistent = Persistent_;
  static constexpr int kThreads = P::kThreads;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // (24 + 2 * 240) * 128 = 64,512
  static constexpr int kDBlocks = P::kDBlocks;

  struct alignas(1024) Smem : P::template Shared<kPersistent ? BM * D : 8> {
    int tile_id[2];
  };
  static constexpr size_t kSmemBytes = sizeof(Smem) + 1024;  // + alignment slack

  static __device__ __forceinline__ void tile_coord(const AttnGlobals& g, int id, int& mb, int& bh) {
    const int heads = g.B * g.Hq;
    const int G = g.heads_per_section;
    const int per = G * g.m_blocks;
    const int sec = id / per;
    const int r = id - sec * per;
    const int in_sec = min(G, heads - sec * G);
    mb = r / in_sec;
    bh = sec * G + (r - mb * in_sec);
    if (g.causal) mb = g.m_blocks - 1 - mb;  // longest first
  }
  static __device__ __forceinline__ int kv_blocks(const AttnGlobals& g, int mb) {
    return visible_blocks<BN>(g.S, (mb + 1) * BM, g.causal != 0);
  }

  // One tile's loads. K_0 goes first: its stage frees early, so in a persistent CTA it lands
  // while the previous tile's epilogue runs; Q waits until the consumers' last QK^T is done.
  static __device__ __forceinline__ void produce_tile(const AttnGlobals& g, Smem& sm, int mb, int bh,
                                                      tile::PipeState<kStages>& ks, tile::PipeState<kStages>& vs,
                                                      uint32_t& q_phase) {
    const int b = bh / g.Hq, h = bh - b * g.Hq, hk = h / g.group;
    const int n_max = kv_blocks(g, mb);
    for (int n = 0; n < n_max; ++n) {
      P::load_k(sm, &g.k, ks, hk, n * BN, b);
      ks.advance();
      if (n == 0) P::load_q(sm, &g.q, h, mb * BM, b, q_phase);
      P::load_v(sm, &g.v, vs, hk, n * BN, b);
      vs.advance();
    }
  }

  static __device__ __forceinline__ void producer(const AttnGlobals& g, Smem& sm) {
    tile::tma::prefetch(&g.q);
    tile::tma::prefetch(&g.k);
    tile::tma::prefetch(&g.v);
    tile::PipeState<kStages> ks, vs;
    uint32_t q_phase = 0;
    if constexpr (!kPersistent) {
      int mb, bh;
      tile_coord(g, static_cast<int>(blockIdx.x), mb, bh);
      produce_tile(g, sm, mb, bh, ks, vs, q_phase);
    } else {
      tile::PipeState<2> sched;
      int t = static_cast<int>(blockIdx.x);
      while (true) {
        sm.sched_empty[sched.index].wait(sched.phase ^ 1);
        sm.tile_id[sched.index] = t;  // >= total_tiles: the consumers stop
        sm.sched_full[sched.index].arrive();
        sched.advance();
        if (t >= g.total_tiles) break;
        int mb, bh;
        tile_coord(g, t, mb, bh);
        produce_tile(g, sm, mb, bh, ks, vs, q_phase);
        t = static_cast<int>(gridDim.x) + atomicAdd(g.counter, 1);
      }
    }
  }

  static __device__ __forceinline__ void consume_tile(const AttnGlobals& g, Smem& sm, int c, int mb, int bh,
                                                      tile::PipeState<kStages>& ks, tile::PipeState<kStages>& vs,
                                                      uint32_t& q_phase) {
    const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    const int b = bh / g.Hq, h = bh - b * g.Hq;
    const int row0 = mb * BM + c * 64 + warp * 16 + lane / 4;  // this thread's rows: row0, row0 + 8
    const int wg_row_min = mb * BM + c * 64;
    float o[D / 2], m[2], l[2];
    P::consume(sm, c, InOrder{kv_blocks(g, mb)}, Mask{g.S, g.causal != 0, row0, wg_row_min}, g.scale_log2, ks, vs,
               q_phase, o, m, l);

    // Epilogue. Non-persistent: rows c*64.. of the Q tile (only this warpgroup's wgmmas read
    // them, and those are done). Persistent: the O buffer, once this warpgroup's previous store
    // has read it.
    bf16* stage = kPersistent ? sm.o : sm.q;
    P::template stage_o<kPersistent>(stage, c, o);
    if (tid == 0 && wg_row_min < g.S) {
#pragma unroll
      for (int j = 0; j < kDBlocks; ++j)
        tile::tma::store_4d(&g.o, stage + j * BM * 64 + c * 64 * 64, 64 * j, h, wg_row_min, b);
      tile::tma::commit_group();
    }
    if (g.lse != nullptr && lane % 4 == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = row0 + 8 * r;
        if (row < g.S) g.lse[static_cast<size_t>(bh) * g.S + row] = m[r] * g.scale + logf(l[r]);
      }
    }
    if (tid == 0 && wg_row_min < g.S) tile::tma::wait_group_read<0>();  // the staging tile must outlive the store's reads
  }

  static __device__ __forceinline__ void consumer(const AttnGlobals& g, Smem& sm, int c) {
    tile::PipeState<kStages> ks, vs;
    uint32_t q_phase = 0;
    P::turns_begin(c);
    if constexpr (!kPersistent) {
      int mb, bh;
      tile_coord(g, static_cast<int>(blockIdx.x), mb, bh);
      consume_tile(g, sm, c, mb, bh, ks, vs, q_phase);
    } else {
      tile::PipeState<2> sched;
      while (true) {
        sm.sched_full[sched.index].wait(sched.phase);
        const int t = P::uniform(sm.tile_id[sched.index]);  // broadcast from lane 0: warp-uniform
        P::release(sm.sched_empty[sched.index]);
        sched.advance();
        if (t >= g.total_tiles) break;
        int mb, bh;
        tile_coord(g, t, mb, bh);
        consume_tile(g, sm, c, mb, bh, ks, vs, q_phase);
      }
    }
    P::turns_end(c);
  }
};

template <class K>
__global__ void __launch_bounds__(K::kThreads, 1) attention_kernel(const __grid_constant__ AttnGlobals g) {
  extern __shared__ __align__(16) uint8_t attn_smem[];
  const uintptr_t a = reinterpret_cast<uintptr_t>(attn_smem);
  auto& sm = *reinterpret_cast<typename K::Smem*>((a + 1023) & ~uintptr_t(1023));
  if (threadIdx.x == 0) {
    K::P::init_barriers(sm);
    tile::fence_barrier_init();
  }
  __syncthreads();
  run_roles<K>(g, sm);
}

}  // namespace weave::attention
