// The MoE routing layout of kernels/moe/layout.hpp, executed as a full dispatch and combine on host
// arrays for W in 1..8, E in {W, 2W, 8W, 64}, k in {1, 2, 8}, T in {1, 7, 257, 4096}
// and six routings (balanced, random, Dirichlet-skewed, all to one expert, a token's experts on
// one rank, repeated ids in a row):
// - each rank sends a token to a destination rank at most once, and exactly when one of its
//   experts lives there;
// - the rows a sender computes from the count matrix alone equal the receiver's layout built
//   independently (per local expert, source ranks ascending, then (token, slot) ascending);
// - after the receiver copies primary rows into the other slots' rows, every grouped row is
//   written once and holds its token, every (token, slot) reaching its expert exactly once;
// - combine (fp32 weighted sum of expert outputs, output = known function of expert and token)
//   equals the direct computation;
// - the capacity check flags exactly the ranks whose rows exceed the capacity, naming the first
//   local expert whose rows end past it; balanced routing fits receive_capacity(slack 1) and
//   distinct-id routing fits worst_case_rows.
#include "moe/layout.hpp"  // first: the header compiles as plain C++, without CUDA headers

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

using namespace weave::moe;

namespace {

enum class Routing { balanced, random, dirichlet, all_to_one, same_rank, repeated };
const char* name(Routing r) {
  const char* n[] = {"balanced", "random", "dirichlet", "all_to_one", "same_rank", "repeated"};
  return n[static_cast<int>(r)];
}

// Writes k distinct experts for one token into out, drawn uniformly from `pool` (shuffled prefix).
void pick_distinct(std::vector<int>& pool, int k, std::mt19937& rng, int* out) {
  for (int j = 0; j < k; ++j) {
    std::uniform_int_distribution<int> u(j, static_cast<int>(pool.size()) - 1);
    std::swap(pool[j], pool[u(rng)]);
    out[j] = pool[j];
  }
}

// topk_idx of one rank (T x k).
std::vector<int> route(Routing kind, const Geometry& g, int T, int k, int rank,
                       const std::vector<double>& popularity, std::mt19937& rng) {
  const int E = g.experts, L = g.local_experts();
  std::vector<int> idx(static_cast<size_t>(T) * k);
  std::vector<int> pool(E);
  std::iota(pool.begin(), pool.end(), 0);
  for (int t = 0; t < T; ++t) {
    int* row = idx.data() + static_cast<size_t>(t) * k;
    switch (kind) {
      case Routing::balanced:  // consecutive slots cycle through the experts
        for (int j = 0; j < k; ++j) row[j] = (t * k + j + rank) % E;
        break;
      case Routing::random:
        pick_distinct(pool, k, rng, row);
        break;
      case Routing::dirichlet: {  // weighted sampling without replacement (Efraimidis-Spirakis)
        std::vector<std::pair<double, int>> key(E);
        std::uniform_real_distribution<double> u(1e-12, 1.0);
        for (int e = 0; e < E; ++e) key[e] = {std::log(u(rng)) / popularity[e], e};
        std::partial_sort(key.begin(), key.begin() + k, key.end(), std::greater<>());
        for (int j = 0; j < k; ++j) row[j] = key[j].second;
        break;
      }
      case Routing::all_to_one:  // expert 0 in a rotating slot, then 1 .. k-1
        for (int j = 0; j < k; ++j) row[(j + t) % k] = j;
        break;
      case Routing::same_rank: {  // as many experts as fit on one random rank, the rest random
        const int d = static_cast<int>(rng() % g.world), m = std::min(k, L);
        std::vector<int> own(L), rest;
        for (int l = 0; l < L; ++l) own[l] = g.expert(d, l);
        for (int e = 0; e < E; ++e)
          if (g.rank_of(e) != d) rest.push_back(e);
        pick_distinct(own, m, rng, row);
        if (k > m) pick_distinct(rest, k - m, rng, row + m);
        std::shuffle(row, row + k, rng);
        break;
      }
      case Routing::repeated:  // random, then half the tokens repeat slot 0's id in a later slot
        pick_distinct(pool, k, rng, row);
        if (k > 1 && rng() % 2) row[1 + rng() % (k - 1)] = row[0];
        break;
    }
  }
  return idx;
}

// An expert's output for a token row: a known function of (expert, token id).
float expert_out(int e, long long id) {
  return static_cast<float>((e * 7919LL + id * 31LL) % 1013) / 64.0f - 7.0f;
}
float weighted_sum(const float* w, const float* y, int k) {
  float acc = 0.f;
  for (int j = 0; j < k; ++j) acc += w[j] * y[j];
  return acc;
}

void simulate(Routing kind, int W, int E, int k, int T, std::mt19937& rng) {
  const Geometry g{W, E};
  const int L = g.local_experts();
  ASSERT_TRUE(g.valid());
  std::vector<double> popularity(E);
  std::gamma_distribution<double> gamma(0.3, 1.0);
  for (auto& p : popularity) p = std::max(gamma(rng), 1e-9);

  std::vector<std::vector<int>> idx(W);
  std::vector<std::vector<float>> wts(W);
  std::vector<int> counts(static_cast<size_t>(W) * E);
  std::uniform_real_distribution<float> uw(0.f, 1.f);
  for (int s = 0; s < W; ++s) {
    idx[s] = route(kind, g, T, k, s, popularity, rng);
    ASSERT_EQ(first_bad_slot(idx[s].data(), T, k, g), -1);
    wts[s].resize(idx[s].size());
    for (auto& w : wts[s]) w = uw(rng);
    count_rows(idx[s].data(), T, k, g, counts.data() + static_cast<size_t>(s) * E);
  }

  // The receiver's layout built independently: per (expert, source) buckets of (t, slot) in order.
  std::vector<std::vector<std::vector<int>>> bucket(E, std::vector<std::vector<int>>(W));
  for (int s = 0; s < W; ++s)
    for (int i = 0; i < T * k; ++i) bucket[idx[s][i]][s].push_back(i);
  std::vector<std::vector<int>> ref_row(W, std::vector<int>(static_cast<size_t>(T) * k, -1));
  std::vector<int> ref_total(W, 0);
  for (int d = 0; d < W; ++d)
    for (int l = 0; l < L; ++l)
      for (int s = 0; s < W; ++s) {
        ASSERT_EQ(block_begin(counts.data(), g, d, l, s), ref_total[d]);
        for (int i : bucket[g.expert(d, l)][s]) ref_row[s][i] = ref_total[d]++;
      }

  // Senders: plans from the count matrix alone; the wire (token data once per (token, rank)).
  std::vector<std::vector<long long>> data(W);
  std::vector<std::vector<int>> meta_token(W), meta_primary(W), meta_writes(W);
  for (int d = 0; d < W; ++d) {
    ASSERT_EQ(rank_rows(counts.data(), g, d), ref_total[d]);
    data[d].assign(ref_total[d], -1);
    meta_token[d].assign(ref_total[d], -1);
    meta_primary[d].assign(ref_total[d], -1);
    meta_writes[d].assign(ref_total[d], 0);
  }
  std::vector<DispatchPlan> plans(W);
  for (int s = 0; s < W; ++s) {
    plans[s] = plan_dispatch(idx[s].data(), T, k, g, s, counts);
    const DispatchPlan& p = plans[s];
    ASSERT_EQ(p.row, ref_row[s]) << "sender " << s << "'s rows differ from the receivers' layout";
    std::vector<int> ntok(W);
    count_tokens(idx[s].data(), T, k, g, ntok.data());
    for (int d = 0; d < W; ++d) {
      const std::vector<int>& list = p.tokens[d];
      ASSERT_EQ(static_cast<int>(list.size()), ntok[d]);
      ASSERT_TRUE(std::is_sorted(list.begin(), list.end()));
      ASSERT_EQ(std::adjacent_find(list.begin(), list.end()), list.end())
          << "rank " << s << " sends a token twice to rank " << d;
      size_t pos = 0;
      for (int t = 0; t < T; ++t) {  // listed exactly when one of t's experts lives on d
        bool on_d = false;
        for (int j = 0; j < k; ++j) on_d |= g.rank_of(idx[s][t * k + j]) == d;
        const bool listed = pos < list.size() && list[pos] == t;
        ASSERT_EQ(listed, on_d) << "rank " << s << " token " << t << " to rank " << d;
        pos += listed;
      }
      for (int t : list) {  // one send: data into the primary row, metadata into every slot's row
        const long long id = static_cast<long long>(s) * T + t;
        bool sent = false;
        for (int j = 0; j < k; ++j) {
          const int i = t * k + j;
          if (g.rank_of(idx[s][i]) != d) continue;
          const int prim = p.row[t * k + p.primary[i]];
          meta_token[d][p.row[i]] = t;
          meta_primary[d][p.row[i]] = prim;
          meta_writes[d][p.row[i]]++;
          if (p.primary[i] == j) {
            ASSERT_FALSE(sent);
            data[d][prim] = id;
            sent = true;
          }
        }
        ASSERT_TRUE(sent);
      }
    }
  }

  // Receivers: copy primary rows into the other slots' rows, check grouping, compute outputs.
  std::vector<std::vector<float>> y(W);
  for (int d = 0; d < W; ++d) {
    const int total = ref_total[d];
    for (int r = 0; r < total; ++r) {
      ASSERT_EQ(meta_writes[d][r], 1) << "rank " << d << " row " << r;
      const int prim = meta_primary[d][r];
      ASSERT_EQ(meta_primary[d][prim], prim) << "a primary row points elsewhere";
      if (prim != r) data[d][r] = data[d][prim];
      ASSERT_GE(data[d][r], 0);
    }
    y[d].resize(total);
    const int stride = total <= 5000 ? 1 : 97;
    for (int l = 0; l < L; ++l) {
      const int e = g.expert(d, l), b = expert_begin(counts.data(), g, d, l);
      const int n = expert_rows(counts.data(), g, e);
      ASSERT_EQ(b + n, expert_begin(counts.data(), g, d, l + 1));
      for (int r = b; r < b + n; ++r) {
        if (r > b) ASSERT_LE(data[d][r - 1], data[d][r]) << "expert " << e << " out of order";
        const long long id = data[d][r];
        const int src = static_cast<int>(id / T);
        ASSERT_EQ(meta_token[d][r], id % T);
        ASSERT_GE(r, block_begin(counts.data(), g, d, l, src));
        if ((r - b) % stride == 0) {
          const RowOwner o = locate_row(counts.data(), g, d, r);
          ASSERT_EQ(o.local, l);
          ASSERT_EQ(o.src, src);
        }
        y[d][r] = expert_out(e, id);
      }
    }
  }

  // Combine at the home rank vs the direct computation.
  std::vector<float> gathered(k), direct(k);
  for (int s = 0; s < W; ++s)
    for (int t = 0; t < T; ++t) {
      const long long id = static_cast<long long>(s) * T + t;
      for (int j = 0; j < k; ++j) {
        const int i = t * k + j, e = idx[s][i];
        gathered[j] = y[g.rank_of(e)][plans[s].row[i]];
        direct[j] = expert_out(e, id);
      }
      ASSERT_EQ(weighted_sum(&wts[s][t * k], gathered.data(), k),
                weighted_sum(&wts[s][t * k], direct.data(), k))
          << "rank " << s << " token " << t;
    }

  // Capacity: flagged exactly where a rank's rows exceed it.
  const int max_rows = *std::max_element(ref_total.begin(), ref_total.end());
  const int caps[] = {receive_capacity(T, k, g, 1.0), receive_capacity(T, k, g, 1.5),
                      static_cast<int>(worst_case_rows(T, k, g)), max_rows, max_rows - 1};
  for (int cap : caps) {
    int first = -1;
    for (int d = 0; d < W; ++d) {
      const int l = first_overflow(counts.data(), g, d, cap);
      ASSERT_EQ(l >= 0, ref_total[d] > cap) << "rank " << d << " capacity " << cap;
      if (l < 0) continue;
      if (first < 0) first = d;
      ASSERT_GT(expert_begin(counts.data(), g, d, l + 1), cap);
      ASSERT_LE(expert_begin(counts.data(), g, d, l), cap);
    }
    const Overflow o = check_capacity(counts, g, cap);
    ASSERT_EQ(o.rank, first);
    if (o.any()) {
      const int l = first_overflow(counts.data(), g, o.rank, cap);
      ASSERT_EQ(o.expert, g.expert(o.rank, l));
      ASSERT_EQ(o.expert_rows, expert_rows(counts.data(), g, o.expert));
      ASSERT_EQ(o.rank_rows, ref_total[o.rank]);
    }
  }
  if (kind == Routing::balanced) {
    ASSERT_FALSE(check_capacity(counts, g, receive_capacity(T, k, g, 1.0)).any());
  }
  if (kind != Routing::repeated) {
    ASSERT_LE(max_rows, worst_case_rows(T, k, g));
    if (kind == Routing::all_to_one && k <= L) ASSERT_EQ(max_rows, worst_case_rows(T, k, g));
  }
}

void sweep(Routing kind) {
  std::mt19937 rng(1234 + static_cast<int>(kind));
  int configs = 0;
  for (int W = 1; W <= 8; ++W) {
    std::vector<int> Es = {W, 2 * W, 8 * W};
    if (64 % W == 0 && 64 != 8 * W) Es.push_back(64);
    for (int E : Es)
      for (int k : {1, 2, 8}) {
        if (k > E) continue;
        for (int T : {1, 7, 257, 4096}) {
          SCOPED_TRACE(testing::Message() << name(kind) << " W=" << W << " E=" << E << " k=" << k
                                          << " T=" << T);
          simulate(kind, W, E, k, T, rng);
          if (testing::Test::HasFatalFailure()) return;
          ++configs;
        }
      }
  }
  EXPECT_GT(configs, 100);
}

TEST(MoeLayout, Balanced) { sweep(Routing::balanced); }
TEST(MoeLayout, Random) { sweep(Routing::random); }
TEST(MoeLayout, DirichletSkewed) { sweep(Routing::dirichlet); }
TEST(MoeLayout, AllToOneExpert) { sweep(Routing::all_to_one); }
TEST(MoeLayout, ExpertsOnOneRank) { sweep(Routing::same_rank); }
TEST(MoeLayout, RepeatedIds) { sweep(Routing::repeated); }

TEST(MoeLayout, OverflowMessageNamesExpertAndCount) {
  const Geometry g{2, 4};  // experts 0, 1 on rank 0; 2, 3 on rank 1
  // Rank 0 routes 3 rows to expert 3 and 1 to expert 2; rank 1 routes 2 to expert 3, 1 to 0.
  std::vector<int> counts = {0, 0, 1, 3, /* rank 1 */ 1, 0, 0, 2};
  const Overflow o = check_capacity(counts, g, 4);
  ASSERT_TRUE(o.any());
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.expert, 3);
  EXPECT_EQ(o.expert_rows, 5);
  EXPECT_EQ(o.rank_rows, 6);
  EXPECT_NE(o.message().find("expert 3 (5 rows"), std::string::npos) << o.message();
  EXPECT_FALSE(check_capacity(counts, g, 6).any());
}

