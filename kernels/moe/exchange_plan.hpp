// The pure parts of the non-fused MoE dispatch / combine (exchange.cu), callable from device code
// and CPU-tested in tests/moe/test_moe_exchange_plan.cpp against layout.hpp's host helpers:
// - the row each rank broadcasts in the count exchange (its E counts and what it found wrong);
// - the per-expert cursor of place_token as a prefix over token chunks (a chunk's histogram,
//   the exclusive prefix of the histograms over chunks, then ranks inside the chunk), which is
//   how the kernels compute it in parallel;
// - the call's verdict from the exchanged rows: every rank judges the same matrix with the same
//   code, so every rank reaches the same verdict with no further communication.
#pragma once
#include <climits>
#include <string>

#include "moe/layout.hpp"
#include "weave/common/host_device.hpp"

namespace weave::moe {

// Limits of the exchange kernels: k ids of a token sit in one warp's lanes (and a warp keeps a
// token's k row pointers in shared memory), an exchanged row of E + kRowExtra ints per rank sits
// in one block's shared memory for the whole W x E matrix.
constexpr int kMaxTopk = 16;
constexpr int kMaxExchangeExperts = 1024;

// The exchanged row of rank s: counts[e] for e < E, then these fields.
enum RowField : int {
  kRowBadSlot = 0,   // the first out-of-range (token * k + slot) of rank s, -1 if none
  kRowBadValue = 1,  // the id found there
  kRowTokens = 2,    // T of rank s
  kRowExtra = 4,     // the fields above and one spare
};
WEAVE_HD inline int row_ints(int experts) { return experts + kRowExtra; }

// Entries (token * k + slot, in that order) per chunk: one warp walks a chunk 32 entries at a
// time, so a chunk's order is the layout's (token, slot) order.
constexpr int kChunkEntries = 512;
WEAVE_HD inline int num_chunks(long long entries) {
  return static_cast<int>((entries + kChunkEntries - 1) / kChunkEntries);
}

// hist[c * E + e] (rows of chunk c routed to e) becomes the exclusive prefix over chunks for
// expert e: the cursor of e at chunk c's first entry. Returns the total (the count of e). On the
// device one thread runs it per expert on the count exchange's critical path: the loads of a
// batch are issued before the first store, so it waits for chunks / 16 memory round trips, not
// one per chunk.
WEAVE_HD inline int chunk_prefix(int* hist, int chunks, int experts, int e) {
  constexpr int kBatch = 16;
  int n = 0;
  for (int c0 = 0; c0 < chunks; c0 += kBatch) {
    int h[kBatch];
    for (int u = 0; u < kBatch; ++u)
      h[u] = c0 + u < chunks ? hist[static_cast<long long>(c0 + u) * experts + e] : 0;
    for (int u = 0; u < kBatch; ++u)
      if (c0 + u < chunks) {
        hist[static_cast<long long>(c0 + u) * experts + e] = n;
        n += h[u];
      }
  }
  return n;
}

// The host form of one chunk's walk (the kernel does it with warp matches): entries [begin, end)
// of topk_idx advance cursor[e] (counts before the chunk, or zero for a histogram), each valid
// entry's place (cursor before it) written to place[i - begin] when place is non-null.
WEAVE_HD inline void walk_chunk(const int* topk_idx, long long begin, long long end, const Geometry& g,
                                     int* cursor, int* place) {
  for (long long i = begin; i < end; ++i) {
    const int e = topk_idx[i];
    const int p = valid_expert(e, g) ? cursor[e]++ : -1;
    if (place) place[i - begin] = p;
  }
}

// What every rank concludes from the exchanged rows (rows[s * row_ints(E) + ...]).
enum VerdictKind : int { kVerdictOk = 0, kVerdictBadExpert = 1, kVerdictOverflow = 2 };
struct Verdict {
  int kind = kVerdictOk;
  int rank = -1;            // bad expert: the source rank; overflow: the receiving rank
  int expert = -1;          // bad expert: the id found; overflow: the expert named (global id)
  int expert_rows = 0, rank_rows = 0, capacity = 0;  // overflow
  long long slot = -1;      // bad expert: token * k + slot on that rank
  int topk = 0;
  WEAVE_HD bool ok() const { return kind == kVerdictOk; }
  std::string message() const {
    if (kind == kVerdictBadExpert)
      return "moe dispatch: expert id " + std::to_string(expert) + " on rank " + std::to_string(rank) +
             " (token " + std::to_string(slot / topk) + ", slot " + std::to_string(slot % topk) +
             ") is outside 0..E-1; nothing was dispatched";
    if (kind == kVerdictOverflow) {
      Overflow o;
      o.rank = rank, o.expert = expert, o.expert_rows = expert_rows, o.rank_rows = rank_rows, o.capacity = capacity;
      return o.message() + "; nothing was dispatched";
    }
    return "";
  }
};

// An out-of-range id on any rank wins (the first rank that has one), else the first rank whose
// rows exceed `capacity` at its first expert past it (check_capacity's choice). `counts` is the
// dense W x E matrix; bad_slot[s] / bad_value[s] each rank's own finding (-1: none).
WEAVE_HD inline Verdict judge(const int* counts, const int* bad_slot, const int* bad_value, const Geometry& g,
                                   int topk, int capacity) {
  Verdict v;
  v.topk = topk;
  for (int s = 0; s < g.world; ++s)
    if (bad_slot[s] >= 0) {
      v.kind = kVerdictBadExpert;
      v.rank = s;
      v.expert = bad_value[s];
      v.slot = bad_slot[s];
      return v;
    }
  for (int d = 0; d < g.world; ++d) {
    const int l = first_overflow(counts, g, d, capacity);
    if (l < 0) continue;
    v.kind = kVerdictOverflow;
    v.rank = d;
    v.expert = g.expert(d, l);
    v.expert_rows = expert_rows(counts, g, v.expert);
    v.rank_rows = rank_rows(counts, g, d);
    v.capacity = capacity;
    return v;
  }
  return v;
}

// What the receiver's grouped buffer says about each row (written by the sender with the row's
// data): which token of which rank it is, and the row holding the data (itself for a primary
// slot, the primary slot's row otherwise: the receiver copies that row here).
struct RowMeta {
  int src, token, primary, slot;
};

}  // namespace weave::moe
