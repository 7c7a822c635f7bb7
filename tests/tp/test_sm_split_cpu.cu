// CPU tests of the adaptive SM split (kernels/tp_common/sm_split.hpp): the target of eq. 2 and the
// role rule, then an event simulation of one rank of GEMM + all-reduce (gemm_ar v0: every rank
// computes every output tile; the rank reduces the tiles it owns, every W-th, once every rank wrote
// them) in which the blocks follow next_role, against every fixed split of the tuner's kind (the
// first B - n blocks compute tiles in the LCSC order, n communicator blocks reduce in ar_comm_tile's).
// The model: a tile costs cp on one block, a reduction cs while at most n_sat reductions run and
// proportionally longer beyond (the link's bandwidth), a role change costs `sw` (a compute block's
// pipeline drained and refilled), durations jitter by a few percent, and a peer finishes the same
// tile up to `skew` later. The issue's target for the controller is within 5 % of the best fixed
// split without per-shape tuning.
// Then AG + GEMM (ag_gemm v10, the AgModel tests below): an event simulation of all W ranks at once,
// since a rank's tiles of a peer's rows wait for that peer's pushes, checking that the kernel's
// claim rules never deadlock (W = 2..8, slow, late and fast peers, late signals), that the blocking
// claims of the obvious design can, and how the controller compares with fixed splits there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "check/seed.hpp"
#include "tp_common/schedule.hpp"
#include "tp_common/sm_split.hpp"
#include "weave/runtime/env.hpp"

using namespace weave::tp::sm_split;

