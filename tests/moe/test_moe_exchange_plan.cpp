// The pure parts of the MoE exchange (kernels/moe/exchange_plan.hpp) on the CPU, against
// layout.hpp's host helpers:
// - the per-expert cursor computed as the kernels do (per-chunk histograms, their exclusive prefix
//   over chunks, then ranks inside each chunk) gives plan_dispatch's rows for every (token, slot),
//   for W in 1..8, several E, k in {1, 2, 3, 8}, T in {0, 1, 7, 257, 1500} and routings
//   with repeated ids, empty experts and all tokens on one expert;
// - judge() names what check_capacity and first_bad_slot name (an out-of-range id first, on the
//   first rank that has one), on random count matrices and capacities around the rows needed;
// - the verdict's messages name the expert and the counts (overflow) or rank, token, slot and id.
#include "moe/exchange_plan.hpp"  // first: compiles as plain C++

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

using namespace weave::moe;

namespace {

std::vector<int> routing(int kind, const Geometry& g, int T, int k, std::mt19937& rng) {
  std::vector<int> idx(static_cast<size_t>(T) * k);
  std::uniform_int_distribution<int> any(0, g.experts - 1), half(0, std::max(0, g.experts / 2 - 1));
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      int& e = idx[static_cast<size_t>(t) * k + j];
      if (kind == 0) e = any(rng);                 // random, repeats allowed
      else if (kind == 1) e = half(rng);           // half the experts empty
      else if (kind == 2) e = j == 0 ? 0 : any(rng);  // every token on expert 0
      else e = (t + j) % g.experts;                // balanced
    }
  return idx;
}

// The kernels' decomposition of the cursor, on the host.
std::vector<int> chunked_rows(const std::vector<int>& idx, int T, int k, const Geometry& g, int s,
                              const std::vector<int>& counts) {
  const long long n = static_cast<long long>(T) * k;
  const int chunks = num_chunks(n), E = g.experts;
  std::vector<int> hist(static_cast<size_t>(std::max(chunks, 1)) * E, 0);
  for (int c = 0; c < chunks; ++c)
    walk_chunk(idx.data(), static_cast<long long>(c) * kChunkEntries,
               std::min(n, static_cast<long long>(c + 1) * kChunkEntries), g, hist.data() + c * E, nullptr);
  std::vector<int> totals(E);
  for (int e = 0; e < E; ++e) totals[e] = chunk_prefix(hist.data(), chunks, E, e);
  std::vector<int> own(E);
  count_rows(idx.data(), T, k, g, own.data());
  EXPECT_EQ(totals, own);
  std::vector<int> base(E), rows(n, -1), place(kChunkEntries);
  send_bases(counts.data(), g, s, base.data());
  for (int c = 0; c < chunks; ++c) {
    const long long b = static_cast<long long>(c) * kChunkEntries, e_ = std::min(n, b + kChunkEntries);
    std::vector<int> cur(hist.begin() + c * E, hist.begin() + (c + 1) * E);
    walk_chunk(idx.data(), b, e_, g, cur.data(), place.data());
    for (long long i = b; i < e_; ++i) rows[i] = base[idx[i]] + place[i - b];
  }
  return rows;
}

}  // namespace

TEST(MoeExchangePlan, ChunkedCursorEqualsPlaceToken) {
  std::mt19937 rng(1234);
  for (int W = 1; W <= 8; ++W)
    for (int per : {1, 2, 8})
      for (int k : {1, 2, 3, 8})
        for (int T : {0, 1, 7, 257, 1500})
          for (int kind = 0; kind < 4; ++kind) {
            const Geometry g{W, W * per};
            std::vector<std::vector<int>> idx(W);
            std::vector<int> counts(static_cast<size_t>(W) * g.experts);
            for (int s = 0; s < W; ++s) {
              idx[s] = routing(kind, g, T + s, k, rng);  // T differs across ranks
              count_rows(idx[s].data(), T + s, k, g, counts.data() + s * g.experts);
            }
            for (int s = 0; s < W; ++s) {
              const DispatchPlan p = plan_dispatch(idx[s].data(), T + s, k, g, s, counts);
              ASSERT_EQ(chunked_rows(idx[s], T + s, k, g, s, counts), p.row)
                  << "W " << W << " E " << g.experts << " k " << k << " T " << T + s << " kind " << kind;
            }
          }
}

