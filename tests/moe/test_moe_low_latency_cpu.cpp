// The pure layout of the MoE low-latency mode (kernels/moe/low_latency_schedule.hpp) on the CPU,
// for W = 2..8, E = W..64, k = 1, 2, 8, 16, T = 0, 1, 37, 255, 256 (different per rank too) and
// random, skewed and adversarial routings (every token on one expert, all of a token's slots on
// one expert, repeated ids, every token's experts on one rank):
// - the sender's pieces (route codes from each slot's place, the block-split place count, the
//   destination mask) composed as the kernels compose them (ll_plan) give exactly the receive
//   layout built independently by brute force: per local expert, sources in rotated order (the
//   receiver's own rank first), then (token, slot) ascending; every (token, slot) lands exactly
//   once, inside its expert's region [l S, l S + count), no two on one row, counts and per-source
//   counts and offsets right, count <= S;
// - the staging slot of a (source, token) on a rank is written exactly when the token has an
//   expert there, by that source only;
// - combine: every home (token, slot) reads the row that holds its expert's output: its own
//   receive row for a local expert, else the landing row t k + j, which exactly one rank (the
//   expert's) writes, from the receive row holding (source, token, slot);
// - the verdict: an out-of-range id or a source with more than max_tokens rows on one expert fails
//   the call, naming the first such rank (ids before row counts), with the messages check() throws;
// - the block split: every token of every source handled by exactly one block.
#include "moe/low_latency_schedule.hpp"  // first: the header compiles as plain C++, without CUDA

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "check/seed.hpp"

using namespace weave::moe;