namespace {

View view(int B, long long rp_tasks, long long rs_tasks) {
  View v;
  v.blocks = B;
  v.compute_tasks = rp_tasks;
  v.comm_tasks = rs_tasks;
  v.comm_next_ready = true;
  return v;
}

// Eq. 2 on the tasks not done: the split where both roles' remaining work ends together.
TEST(SmSplit, TargetEqualisesPredictedCompletion) {
  for (int B : {8, 78, 132})
    for (double cs : {0.05, 0.3, 1.0, 4.0}) {
      View v = view(B, 1000, 500);
      v.compute_done = 200, v.compute_cycles = 200 * 1.0;  // 1 cycle per compute task measured
      v.comm_done = 50, v.comm_cycles = 50 * cs;
      const int n = target_comm_blocks(v);
      // 800 compute tasks of 1 cycle left, 450 reductions of cs: 800 / (B - x) = 450 cs / x.
      const double x = B * 450 * cs / (800 + 450 * cs);
      EXPECT_EQ(n, std::clamp(static_cast<int>(std::lround(x)), 1, B - 1)) << B << " " << cs;
      // The later role's predicted end is within one block's share of the best integer split's.
      auto finish = [&](int k) { return std::max(800.0 / (B - k), 450.0 * cs / k); };
      double best = 1e300;
      for (int k = 1; k < B; ++k) best = std::min(best, finish(k));
      EXPECT_LE(finish(n), best * (1 + 1.0 / std::min(n, B - n))) << B << " " << cs;
    }
}

TEST(SmSplit, TargetLimitsAndPriors) {
  View v = view(132, 100, 50);
  v.compute_prior = 10, v.comm_prior = 10;  // no task measured: the priors decide
  EXPECT_EQ(target_comm_blocks(v), 44);     // 132 * 500 / (1000 + 500)
  v.comm_done = v.comm_tasks;  // no communication left: no communication block
  EXPECT_EQ(target_comm_blocks(v), 0);
  v = view(132, 100, 50);
  v.compute_done = v.compute_tasks;  // compute finished: every block communicates
  EXPECT_EQ(target_comm_blocks(v), 132);
  v = view(132, 1000000, 1);  // a sliver of communication left: still one block for it
  EXPECT_EQ(target_comm_blocks(v), 1);
  v = view(132, 1, 1000000);  // a sliver of compute left: still one block for it
  EXPECT_EQ(target_comm_blocks(v), 131);
}

TEST(SmSplit, RoleRule) {
  View v = view(132, 100, 50);
  v.compute_prior = 1, v.comm_prior = 1;  // target 44
  v.comm_blocks = 10;
  EXPECT_EQ(next_role(v, Role::Compute), Role::Comm);  // below target, input ready
  v.comm_next_ready = false;
  EXPECT_EQ(next_role(v, Role::Compute), Role::Compute);  // would wait: compute instead
  EXPECT_EQ(next_role(v, Role::Comm), Role::Compute);
  v.comm_next_ready = true, v.comm_blocks = 60;
  EXPECT_EQ(next_role(v, Role::Comm), Role::Compute);  // above target
  EXPECT_EQ(next_role(v, Role::Compute), Role::Compute);
  v.comm_blocks = 44;
  EXPECT_EQ(next_role(v, Role::Comm), Role::Comm);  // at target
  v.compute_claimed = v.compute_tasks, v.comm_next_ready = false;
  EXPECT_EQ(next_role(v, Role::Compute), Role::Comm);  // nothing to compute: wait for the input
  v.comm_claimed = v.comm_tasks;
  EXPECT_EQ(next_role(v, Role::Comm), Role::Done);
  v.compute_claimed = 0;
  EXPECT_EQ(next_role(v, Role::Comm), Role::Compute);  // communication all claimed
}

// AG + GEMM: the next tile's rows have not arrived (a peer's pushes): communicate whatever the
// target, if the next communication task can start; the cap then admits every block.
TEST(SmSplit, StalledComputeCommunicates) {
  View v = view(132, 100, 50);
  v.compute_prior = 1, v.comm_prior = 1;  // target 44
  v.comm_blocks = 60;                     // above it
  EXPECT_EQ(comm_cap(v), 44);
  EXPECT_EQ(next_role(v, Role::Compute), Role::Compute);
  EXPECT_EQ(next_role(v, Role::Comm), Role::Compute);
  v.compute_next_ready = false;
  EXPECT_EQ(comm_cap(v), 132);
  EXPECT_EQ(next_role(v, Role::Compute), Role::Comm);
  EXPECT_EQ(next_role(v, Role::Comm), Role::Comm);
  v.comm_next_ready = false;  // nothing can start either: compute (the block polls)
  EXPECT_EQ(next_role(v, Role::Compute), Role::Compute);
  EXPECT_EQ(next_role(v, Role::Comm), Role::Compute);
  v.comm_next_ready = true, v.comm_claimed = v.comm_tasks;  // no communication left: compute (poll)
  EXPECT_EQ(next_role(v, Role::Comm), Role::Compute);
  v = view(1, 10, 5);  // one block: the target keeps it computing, a stalled tile sends it pushing
  EXPECT_EQ(target_comm_blocks(v), 0);
  EXPECT_EQ(next_role(v, Role::Compute), Role::Compute);
  v.compute_next_ready = false;
  EXPECT_EQ(comm_cap(v), 1);
  EXPECT_EQ(next_role(v, Role::Compute), Role::Comm);
}

struct Scenario {
  int B, W, tiles;
  double cp, cs;  // cycles per tile on one block; per reduction while the link is not saturated
  int n_sat;      // reductions that saturate the link
  double sw = 0.1, skew = 0.1, jitter = 0.05;
  double prior_error = 1.0;  // the launch's cost priors off by this factor (compute) and its inverse (communication)
};

// One rank's call; n_comm < 0: adaptive (next_role), else that fixed split. Returns the makespan.
// Reductions share the link as a fluid: each runs at min(1, n_sat / running) of its own rate.
double simulate(const Scenario& s, int n_comm, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0), u01(0.0, 1.0);
  const bool adaptive = n_comm < 0;
  const int comm_tasks = (s.tiles + s.W - 1) / s.W;  // rank 0 owns tiles 0, W, 2W, ...
  std::vector<double> tile_end(s.tiles, -1), skew(comm_tasks);
  for (double& k : skew) k = s.skew * s.cp * u01(rng);
  View v;
  v.blocks = s.B, v.compute_tasks = s.tiles, v.comm_tasks = comm_tasks;
  v.compute_prior = s.cp * s.prior_error, v.comm_prior = s.cs / s.prior_error;  // the launch's model
  struct Event {  // a block is free at t (its compute task, if any, ended then)
    double t;
    int block;
    long long tile;  // >= 0: the compute task that ended
    double cycles;
    bool operator<(const Event& o) const { return t > o.t || (t == o.t && block > o.block); }
  };
  struct Reduction {
    int block;
    double left, start;  // work left in units of cs at full rate; when it started
  };
  std::priority_queue<Event> q;
  std::vector<Reduction> link;
  std::vector<Role> role(s.B, Role::Compute);
  std::vector<bool> started(s.B, false);
  std::vector<long long> next_fixed(s.B);  // fixed: a block's next task index in its static order
  for (int b = 0; b < s.B; ++b) {
    if (!adaptive && b >= s.B - n_comm) role[b] = Role::Comm;
    next_fixed[b] = adaptive ? 0 : role[b] == Role::Comm ? b - (s.B - n_comm) : b;
    q.push({0.0, b, -1, 0});
  }
  int comm_role = adaptive ? 0 : n_comm;
  double now = 0;
  auto ready_at = [&](long long j) {  // when reduction j's tile is in place on every rank (< 0: not yet known)
    const double te = tile_end[j * s.W];
    return te < 0 ? -1.0 : te + skew[j];
  };
  static const bool trace = weave::env::get_bool("WEAVE_SM_SPLIT_TRACE");
  double next_trace = 0;
  while (!q.empty() || !link.empty()) {
    // The next event: a block freed, or the first reduction to finish at the link's present share.
    const double rate = link.empty() ? 0 : std::min(1.0, static_cast<double>(s.n_sat) / link.size()) / s.cs;
    size_t first = 0;
    for (size_t i = 1; i < link.size(); ++i)
      if (link[i].left < link[first].left) first = i;
    const double t_link = link.empty() ? 1e300 : now + link[first].left / rate;
    const bool from_link = q.empty() || t_link < q.top().t;
    const double t = from_link ? t_link : q.top().t;
    for (Reduction& r : link) r.left -= (t - now) * rate;
    now = t;
    Event e{t, 0, -1, 0};
    if (from_link) {
      const Reduction r = link[first];
      link.erase(link.begin() + static_cast<long>(first));
      const double cycles = t - r.start;
      v.comm_done++, v.comm_cycles += cycles;
      e.block = r.block;
    } else {
      e = q.top();
      q.pop();
      if (e.tile >= 0) v.compute_done++, v.compute_cycles += e.cycles, tile_end[e.tile] = t;
    }
    if (trace && t >= next_trace) {
      std::printf("t %6.2f comm_role %3d running %3zu compute %lld/%lld comm %lld/%lld\n", t, comm_role, link.size(),
                  v.compute_done, v.compute_claimed, v.comm_done, v.comm_claimed);
      next_trace += 0.5;
    }
    const int b = e.block;
    Role r = role[b];
    if (adaptive) {
      v.comm_blocks = comm_role;
      // Imminent: this rank wrote the tile (the kernel sees its own signal in the ready count); the
      // peers' copies follow within the skew.
      v.comm_next_ready = v.comm_claimed < comm_tasks && tile_end[v.comm_claimed * s.W] >= 0;
      r = next_role(v, role[b]);
      if (r == Role::Done) continue;
    }
    double start = t;
    if (r != role[b]) {  // a change costs a pipeline drain and refill; the first choice costs nothing
      comm_role += r == Role::Comm ? 1 : -1;
      role[b] = r;
      if (started[b]) start += s.sw * s.cp;
    }
    started[b] = true;
    if (r == Role::Compute) {
      long long k;
      if (adaptive) {
        k = v.compute_claimed++;
      } else {
        k = next_fixed[b];
        next_fixed[b] += s.B - n_comm;
        if (k >= s.tiles) continue;
      }
      const double d = s.cp * (1 + s.jitter * u(rng));
      q.push({start + d, b, k, d});
      continue;
    }
    // Adaptive: claim the next reduction only once its tile is in place on every rank (the kernel
    // reads the claim counter, checks that index's ready count and takes it with a compare-and-swap),
    // so that no block holds an index others could run. Fixed: a block's own static sequence.
    const long long j = adaptive ? v.comm_claimed : next_fixed[b];
    if (j >= comm_tasks) continue;
    const double rd = ready_at(j);
    if (rd < 0 || rd > start) {  // wait for the tile on every rank (a kernel spins on the ready count)
      q.push({rd < 0 ? start + 0.02 * s.cp : rd, b, -1, 0});
      continue;
    }
    if (start > t) {  // a role change first: come back when it is done
      q.push({start, b, -1, 0});
      continue;
    }
    if (adaptive) v.comm_claimed++;
    else next_fixed[b] += n_comm;
    link.push_back({b, 1 + s.jitter * u(rng), t});
  }
  EXPECT_EQ(v.compute_done, s.tiles);  // every task ran once, whatever the split
  EXPECT_EQ(v.comm_done, comm_tasks);
  return now;
}

