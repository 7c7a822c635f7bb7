// The MoE grouped GEMM as an LCSC kernel: Y[rows of e] = X[rows of e] * W[e]^T (NK) or * W[e]
// (KN) for every local expert e in one launch, with the per-expert row counts read on the device.
//
// It is the dense GEMM's kernel (gemm_kernel.cuh: 128 x 256 x 64 tiles, 3 stages, two consumer
// warpgroups, TMA operands, bf16 staging) with these parts replaced:
// - setup (lcsc.cuh's per-block hook): warp 0 reads the E counts once and builds the prefix
//   table (tile rows and rows per expert) in shared memory; every role reads it after the
//   template's block barrier. No host synchronisation: the grid is sized for the worst case the
//   capacity allows, and the device runs the real number of tiles (num_work).
// - tile_of / load: A rows from the expert's first row (a 2-D map over the whole X: rows past the
//   expert's end belong to the next expert and only feed outputs that are discarded); B by a 3-D
//   map (K, N, E) so that a tile of expert e never reads another expert's weight (N and K
//   overhangs zero-fill).
// - store: a tile whose 128 rows all belong to the expert goes out as the dense kernel's TMA
//   store; the expert's last, cut tile must not touch the next expert's rows, so its whole 8-row
//   groups go out by TMA with an 8-row box (1024 B per 64 columns: each group starts on a swizzle
//   atom, so the staging tile's 128B swizzle is what the box expects) and its last < 8 rows by
//   16-byte stores from the storer thread, un-swizzling by hand. (Letting the second consumer
//   warpgroup skip its math when the cut tile has <= 64 rows measured 2-7 % slower: not done.)
// - counts that break the contract (a negative count, or rows past the capacity) make every
//   block run no tiles; block 0 records the first bad expert in the status words (GroupedStatus,
//   grouped_gemm.hpp), which the host reads later. Nothing is written to Y then.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include "gemm/gemm_kernel.cuh"
#include "gemm/split_k.cuh"
#include "moe/grouped_gemm_schedule.hpp"
#include "weave/tile/swizzle.hpp"
#include "weave/tile/tma.cuh"

namespace weave::moe {

// Status words in device memory (grouped_gemm.hpp reads them): what the first refused launch saw.
enum GroupedStatusWord : int {
  kStatusError = 0,  // GroupedError; 0 = none (only the first error is kept until the host clears it)
  kStatusExpert,
  kStatusCount,
  kStatusRows,  // rows of experts 0..expert (the end of the bad expert's rows)
  kStatusCapacity,
  kStatusSplits,  // the last-round split of the last launch of GroupedSplitKernel (1: none); not an error
  kStatusWords = 8
};

struct GroupedGlobals : gemm::GemmGlobals {
  CUtensorMap c8;          // Y in {64 (N), 8 rows} boxes: the cut tile's whole 8-row groups
  __nv_bfloat16* y;        // Y itself: the cut tile's last < 8 rows
  const int* counts;       // E row counts, device
  int* status;             // kStatusWords ints, device
  int experts, capacity;   // E, and the rows of X and Y
};

// The fixed-stride layout's launch (GroupedGemmOptions::row_stride > 0): expert e's rows start at
// e * row_stride (grouped_gemm_schedule.hpp, build_prefix_strided / grouped_tile_strided).
struct StridedGroupedGlobals : GroupedGlobals {
  int row_stride;
};

// The kernel parameters of one launch (grouped_gemm.cu): tensor maps of X (R_cap x K), W (E
// stacked N x K or K x N matrices) and, unless Y is null (gemm_combine: tiles leave by other
// means), Y (R_cap x N). Host only.
GroupedGlobals grouped_globals(gemm::BLayout layout, const __nv_bfloat16* X, const __nv_bfloat16* W,
                               __nv_bfloat16* Y, const int* counts, int E, int N, int K, int R_cap, int group_m,
                               int* status);

// Strided = true: the fixed-stride layout (its own instantiation: the packed kernel's code is
// what it was without the option; `if constexpr` below keeps the two apart).
template <gemm::BLayout L, bool Strided = false>
struct GroupedKernel : gemm::GemmKernel<kGroupedBN, L, 3> {
  using Base = gemm::GemmKernel<kGroupedBN, L, 3>;
  using Globals = std::conditional_t<Strided, StridedGroupedGlobals, GroupedGlobals>;
  using bf16 = typename Base::bf16;
  using Stage = typename Base::Stage;
  using Output = typename Base::Output;
  static constexpr int BM = Base::BM, BN = Base::BN, BK = Base::BK;
  static_assert(BM == kGroupedBM && BN == kGroupedBN && BK == kGroupedBK, "the schedule's tile is the kernel's");

