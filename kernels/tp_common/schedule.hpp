// Schedules of the tensor-parallel fused kernels (ag_gemm, gemm_rs, gemm_ar) as pure
// __host__ __device__ functions of (shape, world, rank, block, num_comm_sms). The kernels call
// them; tests/tp/test_tp_schedule.cpp checks them on the CPU for W = 2..8.
//
// Row shards: rank q owns rows shard(M, W, q) (the first M mod W ranks get one more row). The
// row-sharded kernels (ag_gemm, gemm_rs) tile each shard on its own, from its first row, in
// 128-row tiles ("virtual row tiles"): no output tile straddles two owners, and a tile's rows
// past its shard are clipped by a per-owner TMA map (loads read zeros, stores drop them).
#pragma once
#include "gemm/scheduler.hpp"
#include "weave/config.hpp"

namespace weave::tp {

inline constexpr int kBM = 128;  // output tile rows (the GEMM's 128 x 256 tile)
inline constexpr int kBN = 256;  // output tile columns

struct Range {
  int begin, size;
};

__host__ __device__ inline Range shard(int n, int W, int r) {
  const int q = n / W, rem = n % W;
  return {r * q + (r < rem ? r : rem), q + (r < rem ? 1 : 0)};
}

// Everything about the tiling that every rank computes identically.
struct Layout {
  int W = 1, M = 0, N = 0;
  int tiles_n = 0, group_m = 8;
  int tm[kMaxWorld] = {};       // row tiles of owner q's shard
  int off[kMaxWorld + 1] = {};  // first virtual row tile of owner q
  __host__ __device__ int row_tiles() const { return off[W]; }
  __host__ __device__ int work() const { return off[W] * tiles_n; }  // output tiles of all owners
  __host__ __device__ int owner_tiles(int q) const { return tm[q] * tiles_n; }
};

__host__ __device__ inline Layout make_layout(int M, int N, int W, int group_m) {
  Layout L;
  L.W = W, L.M = M, L.N = N, L.group_m = group_m;
  L.tiles_n = (N + kBN - 1) / kBN;
  L.off[0] = 0;
  for (int q = 0; q < W; ++q) {
    L.tm[q] = (shard(M, W, q).size + kBM - 1) / kBM;
    L.off[q + 1] = L.off[q] + L.tm[q];
  }
  return L;
}

// One output tile of a row-sharded kernel, as rank `rank` meets it.
struct Item {
  int phase;  // 0: the rank's own shard; k: owner (rank + k) mod W
  int owner;  // whose rows
  int i;      // row tile inside the owner's shard
  int n;      // tile column
  int vrow;   // virtual row tile id: off[owner] + i
  int a_row;  // first global row
};

// Rank `rank`'s w-th output tile: its own shard first, then owners rank+1, rank+2, ... (mod W);
// inside a shard, grouped rasterisation (gemm/scheduler.hpp).
__host__ __device__ inline Item item(const Layout& L, int rank, int w) {
  int k = 0, q = rank;
  while (w >= L.owner_tiles(q)) {
    w -= L.owner_tiles(q);
    ++k;
    q = rank + k < L.W ? rank + k : rank + k - L.W;
  }
  const gemm::TileCoord t = gemm::grouped_tile(w, L.tm[q], L.tiles_n, L.group_m);
  Item it;
  it.phase = k, it.owner = q, it.i = t.m, it.n = t.n, it.vrow = L.off[q] + t.m;
  it.a_row = shard(L.M, L.W, q).begin + t.m * kBM;
  return it;
}

// ---- gemm_rs (intra-SM) -------------------------------------------------------------------
// The owner writes its own partial of each of its tiles with a plain TMA store (so the output
// is overwritten each call), then signals `ready[tile]` on every peer; a peer store-adds its
// partial into the owner's output only after that signal. Each block then tells each owner how
// many tiles it added (`done`), and the owner's kernel ends only after all of them landed.
__host__ __device__ inline int rs_ready_index(const Layout& L, const Item& t) { return t.vrow * L.tiles_n + t.n; }
__host__ __device__ inline int rs_ready_count(const Layout& L) { return L.work(); }
// ready[idx] on a peer receives exactly one signal per launch (from the owner).
__host__ __device__ inline unsigned long long rs_ready_expected() { return 1; }
// Tiles block `b` of `blocks` adds into owner q's output (the value of its one `done` signal).
__host__ __device__ inline int rs_block_adds(const Layout& L, int rank, int b, int blocks, int q) {
  if (q == rank) return 0;
  int n = 0;
  for (int w = b; w < L.work(); w += blocks)
    if (item(L, rank, w).owner == q) ++n;
  return n;
}
__host__ __device__ inline unsigned long long rs_done_expected(const Layout& L, int q) {
  return static_cast<unsigned long long>(L.W - 1) * L.owner_tiles(q);
}

// ---- ag_gemm (inter-SM push) --------------------------------------------------------------
// Each row tile of rank r's shard is cut along K into ag_slices(K) equal slices of 64-column
// boxes; unit u = i * slices + p is row tile i, slice p. Communicator block c of rank r copies
// units c, c + n_comm, ... (row tile 0's slices first, spread over all blocks) into every peer's
// gathered A, and after each unit signals `ready[off[r] + i]` on that peer. A compute block's
// loader waits for ready[vrow] == slices (per launch) before the first load of a peer tile.
__host__ __device__ inline int ag_slices(int K) {
  const int kc = (K + 63) / 64;
  for (int p = 8; p > 1; p /= 2)  // slices of >= 16 boxes: a slice ends in a full write drain
    if (kc % p == 0 && kc / p >= 16) return p;
  return 1;
}
__host__ __device__ inline int ag_ready_count(const Layout& L) { return L.row_tiles(); }
__host__ __device__ inline unsigned long long ag_ready_expected(int K) { return ag_slices(K); }
// Units of rank r's shard that communicator block c of n_comm copies: c, c + n_comm, ...
__host__ __device__ inline int ag_units(const Layout& L, int r, int K) { return L.tm[r] * ag_slices(K); }

// Bytes [b0, b1) of rank r's shard (rows x K bf16, contiguous) that unit u carries: row tile
// u / slices (rows clipped to the shard), slice u % slices of it, 16-byte aligned; may be empty.
__host__ __device__ inline void ag_unit_bytes(const Layout& L, int r, int K, int u, long long* b0, long long* b1) {
  const int P = ag_slices(K), rows = shard(L.M, L.W, r).size;
  const long long row_bytes = 2LL * K;
  const long long r0 = static_cast<long long>(u / P) * kBM, r1 = r0 + kBM < rows ? r0 + kBM : rows;
  const long long lo = r0 * row_bytes, hi = r1 * row_bytes;
  const long long step = ((hi - lo + P - 1) / P + 15) / 16 * 16;
  const long long a = lo + (u % P) * step, b = a + step;
  *b0 = a < hi ? a : hi;
  *b1 = b < hi ? b : hi;
}

// ---- gemm_ar (inter-SM) -------------------------------------------------------------------
// Plain GEMM tiling of the full M x N output (tile w in gemm::grouped_tile order). Tile w is
// owned by rank w mod W. Every rank's storer writes tile w to its own buffer and signals
// ready[w] on the owner; the owner's communicator block (w / W) mod n_comm waits for W signals,
// reduces the tile over all ranks (fp32, rank order) and writes the sum to every rank's buffer,
// then signals `done` on every rank. A rank's kernel ends when done reached all tiles.
struct ArLayout {
  int W = 1, M = 0, N = 0, tiles_m = 0, tiles_n = 0, group_m = 8;
  __host__ __device__ int work() const { return tiles_m * tiles_n; }
};
__host__ __device__ inline ArLayout make_ar_layout(int M, int N, int W, int group_m) {
  ArLayout L;
  L.W = W, L.M = M, L.N = N, L.group_m = group_m;
  L.tiles_m = (M + kBM - 1) / kBM;
  L.tiles_n = (N + kBN - 1) / kBN;
  return L;
}
__host__ __device__ inline int ar_owner(const ArLayout& L, int w) { return w % L.W; }
__host__ __device__ inline int ar_reducer_block(const ArLayout& L, int w, int n_comm) { return (w / L.W) % n_comm; }
// The k-th tile handled by communicator block c of rank r (or -1 past the end).
__host__ __device__ inline int ar_comm_tile(const ArLayout& L, int r, int c, int n_comm, int k) {
  const long long w = r + static_cast<long long>(L.W) * (c + static_cast<long long>(n_comm) * k);
  return w < L.work() ? static_cast<int>(w) : -1;
}
__host__ __device__ inline unsigned long long ar_ready_expected(const ArLayout& L) { return L.W; }
__host__ __device__ inline unsigned long long ar_done_expected(const ArLayout& L) { return L.work(); }

}  // namespace weave::tp