namespace {

enum class Routing { random, skewed, all_to_one, one_expert_all_slots, repeats, same_rank, balanced };
const char* name(Routing r) {
  const char* n[] = {"random", "skewed", "all_to_one", "one_expert_all_slots", "repeats", "same_rank", "balanced"};
  return n[static_cast<int>(r)];
}

std::mt19937_64& rng() {
  static std::mt19937_64 g(weave::check::derive(weave::check::test_seed(), 0x11A7));
  return g;
}

// k distinct experts of [0, limit) (k <= limit), uniform or with weights p.
void distinct(int limit, int k, const std::vector<double>& p, int* out) {
  std::vector<char> used(limit, 0);
  std::discrete_distribution<int> pick(p.begin(), p.end());
  for (int j = 0; j < k; ++j) {
    int e = -1;
    for (int tries = 0; tries < 64 && e < 0; ++tries) {
      const int c = p.empty() ? static_cast<int>(rng()() % limit) : pick(rng());
      if (!used[c]) e = c;
    }
    for (int c = 0; e < 0 && c < limit; ++c)  // a skewed draw that keeps hitting used experts
      if (!used[c]) e = c;
    used[e] = 1;
    out[j] = e;
  }
}

std::vector<int> route(Routing r, const Geometry& g, int T, int k, int s) {
  const int E = g.experts, L = g.local_experts();
  std::vector<int> idx(static_cast<size_t>(T) * k);
  std::vector<double> pop;
  if (r == Routing::skewed) {
    std::gamma_distribution<double> gam(0.3, 1.0);
    for (int e = 0; e < E; ++e) pop.push_back(gam(rng()) + 1e-9);
  }
  for (int t = 0; t < T; ++t) {
    int* row = idx.data() + static_cast<size_t>(t) * k;
    switch (r) {
      case Routing::random: distinct(E, std::min(k, E), {}, row); break;
      case Routing::skewed: distinct(E, std::min(k, E), pop, row); break;
      case Routing::balanced:
        for (int j = 0; j < k; ++j) row[j] = (t * k + j + s) % E;
        break;
      case Routing::all_to_one:  // slot 0 of every token on expert 0, the others distinct
        distinct(E, std::min(k, E), {}, row);
        for (int j = 1; j < k; ++j)
          if (row[j] == 0) row[j] = row[0];
        row[0] = 0;
        break;
      case Routing::one_expert_all_slots:  // every slot of every token on one expert
        for (int j = 0; j < k; ++j) row[j] = E - 1;
        break;
      case Routing::repeats:
        for (int j = 0; j < k; ++j) row[j] = static_cast<int>(rng()() % E);
        break;
      case Routing::same_rank: {
        const int d = static_cast<int>(rng()() % g.world);
        for (int j = 0; j < k; ++j) row[j] = g.expert(d, static_cast<int>(rng()() % L));
        break;
      }
    }
    if (r != Routing::repeats && r != Routing::one_expert_all_slots && r != Routing::same_rank && k > E)
      for (int j = E; j < k; ++j) row[j] = row[j % E];  // more slots than experts: ids repeat
  }
  return idx;
}

struct Call {
  Geometry g;
  int k, max_tokens;
  std::vector<int> T;
  std::vector<std::vector<int>> idx;
  std::vector<const int*> ptrs() const {
    std::vector<const int*> p;
    for (const auto& v : idx) p.push_back(v.data());
    return p;
  }
};

// The receive layout of rank d, by brute force: per local expert, sources in rotated order, then
// (token, slot) ascending. want[s][i] = row on the expert's rank (-1: invalid id).
std::vector<std::vector<int>> brute_rows(const Call& c, std::vector<int>& total) {
  const Geometry& g = c.g;
  const int W = g.world, L = g.local_experts(), S = W * c.max_tokens;
  std::vector<std::vector<int>> want(W);
  for (int s = 0; s < W; ++s) want[s].assign(c.idx[s].size(), -1);
  total.assign(static_cast<size_t>(W) * L, 0);
  for (int d = 0; d < W; ++d)
    for (int l = 0; l < L; ++l) {
      int pos = 0;
      for (int q = 0; q < W; ++q) {
        const int s = (d + q) % W;
        for (size_t i = 0; i < c.idx[s].size(); ++i)
          if (c.idx[s][i] == g.expert(d, l)) want[s][i] = l * S + pos++;
      }
      total[static_cast<size_t>(d) * L + l] = pos;
    }
  return want;
}

// Every check of one call whose verdict must be ok.
void check_call(const Call& c, const std::string& what) {
  SCOPED_TRACE(what);
  const Geometry& g = c.g;
  const int W = g.world, L = g.local_experts(), k = c.k, S = ll_row_stride(W, c.max_tokens);
  const LlPlan p = ll_plan(c.ptrs(), c.T, k, g, c.max_tokens);
  ASSERT_TRUE(p.verdict.ok()) << p.verdict.message();
  ASSERT_EQ(p.stride, S);
  std::vector<int> total;
  const auto want = brute_rows(c, total);
  // Each entry's place among its rank's rows of its expert, by a running count per expert.
  std::vector<std::vector<int>> within(W);
  for (int s = 0; s < W; ++s) {
    std::map<int, int> run;
    for (int e : c.idx[s]) within[s].push_back(run[e]++);
  }
  // The layout: rows, counts, per-source counts and offsets.
  for (int d = 0; d < W; ++d)
    for (int l = 0; l < L; ++l) {
      ASSERT_EQ(p.rows_of(d, l), total[static_cast<size_t>(d) * L + l]) << "count of rank " << d << " expert " << l;
      ASSERT_LE(p.rows_of(d, l), S) << "an expert's rows past its stride";
      int run = 0;
      for (int q = 0; q < W; ++q) {
        const int s = (d + q) % W;
        const size_t at = (static_cast<size_t>(d) * L + l) * W + s;
        int n = 0;
        for (int e : c.idx[s]) n += e == g.expert(d, l);
        ASSERT_EQ(p.cnt[at], n);
        ASSERT_EQ(p.off[at], run) << "offset of source " << s << " on rank " << d << " expert " << l;
        run += n;
      }
    }
  std::vector<std::set<int>> used(W);
  for (int s = 0; s < W; ++s)
    for (size_t i = 0; i < c.idx[s].size(); ++i) {
      const int e = c.idx[s][i];
      ASSERT_EQ(p.row[s][i], want[s][i]) << "rank " << s << " entry " << i << " (expert " << e << ")";
      const int d = g.rank_of(e), l = g.local_of(e);
      ASSERT_GE(p.row[s][i], l * S);
      ASSERT_LT(p.row[s][i], l * S + p.rows_of(d, l));
      ASSERT_TRUE(used[d].insert(p.row[s][i]).second) << "two (token, slot) on row " << p.row[s][i] << " of rank " << d;
      // The route code seen by the expert's rank, by every other rank (none), and its place.
      for (int r = 0; r < W; ++r) {
        const int code = ll_route_code(e, within[s][i], g, r);
        if (r != d) ASSERT_EQ(code, kLlNoSlot);
        else ASSERT_EQ(code, p.code[s][i]);
      }
      ASSERT_EQ(ll_code_local(p.code[s][i]), l);
    }
  for (int d = 0; d < W; ++d) {
    size_t n = 0;
    for (int l = 0; l < L; ++l) n += p.rows_of(d, l);
    ASSERT_EQ(used[d].size(), n) << "every received row is some (token, slot)'s";
  }
  // The sender's place count split over a block's threads (as the kernel does) sums to the place.
  for (int s = 0; s < W; ++s) {
    const int n = static_cast<int>(c.idx[s].size());
    for (int i = 0; i < n; i += std::max(1, n / 17)) {
      const int e = c.idx[s][i];
      for (int threads : {1, 7, 32, kLlThreads}) {
        int sum = 0;
        for (int tid = 0; tid < threads; ++tid) sum += ll_partial_within(c.idx[s].data(), n, tid, threads, i, e);
        ASSERT_EQ(sum, within[s][i]) << threads << " threads, entry " << i;
        ASSERT_EQ(ll_within(c.idx[s].data(), i), within[s][i]);
      }
    }
  }
  // Staging: (s, t) written on rank d exactly when the token has an expert there (and d != s).
  for (int s = 0; s < W; ++s)
    for (int t = 0; t < c.T[s]; ++t) {
      const int* ids = c.idx[s].data() + static_cast<size_t>(t) * k;
      const unsigned m = ll_dest_mask(ids, k, g);
      for (int d = 0; d < W; ++d) {
        bool has = false;
        for (int j = 0; j < k; ++j) has |= g.rank_of(ids[j]) == d;
        ASSERT_EQ((m >> d & 1u) != 0, has) << "token " << t << " of rank " << s << " to rank " << d;
      }
    }
  // Combine: each rank d pushes, for every source s != d and token t, the rows of its slots on d to
  // s's landing row t k + j; every home reads its slots from there or from its own receive rows.
  for (int s = 0; s < W; ++s) {
    std::map<long long, int> landed;  // landing row of home s -> the receive row (on its expert's rank) it came from
    for (int d = 0; d < W; ++d) {
      if (d == s) continue;
      const int* off_d = p.off.data() + static_cast<size_t>(d) * L * W;
      for (int t = 0; t < c.T[s]; ++t)
        for (int j = 0; j < k; ++j) {
          const size_t i = static_cast<size_t>(t) * k + j;
          const int code = ll_route_code(c.idx[s][i], within[s][i], g, d);
          if (code == kLlNoSlot) continue;
          const long long dst = ll_landing_row(t, j, k);
          ASSERT_TRUE(landed.emplace(dst, ll_packed_row(code, off_d, W, s, S)).second)
              << "landing row " << dst << " of rank " << s << " written twice";
        }
    }
    const int* off_s = p.off.data() + static_cast<size_t>(s) * L * W;
    for (int t = 0; t < c.T[s]; ++t)
      for (int j = 0; j < k; ++j) {
        const size_t i = static_cast<size_t>(t) * k + j;
        const int code = ll_route_code(c.idx[s][i], within[s][i], g, s);
        bool local = false;
        const long long row = ll_home_row(code, off_s, W, s, S, t, j, k, &local);
        ASSERT_EQ(local, g.rank_of(c.idx[s][i]) == s);
        if (local) {
          ASSERT_EQ(row, want[s][i]) << "home " << s << " reads its own expert output of (" << t << ", " << j << ")";
          ASSERT_EQ(landed.count(ll_landing_row(t, j, k)), 0u) << "a local slot's landing row is written";
        } else {
          ASSERT_EQ(row, ll_landing_row(t, j, k));
          const auto it = landed.find(row);
          ASSERT_NE(it, landed.end()) << "landing row of (" << t << ", " << j << ") of rank " << s << " never written";
          ASSERT_EQ(it->second, want[s][i]) << "landing row of (" << t << ", " << j << ") from the wrong receive row";
        }
      }
    for (const auto& [row, from] : landed) ASSERT_LT(row, static_cast<long long>(c.T[s]) * k) << "landing past T k";
  }
}

// The T of rank s for a kind of token counts.
int tokens(int kind, int s, int max_tokens) {
  switch (kind) {
    case 0: return max_tokens;                                   // all full
    case 1: return s % 2 ? 0 : 1;                                 // 1 and 0
    case 2: return std::max(0, max_tokens - 1 - 37 * s);          // different everywhere, 255-ish
    default: return static_cast<int>(rng()() % (max_tokens + 1));  // random
  }
}

}  // namespace