  struct Table {
    int tile_begin[kMaxGroupedExperts + 1];
    int row_begin[kMaxGroupedExperts + 1];
    int work;  // work items of this launch; 0 when the counts were refused
  };
  static __device__ __forceinline__ Table& table() {
    __shared__ Table t;  // static shared memory, beside the template's dynamic storage
    return t;
  }

  // Warp 0: lane l owns experts [l * per, (l + 1) * per); a warp scan of the lanes' sums gives
  // each lane its first prefix. The loads are independent, so this is about one L2 round trip.
  static __device__ void setup(const Globals& g) {
    if constexpr (Strided) {
      setup_strided(g);
      return;
    }
    if (threadIdx.x >= 32) return;
    Table& t = table();
    const int lane = static_cast<int>(threadIdx.x);
    const int E = g.experts;
    const int per = (E + 31) / 32;
    const int first = lane * per;
    const int last = first + per < E ? first + per : E;
    int tiles = 0;
    long long rows = 0;
    for (int e = first; e < last; ++e) {
      const int c = __ldg(g.counts + e);
      t.row_begin[e] = c;  // parked here until the prefix overwrites it
      if (c > 0) rows += c, tiles += tile_rows_of(c);
    }
    int tiles_incl = tiles;
    long long rows_incl = rows;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int ta = __shfl_up_sync(0xffffffffu, tiles_incl, d);
      const long long ra = __shfl_up_sync(0xffffffffu, rows_incl, d);
      if (lane >= d) tiles_incl += ta, rows_incl += ra;
    }
    int tb = tiles_incl - tiles;
    long long rb = rows_incl - rows;
    int bad = 0x7fffffff, why = kGroupedOk, bad_count = 0;
    long long bad_end = 0;
    for (int e = first; e < last; ++e) {
      const int c = t.row_begin[e];
      t.tile_begin[e] = tb;
      t.row_begin[e] = static_cast<int>(rb < g.capacity ? rb : g.capacity);
      if (c > 0) rb += c, tb += tile_rows_of(c);
      if (bad == 0x7fffffff && (c < 0 || rb > g.capacity)) {
        bad = e, why = c < 0 ? kGroupedNegativeCount : kGroupedOverflow, bad_count = c, bad_end = rb;
      }
    }
    const int first_bad = __reduce_min_sync(0xffffffffu, bad);
    if (lane == 31) {
      t.tile_begin[E] = tiles_incl;
      t.row_begin[E] = static_cast<int>(rows_incl < g.capacity ? rows_incl : g.capacity);
      t.work = first_bad == 0x7fffffff ? tiles_incl * g.tiles_n : 0;
    }
    if (blockIdx.x == 0 && bad == first_bad && bad != 0x7fffffff && g.status != nullptr) {
      // The first refused launch wins until the host reads and clears the words.
      if (atomicCAS(g.status + kStatusError, 0, why) == 0) {
        g.status[kStatusExpert] = bad;
        g.status[kStatusCount] = bad_count;
        g.status[kStatusRows] = static_cast<int>(bad_end < 0x7fffffff ? bad_end : 0x7fffffff);
        g.status[kStatusCapacity] = g.capacity;
      }
    }
  }

