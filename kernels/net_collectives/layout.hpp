// Where every byte of an inter-node all_gather / reduce_scatter / all_reduce call's *network
// phase* goes, for N nodes of G ranks (rank = node * G + local): which commands a rank queues,
// where they land in the peer's receive slot, which arrival flag each one raises. Pure functions
// of (call shape, rank, step, piece), shared by the kernel (kernel.cuh) and its host entry (which
// must count exactly the commands the kernel pushes: the send gate of the next call waits for
// that many completions), and CPU-tested (tests/net/test_net_collectives_layout.cpp).
//
// The schedule is hierarchy.hpp's network phases. Every transfer goes between rail peers (the N
// ranks of one local index l; at G = 1 every rank): all_gather is its net_ag phase (step s: the
// own shard to rail peer (n + s + 1, l)), reduce_scatter its net_rs phase (step s: the node's
// partial of shard (n + s + 1, l) to its owner, which adds it). Shards are the ones over all N * G
// ranks (split_bytes in 16-byte units, rank order), so the result is laid out as at G = 1; the
// NVLink phases around this one are node_phase.hpp's. Each transfer is cut into network pieces of
// `chunk` bytes (the tuned chunk size; the last piece of a shard is ragged); a transfer of an empty
// shard still sends one empty piece, so every rank hears from every rail peer in every call (the
// receive slots' reuse rule relies on it: net_path.hpp, device.cuh).
//
// Regions (offsets in bytes; rail peers are indexed by their node m):
//   all_gather      send: the own shard at 0.  recv slot: shard q's bytes at shard(q).off (the
//                   output's layout).  Needs send >= stride, slot >= bytes.
//   reduce_scatter  send: the partial of rail shard m at m * stride.  recv slot: node m's partial
//                   of the own shard at m * stride.  stride = largest shard rounded up to 16.
//                   The partials are read from the buffer itself at G = 1 (in place) and from the
//                   node scratch at G > 1 (`staged`: the NVLink phase's output, same layout as the
//                   send region), so that the other shards of the buffer keep their input.
// Flags: chunk id = sender's node * max_pieces + piece, plus the call slot's first flag.
//
// all_reduce is hierarchy's ring over node part l (split_bytes of the buffer over the G locals;
// the whole buffer at G = 1) between the N rail peers: net_rs then net_ag over N sub-chunks of the
// part (ring_sub). Sub-chunk c starts at node c, which sends its part to node c + 1; each next
// node adds its own and passes the sum on, until node c - 1 holds the full sum (N - 1 hops); from
// there the sum is forwarded around the ring (N - 1 more hops). Pipelined per (sub-chunk, piece)
// *item*: rank r's role for sub-chunk c is set by its distance d = node(r) - c (mod N):
//   d = 0          send the local piece (reduce-scatter step 0)
//   0 < d < N - 1  wait for the partial sum, add the local piece, send the sum on
//   d = N - 1      wait, add: the result; keep it and send it on (all-gather step 0)
// then, for e = d + 1 (mod N) > 0, wait for the result, keep it, and send it on unless e = N - 1.
// Regions: send and receive slot have two areas of the largest node part rounded to 16
// (reduce-scatter, all-gather), each in the node part's layout; chunk id = (area * N + c) *
// max_pieces + piece. Every rank's result depends on every rail peer's part of the same call, so
// the slot reuse rule holds for the ring too.
#pragma once
#include <cstdint>

#include "net_common/hierarchy.hpp"

