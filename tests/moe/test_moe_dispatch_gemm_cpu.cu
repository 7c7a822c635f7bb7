// The fused dispatch_gemm's send order and readiness (kernels/moe/dispatch_gemm_schedule.hpp),
// executed as a whole dispatch on host arrays for W in 1..8, L in {1, 3, 8}, k in {1, 2, 8},
// T per rank different (0, 1, ragged), and every routing of routing.hpp (balanced, Dirichlet, all
// to one expert, a token's experts on one rank, repeated ids, random, empty experts):
// - each sender's send list, built as route_walk<true> builds it (entry at send_offsets of its
//   expert's position plus its place among the sender's rows of that expert), holds each of its
//   (token, slot) entries exactly once, expert after expert in send order;
// - sending local expert after local expert (all senders, any interleaving), a token's data
//   crosses to a rank exactly once, every row gets its metadata exactly once;
// - once every sender has sent local expert l, every row of l on every rank has its metadata and
//   its primary row's data (the receiver can copy it and start l's tiles), and after the copies
//   every row holds its own token: the readiness the kernel's loader waits for is sufficient.
// A primary rule other than "smallest expert on the rank" (e.g. the first slot) fails the third
// check for routings with several experts of a token on one rank.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "check/seed.hpp"
#include "moe/dispatch_gemm_schedule.hpp"
#include "moe/layout.hpp"
#include "routing.hpp"

using namespace weave::moe;
using test::Routing;