TEST(MoeLowLatencyLayout, EveryRowOnceRotatedSourcesCombineAddresses) {
  int checked = 0, refused = 0;
  for (int W = 2; W <= 8; ++W)
    for (int per : {1, 2, 8})
      for (int k : {1, 2, 8, 16})
        for (Routing r : {Routing::random, Routing::skewed, Routing::all_to_one, Routing::same_rank, Routing::balanced,
                          Routing::repeats}) {
          const Geometry g{W, W * per};
          for (int kind = 0; kind < 4; ++kind) {
            const int max_tokens = kind == 0 ? 256 : (kind == 2 ? 255 : 40);
            Call c{g, k, max_tokens, {}, {}};
            for (int s = 0; s < W; ++s) {
              c.T.push_back(tokens(kind, s, max_tokens));
              c.idx.push_back(route(r, g, c.T.back(), k, s));
            }
            const LlPlan p = ll_plan(c.ptrs(), c.T, k, g, max_tokens);
            if (!p.verdict.ok()) {
              // Only ids repeated in a token's row can put more than max_tokens rows of one rank on
              // one expert; the verdict names the first such rank and expert.
              ASSERT_EQ(p.verdict.kind, kLlTooManyRows) << p.verdict.message();
              const int s = p.verdict.rank;
              int n = 0;
              for (int e : c.idx[s]) n += e == p.verdict.expert;
              ASSERT_EQ(n, p.verdict.rows);
              ASSERT_GT(n, max_tokens);
              ++refused;
              continue;
            }
            check_call(c, std::string(name(r)) + " W " + std::to_string(W) + " E " + std::to_string(g.experts) + " k " +
                              std::to_string(k) + " token kind " + std::to_string(kind));
            if (HasFatalFailure()) return;
            ++checked;
          }
        }
  // 2016 calls: only those whose tokens repeat ids (repeats, k > E, one rank's experts) may be refused.
  EXPECT_GT(checked, 1500) << refused << " refused";
  std::printf("  %d calls checked, %d refused (more than max_tokens rows of one rank on one expert)\n", checked, refused);
}