namespace weave::net::coll {

struct Layout {
  CollPlan plan;          // coll, topo {N, G}, bytes, unit 16 (the single-node collectives' shards)
  long long chunk = 0;    // network piece bytes, a multiple of 16
  long long stride = 0;   // reduce_scatter's per-node region, 16-aligned
  int max_pieces = 1;     // pieces of the largest transfer (shard; all_reduce: ring sub-chunk)
  bool staged = false;    // reduce_scatter at G > 1: partials in the node scratch (see the header)
};

WEAVE_HD inline long long round16(long long x) { return (x + 15) / 16 * 16; }

// Pieces of a transfer of `bytes`: at least one (an empty piece only notifies).
WEAVE_HD inline int pieces(const Layout& L, long long bytes) {
  const long long n = (bytes + L.chunk - 1) / L.chunk;
  return n < 1 ? 1 : static_cast<int>(n);
}

// Piece p of a transfer of `bytes`: its offset inside the transfer and its size.
WEAVE_HD inline Bytes piece_of(const Layout& L, long long bytes, int p) {
  const long long off = static_cast<long long>(p) * L.chunk, left = bytes - off;
  return {off, left < 0 ? 0 : left < L.chunk ? left : L.chunk};
}

// The largest part of split_bytes(off, size, 16, parts, .): the first is the largest in whole
// units, but the last also takes the trailing partial unit (with fewer units than parts it wins).
WEAVE_HD inline long long largest_part(long long off, long long size, int parts) {
  const long long first = split_bytes(off, size, 16, parts, 0).size, last = split_bytes(off, size, 16, parts, parts - 1).size;
  return first > last ? first : last;
}

// `coll`: all_gather, reduce_scatter or all_reduce over `topo` (N nodes of G ranks). Shards are
// split_bytes of the buffer over the N * G ranks; the ring's sub-chunks split each node part.
WEAVE_HD inline Layout make_layout(Coll coll, Topo topo, long long bytes, long long chunk) {
  Layout L;
  L.plan.coll = coll;
  L.plan.topo = topo;
  L.plan.bytes = bytes;
  L.plan.unit = 16;
  L.chunk = chunk;
  const long long largest_shard = largest_part(0, bytes, topo.world());
  long long largest_sub = 0;
  for (int l = 0; l < topo.gpus; ++l) {
    const Bytes part = node_part(L.plan, l);
    const long long s = largest_part(part.off, part.size, topo.nodes);
    largest_sub = s > largest_sub ? s : largest_sub;
  }
  L.stride = round16(largest_shard);
  L.max_pieces = pieces(L, coll == Coll::all_reduce ? largest_sub : largest_shard);
  L.staged = coll == Coll::reduce_scatter && topo.gpus > 1;
  return L;
}

WEAVE_HD inline int steps(const Layout& L) { return L.plan.topo.nodes - 1; }

// Step s of rank r (s = 0 .. steps - 1): hierarchy's transfer of its network phase (the steps
// after its NVLink reduce-scatter steps) and the rank it receives from in that step.
WEAVE_HD inline int first_net_step(const Layout& L) {
  return phase_steps(L.plan.coll, L.plan.topo, Phase::intra_rs) +
         (L.plan.coll == Coll::all_gather ? phase_steps(L.plan.coll, L.plan.topo, Phase::net_rs) : 0);
}
WEAVE_HD inline Xfer step_send(const Layout& L, int r, int s) { return send(L.plan, r, first_net_step(L) + s, 0); }
WEAVE_HD inline Xfer step_recv(const Layout& L, int r, int s) { return recv(L.plan, r, first_net_step(L) + s, 0); }

// Flags are per receiving rank and only rail peers send to it: numbered by the sender's node.
WEAVE_HD inline uint32_t chunk_id(const Layout& L, int sender, int piece) {
  return static_cast<uint32_t>(L.plan.topo.node(sender) * L.max_pieces + piece);
}
// reduce_scatter: where a rank's partial of owner q's shard is read from, `off` bytes into the
// shard: the buffer (in place) at G = 1, the node scratch at node(q) * stride at G > 1.
WEAVE_HD inline long long partial_off(const Layout& L, int q, long long off) {
  return L.staged ? L.plan.topo.node(q) * L.stride + off : shard(L.plan, q).off + off;
}
WEAVE_HD inline long long scratch_needed(const Layout& L) { return L.staged ? L.plan.topo.nodes * L.stride : 0; }

// ---- all_reduce: the ring (see the header) ----------------------------------------------------

// One area of the send buffer and of the receive slot: the largest node part, rounded to 16.
WEAVE_HD inline long long ring_area(const Layout& L) { return round16(largest_part(0, L.plan.bytes, L.plan.topo.gpus)); }
WEAVE_HD inline uint32_t ring_chunk_id(const Layout& L, int area, int c, int p) {
  return static_cast<uint32_t>((area * L.plan.topo.nodes + c) * L.max_pieces + p);
}
// Rank r's ring runs over its node part; sub-chunk c of it, cut into pieces.
WEAVE_HD inline Bytes ring_sub_of(const Layout& L, int r, int c) { return ring_sub(L.plan, L.plan.topo.local(r), c); }
WEAVE_HD inline int ring_pieces(const Layout& L, int r, int c) { return pieces(L, ring_sub_of(L, r, c).size); }
WEAVE_HD inline long long ring_items(const Layout& L, int r) {
  long long n = 0;
  for (int c = 0; c < L.plan.topo.nodes; ++c) n += ring_pieces(L, r, c);
  return n;
}
// Item j (sub-chunk-major, the same order on every rail peer): its sub-chunk and piece.
WEAVE_HD inline void ring_item(const Layout& L, int r, long long j, int* c, int* p) {
  int k = 0;
  for (; k < L.plan.topo.nodes - 1 && j >= ring_pieces(L, r, k); ++k) j -= ring_pieces(L, r, k);
  *c = k;
  *p = static_cast<int>(j);
}
WEAVE_HD inline int ring_dist(const Layout& L, int r, int c) { return detail::wrap(L.plan.topo.node(r) - c, L.plan.topo.nodes); }
// Commands of rank r for one piece of sub-chunk c: a reduce-scatter send unless it is the last
// hop's receiver (d = N - 1), an all-gather send unless it is the ring's last (e = N - 1).
WEAVE_HD inline int ring_item_commands(const Layout& L, int r, int c) {
  const int d = ring_dist(L, r, c), N = L.plan.topo.nodes;
  return (d <= N - 2) + (d != N - 2);
}
// Piece p of sub-chunk c: its offset in the buffer and its bytes.
WEAVE_HD inline Bytes ring_piece(const Layout& L, int r, int c, int p) {
  const Bytes sub = ring_sub_of(L, r, c);
  const Bytes pc = piece_of(L, sub.size, p);
  return {sub.off + pc.off, pc.size};
}
// Where that piece sits in the send buffer and in the receive slot: area `which` (0: partial
// sums, 1: results), at its offset inside the node part (rail peers share the part).
WEAVE_HD inline long long ring_slot_off(const Layout& L, int r, int which, const Bytes& pc) {
  return which * ring_area(L) + pc.off - node_part(L.plan, L.plan.topo.local(r)).off;
}

// ---- what the host entry checks and counts ----------------------------------------------------

WEAVE_HD inline uint32_t flags_needed(const Layout& L) {
  const int areas = L.plan.coll == Coll::all_reduce ? 2 : 1;
  return static_cast<uint32_t>(areas * L.plan.topo.nodes * L.max_pieces);
}
WEAVE_HD inline long long send_needed(const Layout& L) {
  if (L.plan.coll == Coll::all_reduce) return 2 * ring_area(L);
  return L.plan.coll == Coll::all_gather ? L.stride : L.plan.topo.nodes * L.stride;
}
WEAVE_HD inline long long recv_needed(const Layout& L) {
  if (L.plan.coll == Coll::all_reduce) return 2 * ring_area(L);
  return L.plan.coll == Coll::all_gather ? L.plan.bytes : L.plan.topo.nodes * L.stride;
}

// Rank r's commands of one call, in the order its send blocks may push them: step s, piece p.
// all_gather pushes one command per (step, piece of the own shard), reduce_scatter one per (step,
// piece of the destination's shard).
WEAVE_HD inline int step_pieces(const Layout& L, int r, int s) { return pieces(L, step_send(L, r, s).bytes); }
WEAVE_HD inline long long commands(const Layout& L, int r) {
  long long n = 0;
  if (L.plan.coll == Coll::all_reduce) {
    for (int c = 0; c < L.plan.topo.nodes; ++c) n += static_cast<long long>(ring_pieces(L, r, c)) * ring_item_commands(L, r, c);
    return n;
  }
  for (int s = 0; s < steps(L); ++s) n += step_pieces(L, r, s);
  return n;
}

// Where a piece of `sender`'s lands in the receiver's slot: all_gather at the data's own offset in
// the buffer (`data_off`), the others at the piece's offset (`piece_off`) in the sending node's
// stride-sized area. The sender's command and the receiver's read both come from here.
WEAVE_HD inline long long landing_off(const Layout& L, int sender, long long data_off, long long piece_off) {
  return L.plan.coll == Coll::all_gather ? data_off : L.plan.topo.node(sender) * L.stride + piece_off;
}

// The command of (step s, piece p) of rank r: source offset in r's send buffer, destination
// offset in the peer's receive slot, bytes, chunk id (without the slot's flag offset).
struct PieceCmd {
  int peer;
  long long src_off, dst_off, bytes;
  long long data_off;  // where the bytes are in r's buffer
  long long part_off;  // reduce_scatter: where r's partial of them is read from (partial_off)
  uint32_t chunk;
};
WEAVE_HD inline PieceCmd piece_cmd(const Layout& L, int r, int s, int p) {
  const Xfer x = step_send(L, r, s);
  const Bytes pc = piece_of(L, x.bytes, p);
  PieceCmd c;
  c.peer = x.dst;
  c.bytes = pc.size;
  c.data_off = x.off + pc.off;
  c.part_off = partial_off(L, x.dst, pc.off);
  c.chunk = chunk_id(L, r, p);
  // all_gather: the own shard sits at 0 of the send buffer; the others: per destination node.
  c.src_off = L.plan.coll == Coll::all_gather ? pc.off : L.plan.topo.node(x.dst) * L.stride + pc.off;
  c.dst_off = landing_off(L, r, c.data_off, pc.off);
  return c;
}

// What rank r receives in (step s, piece p): the sender, where it lands in r's receive slot,
// where it belongs in r's buffer, bytes, chunk id.
struct PieceRecv {
  int sender;
  long long recv_off, data_off, bytes;
  long long part_off;  // reduce_scatter: where r's own partial of these bytes is (partial_off)
  uint32_t chunk;
};
WEAVE_HD inline int recv_pieces(const Layout& L, int r, int s) { return pieces(L, step_recv(L, r, s).bytes); }
WEAVE_HD inline PieceRecv piece_recv(const Layout& L, int r, int s, int p) {
  const Xfer x = step_recv(L, r, s);
  const Bytes pc = piece_of(L, x.bytes, p);
  PieceRecv v;
  v.sender = x.src;
  v.bytes = pc.size;
  v.data_off = x.off + pc.off;
  v.part_off = partial_off(L, r, pc.off);
  v.chunk = chunk_id(L, x.src, p);
  v.recv_off = landing_off(L, x.src, v.data_off, pc.off);
  return v;
}

}  // namespace weave::net::coll
