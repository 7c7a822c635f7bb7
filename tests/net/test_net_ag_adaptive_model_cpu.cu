// CPU event simulation of the inter-node AG + GEMM with the adaptive SM split
// (kernels/net_tp/net_ag_adaptive_kernel.cuh; one rank per node), all W nodes of a call at once,
// since a rank's tiles of a peer's rows wait for that peer's sends. The tasks are the kernel's:
// layout.hpp's ag_comm_task list (every own unit's send, then the receives in step order) and
// tp::item's tiles; the policy is sm_split.hpp's (next_role, comm_cap: the functions the kernel
// runs). The model, in units of one tile's time on one block:
//  - a tile costs the rank's speed factor; it may start only once its P units were received here;
//  - a send costs cs_send on its block (staging into the mapped send buffer), then its unit goes to
//    every peer over the rank's NIC: `net` per unit at full rate while at most n_sat units are in
//    flight, proportionally longer beyond (a fluid), plus `lat` before the peer's flag rises;
//  - a receive costs cs_recv on its block (out of the mapped receive buffer) once the flag rose,
//    then counts its unit in on its row tile;
//  - durations jitter; a block's first task in a role other than its last one's costs sw first.
// Blocks decide at task boundaries as the kernel's loaders do:
//  - Adaptive (sm_ledger.cuh's next_task with compute_ready): a tile claimed only once its rows are
//    in, a communication task only once its input is (a send at once, a receive once its flag
//    rose), in list order; a block that can claim neither polls, holding nothing (here: it sleeps
//    until this rank's flags, row counts or claims change, the only events that can let it claim);
//  - Fixed(S, R): the fixed kernel, S send blocks (own units c, c + S, ...), R receive blocks
//    (receives in step order b, b + R, ...), the other B - S - R computing tiles in the LCSC deal,
//    every block waiting for its next task's input.
// A run ends when no event is left; it completed if every tile and task of every rank ran, once
// each, every tile after its rows (checked), else it deadlocked.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "check/seed.hpp"
#include "net_tp/layout.hpp"
#include "tp_common/sm_split.hpp"