// The controller against every fixed split (1 to B - 1 communicator blocks), over tiles light and
// heavy in communication, links that saturate early and late, W 2 and 8, tile counts from under
// one round to many, and cost priors exact or off by 2x either way, a role change costing 0.1 tile.
// The issue's target is within 5 % of the best fixed split without per-shape tuning: met on average
// (the controller is faster than the best fixed split in geometric mean: it also moves blocks within
// a call) and in at least 90 % of the scenarios; the rest (96 tiles, under one round, with
// reductions of 0.05 tile on a link of 8; 512 tiles with reductions as long as a tile on a link of
// 32) stay within 12 % (1.06-1.08 over 24 seeds). A dearer role change moves the balance: at 0.3
// tile the geomean is 1.0 and 70 of 80 are within 5 %, at 0.5 tile 1.04 and 59.
double best_fixed(const Scenario& s, unsigned long long seed, int* best_n) {
  double best = 1e300;
  const int comm_tasks = (s.tiles + s.W - 1) / s.W;
  for (int k = 1; k < s.B; ++k) {
    // A split that cannot beat the best so far even with no waiting is not simulated (the splits
    // with few compute blocks would poll for millions of events): its compute alone, or its
    // reductions alone at the link's rate, take longer.
    const double low = 1 - s.jitter;
    const double compute = std::ceil(static_cast<double>(s.tiles) / (s.B - k)) * s.cp * low;
    const double comm = (k <= s.n_sat ? std::ceil(static_cast<double>(comm_tasks) / k)  // the busiest block
                                      : static_cast<double>(comm_tasks) / s.n_sat) *     // the link
                        s.cs * low;
    if (3 * std::max(compute, comm) >= best) continue;
    double m = 0;
    for (unsigned r = 0; r < 3; ++r) m += simulate(s, k, static_cast<unsigned>(seed + r));
    if (m < best) best = m, *best_n = k;
  }
  return best;
}