TEST(MoeExchangePlan, WalkSkipsOutOfRangeIds) {
  const Geometry g{2, 4};
  const std::vector<int> idx = {0, 4, 0, -1, 3, 0};
  std::vector<int> cur(4, 0), place(idx.size());
  walk_chunk(idx.data(), 0, static_cast<long long>(idx.size()), g, cur.data(), place.data());
  EXPECT_EQ(place, (std::vector<int>{0, -1, 1, -1, 0, 2}));
  EXPECT_EQ(cur, (std::vector<int>{3, 0, 0, 1}));
}

TEST(MoeExchangePlan, VerdictMatchesCheckCapacity) {
  std::mt19937 rng(99);
  for (int W = 1; W <= 8; ++W)
    for (int per : {1, 3, 8})
      for (int trial = 0; trial < 200; ++trial) {
        const Geometry g{W, W * per};
        std::vector<int> counts(static_cast<size_t>(W) * g.experts);
        std::uniform_int_distribution<int> u(0, trial % 3 == 0 ? 0 : 40);
        for (int& c : counts) c = u(rng);
        int most = 0;
        for (int d = 0; d < W; ++d) most = std::max(most, rank_rows(counts.data(), g, d));
        const int capacity = std::max(1, most - static_cast<int>(rng() % 20) + 10);
        std::vector<int> bad_slot(W, -1), bad_value(W, 0);
        const Verdict v = judge(counts.data(), bad_slot.data(), bad_value.data(), g, 2, capacity);
        const Overflow o = check_capacity(counts, g, capacity);
        ASSERT_EQ(v.ok(), !o.any());
        if (o.any()) {
          EXPECT_EQ(v.kind, kVerdictOverflow);
          EXPECT_EQ(v.rank, o.rank);
          EXPECT_EQ(v.expert, o.expert);
          EXPECT_EQ(v.expert_rows, o.expert_rows);
          EXPECT_EQ(v.rank_rows, o.rank_rows);
          EXPECT_EQ(v.message(), o.message() + "; nothing was dispatched");
        }
        // An out-of-range id on some ranks wins over any overflow: the first such rank is named.
        if (W > 1 && trial % 2) {
          const int r1 = static_cast<int>(rng() % W), r2 = static_cast<int>(rng() % W);
          bad_slot[r1] = 17, bad_value[r1] = g.experts + 3;
          bad_slot[r2] = 5, bad_value[r2] = -2;
          const Verdict b = judge(counts.data(), bad_slot.data(), bad_value.data(), g, 4, capacity);
          EXPECT_EQ(b.kind, kVerdictBadExpert);
          EXPECT_EQ(b.rank, std::min(r1, r2));
          EXPECT_EQ(b.slot, bad_slot[b.rank]);
          EXPECT_EQ(b.expert, bad_value[b.rank]);
        }
      }
}

TEST(MoeExchangePlan, Messages) {
  Verdict b;
  b.kind = kVerdictBadExpert, b.rank = 1, b.expert = 70, b.slot = 4 * 9 + 3, b.topk = 4;
  EXPECT_EQ(b.message(),
            "moe dispatch: expert id 70 on rank 1 (token 9, slot 3) is outside 0..E-1; nothing was dispatched");
  Verdict o;
  o.kind = kVerdictOverflow, o.rank = 0, o.expert = 2, o.expert_rows = 300, o.rank_rows = 310, o.capacity = 256;
  EXPECT_EQ(o.message(),
            "moe dispatch: receive capacity 256 rows exceeded on rank 0 at expert 2 (300 rows; 310 rows for the rank "
            "in all); nothing was dispatched");
  EXPECT_EQ(Verdict{}.message(), "");
}

TEST(MoeExchangePlan, RowFields) {
  EXPECT_EQ(row_ints(64), 64 + kRowExtra);
  EXPECT_EQ(num_chunks(0), 0);
  EXPECT_EQ(num_chunks(1), 1);
  EXPECT_EQ(num_chunks(kChunkEntries), 1);
  EXPECT_EQ(num_chunks(kChunkEntries + 1), 2);
}
