// The pure parts of the MoE low-latency (decode) mode (low_latency.hpp; design and reasons:
// README.md, "Low-latency mode"): where every (token, slot) row of a call lands, computed by the
// sender and the receiver from the router output alone, with no count exchange before the rows
// move. `__host__ __device__`: the kernels (low_latency_kernels.cuh) call them, and
// tests/moe/test_moe_low_latency_cpu.cpp checks them against a brute-force layout on the CPU.
//
// Layout of rank d's receive buffer (L x S rows of H, S = row_stride = W x max_tokens): local
// expert l owns rows [l S, l S + count[l]), packed; inside it the sources come in *rotated* order
// (position q holds source rank (d + q) mod W: this rank's own rows first), and each source's rows
// in ascending (token, slot) order. A source may put at most max_tokens rows on one expert (only a
// token naming an expert twice can exceed it; the call then fails on every rank), so the W
// sources of an expert never overflow its S rows.
#pragma once
#include <climits>
#include <string>
#include <vector>

#include "moe/layout.hpp"
#include "weave/common/host_device.hpp"
#include "weave/config.hpp"

namespace weave::moe {

// Limits: tokens per rank and call (the mode's purpose: decode batches), top-k (a token's ids sit
// in one block's shared memory), experts (histograms and the L x W tables in shared memory).
constexpr int kLlMaxTokens = 256;
constexpr int kLlMaxTopk = 16;
constexpr int kLlMaxExperts = 1024;
// Threads per block of both kernels; every block holds all T k ids of its rank, kLlPerThread per
// thread (entry i of the row-major T x k ids is held by thread i % kLlThreads, as its i / kLlThreads-th).
constexpr int kLlThreads = 512;
constexpr int kLlMaxEntries = kLlMaxTokens * kLlMaxTopk;
constexpr int kLlPerThread = kLlMaxEntries / kLlThreads;

WEAVE_HD inline int ll_row_stride(int world, int max_tokens) { return world * max_tokens; }

// The blocks of both kernels (the same on every rank: `sms` is the smallest SM count of all ranks):
// at most one per SM, so that every block of a grid is resident at once (the kernels wait for the
// peers' grids, which wait for theirs), and no more than there are token slots. Block b handles
// tokens b, b + B, b + 2B, ...
WEAVE_HD inline int ll_blocks(int sms, int max_tokens) {
  const int b = sms < max_tokens ? sms : max_tokens;
  return b > 0 ? b : 1;
}

// ---- Sources in rotated order ----
// Position of source rank s among rank d's sources, and the source at position q.
WEAVE_HD inline int ll_source_pos(int s, int d, int world) { return (s - d + world) % world; }
WEAVE_HD inline int ll_source_at(int q, int d, int world) { return (d + q) % world; }

// ---- The sender's view of one (token, slot) ----
// within(i): the entries before entry i (= t k + j) of this rank's ids that name the same expert,
// i.e. the row's place among this rank's rows of that expert. The kernel splits the count over its
// threads: ll_partial_within is thread `tid`'s share (the entries it holds, i % threads == tid), and
// the shares of all threads sum to within (the CPU test checks it).
WEAVE_HD inline int ll_partial_within(const int* ids, int n, int tid, int threads, int limit, int e) {
  int c = 0;
  for (int i = tid; i < n && i < limit; i += threads) c += ids[i] == e ? 1 : 0;
  return c;
}
inline int ll_within(const int* ids, int i) {
  int c = 0;
  for (int p = 0; p < i; ++p) c += ids[p] == ids[i] ? 1 : 0;
  return c;
}

// What rank d learns about a (token, slot) of a source: its local expert and place (a route code),
// or kLlNoSlot when the slot's expert is not on d. One int per (source, token, slot) on each rank.
constexpr int kLlNoSlot = -1;
WEAVE_HD inline int ll_code(int local, int within) { return local * kLlMaxEntries + within; }
WEAVE_HD inline int ll_code_local(int code) { return code / kLlMaxEntries; }
WEAVE_HD inline int ll_code_within(int code) { return code % kLlMaxEntries; }
WEAVE_HD inline int ll_route_code(int e, int within, const Geometry& g, int d) {
  return valid_expert(e, g) && g.rank_of(e) == d ? ll_code(g.local_of(e), within) : kLlNoSlot;
}

// The ranks that hold at least one of a token's (valid) experts: its row goes once to each of them
// (bit r set), its k route codes to every rank.
WEAVE_HD inline unsigned ll_dest_mask(const int* ids, int k, const Geometry& g) {
  unsigned m = 0;
  for (int j = 0; j < k; ++j)
    if (valid_expert(ids[j], g)) m |= 1u << g.rank_of(ids[j]);
  return m;
}

// Where source s's rows of each of rank d's experts start inside the expert's region: cnt[l W + s]
// (rows of local expert l from source s) -> off[l W + s], the exclusive prefix over the sources in
// rotated order; total[l] (may be null): the expert's rows.
WEAVE_HD inline void ll_offsets(const int* cnt, int L, int world, int d, int* off, int* total) {
  for (int l = 0; l < L; ++l) {
    int run = 0;
    for (int q = 0; q < world; ++q) {
      const int s = ll_source_at(q, d, world);
      off[l * world + s] = run;
      run += cnt[l * world + s];
    }
    if (total) total[l] = run;
  }
}

// Receive-buffer row of a (token, slot) of source s on its expert's rank: route code `code`, the
// rank's offsets off (L x W), row stride S.
WEAVE_HD inline int ll_packed_row(int code, const int* off, int world, int s, int row_stride) {
  const int l = ll_code_local(code);
  return l * row_stride + off[l * world + s] + ll_code_within(code);
}

// Combine: the landing row of home token t's slot j (max_tokens x k rows per rank), written by the
// slot's expert's rank when that is not the home rank.
WEAVE_HD inline long long ll_landing_row(int t, int j, int k) { return static_cast<long long>(t) * k + j; }

// Combine, on the home rank s of token t: where slot j's expert output is read. `code` is the
// slot's route code for s itself (ll_route_code(e, within, g, s)): an expert of s -> its row of s's
// own expert outputs (local = true); else the landing row t k + j, which the expert's rank wrote.
WEAVE_HD inline long long ll_home_row(int code, const int* off, int world, int s, int row_stride, int t, int j, int k,
                                      bool* local) {
  *local = code != kLlNoSlot;
  if (*local) return ll_packed_row(code, off, world, s, row_stride);
  return ll_landing_row(t, j, k);
}

// ---- Each source's header (every rank sends one to every peer; the receiver judges all W) ----
enum LlHeaderField : int {
  kLlHdrTokens = 0,      // T of the source
  kLlHdrBadSlot = 1,     // the first out-of-range entry (t k + j), -1 if none
  kLlHdrBadValue = 2,    // the id found there
  kLlHdrOverExpert = 3,  // the first expert (global id) with more than max_tokens of the source's rows, -1 if none
  kLlHdrOverRows = 4,    // its rows
  kLlHdrCounts = 8,      // then L counts: the source's rows of each of the receiver's local experts
};
WEAVE_HD inline int ll_header_ints(int L) { return (kLlHdrCounts + L + 3) / 4 * 4; }  // 16-byte rows

// What a source finds wrong with its own ids (every block of its grid finds the same).
struct LlSourceCheck {
  int bad_slot = -1, bad_value = 0;  // the first entry outside 0..E-1 and its id
  int over_expert = -1, over_rows = 0;  // the first expert with more than max_tokens rows, and its rows
  WEAVE_HD bool ok() const { return bad_slot < 0 && over_expert < 0; }
};
// hist: the source's rows per expert (valid ids only).
WEAVE_HD inline LlSourceCheck ll_check_source(const int* ids, int n, const int* hist, const Geometry& g,
                                              int max_tokens) {
  LlSourceCheck c;
  for (int i = 0; i < n; ++i)
    if (!valid_expert(ids[i], g)) {
      c.bad_slot = i, c.bad_value = ids[i];
      break;
    }
  for (int e = 0; e < g.experts; ++e)
    if (hist[e] > max_tokens) {
      c.over_expert = e, c.over_rows = hist[e];
      break;
    }
  return c;
}

// The call's verdict, from the W sources' checks (each rank judges the same W headers, so every
// rank reaches the same verdict): the first source rank with a problem, an out-of-range id before
// an overfull expert.
enum LlVerdictKind : int { kLlOk = 0, kLlBadExpert = 1, kLlTooManyRows = 2 };
struct LlVerdict {
  int kind = kLlOk;
  int rank = -1;          // the source rank
  int expert = -1;        // bad expert: the id found; too many rows: the expert (global id)
  int rows = 0;           // too many rows: the source's rows of that expert
  int slot = -1;          // bad expert: t k + j on that rank
  int topk = 0, max_tokens = 0;
  WEAVE_HD bool ok() const { return kind == kLlOk; }
  std::string message() const {
    if (kind == kLlBadExpert)
      return "moe low-latency dispatch: expert id " + std::to_string(expert) + " on rank " + std::to_string(rank) +
             " (token " + std::to_string(slot / topk) + ", slot " + std::to_string(slot % topk) +
             ") is outside 0..E-1; nothing was dispatched";
    if (kind == kLlTooManyRows)
      return "moe low-latency dispatch: rank " + std::to_string(rank) + " routes " + std::to_string(rows) +
             " rows to expert " + std::to_string(expert) + ", more than max_tokens (" + std::to_string(max_tokens) +
             "; a token names that expert more than once); nothing was dispatched";
    return "";
  }
};
// check_of(s) returns source s's LlSourceCheck (the kernel reads them from shared memory).
template <class CheckOf>
WEAVE_HD LlVerdict ll_judge_by(CheckOf&& check_of, int world, int topk, int max_tokens) {
  LlVerdict v;
  v.topk = topk, v.max_tokens = max_tokens;
  for (int s = 0; s < world; ++s) {
    const LlSourceCheck c = check_of(s);
    if (c.bad_slot >= 0) {
      v.kind = kLlBadExpert, v.rank = s, v.expert = c.bad_value, v.slot = c.bad_slot;
      return v;
    }
    if (c.over_expert >= 0) {
      v.kind = kLlTooManyRows, v.rank = s, v.expert = c.over_expert, v.rows = c.over_rows;
      return v;
    }
  }
  return v;
}
WEAVE_HD inline LlVerdict ll_judge(const LlSourceCheck* src, int world, int topk, int max_tokens) {
  return ll_judge_by([&](int s) { return src[s]; }, world, topk, max_tokens);
}

// Per receive-buffer row: which (source, token, slot) it holds and the global expert.
struct LlRowMeta {
  int src, token, slot, expert;
};

// ---- Host: the whole call as every rank's kernels compute it (the tests' reference) ----
struct LlPlan {
  Geometry g;
  int k = 0, max_tokens = 0, stride = 0;
  LlVerdict verdict;
  std::vector<int> cnt;    // [d][l][s]: rows of rank d's local expert l from source s
  std::vector<int> off;    // [d][l][s]: where they start in the expert's region (ll_offsets)
  std::vector<int> total;  // [d][l]: the expert's rows
  std::vector<std::vector<int>> code;  // code[s][i]: route code of source s's entry i for its expert's rank
  std::vector<std::vector<int>> row;   // row[s][i]: receive row on the expert's rank (-1: invalid id)
  int rows_of(int d, int l) const { return total[static_cast<size_t>(d) * g.local_experts() + l]; }
};

// idx[s]: source s's T[s] x k ids.
inline LlPlan ll_plan(const std::vector<const int*>& idx, const std::vector<int>& T, int k, const Geometry& g,
                      int max_tokens) {
  const int W = g.world, L = g.local_experts(), E = g.experts;
  LlPlan p;
  p.g = g, p.k = k, p.max_tokens = max_tokens, p.stride = ll_row_stride(W, max_tokens);
  p.cnt.assign(static_cast<size_t>(W) * L * W, 0);
  p.off.assign(p.cnt.size(), 0);
  p.total.assign(static_cast<size_t>(W) * L, 0);
  std::vector<LlSourceCheck> checks(W);
  for (int s = 0; s < W; ++s) {
    const int n = T[s] * k;
    std::vector<int> hist(E, 0);  // also the running place of each expert (ll_within, in one pass)
    std::vector<int>& code = p.code.emplace_back(n, kLlNoSlot);
    for (int i = 0; i < n; ++i) {
      const int e = idx[s][i];
      if (!valid_expert(e, g)) continue;
      code[i] = ll_route_code(e, hist[e]++, g, g.rank_of(e));
    }
    checks[s] = ll_check_source(idx[s], n, hist.data(), g, max_tokens);
    for (int e = 0; e < E; ++e)
      p.cnt[(static_cast<size_t>(g.rank_of(e)) * L + g.local_of(e)) * W + s] = hist[e];
  }
  p.verdict = ll_judge(checks.data(), W, k, max_tokens);
  for (int d = 0; d < W; ++d)
    ll_offsets(p.cnt.data() + static_cast<size_t>(d) * L * W, L, W, d, p.off.data() + static_cast<size_t>(d) * L * W,
               p.total.data() + static_cast<size_t>(d) * L);
  for (int s = 0; s < W; ++s) {
    std::vector<int>& row = p.row.emplace_back(p.code[s].size(), -1);
    for (size_t i = 0; i < row.size(); ++i) {
      if (p.code[s][i] == kLlNoSlot) continue;
      const int d = g.rank_of(idx[s][i]);
      row[i] = ll_packed_row(p.code[s][i], p.off.data() + static_cast<size_t>(d) * L * W, W, s, p.stride);
    }
  }
  return p;
}

}  // namespace weave::moe
