// The fused gemm_combine's device side (host entry: gemm_combine.cu; design: README.md, "Fused
// gemm_combine"): the down projection's grouped GEMM whose finished tiles go straight to their
// tokens' home ranks, then the home rank's weighted sum.
//
// GemmCombineKernel is the grouped GEMM's kernel (grouped_gemm_kernel.cuh: the same setup, order,
// loads and consumers, so the same bf16 output tiles) with the store replaced: nothing goes to a
// local expert output buffer. The storer hands each staged tile to the producer's two idle warps
// (lcsc.cuh's aux role) and waits until they have read it; they copy each of the tile's rows
// (16 bytes per lane, un-swizzled from the staging tile) into row token * k + slot of its home
// rank's landing buffer (RowMeta of the grouped row, written by the dispatch), peer stores over
// NVLink or local ones. The consumers meanwhile compute the next tile: the transfer overlaps the
// remaining tiles. When a block's storer is done (store_done), its pushes are complete in the
// block's view; one release at system scope, then a signal to every rank.
//
// sum_landed, on the home rank after the GEMM: waits until every compute block of every rank has
// signalled (a count that does not depend on the routing), then out[t] = bf16(sum_j w[t, j] *
// landing[t k + j]) in fp32 with combine_sum.cuh's code (the non-fused combine's math, bit for bit).
// It waits only for kernels before it (this and other ranks' GEMMs), never for a block of its own
// grid: ranks time-slicing one GPU make progress.
#pragma once
#include <cuda_bf16.h>

#include "moe/combine_sum.cuh"
#include "moe/gemm_combine_schedule.hpp"
#include "moe/grouped_gemm_kernel.cuh"
#include "weave/pdl.cuh"
#include "weave/signal.cuh"
#include "weave/tile/mbarrier.cuh"

namespace weave::moe {

struct CombineGlobals : GroupedGlobals {
  __nv_bfloat16* landing[kMaxWorld];  // every rank's landing buffer (max_tokens x k x H), as mapped here
  const RowMeta* meta;                // this rank's grouped rows' metadata (the dispatch's)
  signals landed;                     // counter 0: compute blocks whose pushes into this rank are complete
  int topk, max_tokens;
};

struct GemmCombineKernel : GroupedKernel<gemm::BLayout::NK> {
  using Base = GroupedKernel<gemm::BLayout::NK>;
  using Globals = CombineGlobals;
  using bf16 = Base::bf16;
  using Output = Base::Output;
  struct AuxShared {};  // the hand-off lives in static shared memory (handoff()), reachable by the storer

  // Storer -> aux: `staged` completes once per tile (the storer's arrival after the consumers'
  // out_full), `pushed` once the two aux warps have read the tile (after their stores issued,
  // so the staging buffer is free again). Both CTA-scope release / acquire.
  struct Handoff {
    tile::Mbarrier staged, pushed;
    const bf16* stage;  // the staging tile (the template's Output), for the aux warps
    uint32_t tiles;     // tiles the storer handed over (its parity)
  };
  static __device__ __forceinline__ Handoff& handoff() {
    __shared__ Handoff h;  // static shared memory, beside the template's dynamic storage
    return h;
  }

  // Thread 32 (warp 1, not the warp that builds the grouped table) initialises the hand-off; the
  // template's block barrier after setup publishes it.
  static __device__ void setup(const Globals& g) {
    if (threadIdx.x == 32) {
      Handoff& h = handoff();
      h.staged.init(1);
      h.pushed.init(kAuxWarps);
      h.stage = nullptr;
      h.tiles = 0;
      tile::fence_barrier_init();
    }
    Base::setup(g);
  }

  // Only the operands' maps: the output maps are never used (and not encoded: grouped_globals with
  // Y null), the rows leave through push_tile.
  static __device__ __forceinline__ void prologue(const Globals& g) {
    tile::tma::prefetch(&g.a);
    tile::tma::prefetch(&g.b);
  }

  static __device__ __forceinline__ void store(const Globals&, Output& o, int, int) {
    Handoff& h = handoff();
    const uint32_t parity = h.tiles & 1;
    h.stage = o.c;
    h.staged.arrive();     // release: the consumers' tile (seen through out_full) and h.stage
    h.pushed.wait(parity);  // the aux warps have read the tile; their stores are issued
    h.tiles += 1;
  }

  // Every push of this block is complete in the storer's view (it acquired each tile's `pushed`):
  // one system-scope release covers them (signal_all's fence), then one signal per rank.
  static __device__ __forceinline__ void store_done(const Globals& g, int) { signal_all(g.landed, 0); }