TEST(SmSplit, AdaptiveAgainstTheBestFixedSplit) {
  const unsigned long long seed = weave::check::test_seed();
  std::vector<Scenario> all;
  for (int tiles : {96, 512, 2048})
    for (int W : {2, 8})
      for (double cs : {0.05, 0.25, 1.0, 3.0})
        for (int n_sat : {8, 32, 132}) all.push_back({132, W, tiles, 1.0, cs, n_sat});
  for (double e : {0.5, 2.0})
    for (int tiles : {96, 2048})
      for (double cs : {0.25, 1.0}) {
        Scenario s{132, 2, tiles, 1.0, cs, 32};
        s.prior_error = e;
        all.push_back(s);
      }
  int within = 0, worst_i = 0;
  double worst = 0, sum_log = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const Scenario& s = all[i];
    int best_n = 0;
    const double best = best_fixed(s, seed, &best_n);
    double a = 0;
    for (unsigned r = 0; r < 3; ++r) a += simulate(s, -1, static_cast<unsigned>(seed + r));
    const double ratio = a / best;
    sum_log += std::log(ratio);
    within += ratio <= 1.05;
    if (ratio > worst) worst = ratio, worst_i = static_cast<int>(i);
    EXPECT_LE(ratio, 1.12) << "tiles " << s.tiles << " W " << s.W << " cs " << s.cs << " n_sat " << s.n_sat
                           << " prior error " << s.prior_error << ": adaptive " << a / 3 << ", best fixed " << best / 3
                           << " at " << best_n << " blocks";
  }
  const int n = static_cast<int>(all.size());
  const double geomean = std::exp(sum_log / n);
  const Scenario& w = all[worst_i];
  std::printf("adaptive / best fixed split over %d scenarios: geomean %.3f, %d within 5 %%, worst %.3f (tiles %d, W %d, "
              "cs %.2f, n_sat %d, prior error %.1f)\n", n, geomean, within, worst, w.tiles, w.W, w.cs, w.n_sat,
              w.prior_error);
  EXPECT_LE(geomean, 1.0);
  EXPECT_GE(within, (9 * n + 9) / 10);
}

// WEAVE_SM_SPLIT_TRACE=1 ... --gtest_also_run_disabled_tests --gtest_filter=*Trace: one scenario's ledger
// every half tile, adaptive and fixed (simulate checks that every task ran).
TEST(SmSplit, DISABLED_Trace) {
  const Scenario s{132, 2, 512, 1.0, 1.0, 32};
  const unsigned seed = static_cast<unsigned>(weave::check::test_seed());
  std::printf("adaptive %.3f\n", simulate(s, -1, seed));
  std::printf("fixed 44 %.3f\n", simulate(s, 44, seed));
}

// ---- AG + GEMM (ag_gemm v10) -------------------------------------------------------------------
// All W ranks of one call, since a rank's tiles of a peer's rows wait for that peer's pushes. Rank
// r's compute tasks are the output tiles in item()'s order (its own shard first, then owners r + 1,
// r + 2, ...); tile i of owner q != r needs ready[r][vrow] = P, the P push units of q's row tile.
// Its communication tasks are its ag_units push units (unit u: row tile u / P), which need every
// rank's arrival (each rank's block 0 signals it when the rank's kernel starts); a finished unit
// adds 1 to ready[d][off[r] + u / P] on every peer d a signal latency later. A tile costs 1 x the
// rank's speed factor on one block; a push unit cs x that factor while at most n_sat of the rank's
// units are in flight and proportionally longer beyond (the rank's links, as a fluid); durations
// jitter; a block's first task in a role other than its last one's costs sw first (its pipeline
// drained and refilled). Blocks decide at their task boundaries, as the kernel's loaders do:
//  - Adaptive, the kernel's rule (sm_ledger.cuh's next_task with compute_ready): a tile is claimed
//    only once its rows are in place, a unit only once every rank arrived; a block that can claim
//    neither polls, holding nothing (here: it sleeps until a ready count or the arrival changes on
//    its rank, the only events that can let it claim); next_role with compute_next_ready, join
//    capped by comm_cap.
//  - Blocking, the obvious design the kernel does not use: tiles claimed in order (fetch-and-add)
//    whether their rows are in place or not, the block then waiting for them (v0's compute blocks'
//    wait in tile_of); the policy as for GEMM + AR (compute_next_ready always true).
//  - Fixed(n): v0, n communicator blocks pushing units c, c + n, ..., the other B - n computing
//    tiles b, b + (B - n), ... (the LCSC deal), each waiting for its rows.
// A run ends when no event is left; it completed if every tile and unit ran, once each (checked),
// else it deadlocked (what was left is reported).
enum class AgMode { Adaptive, Blocking, Fixed };

