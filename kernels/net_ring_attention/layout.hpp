// Where every byte of the inter-node ring attention goes (N nodes of G ranks each; rank q = node n
// x G + local l, the sequence sharded over all W = N x G ranks as the single-node ring shards it).
// Pure __host__ __device__ functions shared by the kernels (net_ring_kernel.cuh) and the CPU tests
// (tests/net/test_net_ring_layout.cu).
//
// The units are the single-node kernel's push units (gathered_schedule.hpp: one per (batch,
// 512-row slice, own chunk), its rows of every kv head, K and V), and a unit's readiness counter
// (counter_index(b, 0, slice)) expects, as there, one count per chunk of other ranks that has rows
// in the slice. What travels for unit u of rank q is its K rows and its V rows: two commands to
// each peer, each a byte range that lies in the sender's local K (or V), (B, L_q, Hkv, D), at
// (b L_q + local row) row_bytes. The send buffer holds the sender's K then V at those offsets (K
// at 0, V at B Lmax row_bytes); step s = 0 .. N - 2 goes to rank r - s - 1 and lands in the
// receiver's slot at s * stride + (the same offset), flag s * 2 max_units + 2u + t (t: 0 K, 1 V).
// So rank r receives at step s from rank r + s + 1.
// At G > 1 the steps run over nodes between rail peers (the ranks of one local index): step
// s = 0 .. N - 2 goes from (n, l) to (n - s - 1, l), so (n, l) receives at step s from
// (n + s + 1, l); the other ranks' units reach it over NVLink (net_ring_kernel.cuh). Every unit
// lands in every gathered K (or V) of the node at its global rows (gathered_off).
#pragma once
#include "gathered_attention/gathered_schedule.hpp"
#include "net_common/hierarchy.hpp"
#include "ring_attention/schedule.hpp"

namespace weave::net::ring_net {

namespace gs = weave::attention::gathered;
namespace rg = weave::sp::ring;

struct RingPlan {
  int W, G, zz, B, slices, n_chunks, max_units;  // W = nodes x G ranks
  long long S, row_bytes, Lmax;
};

__host__ __device__ inline RingPlan make_plan(int W, int zz, int B, long long S, long long row_bytes, int G = 1) {
  RingPlan p;
  p.W = W, p.G = G, p.zz = zz, p.B = B, p.S = S, p.row_bytes = row_bytes;
  p.slices = gs::num_slices(S);
  p.n_chunks = rg::num_chunks(W, zz);
  p.Lmax = 0;
  for (int q = 0; q < W; ++q) {
    const long long L = rg::local_rows(S, W, zz, q);
    p.Lmax = L > p.Lmax ? L : p.Lmax;
  }
  p.max_units = gs::num_units(B, 1, p.slices, rg::chunks_per_rank(zz));
  return p;
}

__host__ __device__ inline int nodes(const RingPlan& p) { return p.W / p.G; }
__host__ __device__ inline int steps(const RingPlan& p) { return nodes(p) - 1; }
__host__ __device__ inline int send_peer(const RingPlan& p, int r, int s) {
  return Topo{nodes(p), p.G}.rail_peer(r, -s - 1);
}
__host__ __device__ inline int from_peer(const RingPlan& p, int r, int s) {
  return Topo{nodes(p), p.G}.rail_peer(r, s + 1);
}
__host__ __device__ inline int units(const RingPlan& p) { return p.max_units; }  // every rank has as many chunks
// One tensor's region in the send buffer and in each step's receive area.
__host__ __device__ inline long long tensor_bytes(const RingPlan& p) { return p.B * p.Lmax * p.row_bytes; }
__host__ __device__ inline long long stride(const RingPlan& p) { return 2 * tensor_bytes(p); }

// Unit u of rank q: its batch, slice and global rows (empty when its chunk has no rows in the
// slice), and where its rows lie in q's local K (or V), in bytes.
struct UnitBytes {
  int b, slice;
  gs::Rows rows;
  long long off, bytes;
};
__host__ __device__ inline UnitBytes unit(const RingPlan& p, int q, int u) {
  const gs::Unit x = gs::unit_at(u, 1, p.slices, rg::chunks_per_rank(p.zz));
  const gs::Rows ch = rg::chunk(p.S, p.W, p.zz, q, x.i);
  const gs::Rows pc = gs::piece(p.S, p.n_chunks, rg::chunk_id(p.W, p.zz, q, x.i), x.s);
  const long long L = rg::local_rows(p.S, p.W, p.zz, q);
  const long long local = rg::local_offset(p.S, p.W, p.zz, q, x.i) + (pc.begin - ch.begin);
  return {x.b, x.s, pc, (x.b * L + local) * p.row_bytes, pc.rows * p.row_bytes};
}
// Where a unit's rows lie in a gathered K (or V), (B, S, Hkv, D) in global row order, in bytes.
__host__ __device__ inline long long gathered_off(const RingPlan& p, const UnitBytes& x) {
  return (x.b * p.S + x.rows.begin) * p.row_bytes;
}
// Tensor t (0: K, 1: V) of a unit at byte offset `off` of its tensor: in the send buffer and in
// step s's receive area; its flag.
__host__ __device__ inline long long send_off(const RingPlan& p, int t, long long off) { return t * tensor_bytes(p) + off; }
__host__ __device__ inline long long recv_off(const RingPlan& p, int s, int t, long long off) {
  return s * stride(p) + t * tensor_bytes(p) + off;
}
__host__ __device__ inline int flag(const RingPlan& p, int s, int u, int t) { return (s * p.max_units + u) * 2 + t; }
__host__ __device__ inline long long send_needed(const RingPlan& p) { return stride(p); }
__host__ __device__ inline long long recv_needed(const RingPlan& p) { return steps(p) * stride(p); }
__host__ __device__ inline long long flags_needed(const RingPlan& p) {
  return 2LL * steps(p) * p.max_units;
}
__host__ __device__ inline long long commands(const RingPlan& p, int r) {
  long long n = 0;
  for (int u = 0; u < units(p); ++u) n += unit(p, r, u).bytes > 0;
  return 2 * n * steps(p);
}

}  // namespace weave::net::ring_net
