// The NVLink phases of the hierarchical collectives (G > 1 ranks per node), run as calls of the
// single-node collectives (kernels/collectives) on a node-local communicator. Those shard a
// dimension near-equally in *elements*; the network phase's shards are near-equal in 16-byte
// *units* (layout.hpp, split_bytes). Viewing a run of whole units as a matrix of 16-byte rows
// makes the two agree: the near-equal split gives its extra units to a prefix of the parts, so
// node m's block (the whole units of shards (m, 0 .. G - 1), consecutive) split by rows over the G
// ranks of a node gives exactly those shards, and the whole buffer's rows split over G give
// all_reduce's node parts. The trailing partial unit (bytes mod 16, in the last rank's shard and
// the last node part) is no row: it travels on its own (tail). Pure functions, CPU-tested with
// the layout (tests/net/test_net_collectives_layout.cpp), which runs these stage lists on host
// buffers; the host entry (net_collectives.cu) runs them on the stream.
#pragma once
#include "net_collectives/layout.hpp"

namespace weave::net::coll {

// A run of whole 16-byte units at byte offset `off`: a (rows x 16 bytes) matrix sharded by rows.
struct Rows {
  long long off, rows;
};

WEAVE_HD inline long long whole_bytes(const Layout& L) { return L.plan.bytes / 16 * 16; }

// all_gather, reduce_scatter: node m's block, the whole units of the shards (m, 0 .. G - 1).
WEAVE_HD inline Rows node_block(const Layout& L, int m) {
  const Topo& t = L.plan.topo;
  const Bytes first = shard(L.plan, t.rank(m, 0)), last = shard(L.plan, t.rank(m, t.gpus - 1));
  return {first.off, (last.off + last.size - first.off) / 16};  // rounded down: without the tail
}
// all_reduce: every whole unit of the buffer (its row shard l is node part l, less the tail).
WEAVE_HD inline Rows all_rows(const Layout& L) { return {0, L.plan.bytes / 16}; }
// Row shard l of `parts`, in bytes: what the single-node collectives give local rank l.
WEAVE_HD inline Bytes row_shard(const Rows& b, int parts, int l) {
  const Part<long long> p = near_equal_part(b.rows, parts, l);
  return {b.off + p.begin * 16, p.size * 16};
}
// The trailing partial unit: the end of the last rank's shard and of the last node part.
WEAVE_HD inline Bytes tail(const Layout& L) { return {whole_bytes(L), L.plan.bytes - whole_bytes(L)}; }

// ---- a call at G > 1: its stages, in stream order ------------------------------------------------
//   all_gather      [net] (own shard to every rail peer), then per node m: ag_rows(node_block(m)),
//                   then tail_from_last.
//   reduce_scatter  per node m: rs_rows(node_block(m)) into the scratch at partial_off (the node's
//                   partial of shard (m, l)); tail_sum into the tail scratch, which the last local
//                   rank copies after its shard's units in the scratch; then [net] (reading the
//                   scratch), or with one node a copy of the own partial into the buffer.
//   all_reduce      rs_rows(all_rows) in place (node part l), tail_sum in place, [net] (the ring
//                   over node part l), ag_rows(all_rows), tail_from_last.
// [net]: the network phase (layout.hpp), with more than one node only. The single-node
// collectives' outputs sit at the same offset on every rank of the node (symmetric: their
// multi-destination algorithms write peers' outputs at the writer's offset), except the in-place
// slices they allow. Empty rows, tails and copies do nothing (the host entry skips them).
// They check a byte at each pointer even for an empty shard, which may lie one past the buffer's
// end: an empty own row shard points into the tail scratch instead (nothing moves through it).
enum class StageOp : int {
  net = 0,
  ag_rows = 1,         // single-node all_gather in place: own row shard to the node's ranks
  rs_rows = 2,         // single-node reduce_scatter: the node's sum of own row shard -> out
  tail_sum = 3,        // single-node all_reduce: the node's sum of the tail -> out
  tail_from_last = 4,  // the last local rank's tail to the node's other ranks (via the tail scratch)
  copy = 5,            // this rank alone: `size` bytes, in -> out
};
enum class Where : int { buffer = 0, scratch = 1, tail_scratch = 2 };
struct Place {
  Where where;
  long long off;
};
struct Stage {
  StageOp op;
  Rows rows;       // ag_rows, rs_rows
  Bytes tail;      // tail_sum, tail_from_last: the tail's bytes in the buffer
  Place in, out;   // ag_rows, rs_rows, copy: both; tail_sum: out
  long long size;  // copy
};

WEAVE_HD inline Place own_rows(const Rows& b, int parts, int l, Place p) {
  return row_shard(b, parts, l).size > 0 ? p : Place{Where::tail_scratch, 0};
}
WEAVE_HD inline Stage ag_rows(const Rows& b, int parts, int l) {
  return {StageOp::ag_rows, b, {0, 0}, own_rows(b, parts, l, {Where::buffer, row_shard(b, parts, l).off}),
          {Where::buffer, b.off}, 0};
}
WEAVE_HD inline Stage rs_rows(const Rows& b, int parts, int l, Place out) {
  return {StageOp::rs_rows, b, {0, 0}, {Where::buffer, b.off}, own_rows(b, parts, l, out), 0};
}

WEAVE_HD inline int num_stages(const Layout& L) {
  const int N = L.plan.topo.nodes, net = N > 1;
  if (L.plan.coll == Coll::all_gather) return net + N + 1;
  if (L.plan.coll == Coll::reduce_scatter) return N + 3;
  return 4 + net;
}

// Stage i of rank r's call.
WEAVE_HD inline Stage stage(const Layout& L, int r, int i) {
  const Topo& t = L.plan.topo;
  const int N = t.nodes, l = t.local(r), net = N > 1, last = t.world() - 1;
  const Bytes tl = tail(L);
  Stage st{StageOp::net, {0, 0}, tl, {Where::buffer, 0}, {Where::buffer, 0}, 0};
  if (L.plan.coll == Coll::all_gather) {
    if (i < net) return st;
    i -= net;
    if (i < N) return ag_rows(node_block(L, i), t.gpus, l);
    st.op = StageOp::tail_from_last;
  } else if (L.plan.coll == Coll::reduce_scatter) {
    if (i < N) return rs_rows(node_block(L, i), t.gpus, l, {Where::scratch, partial_off(L, t.rank(i, l), 0)});
    if (i == N) {
      st.op = StageOp::tail_sum, st.out = {Where::tail_scratch, 0};
    } else if (i == N + 1) {
      st.op = StageOp::copy, st.size = l == t.gpus - 1 ? tl.size : 0;
      st.in = {Where::tail_scratch, 0};
      st.out = {Where::scratch, partial_off(L, last, tl.off - shard(L.plan, last).off)};
    } else if (!net) {
      const Bytes own = shard(L.plan, r);
      st.op = StageOp::copy, st.size = own.size;
      st.in = {Where::scratch, partial_off(L, r, 0)}, st.out = {Where::buffer, own.off};
    }
  } else {
    const Rows all = all_rows(L);
    if (i == 0) return rs_rows(all, t.gpus, l, {Where::buffer, row_shard(all, t.gpus, l).off});
    if (i == 1) st.op = StageOp::tail_sum, st.out = {Where::buffer, tl.off};
    else if (i - 2 < net) return st;
    else if (i - 2 - net == 0) return ag_rows(all, t.gpus, l);
    else st.op = StageOp::tail_from_last;
  }
  return st;
}

}  // namespace weave::net::coll