TEST(MoeLowLatencyLayout, AllTokensOnOneExpertAndE64) {
  for (int W : {2, 4, 8}) {
    const Geometry g{W, 64};
    for (int k : {1, 8}) {
      // Every token's first slot on expert 0: W x 256 rows on it, exactly its stride.
      Call c{g, k, 256, {}, {}};
      for (int s = 0; s < W; ++s) c.T.push_back(256), c.idx.push_back(route(Routing::all_to_one, g, 256, k, s));
      check_call(c, "all_to_one E 64 W " + std::to_string(W) + " k " + std::to_string(k));
      const LlPlan p = ll_plan(c.ptrs(), c.T, k, g, 256);
      EXPECT_EQ(p.rows_of(0, 0), W * 256);
      EXPECT_EQ(p.rows_of(0, 0), p.stride);
    }
  }
  // k = 1 with every token on one expert, and no tokens at all.
  const Geometry g{2, 8};
  Call one{g, 1, 37, {37, 37}, {}};
  for (int s = 0; s < 2; ++s) one.idx.push_back(std::vector<int>(37, 5));
  check_call(one, "k 1 one expert");
  Call none{g, 8, 256, {0, 0}, {{}, {}}};
  check_call(none, "T 0 everywhere");
  const LlPlan p = ll_plan(none.ptrs(), none.T, 8, g, 256);
  for (int d = 0; d < 2; ++d)
    for (int l = 0; l < 4; ++l) EXPECT_EQ(p.rows_of(d, l), 0);
}

