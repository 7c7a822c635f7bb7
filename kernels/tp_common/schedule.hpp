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
#include "tp_common/variants.hpp"
#include "weave/common/split.hpp"
#include "weave/config.hpp"

namespace weave::tp {

inline constexpr int kBM = 128;  // output tile rows (the GEMM's 128 x 256 tile)
inline constexpr int kBN = 256;  // output tile columns

using Range = Part<int>;
__host__ __device__ inline Range shard(int n, int W, int r) { return near_equal_part(n, W, r); }

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
  int phase;  // 0: the rank's own shard; k: owner (rank + k) mod W (gemm_rs v5: the chain step)
  int owner;  // whose rows
  int i;      // row tile inside the owner's shard
  int n;      // tile column
  int vrow;   // virtual row tile id: off[owner] + i
  int a_row;  // first global row
};

// The Item for owner q's j-th tile (grouped rasterisation inside the shard, gemm/scheduler.hpp),
// met at `phase`: one place for every order below.
__host__ __device__ inline Item owner_item(const Layout& L, int phase, int q, int j) {
  const gemm::TileCoord t = gemm::grouped_tile(j, L.tm[q], L.tiles_n, L.group_m);
  Item it;
  it.phase = phase, it.owner = q, it.i = t.m, it.n = t.n, it.vrow = L.off[q] + t.m;
  it.a_row = shard(L.M, L.W, q).begin + t.m * kBM;
  return it;
}

// Rank `rank`'s w-th output tile: its own shard first, then owners rank+1, rank+2, ... (mod W);
// inside a shard, grouped rasterisation (gemm/scheduler.hpp).
__host__ __device__ inline Item item(const Layout& L, int rank, int w) {
  int k = 0, q = rank;
  while (w >= L.owner_tiles(q)) {
    w -= L.owner_tiles(q);
    ++k;
    q = rank + k < L.W ? rank + k : rank + k - L.W;
  }
  return owner_item(L, k, q, w);
}

