// The routing layout of expert-parallel MoE dispatch and combine (issue 21) as pure functions of
// the router output and the exchanged count matrix: which tokens go to which rank (once per rank),
// where each (token, k slot) row lands in the receiver's expert-grouped buffer, what combine reads
// back, and the receive capacity with its overflow check. Plain C++, callable from device code (no
// containers, no allocation); the host helpers at the end use std::vector. CPU-tested in
// tests/moe/test_moe_layout.cpp; the design and its reasons: README.md next to this file.
//
// World W ranks, E experts, L = E / W per rank: expert e lives on rank e / L as local expert e % L.
// Rank s has T tokens and topk_idx / topk_weights (T x k, row-major). The count matrix
// counts[s * E + e] (W x E, int32) is the number of (token, slot) pairs of rank s routed to e; it
// is the only thing the ranks exchange before the rows move.
//
// Receiver layout of rank d (the grouped buffer, one row per (source token, slot) routed to d):
//   for local expert l = 0 .. L-1, for source rank s = 0 .. W-1, the rows of s routed to
//   expert(d, l) in ascending (token, slot) order.
// Each expert's rows are contiguous (what a grouped GEMM's TMA tile loads need). A token whose
// several experts live on d crosses NVLink once: the sender writes its data into the row of its
// primary slot (of its slots on d, the one with the smallest expert) and, for every slot on d, the row's metadata
// (source token, primary row); the receiver then copies primary rows into the other slots' rows
// (local HBM traffic only) before the grouped GEMM reads them.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "weave/common/host_device.hpp"

namespace weave::moe {

struct Geometry {
  int world = 1, experts = 1;
  WEAVE_HD bool valid() const { return world > 0 && experts > 0 && experts % world == 0; }
  WEAVE_HD int local_experts() const { return experts / world; }
  WEAVE_HD int rank_of(int e) const { return e / local_experts(); }
  WEAVE_HD int local_of(int e) const { return e % local_experts(); }
  WEAVE_HD int expert(int rank, int local) const { return rank * local_experts() + local; }
};

WEAVE_HD inline bool valid_expert(int e, const Geometry& g) { return e >= 0 && e < g.experts; }

// Of the token's slots (k ids) whose experts live on the same rank as slot's, the one with the
// smallest expert id (the first such slot on a tie): that slot carries the token to the rank, the
// others on the rank reuse its row. The smallest expert, not the first slot, so that every row's
// data sits in an expert at or before the row's own in the receiver's layout: the fused
// dispatch_gemm sends expert after expert and may start an expert's GEMM tiles once it and the
// experts before it have arrived (dispatch_gemm_schedule.hpp).
WEAVE_HD inline int primary_slot(const int* idx_row, int k, const Geometry& g, int slot) {
  const int r = g.rank_of(idx_row[slot]);
  int best = slot;
  for (int j = 0; j < k; ++j)
    if (g.rank_of(idx_row[j]) == r && (idx_row[j] < idx_row[best] || (idx_row[j] == idx_row[best] && j < best)))
      best = j;
  return best;
}

// Sender side, rank s: its row of the count matrix (rows per expert, counts[E]) and the number of
// distinct tokens it sends to each rank (tokens[W], what crosses NVLink). Both are overwritten.
WEAVE_HD inline void count_rows(const int* topk_idx, int T, int k, const Geometry& g,
                                    int* counts) {
  for (int e = 0; e < g.experts; ++e) counts[e] = 0;
  for (int i = 0; i < T * k; ++i) counts[topk_idx[i]]++;
}
WEAVE_HD inline void count_tokens(const int* topk_idx, int T, int k, const Geometry& g,
                                      int* tokens) {
  for (int r = 0; r < g.world; ++r) tokens[r] = 0;
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j)
      if (primary_slot(topk_idx + t * k, k, g, j) == j) tokens[g.rank_of(topk_idx[t * k + j])]++;
}

// Receiver layout from the count matrix alone (any rank computes any rank's layout).
// Rows of expert e from all ranks:
WEAVE_HD inline int expert_rows(const int* counts, const Geometry& g, int e) {
  int n = 0;
  for (int s = 0; s < g.world; ++s) n += counts[s * g.experts + e];
  return n;
}
// First row of local expert l in rank d's grouped buffer (l = L: the rank's total rows).
WEAVE_HD inline int expert_begin(const int* counts, const Geometry& g, int d, int l) {
  int n = 0;
  for (int j = 0; j < l; ++j) n += expert_rows(counts, g, g.expert(d, j));
  return n;
}
WEAVE_HD inline int rank_rows(const int* counts, const Geometry& g, int d) {
  return expert_begin(counts, g, d, g.local_experts());
}
// First row of the block (local expert l, source s) in rank d's grouped buffer.
WEAVE_HD inline int block_begin(const int* counts, const Geometry& g, int d, int l, int s) {
  int n = expert_begin(counts, g, d, l);
  for (int j = 0; j < s; ++j) n += counts[j * g.experts + g.expert(d, l)];
  return n;
}

// Which (local expert, source rank) block of rank d holds grouped row `row` (< rank_rows): what a
// receiver needs to send an output row home (gemm_combine) given the row's source token.
struct RowOwner {
  int local = -1, src = -1;
};
WEAVE_HD inline RowOwner locate_row(const int* counts, const Geometry& g, int d, int row) {
  int n = 0;
  for (int l = 0; l < g.local_experts(); ++l)
    for (int s = 0; s < g.world; ++s) {
      n += counts[s * g.experts + g.expert(d, l)];
      if (row < n) return {l, s};
    }
  return {};
}

