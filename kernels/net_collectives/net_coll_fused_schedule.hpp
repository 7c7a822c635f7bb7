// The fused hierarchical collectives (G > 1 ranks per node, NetCollOptions::fused): one persistent
// kernel per call whose blocks take mKernel's roles (section 3: intra-node communication SMs,
// inter-node send and receive SMs) and hand each other the call's *items*, the network pieces of
// layout.hpp, through per-item counters of this rank. Pure functions of (call shape, rank, item),
// shared by the kernel (net_coll_fused_kernel.cuh) and its CPU test
// (tests/net/test_net_collectives_layout.cpp), which runs the items of every role in random
// orders allowed by these counters and checks every output byte.
//
// Items, per collective (rank r = (n, l); the bytes are the host-composed path's, so the sums run
// in the same order and the results are bit-identical to it):
//   all_reduce      the ring items (sub-chunk c, piece p) of node part l (layout.hpp). Each goes
//                   through three phases: node_reduce (the node's sum of the item's bytes, read
//                   from the G node ranks' buffers over NVLink, local ranks in order, fp32, rounded
//                   once, into this rank's buffer), net (the ring between rail peers, unchanged;
//                   none with one node), node_gather (the result into the G - 1 node peers'
//                   buffers). Counter ready(j) joins the first two, result(j) the last two.
//   reduce_scatter  (step s, piece p), s = 0 .. N - 1, for owner q = (n + s + 1, l) (s = N - 1: r
//                   itself): node_reduce sums piece p of q's shard over the node into the node
//                   scratch at partial_off (the partial layout.hpp's network phase reads), ready(j);
//                   then net: for s < N - 1 the send of that partial (layout.hpp's command (s, p):
//                   item index = command index), for s = N - 1 the receive of piece p, which adds
//                   the N - 1 arrived partials to the own one.
//   all_gather      no counters: the own shard's pieces go to the node peers (node_gather) and,
//                   unchanged, to the rail peers (net send); a rail peer's piece, once arrived, is
//                   copied into all G buffers of the node (net receive).
// The trailing partial unit (bytes mod 16) is part of the last rank's shard and of the last node
// part, so it rides in their last item (the host-composed path moves it on its own).
#pragma once
#include "net_collectives/layout.hpp"