// ---- gemm_rs (intra-SM) -------------------------------------------------------------------
// Two intra-SM variants (RsVariant, variants.hpp; InterSm (2) and Chain (5) below); the tuner picks.
// Variant 0, owner first (order item()): the owner writes its own partial of each of its tiles
// with a plain TMA store (so the output is overwritten each call), then signals `ready[tile]`
// on every peer; a peer store-adds its partial into the owner's output only after that signal.
// Own tiles come first, so every wait is on phase-0 work that never waits.
// Variant 1, zero first (order rs_item()): the producer's idle warps of every block zero a
// slice of the rank's own output at kernel start and signal `zeroed[rank]` on every rank; every
// contribution, own ones included, is a reduce-add, issued after the block's first tile once
// every rank's zeroing is complete (zeroed[q] == compute blocks per launch). No per-tile wait,
// and own and peer tiles interleave, so the traffic spreads over the whole kernel.
// Both: each block then tells each owner how many tiles it added there (`done`); the owner's
// kernel ends only after all of them landed, so the next call's stores (or zeroing) cannot race
// the previous call's adds.
//
// rs_item: position W*j + k is owner (rank + k) mod W, that owner's j-th tile (grouped raster
// inside the shard). Shards differ by at most one row tile, so owners have T_lo or T_hi tiles;
// past W*T_lo only the n_hi owners with T_hi remain.
struct RsSplit {
  int hi;    // the larger row-tile count of a shard
  int t_lo;  // tiles every owner has
  int n_hi;  // owners with hi row tiles
};
__host__ __device__ inline RsSplit rs_split(const Layout& L) {
  int lo = L.tm[0], hi = L.tm[0], n_hi = 0;
  for (int q = 1; q < L.W; ++q) {
    lo = L.tm[q] < lo ? L.tm[q] : lo;
    hi = L.tm[q] > hi ? L.tm[q] : hi;
  }
  for (int q = 0; q < L.W; ++q) n_hi += L.tm[q] == hi;
  return {hi, lo * L.tiles_n, n_hi};
}
__host__ __device__ inline Item rs_item(const Layout& L, int rank, int w) {
  const RsSplit sp = rs_split(L);
  int j, k;
  if (w < L.W * sp.t_lo) {
    j = w / L.W, k = w % L.W;
  } else {
    const int x = w - L.W * sp.t_lo;
    j = sp.t_lo + x / sp.n_hi;
    int m = x % sp.n_hi;
    for (k = 0;; ++k) {  // the m-th owner (in k order) that still has tiles
      const int q = rank + k < L.W ? rank + k : rank + k - L.W;
      if (L.tm[q] == sp.hi && m-- == 0) break;
    }
  }
  return owner_item(L, k, rank + k < L.W ? rank + k : rank + k - L.W, j);
}
// Variant 2, inter-SM: every rank walks the same order (rs_item as rank 0 sees it: owners
// interleaved) and plain-stores each tile into its local scratch (M x N), then signals
// ready[tile] on the owner; the owner's communicator block j mod n_comm waits for W signals,
// sums the tile over every rank's scratch (fp32, rank order) into its output and signals `done`
// on every rank. A rank's call ends when done reached all tiles (nobody still reads its
// scratch). Compute never waits; communicator blocks wait only on storers.
// Variant 5, the v3 chain in one kernel (order rs_chain_item()): rank r walks owner r - 1's tiles
// (step 1), then r - 2's, ..., its own last (step W). Step 1 plain-stores into the owner's output
// once owner r - 1 signalled `entered` (its previous call is over); a later step, the own one
// included, first waits for ready[tile] >= round: rank r - 1's step t - 1 on the same owner, the
// signal every step t < W sends to rank r + 1 after its store or add completed.
// Owner of rank `rank`'s step t = 1..W (step W: rank itself); variants 3 and 5.
__host__ __device__ inline int rs_chain_owner(int rank, int t, int W) { return ((rank - t) % W + W) % W; }
__host__ __device__ inline Item rs_chain_item(const Layout& L, int rank, int w) {
  int t = 1, q = rs_chain_owner(rank, 1, L.W);
  while (w >= L.owner_tiles(q)) {
    w -= L.owner_tiles(q);
    q = rs_chain_owner(rank, ++t, L.W);
  }
  return owner_item(L, t, q, w);
}
// The w-th tile of rank `rank` in variant v's order (v: RsVariant's number).
__host__ __device__ inline Item rs_order(const Layout& L, int rank, int w, int v) {
  return v == to_int(RsVariant::ZeroFirst) ? rs_item(L, rank, w)
         : v == to_int(RsVariant::InterSm) ? rs_item(L, 0, w)
         : v == to_int(RsVariant::Chain)   ? rs_chain_item(L, rank, w)
                                           : item(L, rank, w);
}
// Variant 2: ready[idx] on the owner receives one signal from every rank per launch; done[0] on
// every rank one per tile of every owner.
__host__ __device__ inline unsigned long long rs_inter_ready_expected(const Layout& L) { return L.W; }
__host__ __device__ inline unsigned long long rs_inter_done_expected(const Layout& L) { return L.work(); }
__host__ __device__ inline int rs_ready_index(const Layout& L, const Item& t) { return t.vrow * L.tiles_n + t.n; }
__host__ __device__ inline int rs_ready_count(const Layout& L) { return L.work(); }
// Variant 0: ready[idx] on a peer receives exactly one signal per launch (from the owner).
__host__ __device__ inline unsigned long long rs_ready_expected() { return 1; }
// Variant 1: zeroed[q] receives one signal per compute block of rank q per launch.
__host__ __device__ inline unsigned long long rs_zeroed_expected(int compute_blocks) { return compute_blocks; }
// Elements [e0, e1) of the own output (rows x N, 16-byte multiples) that block b of `blocks` zeroes.
__host__ __device__ inline void rs_zero_range(long long elems, int b, int blocks, long long* e0, long long* e1) {
  const long long chunks = elems / 8, per = (chunks + blocks - 1) / blocks;
  const long long a = b * per < chunks ? b * per : chunks, e = a + per < chunks ? a + per : chunks;
  *e0 = 8 * a, *e1 = 8 * e;
}
// Tiles block `b` of `blocks` adds into peer q's output in variant v (the value of its one
// `done` signal).
__host__ __device__ inline int rs_block_adds(const Layout& L, int rank, int b, int blocks, int q, int v) {
  if (q == rank) return 0;
  int n = 0;
  for (int w = b; w < L.work(); w += blocks)
    if (rs_order(L, rank, w, v).owner == q) ++n;
  return n;
}
__host__ __device__ inline unsigned long long rs_done_expected(const Layout& L, int q) {
  return static_cast<unsigned long long>(L.W - 1) * L.owner_tiles(q);
}

// ---- gemm_rs v3 (one plain GEMM per owner, chained; host only, gemm_rs.cu) -----------------
// Rank r's steps t = 1 .. W-1 compute owner rs_chain_owner(r, t)'s rows into that owner's output
// (a plain store at t = 1, C += A * B after), then add 1 to counter 1 of rank r + 1; step W is
// its own rows (C += A * B). Counter 0 of rank r + 1 gets 1 when rank r enters a call ("my
// output is free"); rank r waits for counter 0 >= round before step 1. Before step t >= 2 and
// before step W, rank r waits for counter 1 >= rs_chain_expected(round, t, W): rank r - 1 has
// finished its step t - 1, which targeted the same owner.
__host__ __device__ inline unsigned long long rs_chain_expected(unsigned long long round, int t, int W) {
  return (round - 1) * static_cast<unsigned long long>(W - 1) + static_cast<unsigned long long>(t - 1);
}