TEST(MoeLowLatencyLayout, RepeatedIdsWithinTheLimitAreLaidOutPerSlot) {
  // A token naming one expert in all its slots: T k rows of the rank on it, fine up to max_tokens.
  const Geometry g{2, 8};
  Call c{g, 8, 256, {32, 3}, {}};
  for (int s = 0; s < 2; ++s) c.idx.push_back(route(Routing::one_expert_all_slots, g, c.T[s], 8, s));
  check_call(c, "one expert in all slots, 256 rows");
  c.T[0] = 33;  // 264 rows of rank 0 on expert 7: more than max_tokens
  c.idx[0] = route(Routing::one_expert_all_slots, g, 33, 8, 0);
  const LlPlan p = ll_plan(c.ptrs(), c.T, 8, g, 256);
  ASSERT_EQ(p.verdict.kind, kLlTooManyRows);
  EXPECT_EQ(p.verdict.rank, 0);
  EXPECT_EQ(p.verdict.expert, 7);
  EXPECT_EQ(p.verdict.rows, 264);
  EXPECT_EQ(p.verdict.message(),
            "moe low-latency dispatch: rank 0 routes 264 rows to expert 7, more than max_tokens (256; a token names "
            "that expert more than once); nothing was dispatched");
}

TEST(MoeLowLatencyLayout, VerdictNamesTheFirstBadRankIdsFirst) {
  const Geometry g{4, 16};
  const int k = 2, max_tokens = 8;
  std::vector<std::vector<int>> idx(4);
  std::vector<int> T = {8, 8, 8, 8};
  for (int s = 0; s < 4; ++s) idx[s] = route(Routing::random, g, 8, k, s);
  auto plan = [&] {
    std::vector<const int*> p;
    for (auto& v : idx) p.push_back(v.data());
    return ll_plan(p, T, k, g, max_tokens);
  };
  EXPECT_TRUE(plan().verdict.ok());
  idx[3][7 * k + 1] = 16;  // rank 3, token 7, slot 1
  idx[3][2 * k] = -1;      // an earlier one on the same rank: named first
  LlVerdict v = plan().verdict;
  ASSERT_EQ(v.kind, kLlBadExpert);
  EXPECT_EQ(v.rank, 3);
  EXPECT_EQ(v.slot, 2 * k);
  EXPECT_EQ(v.expert, -1);
  EXPECT_EQ(v.message(), "moe low-latency dispatch: expert id -1 on rank 3 (token 2, slot 0) is outside 0..E-1; "
                         "nothing was dispatched");
  for (int j = 0; j < 8 * k; ++j) idx[1][j] = 5;  // rank 1: 16 rows on expert 5 > 8 (and before rank 3)
  v = plan().verdict;
  ASSERT_EQ(v.kind, kLlTooManyRows);
  EXPECT_EQ(v.rank, 1);
  idx[1][3] = 99;  // rank 1 also has a bad id: ids come before row counts
  v = plan().verdict;
  ASSERT_EQ(v.kind, kLlBadExpert);
  EXPECT_EQ(v.rank, 1);
  EXPECT_EQ(v.slot, 3);
  EXPECT_EQ(v.expert, 99);
  // The sender's own check, as every block of its grid computes it.
  std::vector<int> hist(16, 0);
  for (int e : idx[1])
    if (e >= 0 && e < 16) ++hist[e];
  const LlSourceCheck sc = ll_check_source(idx[1].data(), 8 * k, hist.data(), g, max_tokens);
  EXPECT_EQ(sc.bad_slot, 3);
  EXPECT_EQ(sc.bad_value, 99);
  EXPECT_EQ(sc.over_expert, 5);
  EXPECT_EQ(sc.over_rows, 15);
  EXPECT_FALSE(sc.ok());
}

