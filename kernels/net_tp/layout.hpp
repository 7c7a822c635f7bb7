// Where every byte of the inter-node fused TP kernels goes (N nodes of G ranks each; rank =
// node * G + local). Pure __host__ __device__ functions of the shape and the rank, shared by the kernels
// (net_ag_gemm_kernel.cuh, net_gemm_rs_kernel.cuh) and the CPU tests (tests/net/test_net_tp_layout.cu).
//
// Both kernels move row shards (rank q's rows tp::shard(M, W, q), contiguous, W = N nodes x G
// ranks, rank q = node * G + local) cut into units as the single-node push cuts them
// (tp_common/schedule.hpp's ag_unit_bytes: P byte slices per 128-row tile). A unit is one network
// command between rail peers (the ranks of one local index): step s = 0 .. N - 2 goes from rank
// (n, l) to rank (n - s - 1, l) (send_peer), so a rank receives at step s from (n + s + 1, l)
// (from_peer), into its receive slot at s * stride + (the unit's offset in the shard), raising
// flag s * max_units + u. At G > 1 the shards of the other local indices move over NVLink: AG
// pushes its own shard to the node peers and forwards every unit it receives from the network to
// them; RS sends at step s the node's partial of shard (n - s - 1, l), which this rank sums from
// the G node ranks' partial products (rs_owner says in which order they are computed).
//   - AllGather + GEMM (row_bytes = K x element): the units of the sender's own shard, staged once
//     in its send buffer at their shard offsets and posted to every peer. Rank r meets the peer
//     shards in the GEMM's order (tp::item: own rows, then r + 1, r + 2, ...): step order.
//   - GEMM + ReduceScatter (row_bytes = N x 2, bf16 partials): at step s the units of the
//     receiver's shard of this rank's partial product, staged at s * stride + offset. The GEMM
//     computes them in step order (rs_item: owner r - 1 first, its own rows last).
//   - GEMM + AllReduce: GEMM + ReduceScatter, then the reduced own shard as AllGather posts its
//     shard (ar_* below).
#pragma once
#include "net_common/hierarchy.hpp"
#include "tp_common/schedule.hpp"