// Sender side, rank s: base[e] = first row of block (local_of(e), s) on rank_of(e), for every e.
WEAVE_HD inline void send_bases(const int* counts, const Geometry& g, int s, int* base) {
  for (int e = 0; e < g.experts; ++e) base[e] = block_begin(counts, g, g.rank_of(e), g.local_of(e), s);
}
// The rows of token t's k slots on their experts' ranks. cursor[e] counts rank s's rows to e
// already placed (all tokens before t): zero before token 0, or, in a kernel, an exclusive prefix
// over tokens. Advances cursor.
WEAVE_HD inline void place_token(const int* idx_row, int k, const int* base, int* cursor,
                                     int* rows) {
  for (int j = 0; j < k; ++j) rows[j] = base[idx_row[j]] + cursor[idx_row[j]]++;
}

// Capacity: the grouped buffer of rank d must hold rank_rows(d). The first local expert (in layout
// order) whose rows end past `capacity`, or -1: the expert the overflow error names.
WEAVE_HD inline int first_overflow(const int* counts, const Geometry& g, int d, int capacity) {
  int end = 0;
  for (int l = 0; l < g.local_experts(); ++l) {
    end += expert_rows(counts, g, g.expert(d, l));
    if (end > capacity) return l;
  }
  return -1;
}

// ---- host helpers ----

// The most rows one rank can receive when every token's k experts are distinct (a top-k router):
// all W * T tokens with min(k, L) experts on that rank. Repeated ids in a row make it W * T * k.
inline long long worst_case_rows(int T, int k, const Geometry& g) {
  const int per_token = k < g.local_experts() ? k : g.local_experts();
  return static_cast<long long>(g.world) * T * per_token;
}
// A receive capacity (rows per rank) safe for balanced routing: every (source, expert) pair given
// ceil(slack * ceil(T k / E)) rows, i.e. W L of those per rank (>= slack * T * k), never more than
// the worst case. slack >= 1; skewed routing needs more, all-to-one needs worst_case_rows.
inline int receive_capacity(int T, int k, const Geometry& g, double slack) {
  const long long even = (static_cast<long long>(T) * k + g.experts - 1) / g.experts;
  const long long per = static_cast<long long>(std::ceil(slack * static_cast<double>(even)));
  const long long cap = static_cast<long long>(g.world) * g.local_experts() * per;
  const long long worst = worst_case_rows(T, k, g);
  return static_cast<int>(cap < worst ? cap : worst);
}

// First (token * k + slot) whose expert id is out of range, or -1.
inline long long first_bad_slot(const int* topk_idx, int T, int k, const Geometry& g) {
  for (long long i = 0; i < static_cast<long long>(T) * k; ++i)
    if (!valid_expert(topk_idx[i], g)) return i;
  return -1;
}

// The first rank (ascending) whose rows exceed `capacity`, with the expert to name.
struct Overflow {
  int rank = -1, expert = -1;  // -1: no overflow
  int expert_rows = 0, rank_rows = 0, capacity = 0;
  bool any() const { return rank >= 0; }
  std::string message() const {
    return "moe dispatch: receive capacity " + std::to_string(capacity) + " rows exceeded on rank " +
           std::to_string(rank) + " at expert " + std::to_string(expert) + " (" +
           std::to_string(expert_rows) + " rows; " + std::to_string(rank_rows) +
           " rows for the rank in all)";
  }
};
inline Overflow check_capacity(const std::vector<int>& counts, const Geometry& g, int capacity) {
  Overflow o;
  for (int d = 0; d < g.world; ++d) {
    const int l = first_overflow(counts.data(), g, d, capacity);
    if (l < 0) continue;
    o.rank = d;
    o.expert = g.expert(d, l);
    o.expert_rows = expert_rows(counts.data(), g, o.expert);
    o.rank_rows = rank_rows(counts.data(), g, d);
    o.capacity = capacity;
    return o;
  }
  return o;
}

// Rank s's whole dispatch plan, from its routing and the count matrix:
// - tokens[d]: the distinct tokens it sends to rank d, ascending (each crosses NVLink once);
// - row[t * k + j]: the row of (t, j) in rank_of(topk_idx[t * k + j])'s grouped buffer, also
//   what combine reads back (with topk_weights[t * k + j]);
// - primary[t * k + j]: the slot whose row carries the token's data on that rank.
struct DispatchPlan {
  std::vector<std::vector<int>> tokens;
  std::vector<int> row, primary;
};
inline DispatchPlan plan_dispatch(const int* topk_idx, int T, int k, const Geometry& g, int s,
                                  const std::vector<int>& counts) {
  DispatchPlan p;
  p.tokens.assign(g.world, {});
  p.row.assign(static_cast<size_t>(T) * k, -1);
  p.primary.assign(static_cast<size_t>(T) * k, -1);
  std::vector<int> base(g.experts), cursor(g.experts, 0);
  send_bases(counts.data(), g, s, base.data());
  for (int t = 0; t < T; ++t) {
    const int* idx = topk_idx + static_cast<size_t>(t) * k;
    place_token(idx, k, base.data(), cursor.data(), p.row.data() + static_cast<size_t>(t) * k);
    for (int j = 0; j < k; ++j) {
      const int pj = primary_slot(idx, k, g, j);
      p.primary[static_cast<size_t>(t) * k + j] = pj;
      if (pj == j) p.tokens[g.rank_of(idx[j])].push_back(t);
    }
  }
  return p;
}

}  // namespace weave::moe