TEST(MoeLowLatencyLayout, PiecesAndLimits) {
  // Rotated sources: position and source are inverse, own rank first.
  for (int W = 1; W <= 8; ++W)
    for (int d = 0; d < W; ++d) {
      EXPECT_EQ(ll_source_at(0, d, W), d);
      for (int q = 0; q < W; ++q) EXPECT_EQ(ll_source_pos(ll_source_at(q, d, W), d, W), q);
    }
  // Codes round-trip for every local expert and place.
  for (int l : {0, 1, 511, 1023})
    for (int w : {0, 1, 255, kLlMaxEntries - 1}) {
      EXPECT_EQ(ll_code_local(ll_code(l, w)), l);
      EXPECT_EQ(ll_code_within(ll_code(l, w)), w);
      EXPECT_NE(ll_code(l, w), kLlNoSlot);
    }
  // The largest receive row fits an int: L S <= 1024 x 8 x 256.
  EXPECT_LE(static_cast<long long>(kLlMaxExperts) * ll_row_stride(weave::kMaxWorld, kLlMaxTokens), INT32_MAX);
  // Every id of a full call has its register slot in the dispatch kernel.
  EXPECT_EQ(kLlPerThread * kLlThreads, kLlMaxTokens * kLlMaxTopk);
  // Headers are whole 16-byte rows and hold the counts.
  for (int L : {1, 3, 4, 128, 1024}) {
    EXPECT_EQ(ll_header_ints(L) % 4, 0);
    EXPECT_GE(ll_header_ints(L), kLlHdrCounts + L);
  }
  // Blocks: at most one per SM and per token slot; every token of any T <= max_tokens in exactly
  // one block (t = b + i B).
  for (int sms : {1, 78, 132})
    for (int mt : {1, 37, 128, 256}) {
      const int B = ll_blocks(sms, mt);
      EXPECT_GE(B, 1);
      EXPECT_LE(B, std::min(sms, mt));
      std::vector<int> seen(mt, 0);
      for (int b = 0; b < B; ++b)
        for (int t = b; t < mt; t += B) ++seen[t];
      for (int t = 0; t < mt; ++t) ASSERT_EQ(seen[t], 1);
    }
  // Offsets: rotated exclusive prefix.
  const int cnt[] = {3, 5, 7, /* l = 1 */ 0, 2, 4};  // L = 2, W = 3: cnt[l W + s]
  int off[6], total[2];
  ll_offsets(cnt, 2, 3, 1, off, total);  // rank 1: sources 1, 2, 0
  EXPECT_EQ(off[1], 0);
  EXPECT_EQ(off[2], 5);
  EXPECT_EQ(off[0], 12);
  EXPECT_EQ(total[0], 15);
  EXPECT_EQ(off[4], 0);
  EXPECT_EQ(off[5], 2);
  EXPECT_EQ(off[3], 6);
  EXPECT_EQ(total[1], 6);
}