struct AgScenario {
  int W, B, M, tiles_n, P;
  double cs;       // a push unit's cost at the link's full rate (a tile costs 1)
  int n_sat;       // push units a rank's links carry at full rate
  double lat = 0.01;  // a signal's latency (the arrival, the ready counts)
  std::vector<double> start, speed;  // per rank: when its kernel starts, its cost factor
  double sw = 0.1, jitter = 0.05, prior_error = 1.0;
  std::string name;
};

struct AgRun {
  bool completed = false;
  double makespan = 0;
  std::string why;
};

AgRun simulate_ag(const AgScenario& s, AgMode mode, int n_comm, unsigned seed) {
  using weave::tp::Item;
  using weave::tp::Layout;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const int W = s.W, B = s.B, P = s.P;
  const Layout L = weave::tp::make_layout(s.M, s.tiles_n * weave::tp::kBN, W, 8);
  struct Push {
    int block;
    long long unit;
    double left, start;
  };
  struct Rank {
    View v;
    int comm_role = 0, arrived = 0;
    std::vector<Role> role;
    std::vector<int> last;                  // the role of the block's last task: -1 none, 0 compute, 1 comm
    std::vector<long long> next_fixed, held;  // Fixed: the next task; Blocking: a tile claimed, not yet in place
    std::vector<char> idle;
    std::vector<int> idlers;
    std::vector<int> ready, computed, pushed;
    std::vector<Push> link;
  };
  std::vector<Rank> rk(W);
  for (int r = 0; r < W; ++r) {
    Rank& R = rk[r];
    R.v.blocks = B;
    R.v.compute_tasks = L.work();
    R.v.comm_tasks = weave::tp::ag_units(L, r, P);
    R.v.compute_prior = 1.0 * s.prior_error, R.v.comm_prior = s.cs / s.prior_error;
    R.role.assign(B, Role::Compute);
    R.last.assign(B, -1);
    R.next_fixed.assign(B, 0);
    R.held.assign(B, -1);
    R.idle.assign(B, 0);
    R.ready.assign(L.row_tiles(), 0);
    R.computed.assign(L.work(), 0);
    R.pushed.assign(R.v.comm_tasks, 0);
    if (mode == AgMode::Fixed)
      for (int b = 0; b < B; ++b) {
        const bool comm = b >= B - n_comm;
        R.role[b] = comm ? Role::Comm : Role::Compute;
        R.next_fixed[b] = comm ? b - (B - n_comm) : b;
      }
  }
  enum Kind { kDecide, kTileDone, kPushStart, kSignal, kArrive };
  struct Event {
    double t;
    long long seq;
    int kind, rank, a;   // a: the block (kDecide, kTileDone, kPushStart) or the row tile (kSignal)
    long long index;     // the tile or unit
    double cost;
    bool operator<(const Event& o) const { return t > o.t || (t == o.t && seq > o.seq); }
  };
  std::priority_queue<Event> q;
  long long seq = 0;
  auto post = [&](double t, int kind, int r, int a, long long index = -1, double cost = 0) {
    q.push({t, seq++, kind, r, a, index, cost});
  };
  for (int r = 0; r < W; ++r) {
    for (int d = 0; d < W; ++d) post(s.start[r] + s.lat, kArrive, d, 0);  // block 0 of rank r, first
    for (int b = 0; b < B; ++b) post(s.start[r], kDecide, r, b);
  }
  double now = 0, end = 0;
  auto rows_in = [&](int r, long long i) {
    const Item t = weave::tp::item(L, r, static_cast<int>(i));
    return t.owner == r || rk[r].ready[t.vrow] >= P;
  };
  auto sleep = [&](int r, int b) {
    if (!rk[r].idle[b]) rk[r].idle[b] = 1, rk[r].idlers.push_back(b);
  };
  auto wake = [&](int r) {
    for (int b : rk[r].idlers) rk[r].idle[b] = 0, post(now, kDecide, r, b);
    rk[r].idlers.clear();
  };
  bool bad_order = false;
  auto start_tile = [&](int r, int b, long long i) {
    Rank& R = rk[r];
    if (!rows_in(r, i)) bad_order = true;  // a tile computed before its rows arrived
    const double t0 = now + (R.last[b] == 1 ? s.sw : 0);
    R.last[b] = 0;
    R.computed[i]++;
    const double d = s.speed[r] * (1 + s.jitter * u(rng));
    post(t0 + d, kTileDone, r, b, i, d);
  };
  auto start_push = [&](int r, int b, long long k) {
    Rank& R = rk[r];
    const double t0 = now + (R.last[b] == 0 ? s.sw : 0);
    R.last[b] = 1;
    post(t0, kPushStart, r, b, k);
  };
  auto decide = [&](int r, int b) {
    Rank& R = rk[r];
    const bool arrived = R.arrived >= W;
    if (mode == AgMode::Fixed) {
      long long& k = R.next_fixed[b];
      if (R.role[b] == Role::Comm) {
        if (k >= R.v.comm_tasks) return;
        if (!arrived) return sleep(r, b);
        R.v.comm_claimed++;
        start_push(r, b, k);
        k += n_comm;
      } else {
        if (k >= R.v.compute_tasks) return;
        if (!rows_in(r, k)) return sleep(r, b);
        R.v.compute_claimed++;
        start_tile(r, b, k);
        k += B - n_comm;
      }
      return;
    }
    if (R.held[b] >= 0) {  // Blocking: waiting in tile_of
      if (!rows_in(r, R.held[b])) return sleep(r, b);
      start_tile(r, b, R.held[b]);
      R.held[b] = -1;
      return;
    }
    View v = R.v;
    v.comm_blocks = R.comm_role;
    v.comm_next_ready = v.comm_claimed < v.comm_tasks && arrived;
    if (mode == AgMode::Adaptive) v.compute_next_ready = v.compute_claimed < v.compute_tasks && rows_in(r, v.compute_claimed);
    Role want = next_role(v, R.role[b]);
    if (want == Role::Comm && R.role[b] != Role::Comm) {  // join_comm
      if (v.compute_claimed < v.compute_tasks && R.comm_role >= comm_cap(v)) want = Role::Compute;
      else R.comm_role++, R.role[b] = Role::Comm;
    }
    if (want != Role::Comm && R.role[b] == Role::Comm) R.comm_role--;
    R.role[b] = want;
    if (want == Role::Done) return;
    if (want == Role::Compute) {
      const long long i = R.v.compute_claimed;
      if (mode == AgMode::Adaptive && !v.compute_next_ready) return sleep(r, b);  // poll, holding nothing
      R.v.compute_claimed++;
      if (!rows_in(r, i)) {  // Blocking: the block waits for the rows
        R.held[b] = i;
        return sleep(r, b);
      }
      start_tile(r, b, i);
      return;
    }
    if (!arrived) return sleep(r, b);  // a unit is claimed once every rank arrived
    start_push(r, b, R.v.comm_claimed++);
  };
  long long events = 0;
  for (;;) {
    // The first push to finish at its rank's present share of the links, against the queue.
    int lr = -1;
    size_t li = 0;
    double t_link = 1e300;
    for (int r = 0; r < W; ++r) {
      const Rank& R = rk[r];
      if (R.link.empty()) continue;
      const double rate = std::min(1.0, static_cast<double>(s.n_sat) / R.link.size()) / (s.cs * s.speed[r]);
      for (size_t i = 0; i < R.link.size(); ++i)
        if (now + R.link[i].left / rate < t_link) t_link = now + R.link[i].left / rate, lr = r, li = i;
    }
    if (q.empty() && lr < 0) break;
    if (++events > 50'000'000) return {false, now, "no end after 50M events"};
    const bool from_link = lr >= 0 && (q.empty() || t_link < q.top().t);
    const double t = from_link ? t_link : q.top().t;
    for (Rank& R : rk) {
      if (R.link.empty()) continue;
      const int r = static_cast<int>(&R - rk.data());
      const double rate = std::min(1.0, static_cast<double>(s.n_sat) / R.link.size()) / (s.cs * s.speed[r]);
      for (Push& x : R.link) x.left -= (t - now) * rate;
    }
    now = t;
    if (from_link) {
      Rank& R = rk[lr];
      const Push x = R.link[li];
      R.link.erase(R.link.begin() + static_cast<long>(li));
      R.pushed[x.unit]++;
      R.v.comm_done++, R.v.comm_cycles += now - x.start;
      end = std::max(end, now);
      for (int d = 0; d < W; ++d)
        if (d != lr) post(now + s.lat, kSignal, d, L.off[lr] + static_cast<int>(x.unit / P));
      decide(lr, x.block);
      continue;
    }
    const Event e = q.top();
    q.pop();
    Rank& R = rk[e.rank];
    switch (e.kind) {
      case kDecide: decide(e.rank, e.a); break;
      case kTileDone:
        R.v.compute_done++, R.v.compute_cycles += e.cost;
        end = std::max(end, now);
        decide(e.rank, e.a);
        break;
      case kPushStart: R.link.push_back({e.a, e.index, 1 + s.jitter * u(rng), now}); break;
      case kSignal:
        // Adaptive: a sleeping block waits for the next tile's rows or the arrival; a count that
        // leaves the next tile waiting changes none of its choices (the others wait for their own
        // tile: wake them all).
        R.ready[e.a]++;
        if (mode != AgMode::Adaptive || (R.v.compute_claimed < R.v.compute_tasks && rows_in(e.rank, R.v.compute_claimed)))
          wake(e.rank);
        break;
      case kArrive:
        if (++R.arrived == W) wake(e.rank);
        break;
    }
  }
  AgRun res;
  res.makespan = end;
  res.completed = true;
  for (int r = 0; r < W && res.completed; ++r) {
    const Rank& R = rk[r];
    for (long long i = 0; i < R.v.compute_tasks; ++i)
      if (R.computed[i] != 1) {
        res.completed = false;
        res.why = "rank " + std::to_string(r) + ": tile " + std::to_string(i) + " computed " +
                  std::to_string(R.computed[i]) + " times (" + std::to_string(R.v.compute_done) + " of " +
                  std::to_string(R.v.compute_tasks) + " tiles, " + std::to_string(R.v.comm_done) + " of " +
                  std::to_string(R.v.comm_tasks) + " units done)";
        break;
      }
    for (long long k = 0; k < R.v.comm_tasks && res.completed; ++k)
      if (R.pushed[k] != 1) {
        res.completed = false;
        res.why = "rank " + std::to_string(r) + ": unit " + std::to_string(k) + " pushed " +
                  std::to_string(R.pushed[k]) + " times";
      }
  }
  if (bad_order) res.completed = false, res.why += " (a tile computed before its rows arrived)";
  return res;
}