// ---- ag_gemm (push) ------------------------------------------------------------------------
// Each row tile of rank r's shard (contiguous bytes: rows x K elements of `row_bytes` per row:
// bf16 or fp8) is cut into P equal byte
// slices; unit u = i * P + p is row tile i, slice p. A pusher c of n (a communicator block, or
// the aux warps of compute block c) copies units c, c + n, ... (row tile 0's slices first,
// spread over all pushers) into every peer's gathered A, and after each unit signals
// `ready[off[r] + i]` on that peer. A compute block's loader waits for ready[vrow] == P (per
// launch) before the first load of a peer tile.
// P for the communicator-SM pushes: slices of >= 16 boxes of 128 rows x 128 bytes, so a slice
// ends in a full write drain.
__host__ __device__ inline int ag_slices(long long row_bytes) {
  const long long kc = (row_bytes + 127) / 128;
  for (int p = 8; p > 1; p /= 2)
    if (kc % p == 0 && kc / p >= 16) return p;
  return 1;
}
// P for the aux-warp push (every compute block pushes): about 256 units, so that the first
// batch of units (one per block) covers the first row tiles, each unit >= 8 KB.
__host__ __device__ inline int ag_slices_aux(const Layout& L, long long row_bytes) {
  int tm = 1;
  for (int q = 0; q < L.W; ++q) tm = L.tm[q] > tm ? L.tm[q] : tm;
  int p = (256 + tm - 1) / tm;
  const int cap = row_bytes / 64 > 1 ? static_cast<int>(row_bytes / 64) : 1;  // 128 rows x row_bytes / P >= 8 KB
  return p < cap ? p : cap;
}
// Aux-warp register push, variants v = 3..6 (AgVariant::AuxRegisterPush1..8): blocks 0, s, 2s, ...
// of the compute blocks push (s = 2^(v-3)), as pushers 0, 1, 2, ...
__host__ __device__ inline int ag_aux_stride(int v) { return 1 << (v - to_int(AgVariant::AuxRegisterPush1)); }
__host__ __device__ inline int ag_aux_pushers(int compute_blocks, int v) {
  return (compute_blocks + ag_aux_stride(v) - 1) / ag_aux_stride(v);
}
__host__ __device__ inline int ag_ready_count(const Layout& L) { return L.row_tiles(); }
__host__ __device__ inline unsigned long long ag_ready_expected(int P) { return P; }
__host__ __device__ inline int ag_units(const Layout& L, int r, int P) { return L.tm[r] * P; }

// Bytes [b0, b1) of rank r's shard (rows of row_bytes, contiguous) that unit u of P slices per
// row tile carries: row tile u / P (rows clipped to the shard), slice u % P of it, 16-byte
// aligned; may be empty.
__host__ __device__ inline void ag_unit_bytes(const Layout& L, int r, long long row_bytes, int P, int u, long long* b0,
                                              long long* b1) {
  const int rows = shard(L.M, L.W, r).size;
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
// The tiles rank r owns (r, r + W, ...): its reductions per call.
__host__ __device__ inline int ar_owned_tiles(const ArLayout& L, int r) {
  return r < L.work() ? (L.work() - r + L.W - 1) / L.W : 0;
}

// gemm_ar intra-SM (no communicator SM): every rank walks all tiles in the same order. At tile w
// the storer plain-stores its partial into its own output, then signals ready[w * W + rank] on
// every peer; then, for each peer d, waits for ready[w * W + d] (d's partial is in place) and
// reduce-adds its partial into d's output. A rank signals before it waits at the same position,
// so every wait depends only on work at that position or earlier (deadlock-free). Each block
// tells each peer how many tiles it added there (`done`); a rank's call ends when every peer's
// adds into its output landed, so the next call's plain stores cannot race them.
__host__ __device__ inline int ar_intra_ready_index(const ArLayout& L, int w, int from) { return w * L.W + from; }
__host__ __device__ inline int ar_intra_ready_count(const ArLayout& L) { return L.work() * L.W; }
__host__ __device__ inline unsigned long long ar_intra_ready_expected() { return 1; }
// Tiles block b of `blocks` computes (and adds into every peer's output).
__host__ __device__ inline int ar_intra_block_tiles(const ArLayout& L, int b, int blocks) {
  return b < L.work() ? (L.work() - 1 - b) / blocks + 1 : 0;
}
__host__ __device__ inline unsigned long long ar_intra_done_expected(const ArLayout& L) {
  return static_cast<unsigned long long>(L.W - 1) * L.work();
}

}  // namespace weave::tp
