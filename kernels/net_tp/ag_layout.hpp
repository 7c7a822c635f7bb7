// Where every byte of the inter-node AllGather + GEMM goes (N nodes of one rank each; rank =
// node). Pure __host__ __device__ functions of the shape and the rank, which the kernel
// (net_ag_gemm_kernel.cuh) and the CPU tests (tests/net/test_net_tp_layout.cpp) share.
//
// Rank r's A shard (shard(M, N, r) rows, contiguous) is cut into units as the single-node push
// cuts it (tp_common/schedule.hpp's ag_unit_bytes: P byte slices per 128-row tile). Each unit is
// one network command to each other rank:
//   - the sender copies unit u of its shard into its send buffer at the unit's shard offset (the
//     buffer holds the whole shard, so the bytes are staged once and posted N - 1 times);
//   - step s = 0 .. N - 2 sends it to rank r - s - 1, into that rank's receive slot at
//     s * stride + (the unit's shard offset), raising flag s * max_units + u.
// So rank r receives at step s from owner r + s + 1: the order in which its GEMM meets the peer
// shards (tp::item: own shard first, then r + 1, r + 2, ...), and the first peer shard it needs
// is the one every sender posts first.
#pragma once
#include "tp_common/schedule.hpp"

namespace weave::net::tp_net {

using weave::tp::Layout;

struct AgLayout {
  Layout L;              // the GEMM's tiling (W = nodes)
  long long row_bytes;   // one row of A
  long long stride;      // receive slot bytes per step: the largest shard, 16-byte aligned
  int P;                 // units per 128-row tile
  int max_units;         // units of the largest shard
};

// P for chunks of about `chunk_bytes` (a 128-row tile in ceil(tile bytes / chunk) slices, at
// most 64; slices are 16-byte aligned, so a tile of few bytes gets fewer).
__host__ __device__ inline int ag_net_slices(long long row_bytes, long long chunk_bytes) {
  const long long tile = row_bytes * weave::tp::kBM;
  long long p = (tile + chunk_bytes - 1) / chunk_bytes;
  if (p > 64) p = 64;
  if (p > tile / 16) p = tile / 16;
  return p < 1 ? 1 : static_cast<int>(p);
}

__host__ __device__ inline AgLayout make_ag_layout(int M, int N, int K, int elem_bytes, int nodes, int group_m,
                                                   long long chunk_bytes) {
  AgLayout a;
  a.L = weave::tp::make_layout(M, N, nodes, group_m);
  a.row_bytes = static_cast<long long>(K) * elem_bytes;
  a.P = ag_net_slices(a.row_bytes, chunk_bytes);
  const int rows = weave::tp::shard(M, nodes, 0).size;  // the first shards are the largest
  a.stride = (rows * a.row_bytes + 15) / 16 * 16;
  a.max_units = weave::tp::ag_units(a.L, 0, a.P);
  return a;
}

__host__ __device__ inline int ag_steps(const AgLayout& a) { return a.L.W - 1; }
// Whom rank r sends to at step s, and whose shard it receives at step s.
__host__ __device__ inline int ag_send_peer(const AgLayout& a, int r, int s) { return ((r - s - 1) % a.L.W + a.L.W) % a.L.W; }
__host__ __device__ inline int ag_recv_owner(const AgLayout& a, int r, int s) { return (r + s + 1) % a.L.W; }
// Units of owner q's shard, and unit u's bytes [b0, b1) from the shard's first byte (may be empty).
__host__ __device__ inline int ag_owner_units(const AgLayout& a, int q) { return weave::tp::ag_units(a.L, q, a.P); }
__host__ __device__ inline void ag_unit(const AgLayout& a, int q, int u, long long* b0, long long* b1) {
  weave::tp::ag_unit_bytes(a.L, q, a.row_bytes, a.P, u, b0, b1);
}
// Offsets in the call's receive slot and flags of step s's unit u (at shard offset b0).
__host__ __device__ inline long long ag_recv_off(const AgLayout& a, int s, long long b0) { return s * a.stride + b0; }
__host__ __device__ inline int ag_flag(const AgLayout& a, int s, int u) { return s * a.max_units + u; }

// What a call needs of the path, and the commands rank r queues (one per non-empty unit and step).
__host__ __device__ inline long long ag_send_needed(const AgLayout& a) { return a.stride; }
__host__ __device__ inline long long ag_recv_needed(const AgLayout& a) { return ag_steps(a) * a.stride; }
__host__ __device__ inline long long ag_flags_needed(const AgLayout& a) {
  return static_cast<long long>(ag_steps(a)) * a.max_units;
}
__host__ __device__ inline long long ag_commands(const AgLayout& a, int r) {
  long long n = 0;
  for (int u = 0; u < ag_owner_units(a, r); ++u) {
    long long b0, b1;
    ag_unit(a, r, u, &b0, &b1);
    n += b1 > b0;
  }
  return n * ag_steps(a);
}

// The receive blocks' items: (step, unit) in step order (the GEMM's order of peer shards), j-th
// of all; false past the end.
__host__ __device__ inline bool ag_recv_item(const AgLayout& a, int r, long long j, int* s, int* u) {
  for (int st = 0; st < ag_steps(a); ++st) {
    const int n = ag_owner_units(a, ag_recv_owner(a, r, st));
    if (j < n) {
      *s = st, *u = static_cast<int>(j);
      return true;
    }
    j -= n;
  }
  return false;
}
__host__ __device__ inline long long ag_recv_items(const AgLayout& a, int r) {
  long long n = 0;
  for (int st = 0; st < ag_steps(a); ++st) n += ag_owner_units(a, ag_recv_owner(a, r, st));
  return n;
}

}  // namespace weave::net::tp_net