// A shape: `tm` row tiles per shard (M ragged: 37 rows short of W tm full tiles), `tn` column tiles.
AgScenario ag_scenario(int W, int B, int tm, int tn, int P, double cs, int n_sat) {
  AgScenario s;
  s.W = W, s.B = B, s.M = W * tm * weave::tp::kBM - 37, s.tiles_n = tn, s.P = P, s.cs = cs, s.n_sat = n_sat;
  s.start.assign(W, 0.0);
  s.speed.assign(W, 1.0);
  return s;
}

// The peers' timing: 0 together and alike; 1 the last rank 10 tiles late; 2 rank 0 at half speed;
// 3 starts in [0, 3] and speeds in [0.6, 1.8] at random; 4 every signal 3 tiles late (the arrival
// seen long after the own tiles end); 5 rank 0 twice as fast as the others, which start 2 late.
void ag_peers(AgScenario& s, int mode, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> st(0, 3), sp(0.6, 1.8);
  static const char* names[] = {"together", "last rank late", "rank 0 slow", "random", "late signals", "rank 0 fast"};
  s.name += std::string(" peers ") + names[mode];
  switch (mode) {
    case 1: s.start[s.W - 1] = 10; break;
    case 2: s.speed[0] = 2; break;
    case 3:
      for (int r = 0; r < s.W; ++r) s.start[r] = st(rng), s.speed[r] = sp(rng);
      break;
    case 4: s.lat = 3; break;
    case 5:
      s.speed[0] = 0.5;
      for (int r = 1; r < s.W; ++r) s.start[r] = 2;
      break;
    default: break;
  }
}