  // The fixed-stride table: tile_begin as in the packed layout, row_begin[e] holds expert e's count
  // (clamped to [0, row_stride]); a count outside 0..row_stride refuses the launch
  // (build_prefix_strided is the host form).
  static __device__ void setup_strided(const Globals& g) {
    if (threadIdx.x >= 32) return;
    Table& t = table();
    const int lane = static_cast<int>(threadIdx.x);
    const int E = g.experts, S = g.row_stride;
    const int per = (E + 31) / 32;
    const int first = lane * per;
    const int last = first + per < E ? first + per : E;
    int tiles = 0;
    int bad = 0x7fffffff, why = kGroupedOk, bad_count = 0;
    for (int e = first; e < last; ++e) {
      const int c = __ldg(g.counts + e);
      const int kept = c < 0 ? 0 : (c > S ? S : c);
      t.row_begin[e] = kept;
      t.tile_begin[e] = tiles;  // the lane's local prefix, shifted below
      tiles += tile_rows_of(kept);
      if (bad == 0x7fffffff && (c < 0 || c > S)) bad = e, why = c < 0 ? kGroupedNegativeCount : kGroupedStrideOverflow, bad_count = c;
    }
    int tiles_incl = tiles;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int ta = __shfl_up_sync(0xffffffffu, tiles_incl, d);
      if (lane >= d) tiles_incl += ta;
    }
    const int tb = tiles_incl - tiles;
    for (int e = first; e < last; ++e) t.tile_begin[e] += tb;
    const int first_bad = __reduce_min_sync(0xffffffffu, bad);
    if (lane == 31) {
      t.tile_begin[E] = tiles_incl;
      t.work = first_bad == 0x7fffffff ? tiles_incl * g.tiles_n : 0;
    }
    if (blockIdx.x == 0 && bad == first_bad && bad != 0x7fffffff && g.status != nullptr) {
      if (atomicCAS(g.status + kStatusError, 0, why) == 0) {
        g.status[kStatusExpert] = bad;
        g.status[kStatusCount] = bad_count;
        const long long end = static_cast<long long>(bad) * S + bad_count;
        g.status[kStatusRows] = static_cast<int>(end < 0x7fffffff ? end : 0x7fffffff);
        g.status[kStatusCapacity] = S;
      }
    }
  }

  // Host: the bound the grid is sized for (max_work); device: the real count from the table.
  static __host__ __device__ int num_work(const Globals& g) {
#ifdef __CUDA_ARCH__
    return table().work;
#else
    return static_cast<int>(max_work(g.capacity, g.experts, g.tiles_n));
#endif
  }

  static __device__ __forceinline__ void prologue(const Globals& g) {
    Base::prologue(g);
    tile::tma::prefetch(&g.c8);
  }

  static __device__ __forceinline__ GroupedTile tile_of(const Globals& g, int w) {
    const Table& t = table();
    if constexpr (Strided)
      return grouped_tile_strided(w, t.tile_begin, t.row_begin, g.experts, g.tiles_n, g.group_m, g.row_stride);
    else
      return grouped_tile(w, t.tile_begin, t.row_begin, g.experts, g.tiles_n, g.group_m);
  }

  static __device__ __forceinline__ void load(const Globals& g, Stage& s, tile::Mbarrier& full, const GroupedTile& t,
                                              int it) {
    const int k0 = it * BK;
    tile::tma::load_2d(s.a, &g.a, &full, k0, t.row0);
    if constexpr (L == gemm::BLayout::NK) {
      tile::tma::load_3d(s.b, &g.b, &full, k0, t.n * BN, t.expert);
    } else {
#pragma unroll
      for (int j = 0; j < BN / 64; ++j)
        tile::tma::load_3d(s.b + j * 64 * BK, &g.b, &full, t.n * BN + 64 * j, k0, t.expert);
    }
  }

  static __device__ __forceinline__ void store(const Globals& g, Output& o, int w, int) {
    const GroupedTile t = tile_of(g, w);
    store_rows(g, o, t, 0, t.rows);
  }

  // Rows [r0, r1) of tile t (r0 a multiple of 8): the whole tile by the dense kernel's TMA store,
  // else whole 8-row groups by 8-row boxes and the last < 8 rows by the storer's own stores.
  static __device__ __forceinline__ void store_rows(const GroupedGlobals& g, Output& o, const GroupedTile& t, int r0,
                                                    int r1) {
    const int whole = r1 & ~7;
#pragma unroll 1
    for (int j = 0; j < BN / 64; ++j) {
      const int n = t.n * BN + 64 * j;
      if (n >= g.N) break;
      const bf16* blk = o.c + j * BM * 64;  // 128 rows x 128 B, 128B-swizzled
      if (r0 == 0 && r1 == BM) {
        tile::tma::store_2d(&g.c, blk, n, t.row0);
        continue;
      }
#pragma unroll 1
      for (int r = r0; r < whole; r += 8) tile::tma::store_2d(&g.c8, blk + r * 64, n, t.row0 + r);
      const int chunks = g.N - n < 64 ? (g.N - n) / 8 : 8;  // N % 8 == 0: a chunk is in or out
      const char* base = reinterpret_cast<const char*>(blk);
#pragma unroll 1
      for (int r = whole > r0 ? whole : r0; r < r1; ++r) {
        uint4* dst = reinterpret_cast<uint4*>(g.y + static_cast<size_t>(t.row0 + r) * g.N + n);
#pragma unroll 1
        for (int q = 0; q < chunks; ++q)
          dst[q] = *reinterpret_cast<const uint4*>(base + tile::swizzled_offset(tile::Swizzle::B128, r, q * 16));
      }
    }
  }
};