namespace weave::net::tp_net {

using weave::tp::Layout;

struct UnitPlan {
  Layout L;             // the GEMM's tiling (W = nodes x G ranks)
  int G;                // ranks per node
  long long row_bytes;  // one row of what travels
  long long stride;     // per step, in the receive slot (and RS's send buffer): the largest shard
  int P;                // units per 128-row tile
  int max_units;        // units of the largest shard
};

// P for chunks of about `chunk_bytes` (a 128-row tile in ceil(tile bytes / chunk) slices, at
// most 64; slices are 16-byte aligned, so a tile of few bytes gets fewer).
__host__ __device__ inline int net_slices(long long row_bytes, long long chunk_bytes) {
  const long long tile = row_bytes * weave::tp::kBM;
  long long p = (tile + chunk_bytes - 1) / chunk_bytes;
  if (p > 64) p = 64;
  if (p > tile / 16) p = tile / 16;
  return p < 1 ? 1 : static_cast<int>(p);
}

__host__ __device__ inline UnitPlan make_plan(const Layout& L, long long row_bytes, long long chunk_bytes, int G = 1) {
  UnitPlan a;
  a.L = L;
  a.G = G;
  a.row_bytes = row_bytes;
  a.P = net_slices(row_bytes, chunk_bytes);
  const int rows = weave::tp::shard(L.M, L.W, 0).size;  // the first shards are the largest
  a.stride = (rows * row_bytes + 15) / 16 * 16;
  a.max_units = weave::tp::ag_units(L, 0, a.P);
  return a;
}
// AllGather + GEMM: the A rows travel. GEMM + ReduceScatter: the bf16 partial output rows.
__host__ __device__ inline UnitPlan ag_plan(int M, int N, int K, int elem_bytes, int world, int group_m,
                                            long long chunk, int G = 1) {
  return make_plan(weave::tp::make_layout(M, N, world, group_m), static_cast<long long>(K) * elem_bytes, chunk, G);
}
__host__ __device__ inline UnitPlan rs_plan(int M, int N, int world, int group_m, long long chunk, int G = 1) {
  return make_plan(weave::tp::make_layout(M, N, world, group_m), static_cast<long long>(N) * 2, chunk, G);
}

__host__ __device__ inline int nodes(const UnitPlan& a) { return a.L.W / a.G; }
__host__ __device__ inline int steps(const UnitPlan& a) { return nodes(a) - 1; }
__host__ __device__ inline int send_peer(const UnitPlan& a, int r, int s) {
  return Topo{nodes(a), a.G}.rail_peer(r, -s - 1);
}
__host__ __device__ inline int from_peer(const UnitPlan& a, int r, int s) {
  return Topo{nodes(a), a.G}.rail_peer(r, s + 1);
}
// Units of owner q's shard, and unit u's bytes [b0, b1) from the shard's first byte (may be empty).
__host__ __device__ inline int units(const UnitPlan& a, int q) { return weave::tp::ag_units(a.L, q, a.P); }
__host__ __device__ inline void unit(const UnitPlan& a, int q, int u, long long* b0, long long* b1) {
  weave::tp::ag_unit_bytes(a.L, q, a.row_bytes, a.P, u, b0, b1);
}
__host__ __device__ inline long long shard_byte(const UnitPlan& a, int q) {
  return weave::tp::shard(a.L.M, a.L.W, q).begin * a.row_bytes;
}
// Step s's unit at shard offset b0 in the call's receive slot (RS: also in the send buffer); flag.
__host__ __device__ inline long long slot_off(const UnitPlan& a, int s, long long b0) { return s * a.stride + b0; }
__host__ __device__ inline int flag(const UnitPlan& a, int s, int u) { return s * a.max_units + u; }
__host__ __device__ inline long long recv_needed(const UnitPlan& a) { return steps(a) * a.stride; }
__host__ __device__ inline long long flags_needed(const UnitPlan& a) { return static_cast<long long>(steps(a)) * a.max_units; }
__host__ __device__ inline int nonempty_units(const UnitPlan& a, int q) {
  int n = 0;
  for (int u = 0; u < units(a, q); ++u) {
    long long b0, b1;
    unit(a, q, u, &b0, &b1);
    n += b1 > b0;
  }
  return n;
}

// The j-th (step, unit) of the units of from_peer(r, s) (AG's receive order) or of
// send_peer(r, s) (RS's send order), steps in order; false past the end.
__host__ __device__ inline bool nth_unit(const UnitPlan& a, int r, bool from, long long j, int* s, int* u) {
  for (int st = 0; st < steps(a); ++st) {
    const int n = units(a, from ? from_peer(a, r, st) : send_peer(a, r, st));
    if (j < n) {
      *s = st, *u = static_cast<int>(j);
      return true;
    }
    j -= n;
  }
  return false;
}
// nth_unit's j-th item with the rank whose shard it cuts (from_peer(r, s) or send_peer(r, s)) and
// its bytes [b0, b1) of that shard (none when b1 <= b0).
struct StepUnit {
  int s = 0, u = 0, peer = 0;
  long long b0 = 0, b1 = 0;
};
__host__ __device__ inline StepUnit step_unit(const UnitPlan& a, int r, bool from, long long j) {
  StepUnit x;
  nth_unit(a, r, from, j, &x.s, &x.u);
  x.peer = from ? from_peer(a, r, x.s) : send_peer(a, r, x.s);
  unit(a, x.peer, x.u, &x.b0, &x.b1);
  return x;
}
__host__ __device__ inline long long step_units(const UnitPlan& a, int r, bool from) {
  long long n = 0;
  for (int st = 0; st < steps(a); ++st) n += units(a, from ? from_peer(a, r, st) : send_peer(a, r, st));
  return n;
}

// GEMM + ReduceScatter's owner order, rank r = (n, l)'s t-th shard (t = 0 .. W - 1): the remote
// nodes in step order (node n - s - 1 at step s, whose shard (n - s - 1, l) this rank's send blocks
// post at step s), inside each node the owners (m, 0), (m, 1), ..., (m, G - 1), the same order on
// every rank of a node so that the G partials of a shard complete together on its collector; then
// the own node's owners (n, l + 1), (n, l + 2), ..., the own shard last (no network step waits for
// them). At G = 1: tp::rs_chain_item's order.
__host__ __device__ inline int rs_owner(const UnitPlan& a, int r, int t) {
  const int G = a.G, N = nodes(a), n = r / G, s = t / G, j = t % G;
  if (s < N - 1) return ((n - s - 1) % N + N) % N * G + j;
  return n * G + (r % G + 1 + j) % G;
}
// Rank r's w-th output tile in that order (grouped rasterisation inside a shard); phase = t + 1.
__host__ __device__ inline weave::tp::Item rs_item(const UnitPlan& a, int r, int w) {
  int t = 0, q = rs_owner(a, r, 0);
  while (w >= a.L.owner_tiles(q)) {
    w -= a.L.owner_tiles(q);
    q = rs_owner(a, r, ++t);
  }
  return weave::tp::owner_item(a.L, t + 1, q, w);
}
// Node rank (local index) that reduces the node's partial of owner q's shard: q's rail peer on
// this node (hierarchy.hpp's collector, Topo::rail_peer_on).
__host__ __device__ inline int collector(const UnitPlan& a, int q) { return q % a.G; }

// AG: the send buffer holds the own shard; one command per non-empty own unit and step.
__host__ __device__ inline long long ag_send_needed(const UnitPlan& a) { return a.stride; }
__host__ __device__ inline long long ag_commands(const UnitPlan& a, int r) {
  return static_cast<long long>(nonempty_units(a, r)) * steps(a);
}
// RS: the send buffer holds every step's partial rows; one command per non-empty unit of each peer.
__host__ __device__ inline long long rs_send_needed(const UnitPlan& a) { return steps(a) * a.stride; }
__host__ __device__ inline long long rs_commands(const UnitPlan& a, int r) {
  long long n = 0;
  for (int s = 0; s < steps(a); ++s) n += nonempty_units(a, send_peer(a, r, s));
  return n;
}

// GEMM + AllReduce: GEMM + ReduceScatter, then each owner posts its reduced units to every peer
// as AllGather + GEMM posts its shard (the same plan, row_bytes = N x 2), in areas after RS's:
// the send buffer's own-shard copy at rs_send_needed, the receive slot's at recv_needed, the
// flags at flags_needed.
__host__ __device__ inline long long ar_send_needed(const UnitPlan& a) { return rs_send_needed(a) + a.stride; }
__host__ __device__ inline long long ar_recv_needed(const UnitPlan& a) { return 2 * recv_needed(a); }
__host__ __device__ inline long long ar_flags_needed(const UnitPlan& a) { return 2 * flags_needed(a); }
__host__ __device__ inline long long ar_commands(const UnitPlan& a, int r) { return rs_commands(a, r) + ag_commands(a, r); }

// The adaptive SM split's communication tasks of rank r (one rank per node; net_gemm_rs_adaptive.cuh),
// in the order the ledger hands them out: the sends (RS's send order: step s's units of
// send_peer(r, s)'s shard), the reductions of the own shard's units, and with `ar` the rail peers'
// reduced units (AG's receive order). Each kind waits only for the kinds before it (sends for
// this rank's GEMM, reductions also for the peers' sends, AR's gathers for the peers'
// reductions), so handing them out in this order never holds back a task whose input is in place
// behind one whose input needs a later task.
enum class RsCommKind : int { Send = 0, Reduce = 1, Gather = 2 };
struct RsCommTask {
  RsCommKind kind;
  int s;  // the step (Reduce: 0, every step's arrival is summed)
  int u;  // the unit of send_peer(r, s)'s, r's or from_peer(r, s)'s shard
};
__host__ __device__ inline long long rs_comm_tasks(const UnitPlan& a, int r, bool ar) {
  return step_units(a, r, false) + units(a, r) + (ar ? step_units(a, r, true) : 0);
}
// Task k < rs_comm_tasks(a, r, ar).
__host__ __device__ inline RsCommTask rs_comm_task(const UnitPlan& a, int r, bool ar, long long k) {
  RsCommTask t{RsCommKind::Send, 0, 0};
  const long long sends = step_units(a, r, false);
  if (k < sends) {
    nth_unit(a, r, false, k, &t.s, &t.u);
    return t;
  }
  k -= sends;
  if (k < units(a, r) || !ar) {
    t.kind = RsCommKind::Reduce;
    t.u = static_cast<int>(k);
    return t;
  }
  t.kind = RsCommKind::Gather;
  nth_unit(a, r, true, k - units(a, r), &t.s, &t.u);
  return t;
}
// The rank whose shard task t's unit cuts.
__host__ __device__ inline int comm_owner(const UnitPlan& a, int r, const RsCommTask& t) {
  return t.kind == RsCommKind::Send ? send_peer(a, r, t.s) : t.kind == RsCommKind::Reduce ? r : from_peer(a, r, t.s);
}

// AllGather + GEMM's communication tasks for the adaptive SM split (one rank per node;
// net_ag_adaptive_kernel.cuh), in the order the ledger hands them out: the sends of rank r's own
// units (unit k: staged once in the send buffer, posted to every rail peer), then the receives in
// AG's receive order (step s's units of from_peer(r, s)'s shard: the GEMM's order of the peer
// rows). A send waits for nothing of this call (only for the previous calls' commands, outside the
// kernel); a receive waits for a peer's send. So no task waits for a later one of its rank.
enum class AgCommKind : int { Send = 0, Receive = 1 };
struct AgCommTask {
  AgCommKind kind;
  int s;     // Receive: the step (the shard of from_peer(r, s)); Send: 0 (posted at every step)
  int u;     // the unit of that shard (Send: of rank r's own)
  int peer;  // the rank whose shard the unit cuts (Send: r)
};
__host__ __device__ inline long long ag_comm_tasks(const UnitPlan& a, int r) {
  return units(a, r) + step_units(a, r, true);
}
// Task k < ag_comm_tasks(a, r).
__host__ __device__ inline AgCommTask ag_comm_task(const UnitPlan& a, int r, long long k) {
  if (k < units(a, r)) return {AgCommKind::Send, 0, static_cast<int>(k), r};
  const StepUnit x = step_unit(a, r, true, k - units(a, r));
  return {AgCommKind::Receive, x.s, x.u, x.peer};
}

}  // namespace weave::net::tp_net