namespace weave::net::coll {

// The blocks of one grid, in this order: node_reduce, then [send | recv] or [ring] (network),
// then node_gather: each role waits only for roles before it (node_reduce for nothing but the
// node's arrival), so where the GPU places the grid's blocks in index order and not all at once
// (another stream's kernel holding SMs) the first ones placed make progress. `grid` is the same on
// every rank of the job (the smallest SM count, so that every block is resident at once: blocks
// wait for each other's counters).
struct FusedRoles {
  int send = 0, recv = 0, ring = 0, reduce = 0, gather = 0;
  WEAVE_HD int net() const { return send + recv + ring; }
  WEAVE_HD int grid() const { return net() + reduce + gather; }
};
// The network blocks as at G = 1 (all_reduce: send_blocks + recv_blocks ring blocks); the NVLink
// blocks take the rest of the grid (all_reduce: half each to reduce and gather). Zero blocks in a
// role it needs: the grid is too small (the host refuses the call).
WEAVE_HD inline FusedRoles fused_roles(Coll c, int grid, int send_blocks, int recv_blocks) {
  FusedRoles f;
  const int nvl = grid - send_blocks - recv_blocks;
  if (c == Coll::all_reduce) {
    f.ring = send_blocks + recv_blocks;
    f.reduce = nvl / 2;
    f.gather = nvl - f.reduce;
  } else {
    f.send = send_blocks, f.recv = recv_blocks;
    (c == Coll::reduce_scatter ? f.reduce : f.gather) = nvl;
  }
  return f;
}
WEAVE_HD inline bool roles_fit(Coll c, const FusedRoles& f) {
  return f.reduce >= (c != Coll::all_gather) && f.gather >= (c != Coll::reduce_scatter) && f.reduce >= 0 &&
         f.gather >= 0;
}

// Items of rank r's call (all_reduce: ring items; reduce_scatter: (step, piece) over the N steps;
// all_gather: the own shard's pieces, for the node_gather role).
WEAVE_HD inline int rs_item_pieces(const Layout& L, int r, int s) {
  return pieces(L, shard(L.plan, L.plan.topo.rail_peer(r, s + 1)).size);
}
WEAVE_HD inline long long fused_items(const Layout& L, int r) {
  if (L.plan.coll == Coll::all_reduce) return ring_items(L, r);
  if (L.plan.coll == Coll::all_gather) return pieces(L, shard(L.plan, r).size);
  long long n = 0;
  for (int s = 0; s < L.plan.topo.nodes; ++s) n += rs_item_pieces(L, r, s);
  return n;
}

// Item j: the bytes it covers in every node rank's buffer (`src`), where node_reduce writes their
// sum or node_gather reads them (`dst`: the own buffer, or the node scratch for reduce_scatter),
// and its network coordinates (all_reduce: sub-chunk c, piece p; reduce_scatter: step s, piece p).
struct FusedItem {
  Bytes src;
  long long dst;
  int step, piece;
};
WEAVE_HD inline FusedItem fused_item(const Layout& L, int r, long long j) {
  FusedItem it{{0, 0}, 0, 0, 0};
  if (L.plan.coll == Coll::all_reduce) {
    ring_item(L, r, j, &it.step, &it.piece);
    it.src = ring_piece(L, r, it.step, it.piece);
    it.dst = it.src.off;
    return it;
  }
  int s = 0;
  if (L.plan.coll == Coll::reduce_scatter)
    for (; s < L.plan.topo.nodes - 1 && j >= rs_item_pieces(L, r, s); ++s) j -= rs_item_pieces(L, r, s);
  const int q = L.plan.coll == Coll::all_gather ? r : L.plan.topo.rail_peer(r, s + 1);
  const Bytes sh = shard(L.plan, q), pc = piece_of(L, sh.size, static_cast<int>(j));
  it.src = {sh.off + pc.off, pc.size};
  it.dst = L.plan.coll == Coll::all_gather ? it.src.off : partial_off(L, q, pc.off);
  it.step = s, it.piece = static_cast<int>(j);
  return it;
}

// reduce_scatter: the item of the own shard's piece p (the last step's).
WEAVE_HD inline long long own_item(const Layout& L, int r, int p) {
  long long j = p;
  for (int s = 0; s < L.plan.topo.nodes - 1; ++s) j += rs_item_pieces(L, r, s);
  return j;
}

// The per-item counters of this rank: ready(j) once node_reduce wrote item j, result(j)
// (all_reduce) once the ring left its result in the own buffer. Counters are zeroed per call.
WEAVE_HD inline int fused_counters(const Layout& L) { return 2 * L.plan.topo.nodes * L.max_pieces; }
WEAVE_HD inline int ready_counter(const Layout&, long long j) { return static_cast<int>(j); }
WEAVE_HD inline int result_counter(const Layout& L, long long j) {
  return L.plan.topo.nodes * L.max_pieces + static_cast<int>(j);
}

// Signals per call on the node's counters (the node communicator's signal set, one round per
// call): `arrive` once per rank at the kernel's start (its buffer holds this call's input, and
// no earlier call of it still reads the memory peers write into); `done` once per block of the
// grid when it ends (an NVLink block then no longer reads or writes a peer's memory). Every block
// signals, not only the NVLink ones, so that each call adds G x grid to every node rank's counter
// whatever the collective: the counter runs over the object's calls, and a count per collective
// would leave a call after another kind waiting for too many (a hang) or too few (an early end).
// A rank's kernel ends only after every node rank's blocks signalled done.
WEAVE_HD inline unsigned long long done_expected(unsigned long long round, int G, int grid) {
  return round * static_cast<unsigned long long>(G) * static_cast<unsigned long long>(grid);
}

}  // namespace weave::net::coll