TEST(MoeLayout, OutOfRangeIdsFound) {
  const Geometry g{2, 4};
  std::vector<int> idx = {0, 3, 1, 2, 4, 0};
  EXPECT_EQ(first_bad_slot(idx.data(), 3, 2, g), 4);
  idx[4] = -1;
  EXPECT_EQ(first_bad_slot(idx.data(), 3, 2, g), 4);
  idx[4] = 3;
  EXPECT_EQ(first_bad_slot(idx.data(), 3, 2, g), -1);
}

TEST(MoeLayout, CapacityRule) {
  // DeepSeek-like: T 4096, top-8, 64 experts on 8 ranks: T k = 32768 rows per rank when balanced.
  const Geometry g{8, 64};
  EXPECT_EQ(receive_capacity(4096, 8, g, 1.0), 32768);
  EXPECT_EQ(receive_capacity(4096, 8, g, 1.25), 40960);
  EXPECT_EQ(worst_case_rows(4096, 8, g), 8LL * 4096 * 8);  // L = 8 >= k: every slot on one rank
  EXPECT_EQ(worst_case_rows(4096, 8, Geometry{8, 16}), 8LL * 4096 * 2);  // L = 2 < k
  EXPECT_EQ(receive_capacity(4096, 8, g, 100.0), worst_case_rows(4096, 8, g));  // clamped
}

}  // namespace