namespace {

struct Row {
  int src = -1, token = -1;  // whose data the row holds (-1: none yet)
};
struct Meta {
  int src = -1, token = -1, primary = -1, slot = -1;
  int writes = 0;
};

void run_case(int W, int L, int k, Routing kind, std::mt19937_64& rng) {
  const Geometry g{W, W * L};
  const int E = g.experts;
  std::vector<int> T(W);
  std::vector<std::vector<int>> idx(W);
  for (int s = 0; s < W; ++s) {
    const int choices[] = {0, 1, 37, 129, 300};
    T[s] = choices[rng() % 5];
    idx[s] = test::route(kind, g, T[s], k, s, rng);
  }
  std::vector<int> counts(static_cast<size_t>(W) * E);
  for (int s = 0; s < W; ++s) count_rows(idx[s].data(), T[s], k, g, counts.data() + static_cast<size_t>(s) * E);
  const std::string what = std::string(test::name(kind)) + " W=" + std::to_string(W) + " L=" + std::to_string(L) +
                           " k=" + std::to_string(k);

  // Senders: plans and send lists.
  std::vector<DispatchPlan> plan(W);
  std::vector<std::vector<int>> order(W), slist(W);
  for (int s = 0; s < W; ++s) {
    plan[s] = plan_dispatch(idx[s].data(), T[s], k, g, s, counts);
    order[s].assign(E + 1, -1);
    send_offsets(counts.data() + static_cast<size_t>(s) * E, g, s, order[s].data());
    ASSERT_EQ(order[s][E], T[s] * k) << what;
    for (int p = 0; p < E; ++p) ASSERT_LE(order[s][p], order[s][p + 1]) << what;
    slist[s].assign(static_cast<size_t>(T[s]) * k, -1);
    for (int i = 0; i < T[s] * k; ++i) {
      const int e = idx[s][i];
      const int place = plan[s].row[i] - block_begin(counts.data(), g, g.rank_of(e), g.local_of(e), s);
      ASSERT_GE(place, 0) << what;
      const int p = send_position(s, e, g);
      ASSERT_LT(order[s][p] + place, order[s][p + 1]) << what << ": entry past its expert's range";
      int& slot = slist[s][order[s][p] + place];
      ASSERT_EQ(slot, -1) << what << ": two entries at one send-list place";
      slot = i;
    }
    for (int l = 0; l < L; ++l)  // local expert l's range holds exactly l's entries, rank after rank
      for (int q = order[s][l * W]; q < order[s][(l + 1) * W]; ++q) {
        ASSERT_GE(slist[s][q], 0) << what;
        ASSERT_EQ(g.local_of(idx[s][slist[s][q]]), l) << what;
      }
  }

  // Receivers, sent to expert after expert.
  std::vector<std::vector<Row>> data(W);
  std::vector<std::vector<Meta>> meta(W);
  for (int d = 0; d < W; ++d) {
    data[d].assign(rank_rows(counts.data(), g, d), Row{});
    meta[d].assign(rank_rows(counts.data(), g, d), Meta{});
  }
  std::vector<std::vector<int>> sends(W);  // per sender: data sends per (token, rank)
  for (int s = 0; s < W; ++s) sends[s].assign(static_cast<size_t>(T[s]) * W, 0);
  for (int l = 0; l < L; ++l) {
    for (int s = 0; s < W; ++s)
      for (int q = order[s][l * W]; q < order[s][(l + 1) * W]; ++q) {
        const int i = slist[s][q], t = i / k, j = i % k, d = g.rank_of(idx[s][i]), row = plan[s].row[i];
        const int pj = primary_slot(idx[s].data() + static_cast<size_t>(t) * k, k, g, j);
        Meta& m = meta[d][row];
        m = Meta{s, t, plan[s].row[static_cast<size_t>(t) * k + pj], j, m.writes + 1};
        if (pj == j) {
          ASSERT_EQ(data[d][row].src, -1) << what << ": a row's data written twice";
          data[d][row] = Row{s, t};
          sends[s][static_cast<size_t>(t) * W + d]++;
        }
      }
    // Every sender has sent l: l's rows on every rank are ready to be completed.
    for (int d = 0; d < W; ++d)
      for (int r = expert_begin(counts.data(), g, d, l); r < expert_begin(counts.data(), g, d, l + 1); ++r) {
        const Meta& m = meta[d][r];
        ASSERT_EQ(m.writes, 1) << what << ": rank " << d << " row " << r << " metadata written " << m.writes
                               << " times by the time its expert " << l << " is complete";
        const Row& p = data[d][m.primary];
        ASSERT_TRUE(p.src == m.src && p.token == m.token)
            << what << ": rank " << d << " row " << r << " (expert " << l << ") needs row " << m.primary
            << ", which does not hold its token yet";
        data[d][r] = p;  // the copy of the receiver's aux warps
      }
  }

  for (int s = 0; s < W; ++s)
    for (int t = 0; t < T[s]; ++t)
      for (int d = 0; d < W; ++d) {
        bool routed = false;
        for (int j = 0; j < k; ++j) routed |= g.rank_of(idx[s][static_cast<size_t>(t) * k + j]) == d;
        ASSERT_EQ(sends[s][static_cast<size_t>(t) * W + d], routed ? 1 : 0)
            << what << ": rank " << s << " token " << t << " sent to rank " << d << " "
            << sends[s][static_cast<size_t>(t) * W + d] << " times";
      }
  for (int d = 0; d < W; ++d)
    for (size_t r = 0; r < data[d].size(); ++r) {
      const Meta& m = meta[d][r];
      ASSERT_TRUE(data[d][r].src == m.src && data[d][r].token == m.token) << what << ": rank " << d << " row " << r;
      ASSERT_EQ(plan[m.src].row[static_cast<size_t>(m.token) * k + m.slot], static_cast<int>(r)) << what;
    }
}

TEST(DispatchGemmSchedule, SendOrderAndReadiness) {
  std::mt19937_64 rng(weave::check::derive(weave::check::test_seed(), 0x6467));
  const Routing kinds[] = {Routing::balanced,  Routing::dirichlet,      Routing::all_to_one,   Routing::same_rank,
                           Routing::random_repeats, Routing::random, Routing::empty_experts};
  for (int W = 1; W <= 8; ++W)
    for (int L : {1, 3, 8})
      for (int k : {1, 2, 8})
        for (Routing kind : kinds) {
          if (kind == Routing::empty_experts && W * L < 2 * k) continue;  // k distinct of E / 2
          if ((kind == Routing::random || kind == Routing::dirichlet || kind == Routing::all_to_one) && W * L < k)
            continue;  // k distinct experts
          run_case(W, L, k, kind, rng);
          if (HasFatalFailure()) return;
        }
}

TEST(DispatchGemmSchedule, SignalTotals) {
  // A rank's arrival counter of an expert hears every aux warp of every rank once per call; its
  // ready counter its own aux warps once.
  EXPECT_EQ(arrivals_per_call(2, 264), 528u);
  EXPECT_EQ(ready_per_call(264), 264u);
  // Destinations inside an expert: each rank once, the sender's own last.
  for (int W = 1; W <= 8; ++W)
    for (int s = 0; s < W; ++s) {
      std::vector<int> seen(W, 0);
      for (int i = 0; i < W; ++i) seen[send_dest(s, i, W)]++;
      for (int d = 0; d < W; ++d) EXPECT_EQ(seen[d], 1);
      EXPECT_EQ(send_dest(s, W - 1, W), s);
    }
}

}  // namespace
