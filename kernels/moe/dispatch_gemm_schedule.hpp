// The fused dispatch_gemm's send order and readiness (dispatch_gemm_kernel.cuh; README.md, "Fused
// dispatch_gemm") as pure functions, CPU-tested in tests/moe/test_moe_dispatch_gemm_cpu.cpp (the
// whole dispatch simulated for W = 2..8: every (token, slot) sent once, every token's data once
// per rank, and every row of an expert complete, data and metadata, once every rank has sent that
// expert).
//
// Sender s walks its (token, slot) entries expert after expert in local-index order (l = 0..L-1),
// and inside l the W destination ranks starting after itself (its own rank last, so that the
// peers' rows start crossing NVLink first); inside one (rank, expert) block, the layout's (token,
// slot) order. An entry writes its row's metadata; an entry whose slot is the token's primary on
// that rank (layout.hpp: the smallest expert of the token's slots there) also writes the token's
// data. Since the primary's expert is at or before every other slot's on the rank, once every
// sender has sent local expert l (and the experts before it), every row of l on every rank has its
// metadata and its data's source row: the receiver copies primary rows into l's other rows, and
// l's GEMM tiles may start.
#pragma once
#include "moe/layout.hpp"
#include "weave/common/host_device.hpp"

namespace weave::moe {

// The i-th destination (i = 0..W-1) of sender s inside each local expert.
WEAVE_HD inline int send_dest(int s, int i, int W) { return (s + 1 + i) % W; }

// Where global expert e comes in sender s's order: local expert first, then destination.
WEAVE_HD inline int send_position(int s, int e, const Geometry& g) {
  const int W = g.world;
  return g.local_of(e) * W + (g.rank_of(e) - s - 1 + 2 * W) % W;
}

// order[p] (p = 0..E): the first send-list entry of the p-th expert in sender s's order, from s's
// counts (E rows per expert); order[E] is the total. Local expert l's entries are
// [order[l W], order[(l + 1) W]).
WEAVE_HD inline void send_offsets(const int* counts, const Geometry& g, int s, int* order) {
  const int W = g.world, L = g.local_experts();
  int n = 0;
  for (int l = 0; l < L; ++l)
    for (int i = 0; i < W; ++i) {
      order[l * W + i] = n;
      n += counts[g.expert(send_dest(s, i, W), l)];
    }
  order[g.experts] = n;
}

// Signals per call. Every aux warp of every compute block of every rank adds one to counter l
// (local expert l's arrivals) of every rank once it sent its share of l, and one to this rank's
// counter L + l (l ready) once it copied its share of l's duplicated rows: a rank's counter l
// counts W x warps per call, its counter L + l warps. All ranks launch the same number of compute
// blocks (agreed per call), so a rank knows both totals.
WEAVE_HD inline unsigned long long arrivals_per_call(int world, int aux_warps) {
  return static_cast<unsigned long long>(world) * static_cast<unsigned long long>(aux_warps);
}
WEAVE_HD inline unsigned long long ready_per_call(int aux_warps) { return static_cast<unsigned long long>(aux_warps); }

}  // namespace weave::moe