// The packed layout's launch from grouped_gemm(): the kernel above with its last partial round of
// tiles split along K (grouped_split, decided in setup once the counts give the tile count; the
// dense GEMM's split-K items and partial exchange, gemm/split_k.cuh). A split tile's consumer
// halves are stored by the warpgroup that completes each (store_rows over its 64 rows).
struct GroupedSplitGlobals : GroupedGlobals {
  float* partials;  // workers * slots * 2 areas of 64 x 256 floats (null: no split)
  int* counters;    // workers * 2 ints, zero between launches
  int workers;      // the launch's compute blocks
  int split_k;      // GroupedGemmOptions::split_k (0: the model, 1: never, S > 1: S ways)
};

template <gemm::BLayout L>
struct GroupedSplitKernel : GroupedKernel<L> {
  using Base = GroupedKernel<L>;
  using Globals = GroupedSplitGlobals;
  using typename Base::ConsumerState;
  using typename Base::Stage;
  static constexpr int kSlotFloats = 64 * Base::kWN;
  static_assert(Base::kOutputParts == 1 && Base::kConsumers == 2, "split: one output part, two consumer halves");

  struct alignas(1024) Output : Base::Output {
    int finished[2];  // per consumer half of a split tile: 1 when its sums are complete here
  };
  struct LoadState {
    GroupedTile t;
    int k_begin;
  };

  static __device__ __forceinline__ gemm::SplitK& split() {
    __shared__ gemm::SplitK s;
    return s;
  }

  static __device__ void setup(const Globals& g) {
    Base::setup(g);
    if (threadIdx.x >= 32) return;
    __syncwarp();  // lane 31 wrote the work count
    if (threadIdx.x == 0) {
      const gemm::SplitK sk =
          grouped_split(Base::table().work, grouped_k_steps(g.K), g.workers, g.split_k, g.partials != nullptr);
      split() = sk;
      if (blockIdx.x == 0 && g.status != nullptr) g.status[kStatusSplits] = sk.splits;
    }
  }

  static __host__ __device__ int num_work(const Globals& g) {
#ifdef __CUDA_ARCH__
    return gemm::num_work(split());
#else
    // The grid's bound: every tile, or room for split items where the tiles are fewer than SMs.
    const long long tiles = Base::num_work(g), f = g.split_k > 1 ? g.split_k : gemm::plan_model::kMaxSplitsWide;
    return static_cast<int>(tiles * f < 0x7fffffff ? tiles * f : 0x7fffffff);
#endif
  }
  static __device__ __forceinline__ int num_iters(const Globals& g, int w) { return gemm::segment(split(), w).k_iters; }

  static __device__ __forceinline__ LoadState tile_of(const Globals& g, int w) {
    const gemm::Segment s = gemm::segment(split(), w);
    return {Base::tile_of(g, s.item), s.k_begin};
  }
  static __device__ __forceinline__ void load(const Globals& g, Stage& st, tile::Mbarrier& full, const LoadState& l,
                                              int it) {
    Base::load(g, st, full, l.t, l.k_begin + it);
  }

  static __device__ __forceinline__ void finish(const Globals& g, ConsumerState& st, Output& o, int w, int c,
                                                int part) {
    const gemm::SplitK& sk = split();
    const gemm::Segment s = gemm::segment(sk, w);
    if (s.split >= 0) {
      const long long t = s.item - sk.dp_items;
      const GroupedTile tile = Base::tile_of(g, s.item);
      const bool live = 64 * c + 16 * tile::warp_in_warpgroup() < tile.rows;
      auto slot = [&](int j) { return g.partials + ((t * sk.splits + j) * 2 + c) * kSlotFloats; };
      auto counter = [&] { return g.counters + t * 2 + c; };
      if (!gemm::exchange_partials<Base::kWN / 8>(st.d, slot, counter, sk.splits, s.split, live, c, o.finished[c]))
        return;
    }
    Base::finish(g, st, o, s.item, c, part);
  }

  static __device__ __forceinline__ void store(const Globals& g, Output& o, int w, int part) {
    const gemm::Segment s = gemm::segment(split(), w);
    if (s.split < 0) {
      Base::store(g, o, s.item, part);
      return;
    }
    const GroupedTile t = Base::tile_of(g, s.item);
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
      const int r1 = 64 * h + 64 < t.rows ? 64 * h + 64 : t.rows;
      if (o.finished[h] && 64 * h < r1) Base::store_rows(g, o, t, 64 * h, r1);
    }
  }
};

}  // namespace weave::moe