namespace {

namespace tn = weave::net::tp_net;
using weave::tp::sm_split::comm_cap;
using weave::tp::sm_split::next_role;
using weave::tp::sm_split::Role;
using weave::tp::sm_split::View;

struct Scenario {
  int W = 2, B = 16, tm = 2, tn = 4, P = 4;
  double cs_send = 0.1, cs_recv = 0.1, net = 0.5, lat = 1.0;
  int n_sat = 4;
  std::vector<double> start, speed;  // per rank: when its kernel starts, its cost factor
  double sw = 0.1, jitter = 0.05, prior_error = 1.0;
  std::string name;
};

std::string label(const Scenario& s) {
  char b[256];
  std::snprintf(b, sizeof b, "W %d B %d tm %d tn %d P %d send %.2f recv %.2f net %.2f lat %.2f n_sat %d prior x%.2f%s",
                s.W, s.B, s.tm, s.tn, s.P, s.cs_send, s.cs_recv, s.net, s.lat, s.n_sat, s.prior_error, s.name.c_str());
  return b;
}

Scenario make(int W, int B, int tm, int tn, int P) {
  Scenario s;
  s.W = W, s.B = B, s.tm = tm, s.tn = tn, s.P = P;
  s.start.assign(W, 0.0);
  s.speed.assign(W, 1.0);
  return s;
}

// The peers' timing: 0 together and alike; 1 the last rank 10 tiles late; 2 rank 0 at half speed;
// 3 starts in [0, 3] and speeds in [0.6, 1.8] at random.
void peers(Scenario& s, int mode, std::mt19937_64& rng) {
  static const char* names[] = {"together", "last rank late", "rank 0 slow", "random"};
  std::uniform_real_distribution<double> st(0, 3), sp(0.6, 1.8);
  s.name = std::string(", peers ") + names[mode];
  if (mode == 1) s.start[s.W - 1] = 10;
  if (mode == 2) s.speed[0] = 2;
  if (mode == 3)
    for (int r = 0; r < s.W; ++r) s.start[r] = st(rng), s.speed[r] = sp(rng);
}

struct Result {
  bool completed = false;
  double makespan = 0;
  std::string why;
};

Result simulate(const Scenario& s, bool adaptive, int n_send, int n_recv, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> jit(-1.0, 1.0);
  const int W = s.W, B = s.B;
  // M ragged (37 rows short of W tm full row tiles); K = 1024 bf16, chunks giving P units a tile.
  const long long row_bytes = 2048;
  const tn::UnitPlan a = tn::make_plan(weave::tp::make_layout(W * s.tm * weave::tp::kBM - 37, s.tn * weave::tp::kBN, W, 8),
                                       row_bytes, row_bytes * weave::tp::kBM / s.P);
  const weave::tp::Layout& L = a.L;
  struct Transfer {
    int to;
    uint32_t flag;
    double left;
  };
  struct Rank {
    View v;
    int comm_role = 0;
    std::vector<Role> role;
    std::vector<int> last;          // the role of the block's last task: -1 none, 0 compute, 1 comm
    std::vector<long long> next;    // Fixed: the block's next task
    std::vector<char> idle;
    std::vector<int> idlers;
    std::vector<int> rows_in, computed, ran;
    std::vector<char> flags;
    std::vector<Transfer> nic;
  };
  std::vector<Rank> rk(W);
  const int C = B - n_send - n_recv;  // Fixed: compute blocks
  for (int r = 0; r < W; ++r) {
    Rank& R = rk[r];
    R.v.blocks = B;
    R.v.compute_tasks = L.work();
    R.v.comm_tasks = tn::ag_comm_tasks(a, r);
    R.v.compute_prior = s.speed[r] * s.prior_error;
    R.v.comm_prior = 0.5 * (s.cs_send + s.cs_recv) / s.prior_error;
    R.role.assign(B, Role::Compute);
    R.last.assign(B, -1);
    R.next.assign(B, 0);
    R.idle.assign(B, 0);
    R.rows_in.assign(L.row_tiles(), 0);
    R.computed.assign(L.work(), 0);
    R.ran.assign(R.v.comm_tasks, 0);
    R.flags.assign(static_cast<size_t>(tn::flags_needed(a)), 0);
    if (!adaptive)
      for (int b = 0; b < B; ++b) R.next[b] = b < n_send ? b : b < n_send + n_recv ? b - n_send : b - n_send - n_recv;
  }
  enum Kind { kDecide, kTileDone, kSendDone, kRecvDone, kFlag };
  struct Event {
    double t;
    long long seq;
    int kind, rank, a;  // a: the block, or the flag (kFlag)
    long long index;
    double cost;
    bool operator<(const Event& o) const { return t > o.t || (t == o.t && seq > o.seq); }
  };
  std::priority_queue<Event> q;
  long long seq = 0;
  auto post = [&](double t, int kind, int r, int x, long long index = -1, double cost = 0) {
    q.push({t, seq++, kind, r, x, index, cost});
  };
  for (int r = 0; r < W; ++r)
    for (int b = 0; b < B; ++b) post(s.start[r], kDecide, r, b);
  double now = 0, end = 0;
  bool bad_order = false;
  auto bytes = [&](int q, int u) {
    long long b0, b1;
    tn::unit(a, q, u, &b0, &b1);
    return b1 > b0;
  };
  auto rows_ok = [&](int r, long long i) {
    const weave::tp::Item t = weave::tp::item(L, r, static_cast<int>(i));
    return t.owner == r || rk[r].rows_in[t.vrow] >= a.P;
  };
  auto in_place = [&](int r, long long k) {
    const tn::AgCommTask t = tn::ag_comm_task(a, r, k);
    return t.kind == tn::AgCommKind::Send || !bytes(t.peer, t.u) || rk[r].flags[tn::flag(a, t.s, t.u)];
  };
  auto sleep = [&](int r, int b) {
    if (!rk[r].idle[b]) rk[r].idle[b] = 1, rk[r].idlers.push_back(b);
  };
  auto wake = [&](int r) {
    for (int b : rk[r].idlers) rk[r].idle[b] = 0, post(now, kDecide, r, b);
    rk[r].idlers.clear();
  };
  auto start = [&](int r, int b, int role, double cost) {
    const double t0 = now + (rk[r].last[b] >= 0 && rk[r].last[b] != role ? s.sw : 0);
    rk[r].last[b] = role;
    return t0 + cost * (1 + s.jitter * jit(rng));
  };
  auto start_tile = [&](int r, int b, long long i) {
    if (!rows_ok(r, i)) bad_order = true;
    rk[r].computed[i]++;
    const double t1 = start(r, b, 0, s.speed[r]);
    post(t1, kTileDone, r, b, i, t1 - now);
  };
  auto start_comm = [&](int r, int b, long long k) {
    rk[r].ran[k]++;
    const bool send = tn::ag_comm_task(a, r, k).kind == tn::AgCommKind::Send;
    const double t1 = start(r, b, 1, send ? s.cs_send : s.cs_recv);
    post(t1, send ? kSendDone : kRecvDone, r, b, k, t1 - now);
  };
  auto decide = [&](int r, int b) {
    Rank& R = rk[r];
    if (!adaptive) {
      long long& k = R.next[b];
      if (b < n_send) {
        if (k >= tn::units(a, r)) return;
        start_comm(r, b, k);
        k += n_send;
      } else if (b < n_send + n_recv) {
        if (tn::units(a, r) + k >= R.v.comm_tasks) return;
        if (!in_place(r, tn::units(a, r) + k)) return sleep(r, b);
        start_comm(r, b, tn::units(a, r) + k);
        k += n_recv;
      } else {
        if (k >= R.v.compute_tasks) return;
        if (!rows_ok(r, k)) return sleep(r, b);
        start_tile(r, b, k);
        k += C;
      }
      return;
    }
    View v = R.v;
    v.comm_blocks = R.comm_role;
    v.comm_next_ready = v.comm_claimed < v.comm_tasks && in_place(r, v.comm_claimed);
    v.compute_next_ready = v.compute_claimed < v.compute_tasks && rows_ok(r, v.compute_claimed);
    Role want = next_role(v, R.role[b]);
    if (want == Role::Comm && R.role[b] != Role::Comm) {  // sm_ledger.cuh's join_comm
      if (v.compute_claimed < v.compute_tasks && R.comm_role >= comm_cap(v)) want = Role::Compute;
      else R.comm_role++, R.role[b] = Role::Comm;
    }
    if (want != Role::Comm && R.role[b] == Role::Comm) R.comm_role--;
    R.role[b] = want;
    if (want == Role::Done) return;
    if (want == Role::Compute) {
      if (!v.compute_next_ready) return sleep(r, b);  // poll, holding nothing
      start_tile(r, b, R.v.compute_claimed++);
    } else {
      if (!in_place(r, R.v.comm_claimed)) return sleep(r, b);
      start_comm(r, b, R.v.comm_claimed++);
    }
    wake(r);  // a head moved: the pollers decide again
  };
  auto nic_rate = [&](const Rank& R) { return std::min(1.0, double(s.n_sat) / double(R.nic.size())) / s.net; };
  long long events = 0;
  for (;;) {
    int lr = -1;
    size_t li = 0;
    double t_nic = 1e300;
    for (int r = 0; r < W; ++r)
      for (size_t i = 0; i < rk[r].nic.size(); ++i)
        if (now + rk[r].nic[i].left / nic_rate(rk[r]) < t_nic) t_nic = now + rk[r].nic[i].left / nic_rate(rk[r]), lr = r, li = i;
    if (q.empty() && lr < 0) break;
    if (++events > 20'000'000) return {false, now, "no end after 20M events"};
    const bool from_nic = lr >= 0 && (q.empty() || t_nic < q.top().t);
    const double t = from_nic ? t_nic : q.top().t;
    for (Rank& R : rk)
      if (!R.nic.empty()) {
        const double rate = nic_rate(R);
        for (Transfer& x : R.nic) x.left -= (t - now) * rate;
      }
    now = t;
    if (from_nic) {
      const Transfer x = rk[lr].nic[li];
      rk[lr].nic.erase(rk[lr].nic.begin() + static_cast<long>(li));
      post(now + s.lat, kFlag, x.to, static_cast<int>(x.flag));
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
      case kSendDone: {
        const tn::AgCommTask x = tn::ag_comm_task(a, e.rank, e.index);
        if (bytes(e.rank, x.u))
          for (int st = 0; st < tn::steps(a); ++st)
            R.nic.push_back({tn::send_peer(a, e.rank, st), static_cast<uint32_t>(tn::flag(a, st, x.u)), 1 + s.jitter * jit(rng)});
        R.v.comm_done++, R.v.comm_cycles += e.cost;
        end = std::max(end, now);
        decide(e.rank, e.a);
        break;
      }
      case kRecvDone: {
        const tn::AgCommTask x = tn::ag_comm_task(a, e.rank, e.index);
        R.rows_in[L.off[x.peer] + x.u / a.P]++;
        R.v.comm_done++, R.v.comm_cycles += e.cost;
        end = std::max(end, now);
        wake(e.rank);
        decide(e.rank, e.a);
        break;
      }
      case kFlag:
        R.flags[e.a] = 1;
        wake(e.rank);
        break;
    }
  }
  Result res;
  res.makespan = end;
  res.completed = true;
  for (int r = 0; r < W && res.completed; ++r) {
    const Rank& R = rk[r];
    for (long long i = 0; i < R.v.compute_tasks && res.completed; ++i)
      if (R.computed[i] != 1)
        res.completed = false, res.why = "rank " + std::to_string(r) + ": tile " + std::to_string(i) + " computed " +
                                         std::to_string(R.computed[i]) + " times";
    for (long long k = 0; k < R.v.comm_tasks && res.completed; ++k)
      if (R.ran[k] != 1)
        res.completed = false, res.why = "rank " + std::to_string(r) + ": communication task " + std::to_string(k) +
                                         " ran " + std::to_string(R.ran[k]) + " times";
  }
  if (bad_order) res.completed = false, res.why += " (a tile computed before its rows arrived)";
  return res;
}

// The kernel's claims complete every call, over random configurations: W 2..8, grids of 1 block
// (the stalled-work rule alone moves it from a waiting tile to the network), a few, and a full
// H100's; shards of 1 to 12 row tiles, 1 to 8 column tiles, P 1 to 8; sends, receives and the
// network cheap and dear against a tile, latencies of 0 to 20 tiles; every peer timing of peers();
// priors right or off 4x either way.
TEST(NetAgAdaptiveModel, KernelClaimsNeverDeadlock) {
  const unsigned long long seed = weave::check::test_seed();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> w(2, 8), pick(0, 3), tm(1, 12), tnd(1, 8);
  std::uniform_real_distribution<double> lg(std::log(0.02), std::log(2.0)), lat(0, 20);
  const int runs = 400;
  for (int i = 0; i < runs; ++i) {
    static const int blocks[] = {1, 3, 16, 132}, slices[] = {1, 2, 4, 8};
    static const double prior[] = {0.25, 1.0, 4.0, 1.0};
    Scenario s = make(w(rng), blocks[pick(rng)], tm(rng), tnd(rng), slices[pick(rng)]);
    s.cs_send = std::exp(lg(rng)), s.cs_recv = std::exp(lg(rng)), s.net = std::exp(lg(rng)), s.lat = lat(rng);
    s.n_sat = 1 + pick(rng) * 4;
    s.prior_error = prior[pick(rng)];
    peers(s, pick(rng), rng);
    const Result x = simulate(s, true, 0, 0, static_cast<unsigned>(seed + i));
    ASSERT_TRUE(x.completed) << label(s) << ": " << x.why;
  }
  std::printf("%d inter-node AG + GEMM calls simulated, every one completed\n", runs);
}

// The controller against the fixed kernel's splits (S send + R receive blocks, S 1..4, R 2..32) on
// a full grid: W 2, 4 and 8, shards of 2 and 6 row tiles of 8 columns, P 4, the network at a
// quarter and twice a tile per unit with latencies of 1 and 10 tiles, peers together or rank 0 at
// half speed. The ratio to the best fixed split is reported and bounded by kWithin (what the model
// showed when this test was written, with margin; the issue's 5 % target is for GPUs, weave-bench
// net_tp --sweep), so that a change that makes the controller far worse than the fixed splits shows.
TEST(NetAgAdaptiveModel, AdaptiveAgainstFixedSplits) {
  constexpr double kWithin = 1.5;
  const unsigned long long seed = weave::check::test_seed();
  std::mt19937_64 rng(seed);
  int n = 0, within = 0;
  double sum_log = 0, worst = 0;
  std::string worst_s;
  for (int W : {2, 4, 8})
    for (int tm : {2, 6})
      for (double net : {0.25, 2.0})
        for (double lat : {1.0, 10.0})
          for (int p : {0, 2}) {
            Scenario s = make(W, 132, tm, 8, 4);
            s.net = net, s.lat = lat, s.cs_send = 0.1, s.cs_recv = 0.1, s.n_sat = 8;
            peers(s, p, rng);
            double best = 1e300;
            int best_s = 0, best_r = 0;
            for (int S : {1, 2, 4})
              for (int R : {2, 4, 8, 16, 32}) {
                const Result f = simulate(s, false, S, R, static_cast<unsigned>(seed));
                ASSERT_TRUE(f.completed) << label(s) << " fixed " << S << "+" << R << ": " << f.why;
                if (f.makespan < best) best = f.makespan, best_s = S, best_r = R;
              }
            const Result x = simulate(s, true, 0, 0, static_cast<unsigned>(seed));
            ASSERT_TRUE(x.completed) << label(s) << ": " << x.why;
            const double ratio = x.makespan / best;
            ++n;
            sum_log += std::log(ratio);
            within += ratio <= 1.05;
            if (ratio > worst)
              worst = ratio, worst_s = label(s) + " (best fixed " + std::to_string(best_s) + "+" + std::to_string(best_r) + ")";
            EXPECT_LE(ratio, kWithin) << label(s) << ": adaptive " << x.makespan << ", best fixed " << best << " at "
                                      << best_s << "+" << best_r;
          }
  std::printf("inter-node AG + GEMM, adaptive / best fixed split over %d scenarios: geomean %.3f, %d within 5 %%, "
              "worst %.3f (%s)\n",
              n, std::exp(sum_log / n), within, worst, worst_s.c_str());
}

}  // namespace