std::string ag_label(const AgScenario& s) {
  return "W " + std::to_string(s.W) + " B " + std::to_string(s.B) + " M " + std::to_string(s.M) + " tiles_n " +
         std::to_string(s.tiles_n) + " P " + std::to_string(s.P) + " cs " + std::to_string(s.cs) + " n_sat " +
         std::to_string(s.n_sat) + s.name;
}

// The kernel's claims complete every call: W = 2..8; grids of 1 block (the rule alone moves it
// from a stalled tile to the pushes), a few, and a full H100's; shards of one to 12 row tiles (one
// own tile per block or far fewer), 1 or 6 column tiles, P 1 or 4; pushes cheap and dear; every
// peer timing of ag_peers; priors right or off 4x. Every tile and unit once, each tile only after
// its rows arrived (simulate_ag checks).
TEST(AgModel, KernelClaimsNeverDeadlock) {
  const unsigned long long seed = weave::check::test_seed();
  std::mt19937_64 rng(seed);
  int runs = 0;
  for (int W = 2; W <= 8; ++W)
    for (int B : {1, 3, 16, 132})
      for (int tm : {1, 3, 12})
        for (int tn : {1, 6})
          for (int P : {1, 4})
            for (double cs : {0.1, 2.0})
              for (int peers = 0; peers < 6; ++peers) {
                AgScenario s = ag_scenario(W, B, tm, tn, P, cs, 4);
                ag_peers(s, peers, rng);
                s.prior_error = (runs % 3 == 0) ? 4.0 : (runs % 3 == 1) ? 0.25 : 1.0;
                const AgRun a = simulate_ag(s, AgMode::Adaptive, 0, static_cast<unsigned>(seed + runs++));
                ASSERT_TRUE(a.completed) << ag_label(s) << ": " << a.why;
              }
  std::printf("%d AG + GEMM calls simulated, every one completed\n", runs);
}

