// The hierarchical (multi-node) schedules of mKernel (arXiv 2609.13585, sections 3.1 and 4) as
// pure functions of (topology, size, rank, step): NVLink inside a node, and across nodes only
// between rail peers (the GPUs with the same local index), so that a node's share crosses the
// network once per direction. Plain C++, callable from device code (no containers, no
// allocation); the kernels and the host proxy both read them. CPU-tested for nodes 1..16 x
// GPUs {1, 2, 4, 8} in tests/schedule/test_hierarchy.cpp. What each schedule computes and why:
// README.md next to this file.
//
// A job is N nodes x G GPUs, rank = node * G + local. Every split of bytes or rows is the
// near-equal split of weave/common/split.hpp (the first n mod parts parts get one more unit), so
// a shard here is the same shard the single-node collectives and TP kernels use.
#pragma once
#include "weave/common/host_device.hpp"
#include "weave/common/split.hpp"

namespace weave::net {

namespace detail {
WEAVE_HD inline int wrap(int x, int n) {
  x %= n;
  return x < 0 ? x + n : x;
}
}  // namespace detail

struct Topo {
  int nodes = 1, gpus = 1;
  WEAVE_HD int world() const { return nodes * gpus; }
  WEAVE_HD int node(int r) const { return r / gpus; }
  WEAVE_HD int local(int r) const { return r % gpus; }
  // Node and local index taken modulo nodes and gpus.
  WEAVE_HD int rank(int node, int local) const {
    return detail::wrap(node, nodes) * gpus + detail::wrap(local, gpus);
  }
  // The rail peer k nodes further (k = 1 .. nodes - 1; negative: back).
  WEAVE_HD int rail_peer(int r, int k) const { return rank(node(r) + k, local(r)); }
  // The GPU k local indices further on r's node.
  WEAVE_HD int local_peer(int r, int k) const { return rank(node(r), local(r) + k); }
  // Owner q's rail peer on `node` (q itself on q's node): where q's data enters that node, or
  // where that node's data for q leaves it.
  WEAVE_HD int rail_peer_on(int q, int node) const { return rank(node, local(q)); }
  WEAVE_HD bool same_node(int a, int b) const { return node(a) == node(b); }
  WEAVE_HD bool rail_peers(int a, int b) const { return a != b && local(a) == local(b); }
};

enum class Link : int { nvlink = 0, network = 1 };
enum class Op : int { copy = 0, reduce = 1 };  // at the destination: overwrite, or add into

struct Bytes {
  long long off, size;
};

// Piece i of `parts` of [off, off + size): near-equal in units of `unit` bytes (a multiple of the
// element size: reductions never split an element), the trailing partial unit to the last piece.
WEAVE_HD inline Bytes split_bytes(long long off, long long size, long long unit, int parts, int i) {
  const long long units = size / unit;
  const Part<long long> p = near_equal_part(units, parts, i);
  return {off + p.begin * unit, p.size * unit + (i == parts - 1 ? size - units * unit : 0)};
}

// ---- all_reduce / all_gather / reduce_scatter ------------------------------------------------
// Every rank holds a buffer of `bytes` at the same offsets (symmetric): all_reduce's in-place
// buffer, all_gather's full output (rank q's shard already in place), reduce_scatter's full input
// (rank q's result lands in its own shard's bytes). Shards are split_bytes(0, bytes, unit, N*G, q),
// in rank order: the single-node collectives' shards when N = 1.
//
// Steps, in order (a rank's sends of one step are independent; the next step may start once what
// it reads has arrived; every step is a permutation: each rank sends to one peer and receives from
// one, so no link or NIC carries two messages of one step):
//   intra_rs  (all_reduce, reduce_scatter) k = 1 .. G-1: rank (n, l) sends to (n, l + k), which adds
//             it, the bytes that (n, l + k) collects: all_reduce: node part l + k; reduce_scatter:
//             the shards (m, l + k) of every node m (remote nodes' first).
//   net_rs    all_reduce: ring between rail peers over node part l, N sub-chunks: step s sends
//             sub-chunk (n - s) to node n + 1, which adds it (after N - 1 steps node n holds the
//             sum of sub-chunk n + 1). reduce_scatter: direct, k = 1 .. N-1: the node's partial of
//             shard (n + k, l) to its owner, which adds it.
//   net_ag    all_reduce: the ring's second half, step s copies sub-chunk (n + 1 - s) to node n + 1.
//             all_gather: direct, k = 1 .. N-1: the own shard to rail peer (n + k, l).
//   intra_ag  (all_reduce, all_gather) k = 1 .. G-1: to (n, l + k): all_reduce: node part l;
//             all_gather: the shards (m, l) of every node m (own node's first).
// Network crossings per byte of the buffer: all_reduce 2(N-1) (N-1 as a partial sum, N-1 as the
// result), all_gather and reduce_scatter N-1 (once into or out of every other node). With N = 1
// there are no network steps: all_reduce is the single-node two-shot (unit 16), all_gather and
// reduce_scatter the single-node direct ones, peers in the same (staggered) order.
enum class Coll : int { all_reduce = 0, all_gather = 1, reduce_scatter = 2 };
enum class Phase : int { intra_rs = 0, net_rs = 1, net_ag = 2, intra_ag = 3 };

struct CollPlan {
  Coll coll = Coll::all_reduce;
  Topo topo;
  long long bytes = 0;
  long long unit = 16;
};

// One transfer: `bytes` at offset `off` of src's buffer into the same offset of dst's.
struct Xfer {
  int src, dst;
  Link link;
  Op op;
  long long off, bytes;
};

WEAVE_HD inline int phase_steps(Coll c, const Topo& t, Phase ph) {
  const bool ar = c == Coll::all_reduce, rs = c == Coll::reduce_scatter, ag = c == Coll::all_gather;
  const bool on = ph == Phase::intra_rs || ph == Phase::net_rs ? ar || rs : ar || ag;
  return on ? (ph == Phase::intra_rs || ph == Phase::intra_ag ? t.gpus - 1 : t.nodes - 1) : 0;
}
WEAVE_HD inline int num_steps(Coll c, const Topo& t) {
  int n = 0;
  for (int p = 0; p < 4; ++p) n += phase_steps(c, t, static_cast<Phase>(p));
  return n;
}
// Step `step`'s phase and its index inside the phase.
WEAVE_HD inline Phase phase_of(Coll c, const Topo& t, int step, int* s) {
  int p = 0;
  while (p < 3 && step >= phase_steps(c, t, static_cast<Phase>(p))) step -= phase_steps(c, t, static_cast<Phase>(p++));
  *s = step;
  return static_cast<Phase>(p);
}

// all_reduce: node part l (what local l reduces over NVLink and carries over the network) and its
// sub-chunk i of the ring.
WEAVE_HD inline Bytes node_part(const CollPlan& p, int l) {
  return split_bytes(0, p.bytes, p.unit, p.topo.gpus, l);
}
WEAVE_HD inline Bytes ring_sub(const CollPlan& p, int l, int i) {
  const Bytes b = node_part(p, l);
  return split_bytes(b.off, b.size, p.unit, p.topo.nodes, i);
}
// all_gather / reduce_scatter: rank q's shard.
WEAVE_HD inline Bytes shard(const CollPlan& p, int q) { return split_bytes(0, p.bytes, p.unit, p.topo.world(), q); }

// Transfers per rank in step `step`: N for the intra-node steps of all_gather and reduce_scatter
// (one per node's shard), else 1.
WEAVE_HD inline int num_xfers(const CollPlan& p, int step) {
  int s;
  const Phase ph = phase_of(p.coll, p.topo, step, &s);
  const bool intra = ph == Phase::intra_rs || ph == Phase::intra_ag;
  return intra && p.coll != Coll::all_reduce ? p.topo.nodes : 1;
}

// Rank r's i-th send of step `step`.
WEAVE_HD inline Xfer send(const CollPlan& p, int r, int step, int i) {
  const Topo& t = p.topo;
  const int n = t.node(r), l = t.local(r), N = t.nodes;
  const bool ar = p.coll == Coll::all_reduce;
  int s;
  const Phase ph = phase_of(p.coll, t, step, &s);
  Xfer x{r, r, Link::nvlink, Op::reduce, 0, 0};
  Bytes b{0, 0};
  if (ph == Phase::intra_rs) {
    x.dst = t.local_peer(r, s + 1);
    b = ar ? node_part(p, t.local(x.dst)) : shard(p, t.rank(n + 1 + i, t.local(x.dst)));
  } else if (ph == Phase::intra_ag) {
    x.dst = t.local_peer(r, s + 1), x.op = Op::copy;
    b = ar ? node_part(p, l) : shard(p, t.rank(n + i, l));
  } else {
    x.link = Link::network;
    x.op = ph == Phase::net_rs ? Op::reduce : Op::copy;
    x.dst = t.rail_peer(r, ar ? 1 : s + 1);
    b = ar ? ring_sub(p, l, detail::wrap(ph == Phase::net_rs ? n - s : n + 1 - s, N))
           : shard(p, ph == Phase::net_rs ? x.dst : r);
  }
  x.off = b.off, x.bytes = b.size;
  return x;
}
// The rank whose sends of step `step` land on rank r (its receives are that rank's sends).
WEAVE_HD inline int recv_from(const CollPlan& p, int r, int step) {
  int s;
  const Phase ph = phase_of(p.coll, p.topo, step, &s);
  if (ph == Phase::intra_rs || ph == Phase::intra_ag) return p.topo.local_peer(r, -(s + 1));
  return p.topo.rail_peer(r, p.coll == Coll::all_reduce ? -1 : -(s + 1));
}
WEAVE_HD inline Xfer recv(const CollPlan& p, int r, int step, int i) {
  return send(p, recv_from(p, r, step), step, i);
}
// How many times each byte of the buffer crosses the network in one call.
WEAVE_HD inline int net_crossings(Coll c, const Topo& t) {
  return (c == Coll::all_reduce ? 2 : 1) * (t.nodes - 1);
}

// A transfer cut into network messages of at most `chunk` bytes (a multiple of the unit).
WEAVE_HD inline long long num_pieces(long long bytes, long long chunk) { return (bytes + chunk - 1) / chunk; }
WEAVE_HD inline Xfer piece(Xfer x, long long chunk, long long i) {
  const long long b = i * chunk, left = x.bytes - b;
  x.off += b;
  x.bytes = left < chunk ? left : chunk;
  return x;
}

// ---- AG+GEMM and GEMM+RS: tile order and network chunks --------------------------------------
// M rows (A's for AG+GEMM, C's for GEMM+RS) sharded over the N*G ranks; owner q's shard is cut
// into row tiles of bm rows from its first row (no tile straddles two owners, as in
// tp_common/schedule.hpp), and its row tiles into network chunks of `chunk_tiles` row tiles: the
// tuned chunk size (mKernel: 128 rows for AG+GEMM, 2-32 tiles for GEMM+RS).
struct TileGrid {
  Topo topo;
  long long M = 0;
  int bm = 128;
  int tiles_n = 1;          // tile columns of the output
  int chunk_tiles = 1;      // row tiles per network chunk
  long long row_bytes = 0;  // bytes of a row on the network (AG+GEMM: K x elt of A; GEMM+RS: N x elt of C)
};
WEAVE_HD inline Part<long long> shard_rows(const TileGrid& g, int q) {
  return near_equal_part(g.M, g.topo.world(), q);
}
WEAVE_HD inline int row_tiles(const TileGrid& g, int q) {
  return static_cast<int>((shard_rows(g, q).size + g.bm - 1) / g.bm);
}
WEAVE_HD inline int num_chunks(const TileGrid& g, int q) {
  return (row_tiles(g, q) + g.chunk_tiles - 1) / g.chunk_tiles;
}
WEAVE_HD inline int max_chunks(const TileGrid& g) { return num_chunks(g, 0); }  // rank 0's shard is the largest
WEAVE_HD inline int chunk_of_tile(const TileGrid& g, int row_tile) { return row_tile / g.chunk_tiles; }

// Chunk c of owner q: its row tiles and its bytes in the row-major M-row matrix (empty past the
// owner's last chunk).
struct Chunk {
  int owner, index, tile0, tiles;
  long long off, bytes;
};
WEAVE_HD inline Chunk chunk(const TileGrid& g, int q, int c) {
  const int tm = row_tiles(g, q), t0 = c * g.chunk_tiles < tm ? c * g.chunk_tiles : tm;
  const int tiles = tm - t0 < g.chunk_tiles ? tm - t0 : g.chunk_tiles;
  const Part<long long> sh = shard_rows(g, q);
  const long long r0e = static_cast<long long>(t0) * g.bm, r1e = static_cast<long long>(t0 + tiles) * g.bm;
  const long long r0 = r0e < sh.size ? r0e : sh.size, r1 = r1e < sh.size ? r1e : sh.size;
  return {q, c, t0, tiles, (sh.begin + r0) * g.row_bytes, (r1 - r0) * g.row_bytes};
}

// A rank's output tiles come in blocks: a run of row tiles of one owner with all tiles_n columns,
// rasterised inside by the kernel (gemm::grouped_tile(j, tiles, tiles_n, group_m), as today).
// chunk = -1: a whole shard of the rank's own node (NVLink or local, no network chunking).
//
// ag_gemm, rank (n, l): its own shard, the shards of (n, l + 1), ..., (n, l + G - 1) (single-node
// order, tp::item), then the remote shards in arrival order: for k = 1 .. N-1 (node n - k, whose
// k-th send targets node n), for each chunk c, owners (n - k, l), (n - k, l + 1), ... (the rail
// peer's chunk arrives here directly; the others reach (n, j) and come over NVLink).
// gemm_rs, rank (n, l): the reverse: remote owners first, in the same order on every rank of the
// node (for k = 1 .. N-1: node n + k, chunk c, owners (n + k, 0 .. G-1)), so that the G partials of
// one network chunk are complete together on its collector (n, j) and the G NICs take chunks in
// turn; then the own node's owners (n, l - 1), (n, l - 2), ..., own shard last (tp::rs_chain_item).
enum class TileOrder : int { ag_gemm = 0, gemm_rs = 1 };
struct Block {
  int owner, chunk, tile0, tiles;
};
WEAVE_HD inline int num_blocks(const TileGrid& g) {
  return g.topo.gpus + (g.topo.nodes - 1) * max_chunks(g) * g.topo.gpus;
}
WEAVE_HD inline Block block(const TileGrid& g, TileOrder o, int r, int b) {
  const Topo& t = g.topo;
  const int G = t.gpus, remote = (t.nodes - 1) * max_chunks(g) * G;
  const int local_b = o == TileOrder::ag_gemm ? b : b - remote;
  if (local_b >= 0 && local_b < G) {
    const int q = t.local_peer(r, o == TileOrder::ag_gemm ? local_b : -(local_b + 1));
    return {q, -1, 0, row_tiles(g, q)};
  }
  const int x = o == TileOrder::ag_gemm ? b - G : b, per_node = max_chunks(g) * G;
  const int k = x / per_node + 1, c = (x % per_node) / G, j = x % G;
  const int q = o == TileOrder::ag_gemm ? t.rank(t.node(r) - k, t.local(r) + j) : t.rank(t.node(r) + k, j);
  const Chunk ch = chunk(g, q, c);
  return {q, c, ch.tile0, ch.tiles};
}

// Walks rank r's tiles in order: sets *blk to the block of its w-th tile and *j to the tile's
// index inside it (0 .. tiles * tiles_n - 1); false past the last tile. `w` must not decrease
// between calls with the same cursor (a persistent block's tiles w, w + grid, ...): the walk is
// then amortised O(1) per tile instead of a scan per tile on the loader's path.
struct Cursor {
  int block = 0;
  long long first = 0;  // tiles before `block`
};
WEAVE_HD inline bool locate(const TileGrid& g, TileOrder o, int r, long long w, Cursor* cur, Block* blk,
                                long long* j) {
  const int nb = num_blocks(g);
  // (cur->block) in parentheses: nvcc's front end reads `cur->block <` as the start of a template
  // argument list otherwise.
  for (; (cur->block) < nb; ++cur->block) {
    *blk = block(g, o, r, cur->block);
    const long long n = static_cast<long long>(blk->tiles) * g.tiles_n;
    if (w < cur->first + n) {
      *j = w - cur->first;
      return true;
    }
    cur->first += n;
  }
  return false;
}

// Network sends of rank r, in order, s = 0 .. num_net_sends - 1 (k = s / max_chunks + 1, chunk
// c = s % max_chunks; a chunk past the owner's last is empty). Node-major, every step a
// permutation between nodes (node n sends to n + k while it receives from n - k).
// ag_gemm: chunk c of r's own shard to rail peer (n + k, l), issued as soon as it is in place (at
// launch); the receiver forwards it over NVLink to its node's other GPUs.
// gemm_rs: chunk c of the rail peer (n + k, l)'s rows, node n's partial (reduced over NVLink on r,
// the collector: rail_peer_on(owner, n)), sent when its G partials have landed; the owner adds it.
struct ChunkSend {
  int dst;
  Chunk chunk;
};
WEAVE_HD inline int num_net_sends(const TileGrid& g) { return (g.topo.nodes - 1) * max_chunks(g); }
WEAVE_HD inline ChunkSend net_send(const TileGrid& g, TileOrder o, int r, int s) {
  const int dst = g.topo.rail_peer(r, s / max_chunks(g) + 1);
  return {dst, chunk(g, o == TileOrder::ag_gemm ? r : dst, s % max_chunks(g))};
}

// ---- ring attention across nodes --------------------------------------------------------------
// N*G steps; rank r = (n, l) attends at step t = j*G + i (round j, inner step i) to the K/V slice
// of rank (n - j, l - i). Inside a round the node runs the single-node ring over the K/V of node
// n - j (NVLink, each slice to local l + 1, due the next step); across rounds each GPU forwards the
// slice it started the round with, (n - j, l), to its rail peer (n + 1, l): sent during round j,
// due at round j + 1, so one network transfer overlaps G attention steps, every NIC of the node
// carries one slice per round, and each slice enters every other node exactly once (N - 1
// crossings). A rank holds at most 4 slices at a time (the round's first, being forwarded; the
// current; the next from NVLink; the next round's from the network). N = 1: the single-node ring.
WEAVE_HD inline int ring_owner(const Topo& t, int r, int step) {
  return t.rank(t.node(r) - step / t.gpus, t.local(r) - step % t.gpus);
}
struct SliceSend {
  int src, dst, owner;
  Link link;
  int start, due;  // issued at step `start` (the slice is on src), needed by dst at step `due`
};
WEAVE_HD inline int ring_num_net_sends(const Topo& t) { return t.nodes - 1; }
WEAVE_HD inline SliceSend ring_net_send(const Topo& t, int r, int j) {
  return {r, t.rail_peer(r, 1), ring_owner(t, r, j * t.gpus), Link::network, j * t.gpus, (j + 1) * t.gpus};
}
WEAVE_HD inline int ring_num_nvlink_sends(const Topo& t) { return t.nodes * (t.gpus - 1); }
WEAVE_HD inline SliceSend ring_nvlink_send(const Topo& t, int r, int x) {
  const int step = x / (t.gpus - 1) * t.gpus + x % (t.gpus - 1);
  return {r, t.local_peer(r, 1), ring_owner(t, r, step), Link::nvlink, step, step + 1};
}

}  // namespace weave::net