  // Aux warp `warp` (0, 1) of the block: rows aux_row(warp, i) of each staged tile. Lane l holds
  // the landing row base pointers of rows i = l and i = l + 32 (a tile has at most 64 rows per warp),
  // loaded once per tile (the metadata loads of all rows in flight together). Then per row: its
  // pointer from the lane that holds it, the lane's 16 bytes from the staging tile, one store. One
  // row at a time: the aux warps run under the producer's 40 registers (lcsc.cuh), and unrolling
  // two rows spilled; a tile's 64 rows per warp take ~2 us, a tenth of a tile's math.
  static __device__ __forceinline__ void push_tile(const Globals& g, const bf16* stage, const GroupedTile& t,
                                                   int warp, int lane) {
    const int H = g.N, k = g.topk, W = g.landed.world;
    const int col = push_col(t.n, lane);
    const int n = aux_rows(t.rows, warp);
    unsigned long long dst[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      dst[u] = 0;
      const int i = lane + 32 * u;
      if (i < n) {
        const int4 m4 = __ldcg(reinterpret_cast<const int4*>(g.meta + t.row0 + aux_row(warp, i)));
        const RowMeta m{m4.x, m4.y, m4.z, m4.w};
        const long long row = landing_row(m, W, k, g.max_tokens);
        // The row's base: the shuffle below hands it to every lane, each adds its own column.
        if (row >= 0) dst[u] = reinterpret_cast<unsigned long long>(g.landing[m.src] + row * H);
      }
    }
    const char* base = reinterpret_cast<const char*>(stage);
#pragma unroll 1
    for (int i = 0; i < n; ++i) {  // i is warp-uniform
      const unsigned long long d = __shfl_sync(0xffffffffu, i < 32 ? dst[0] : dst[1], i % 32);
      const int4 v = *reinterpret_cast<const int4*>(base + stage_offset(aux_row(warp, i), lane));
      if (col < H && d != 0) *(reinterpret_cast<int4*>(d) + col / 8) = v;
    }
  }

  // Threads t = 0..63 of warps 2-3: the same work items as the storer, in the same order.
  static __device__ __forceinline__ void aux(const Globals& g, AuxShared&, int compute_blocks, int t) {
    Handoff& h = handoff();
    const int warp = t / 32, lane = t % 32;
    const int work = num_work(g);
    uint32_t parity = 0;
#pragma unroll 1
    for (int w = static_cast<int>(blockIdx.x); w < work; w += compute_blocks, parity ^= 1) {
      const GroupedTile tl = tile_of(g, w);
      h.staged.wait(parity);
      push_tile(g, h.stage, tl, warp, lane);
      __syncwarp();
      if (lane == 0) h.pushed.arrive();
    }
  }
};

// ---- the home rank's final sum -------------------------------------------------------------------

constexpr int kSumThreads = 512;

struct SumArgs {
  const __nv_bfloat16* landing;  // this rank's landing buffer
  const float* w;                // T x k router weights
  __nv_bfloat16* out;            // T x H
  const int* failed;             // the dispatch's verdict (nonzero: nothing was sent, write NaN)
  int T, k, H;
  signals landed;
  Round expected;                // the running total of landed_per_round(W, compute blocks) over calls
};

// One warp per token, its k landing rows (contiguous: t k .. t k + k - 1) summed with
// combine_sum.cuh's weighted_sum_vec.
__global__ void __launch_bounds__(kSumThreads) sum_landed(const __grid_constant__ SumArgs a) {
  __shared__ const int4* src[kSumThreads / 32][kMaxTopk];
  __shared__ float wt[kSumThreads / 32][kMaxTopk];
  pdl_enter();
  if (threadIdx.x == 0) wait(a.landed, 0, a.expected);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, k = a.k, nv = a.H / 8;
  const bool failed = *a.failed != 0;
  const int warps = gridDim.x * (blockDim.x / 32);
  for (int t = blockIdx.x * (blockDim.x / 32) + warp; t < a.T; t += warps) {
    if (lane < k) {
      const long long i = static_cast<long long>(t) * k + lane;
      src[warp][lane] = reinterpret_cast<const int4*>(a.landing + i * a.H);
      wt[warp][lane] = a.w[i];
    }
    __syncwarp();
    int4* out = reinterpret_cast<int4*>(a.out + static_cast<long long>(t) * a.H);
    for (int v = lane; v < nv; v += 32) out[v] = failed ? detail::nan_vec() : detail::weighted_sum_vec(src[warp], wt[warp], k, v);
    __syncwarp();
  }
}

}  // namespace weave::moe