// The blocking claims deadlock where the arrival is seen only after a rank's own tiles: every block
// of both ranks then sits on a peer's tile, and no rank pushes. The kernel's rule completes the
// same calls; so do fixed splits (v0: its pushers wait only for the arrival).
TEST(AgModel, BlockingClaimsCanDeadlock) {
  const unsigned seed = static_cast<unsigned>(weave::check::test_seed());
  std::mt19937_64 rng(seed);
  AgScenario s = ag_scenario(2, 8, 1, 8, 4, 0.2, 4);  // 8 own tiles per rank, one per block
  ag_peers(s, 4, rng);                                 // signals 3 tiles late
  const AgRun blocking = simulate_ag(s, AgMode::Blocking, 0, seed);
  EXPECT_FALSE(blocking.completed) << "the blocking claims completed: " << ag_label(s);
  std::printf("blocking claims: %s\n", blocking.why.c_str());
  EXPECT_TRUE(simulate_ag(s, AgMode::Adaptive, 0, seed).completed);
  for (int n : {1, 4, 7}) EXPECT_TRUE(simulate_ag(s, AgMode::Fixed, n, seed).completed) << n;
  // Wider: over the scenarios above at W = 2 and 4, how often the blocking claims deadlock.
  int dead = 0, total = 0;
  for (int W : {2, 4})
    for (int B : {3, 16, 132})
      for (int tm : {1, 3})
        for (int peers = 0; peers < 6; ++peers) {
          AgScenario x = ag_scenario(W, B, tm, 2, 4, 0.2, 4);
          ag_peers(x, peers, rng);
          ++total;
          dead += !simulate_ag(x, AgMode::Blocking, 0, seed + total).completed;
          ASSERT_TRUE(simulate_ag(x, AgMode::Adaptive, 0, seed + total).completed) << ag_label(x);
        }
  std::printf("blocking claims deadlocked in %d of %d calls; the kernel's claims in none\n", dead, total);
  EXPECT_GT(dead, 0);
}

// The controller against fixed splits (v0's division: n communicator blocks, 1..64) on a full
// grid, W 2 and 8, shards of 4 and 16 row tiles of 8 columns, pushes of 0.1 and 0.5 tile on links
// of 8 and 32 units, peers together or rank 0 at half speed. Reported, not a target: the issue's
// comparison is on GPUs (weave-bench tp --sweep), where the fixed splits' best already loses to
// the aux-warp pushes (kernels/tp_common/README.md). Over seeds 1-6: geomean 1.005-1.008, 24 of 32
// within 5 % (a third of them faster than every fixed split, down to 0.84), worst 1.26-1.27, always W 8
// with rank 0 at half speed: eq. 2 spreads the slow rank's pushes to end with its own (slow)
// compute, while its 7 peers wait for its rows. Bounded loosely, so that a policy change that
// makes the controller far worse than any fixed split shows.
TEST(AgModel, AdaptiveAgainstFixedSplits) {
  const unsigned long long seed = weave::check::test_seed();
  std::mt19937_64 rng(seed);
  int n = 0, within = 0;
  double sum_log = 0, worst = 0;
  std::string worst_s;
  for (int W : {2, 8})
    for (int tm : {4, 16})
      for (double cs : {0.1, 0.5})
        for (int n_sat : {8, 32})
          for (int peers : {0, 2}) {
            AgScenario s = ag_scenario(W, 132, tm, 8, 4, cs, n_sat);
            ag_peers(s, peers, rng);
            double best = 1e300;
            int best_n = 0;
            for (int k : {1, 2, 4, 8, 12, 16, 24, 32, 48, 64}) {
              const AgRun f = simulate_ag(s, AgMode::Fixed, k, static_cast<unsigned>(seed));
              ASSERT_TRUE(f.completed) << ag_label(s) << " fixed " << k << ": " << f.why;
              if (f.makespan < best) best = f.makespan, best_n = k;
            }
            const AgRun x = simulate_ag(s, AgMode::Adaptive, 0, static_cast<unsigned>(seed));
            ASSERT_TRUE(x.completed) << ag_label(s) << ": " << x.why;
            const double a = x.makespan;
            const double ratio = a / best;
            ++n;
            sum_log += std::log(ratio);
            within += ratio <= 1.05;
            if (ratio > worst) worst = ratio, worst_s = ag_label(s) + " (best fixed " + std::to_string(best_n) + ")";
            EXPECT_LE(ratio, 1.5) << ag_label(s) << ": adaptive " << a << ", best fixed " << best << " at " << best_n;
          }
  std::printf("AG + GEMM, adaptive / best fixed split over %d scenarios: geomean %.3f, %d within 5 %%, worst %.3f (%s)\n",
              n, std::exp(sum_log / n), within, worst, worst_s.c_str());
}

}  // namespace
