// The collectives' schedules, executed on the CPU for W = 2..8 and ragged shapes: every output
// element of every rank written exactly once and with the right value, every access inside its
// buffer, and every wait's expected count equal to the signals sent to it.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "collectives/plan.hpp"

using namespace weave::coll;

namespace {

// Executes rank r's plan on per-rank int32 buffers (elt = 4): copies move bytes, reductions sum.
struct Sim {
  std::vector<std::vector<int32_t>> in, out;
  std::vector<std::vector<int>> writes;  // per rank, per output element

  void run(const Plan& p) {
    for (int j = 0; j < p.n; ++j) {
      const Xfer& x = p.x[j];
      ASSERT_GE(x.nsrc, 1);
      ASSERT_GE(x.ndst, 1);
      ASSERT_EQ(x.row_bytes % 4, 0);
      for (long long o = 0; o < x.outer; ++o)
        for (long long row = 0; row < x.rows; ++row)
          for (long long b = 0; b < x.row_bytes; b += 4) {
            const long long so = x.src_off + o * x.src_outer_pitch + row * x.src_pitch + b;
            const long long dof = x.dst_off + o * x.dst_outer_pitch + row * x.dst_pitch + b;
            int64_t v = 0;
            for (int i = 0; i < x.nsrc; ++i) {
              auto& src = in[x.src_rank[i]];
              ASSERT_LT(so / 4, static_cast<long long>(src.size())) << "read past the input";
              v += src[so / 4];
            }
            for (int i = 0; i < x.ndst; ++i) {
              auto& dst = out[x.dst_rank[i]];
              ASSERT_LT(dof / 4, static_cast<long long>(dst.size())) << "write past the output";
              dst[dof / 4] = static_cast<int32_t>(v);
              writes[x.dst_rank[i]][dof / 4]++;
            }
          }
    }
  }
  void init(int W, long long in_elems, const std::vector<long long>& out_elems, std::mt19937& rng) {
    in.assign(W, {});
    out.assign(W, {});
    writes.assign(W, {});
    for (int r = 0; r < W; ++r) {
      in[r].resize(in_elems);
      for (auto& e : in[r]) e = static_cast<int32_t>(rng() % 1000);
      out[r].assign(out_elems[r], -1);
      writes[r].assign(out_elems[r], 0);
    }
  }
  void expect_written_once() {
    for (size_t r = 0; r < writes.size(); ++r)
      for (size_t i = 0; i < writes[r].size(); ++i)
        ASSERT_EQ(writes[r][i], 1) << "rank " << r << " output element " << i;
  }
};

Shape random_shape(std::mt19937& rng) {
  Shape s;
  s.ndim = 1 + rng() % 4;
  for (int i = 0; i < s.ndim; ++i) s.d[i] = 1 + rng() % (s.ndim <= 2 ? 40 : 9);
  return s;
}

// Index of (i0..i3) in a row-major tensor of shape s.
long long flat(const Shape& s, const long long* i) {
  long long f = 0;
  for (int k = 0; k < s.ndim; ++k) f = f * s.d[k] + i[k];
  return f;
}

template <class F>
void for_each_index(const Shape& s, F&& f) {
  long long i[4] = {0, 0, 0, 0};
  const long long n = s.numel();
  for (long long c = 0; c < n; ++c) {
    f(i);
    for (int k = s.ndim - 1; k >= 0; --k) {
      if (++i[k] < s.d[k]) break;
      i[k] = 0;
    }
  }
}

}  // namespace

TEST(Shard, CoversTheDimensionInOrder) {
  for (int W = 1; W <= 8; ++W)
    for (long long n = 0; n < 50; ++n) {
      long long next = 0;
      for (int r = 0; r < W; ++r) {
        Range g = shard(n, W, r);
        EXPECT_EQ(g.begin, next);
        EXPECT_GE(g.size, n / W);
        EXPECT_LE(g.size, n / W + 1);
        next += g.size;
      }
      EXPECT_EQ(next, n);
    }
}

TEST(Schedule, AllReduceOneAndTwoShot) {
  std::mt19937 rng(1);
  for (int W = 2; W <= 8; ++W)
    for (long long count : {1ll, 3ll, 4ll, 5ll, 31ll, 100ll, 1000ll, 4099ll}) {
      for (bool two : {false, true}) {
        Sim sim;
        sim.init(W, count, std::vector<long long>(W, count), rng);
        for (int r = 0; r < W; ++r) sim.run(plan_all_reduce(two, count * 4, W, r));
        sim.expect_written_once();
        for (int r = 0; r < W; ++r)
          for (long long i = 0; i < count; ++i) {
            int64_t want = 0;
            for (int q = 0; q < W; ++q) want += sim.in[q][i];
            ASSERT_EQ(sim.out[r][i], want) << "W=" << W << " count=" << count << " two_shot=" << two;
          }
      }
    }
}

TEST(Schedule, AllGatherAnyDim) {
  std::mt19937 rng(2);
  for (int W = 2; W <= 8; ++W)
    for (int trial = 0; trial < 60; ++trial) {
      Shape full = random_shape(rng);
      const int dim = rng() % full.ndim;
      // Each rank's input is its shard of a global tensor G; the output must be G on every rank.
      std::vector<int32_t> G(full.numel());
      for (auto& g : G) g = static_cast<int32_t>(rng());
      Sim sim;
      sim.init(W, 0, std::vector<long long>(W, full.numel()), rng);
      for (int r = 0; r < W; ++r) {
        Shape sh = full;
        const Range g = shard(full.d[dim], W, r);
        sh.d[dim] = g.size;
        sim.in[r].assign(sh.numel(), 0);
        for_each_index(sh, [&](const long long* i) {
          long long j[4] = {i[0], i[1], i[2], i[3]};
          j[dim] += g.begin;
          sim.in[r][flat(sh, i)] = G[flat(full, j)];
        });
      }
      for (int r = 0; r < W; ++r) sim.run(plan_all_gather(full, dim, 4, W, r));
      sim.expect_written_once();
      for (int r = 0; r < W; ++r) ASSERT_EQ(sim.out[r], G) << "W=" << W << " dim=" << dim;
    }
}

TEST(Schedule, ReduceScatterAnyDim) {
  std::mt19937 rng(3);
  for (int W = 2; W <= 8; ++W)
    for (int trial = 0; trial < 60; ++trial) {
      Shape full = random_shape(rng);
      const int dim = rng() % full.ndim;
      std::vector<long long> outn(W);
      for (int r = 0; r < W; ++r) outn[r] = full.numel() / full.d[dim] * shard(full.d[dim], W, r).size;
      Sim sim;
      sim.init(W, full.numel(), outn, rng);
      for (int r = 0; r < W; ++r) sim.run(plan_reduce_scatter(full, dim, 4, W, r));
      sim.expect_written_once();
      for (int r = 0; r < W; ++r) {
        Shape sh = full;
        const Range g = shard(full.d[dim], W, r);
        sh.d[dim] = g.size;
        for_each_index(sh, [&](const long long* i) {
          long long j[4] = {i[0], i[1], i[2], i[3]};
          j[dim] += g.begin;
          int64_t want = 0;
          for (int q = 0; q < W; ++q) want += sim.in[q][flat(full, j)];
          ASSERT_EQ(sim.out[r][flat(sh, i)], want) << "W=" << W << " dim=" << dim;
        });
      }
    }
}

TEST(Schedule, UlyssesBothWaysRoundTrip) {
  std::mt19937 rng(4);
  for (int W = 2; W <= 8; ++W)
    for (long long S : {1ll, 7ll, 16ll, 33ll})
      for (long long B : {1ll, 3ll}) {
        const long long H = W * (1 + rng() % 3), D = 1 + rng() % 5;
        // Global Q of (B, S, H, D); rank r holds rows shard(S, W, r) with all heads.
        Shape g{4, {B, S, H, D}};
        std::vector<int32_t> Q(g.numel());
        for (auto& q : Q) q = static_cast<int32_t>(rng());
        Sim a;
        std::vector<long long> head_n(W, B * S * (H / W) * D);
        a.init(W, 0, head_n, rng);
        for (int r = 0; r < W; ++r) {
          const Range rs = shard(S, W, r);
          Shape sh{4, {B, rs.size, H, D}};
          a.in[r].assign(sh.numel(), 0);
          for_each_index(sh, [&](const long long* i) {
            long long j[4] = {i[0], i[1] + rs.begin, i[2], i[3]};
            a.in[r][flat(sh, i)] = Q[flat(g, j)];
          });
        }
        for (int r = 0; r < W; ++r) a.run(plan_ulysses(true, B, S, H, D, 4, W, r));
        a.expect_written_once();
        for (int r = 0; r < W; ++r) {
          Shape oh{4, {B, S, H / W, D}};
          for_each_index(oh, [&](const long long* i) {
            long long j[4] = {i[0], i[1], i[2] + r * (H / W), i[3]};
            ASSERT_EQ(a.out[r][flat(oh, i)], Q[flat(g, j)]) << "seq_to_head W=" << W;
          });
        }
        // And back: the head-sharded result returns to the original sequence shards.
        Sim b;
        std::vector<long long> seq_n(W);
        for (int r = 0; r < W; ++r) seq_n[r] = B * shard(S, W, r).size * H * D;
        b.init(W, 0, seq_n, rng);
        b.in = a.out;
        for (int r = 0; r < W; ++r) b.run(plan_ulysses(false, B, S, H, D, 4, W, r));
        b.expect_written_once();
        for (int r = 0; r < W; ++r) ASSERT_EQ(b.out[r], a.in[r]) << "head_to_seq W=" << W;
      }
}

// The kernel's protocol: per call, block 0 of every rank signals "arrived" to every rank and
// every block of every rank signals "done" to every rank; each rank waits for the running totals
// the host computes with arrivals_per_call / dones_per_call. Grids vary from call to call.
// The buffers whose places the call agreement compares (`reached`) are exactly those some rank's
// plan reaches on a peer: a source on another rank is its input there, a destination its output.
// Listing fewer would let ranks pass them at different places (a wrong answer); listing more would
// refuse calls that work.
TEST(Schedule, ReachedBuffersAreThoseThePlansReachOnPeers) {
  std::mt19937 rng(9);
  for (int W = 2; W <= 8; ++W) {
    auto expect = [&](const std::string& what, Reached want, auto&& plan_of) {
      bool in = false, out = false;
      for (int r = 0; r < W; ++r) {
        const Plan p = plan_of(r);
        for (int j = 0; j < p.n; ++j) {
          for (int i = 0; i < p.x[j].nsrc; ++i) in |= p.x[j].src_rank[i] != r;
          for (int i = 0; i < p.x[j].ndst; ++i) out |= p.x[j].dst_rank[i] != r;
        }
      }
      EXPECT_EQ(want.in, in) << what << ", W=" << W << ": the input";
      EXPECT_EQ(want.out, out) << what << ", W=" << W << ": the output";
    };
    for (long long bytes : {16ll, 1000ll, 4096ll * W + 12, 1ll << 20}) {
      const std::string n = " of " + std::to_string(bytes) + " bytes";
      expect("one-shot all_reduce" + n, reached(AllReduceAlgo::one_shot, true),
             [&](int r) { return plan_all_reduce(false, bytes, W, r); });
      for (AllReduceAlgo a : {AllReduceAlgo::two_shot, AllReduceAlgo::push})  // push: before it settles
        expect("two-shot all_reduce" + n, reached(a, false), [&](int r) { return plan_all_reduce(true, bytes, W, r); });
    }
    for (int trial = 0; trial < 40; ++trial) {
      const Shape full = random_shape(rng);
      if (full.numel() == 0) continue;  // no call: nothing compared
      const int dim = rng() % full.ndim;
      expect("direct all_gather", reached(ShardAlgo::direct, true),
             [&](int r) { return plan_all_gather(full, dim, 4, W, r); });
      expect("direct reduce_scatter", reached(ShardAlgo::direct, false),
             [&](int r) { return plan_reduce_scatter(full, dim, 4, W, r); });
    }
    for (long long S : {1ll, 7ll, 33ll})
      for (bool to_head : {true, false})
        expect(std::string("ulysses ") + (to_head ? "seq_to_head" : "head_to_seq") + " S=" + std::to_string(S),
               reached_ulysses(), [&](int r) { return plan_ulysses(to_head, 2, S, 2 * W, 8, 2, W, r); });
  }
  // Push once settled writes only the outputs (its pipeline, plan_push_all_reduce, reads this
  // rank's input), and the LL family reaches neither (peers write only the library's scratch).
  EXPECT_FALSE(reached(AllReduceAlgo::push, true).in);
  EXPECT_TRUE(reached(AllReduceAlgo::push, true).out);
  for (AllReduceAlgo a : {AllReduceAlgo::ll, AllReduceAlgo::ll128}) {
    EXPECT_FALSE(reached(a, false).in || reached(a, false).out);
  }
  for (ShardAlgo a : {ShardAlgo::ll, ShardAlgo::ll128})
    for (bool gather : {true, false}) EXPECT_FALSE(reached(a, gather).in || reached(a, gather).out);
}

TEST(Schedule, WaitsExpectExactlyTheSignalsSent) {
  std::mt19937 rng(5);
  for (int W = 2; W <= 8; ++W) {
    std::vector<unsigned long long> arrived(W, 0), done(W, 0);
    unsigned long long expect_arrive = 0, expect_done = 0;
    for (int call = 0; call < 100; ++call) {
      const int blocks = 1 + rng() % 132;
      for (int r = 0; r < W; ++r)
        for (int b = 0; b < blocks; ++b)
          for (int q = 0; q < W; ++q) {
            if (b == 0) arrived[q]++;
            done[q]++;
          }
      expect_arrive += arrivals_per_call(W);
      expect_done += dones_per_call(W, blocks);
      for (int q = 0; q < W; ++q) {
        ASSERT_EQ(arrived[q], expect_arrive);
        ASSERT_EQ(done[q], expect_done);
      }
    }
  }
}

// That protocol needs one grid on every rank, and the grid follows the kernel shape: every
// rank's plan, empty or not, must be run by the shape direct_shape names for the collective, which
// holds exactly the sources its transfers read. The cases include ranks whose share is empty
// (their plans have no transfer; the shape once came from the rank's own plan, so such a rank
// launched a smaller-block grid than its peers and waited for "done" signals never sent).
TEST(Schedule, EveryRankRunsTheCollectivesKernelShape) {
  std::mt19937 rng(9);
  int empty_plans = 0;
  auto check = [&](Kind k, const Plan& p, int W, const std::string& what) {
    if (p.n == 0) ++empty_plans;
    for (int j = 0; j < p.n; ++j) ASSERT_EQ(p.x[j].nsrc, direct_sources(k, W)) << what << " transfer " << j;
  };
  for (int W = 1; W <= 8; ++W) {
    ASSERT_EQ(direct_shape(Kind::all_gather, W), DirectShape::copy);
    ASSERT_EQ(direct_shape(Kind::reduce_scatter, W),
              W == 1 ? DirectShape::copy : W == 2 ? DirectShape::pair : DirectShape::reduce);
    for (long long bytes : {4ll, 8ll, 16ll, 100ll, 4096ll, 4100ll})
      for (bool two : {false, true})
        for (int r = 0; r < W; ++r)
          check(two ? Kind::all_reduce_two_shot : Kind::all_reduce_one_shot, plan_all_reduce(two, bytes, W, r), W,
                "all_reduce W=" + std::to_string(W) + " bytes=" + std::to_string(bytes));
    for (int trial = 0; trial < 200; ++trial) {
      const Shape full = random_shape(rng);
      const int dim = static_cast<int>(rng() % full.ndim);
      for (int r = 0; r < W; ++r) {
        const std::string what = "W=" + std::to_string(W) + " dim " + std::to_string(dim) + " rank " +
                                 std::to_string(r);
        check(Kind::all_gather, plan_all_gather(full, dim, 4, W, r), W, "all_gather " + what);
        check(Kind::reduce_scatter, plan_reduce_scatter(full, dim, 4, W, r), W, "reduce_scatter " + what);
      }
    }
    for (long long S : {1ll, 3ll, 17ll})
      for (int r = 0; r < W; ++r)
        for (bool to_head : {true, false})
          check(to_head ? Kind::seq_to_head : Kind::head_to_seq, plan_ulysses(to_head, 2, S, 2 * W, 8, 4, W, r), W,
                "ulysses S=" + std::to_string(S));
  }
  EXPECT_GT(empty_plans, 100) << "the cases should include ranks with nothing to move";
}

TEST(Schedule, StaggeredOrderServesEveryRankOnceLocalLast) {
  for (int W = 1; W <= 8; ++W)
    for (int r = 0; r < W; ++r) {
      std::vector<int> seen(W, 0);
      for (int k = 0; k < W; ++k) seen[staggered(r, k, W)]++;
      for (int q = 0; q < W; ++q) ASSERT_EQ(seen[q], 1);
      ASSERT_EQ(staggered(r, W - 1, W), r);
      // At step k no two ranks push to the same destination.
      for (int k = 0; k < W; ++k)
        for (int r2 = 0; r2 < r; ++r2) ASSERT_NE(staggered(r, k, W), staggered(r2, k, W));
    }
}

// ---------------------------------------------------------------------------------------------
// LL all_gather / reduce_scatter: executed on bytes for W = 2..8, 2- and 4-byte elements, ragged
// shapes the LL path accepts (some ranks owning nothing). Every line a rank polls was written by
// its sender in this call (the counts agree, and are >= 1 for every pair: the scratch-reuse
// argument), every output word is written exactly once, and the values are the gather / the
// half-word-wise sum.
namespace {

// Lines carry `wpl` words (1: LL, kLL128Words: LL128); the scratch is simulated word by word.
struct LLSim {
  int W, wpl;
  std::vector<std::vector<uint16_t>> in, out;  // half-words
  std::vector<std::vector<int>> writes;        // per output word
  // scratch[q][p]: lines rank p wrote for rank q this call (value, written)
  std::vector<std::vector<std::vector<std::pair<uint32_t, bool>>>> scratch;

  uint32_t word(const std::vector<uint16_t>& b, long long byte) {
    EXPECT_EQ(byte % 4, 0);
    return b.at(byte / 2) | static_cast<uint32_t>(b.at(byte / 2 + 1)) << 16;
  }
  void put(int r, long long byte, uint32_t w) {
    ASSERT_EQ(byte % 4, 0);
    ASSERT_LT(byte / 2 + 1, static_cast<long long>(out[r].size()));
    out[r][byte / 2] = static_cast<uint16_t>(w);
    out[r][byte / 2 + 1] = static_cast<uint16_t>(w >> 16);
    writes[r][byte / 4]++;
  }
  // Phase 1 of every rank (writes into peers' scratch), then phase 2 (reads), as the kernel does.
  void send(int r, const LLPlan& p) {
    for (int q = 0; q < W; ++q) {
      if (q == r) {
        ASSERT_EQ(p.lines_to[q], 0);
        continue;
      }
      ASSERT_GE(p.lines_to[q], 1) << "rank " << r << " sends nothing to " << q;
      ASSERT_LE(p.lines_to[q], p.max_lines);
      // Enough lines for the words, and no line beyond the one that carries the last word.
      ASSERT_GE(p.lines_to[q] * wpl, p.send[q].words());
      ASSERT_LT((p.lines_to[q] - 1) * wpl, std::max(p.send[q].words(), 1ll));
      auto& slot = scratch[q][r];
      slot.assign(p.lines_to[q] * wpl, {0, false});
      for (long long i = 0; i < p.lines_to[q] * wpl; ++i)
        slot[i] = {i < p.send[q].words() ? word(in[r], p.send[q].byte(i)) : 0u, true};
    }
  }
  uint32_t receive(int q, int from, long long i) {
    const auto& slot = scratch[q][from];
    EXPECT_LT(i, static_cast<long long>(slot.size())) << "rank " << q << " polls a line " << from << " never writes";
    if (i >= static_cast<long long>(slot.size())) return 0;
    EXPECT_TRUE(slot[i].second);
    return slot[i].first;
  }
};

struct Geometry {
  long long outer, mid, inner;
};
Geometry geometry(const Shape& s, int dim) {
  Geometry g{1, s.d[dim], 1};
  for (int i = 0; i < dim; ++i) g.outer *= s.d[i];
  for (int i = dim + 1; i < s.ndim; ++i) g.inner *= s.d[i];
  return g;
}

// fn(W, elt, full, dim, rng, wpl) on random shapes the LL path accepts, W = 2..8, 2- and 4-byte
// elements, LL and LL128 lines; checks that enough of them were found.
template <class F>
void for_ll_shapes(unsigned seed, F&& fn) {
  std::mt19937 rng(seed);
  int tested = 0;
  for (int wpl : {1, kLL128Words})
    for (int W = 2; W <= 8; ++W)
      for (int elt : {2, 4})
        for (int trial = 0; trial < 60; ++trial) {
          Shape full = random_shape(rng);
          const int dim = rng() % full.ndim;
          if (!ll_shape_ok(full, dim, elt, W)) continue;
          ++tested;
          fn(W, elt, full, dim, rng, wpl);
          if (::testing::Test::HasFatalFailure()) return;
        }
  EXPECT_GT(tested, 600);
}

}  // namespace

TEST(Schedule, LLAllGatherAnyDim) {
  for_ll_shapes(6, [](int W, int elt, const Shape& full, int dim, std::mt19937& rng, int wpl) {
    const Geometry g = geometry(full, dim);
    const long long row = g.inner * elt, full_bytes = full.numel() * elt;
    std::vector<uint16_t> G(full_bytes / 2 + 1);
    for (auto& x : G) x = static_cast<uint16_t>(rng());
    LLSim sim{W, wpl};
    sim.in.assign(W, {});
    sim.out.assign(W, std::vector<uint16_t>(full_bytes / 2 + 2, 0xffff));
    sim.writes.assign(W, std::vector<int>(full_bytes / 4 + 1, 0));
    sim.scratch.assign(W, std::vector<std::vector<std::pair<uint32_t, bool>>>(W));
    std::vector<LLPlan> plan;
    for (int r = 0; r < W; ++r) {
      plan.push_back(plan_ll_all_gather(full, dim, elt, W, r, wpl));
      const Range sh = shard(g.mid, W, r);
      sim.in[r].assign(g.outer * sh.size * row / 2 + 2, 0);  // rank r's shard, contiguous
      for (long long o = 0; o < g.outer; ++o)
        for (long long b = 0; b < sh.size * row; b += 2)
          sim.in[r][(o * sh.size * row + b) / 2] = G[(o * g.mid * row + sh.begin * row + b) / 2];
    }
    for (int r = 0; r < W; ++r) sim.send(r, plan[r]);
    for (int q = 0; q < W; ++q) {
      const LLPlan& p = plan[q];
      for (long long i = 0; i < p.place[q].words(); ++i)
        sim.put(q, p.place[q].byte(i), sim.word(sim.in[q], p.send[q].byte(i)));
      for (int f = 0; f < W; ++f) {
        if (f == q) continue;
        ASSERT_EQ(p.lines_from[f], plan[f].lines_to[q]) << "W=" << W << " rank " << q << " from " << f;
        for (long long i = 0; i < p.lines_from[f] * wpl; ++i) {
          const uint32_t w = sim.receive(q, f, i);
          if (i < p.place[f].words()) sim.put(q, p.place[f].byte(i), w);
        }
      }
    }
    for (int q = 0; q < W; ++q) {
      for (long long w = 0; w < full_bytes / 4; ++w) ASSERT_EQ(sim.writes[q][w], 1) << "W=" << W << " rank " << q;
      for (long long h = 0; h < full_bytes / 2; ++h) ASSERT_EQ(sim.out[q][h], G[h]) << "W=" << W << " rank " << q;
    }
  });
}

TEST(Schedule, LLReduceScatterAnyDim) {
  for_ll_shapes(7, [](int W, int elt, const Shape& full, int dim, std::mt19937& rng, int wpl) {
    const Geometry g = geometry(full, dim);
    const long long row = g.inner * elt, full_bytes = full.numel() * elt;
    LLSim sim{W, wpl};
    sim.in.assign(W, std::vector<uint16_t>(full_bytes / 2 + 2));
    for (auto& v : sim.in)
      for (auto& x : v) x = static_cast<uint16_t>(rng());
    sim.out.assign(W, {});
    sim.writes.assign(W, {});
    sim.scratch.assign(W, std::vector<std::vector<std::pair<uint32_t, bool>>>(W));
    std::vector<LLPlan> plan;
    for (int r = 0; r < W; ++r) {
      plan.push_back(plan_ll_reduce_scatter(full, dim, elt, W, r, wpl));
      const long long mine = g.outer * shard(g.mid, W, r).size * row;
      sim.out[r].assign(mine / 2 + 2, 0xffff);
      sim.writes[r].assign(mine / 4 + 1, 0);
    }
    for (int r = 0; r < W; ++r) sim.send(r, plan[r]);
    for (int q = 0; q < W; ++q) {
      const LLPlan& p = plan[q];
      for (int f = 0; f < W; ++f)
        if (f != q) ASSERT_EQ(p.lines_from[f], plan[f].lines_to[q]) << "W=" << W << " rank " << q << " from " << f;
      const long long n = p.own.words();
      ASSERT_GE(p.lines_from[(q + 1) % W] * wpl, n);
      for (long long i = 0; i < p.lines_from[(q + 1) % W] * wpl; ++i) {
        uint16_t acc[2] = {0, 0};
        for (int r = 0; r < W; ++r) {
          const uint32_t w = r == q ? (i < n ? sim.word(sim.in[q], p.own.byte(i)) : 0u) : sim.receive(q, r, i);
          acc[0] = static_cast<uint16_t>(acc[0] + (w & 0xffff));
          acc[1] = static_cast<uint16_t>(acc[1] + (w >> 16));
        }
        if (i < n) sim.put(q, 4 * i, acc[0] | static_cast<uint32_t>(acc[1]) << 16);
      }
      // Independent of the plan: the shard's rows out of the full tensors, half-word sums.
      const Range sh = shard(g.mid, W, q);
      for (long long w = 0; w < g.outer * sh.size * row / 4; ++w) ASSERT_EQ(sim.writes[q][w], 1);
      for (long long o = 0; o < g.outer; ++o)
        for (long long b = 0; b < sh.size * row; b += 2) {
          uint16_t want = 0;
          for (int r = 0; r < W; ++r)
            want = static_cast<uint16_t>(want + sim.in[r][(o * g.mid * row + sh.begin * row + b) / 2]);
          ASSERT_EQ(sim.out[q][(o * sh.size * row + b) / 2], want) << "W=" << W << " rank " << q;
        }
    }
  });
}

// LL128 line layout: the 8 lanes x 4 words of a line carry data words 0..30 once each, in runs
// of 8 consecutive words per word index k (what makes a group's loads and stores contiguous),
// and the flag in lane 7's last word, where no data word ever lands.
TEST(Schedule, LL128LineLayout) {
  std::vector<int> seen(kLL128Words, 0);
  int flags = 0;
  for (int j = 0; j < 8; ++j)
    for (int k = 0; k < 4; ++k) {
      const int w = ll128_slot_word(j, k);
      if (w < 0) {
        ++flags;
        EXPECT_TRUE(j == 7 && k == 3) << "flag at lane " << j << " word " << k;
        continue;
      }
      ASSERT_LT(w, kLL128Words);
      ++seen[w];
      if (j > 0 && ll128_slot_word(j - 1, k) >= 0) EXPECT_EQ(w, ll128_slot_word(j - 1, k) + 1);
    }
  EXPECT_EQ(flags, 1);
  for (int w = 0; w < kLL128Words; ++w) EXPECT_EQ(seen[w], 1) << "data word " << w;
  // Lines for a word count: enough, none spare, at least one.
  for (long long n : {0ll, 1ll, 30ll, 31ll, 32ll, 62ll, 63ll, 1000003ll}) {
    const long long l = ll_lines(n, kLL128Words);
    EXPECT_GE(l, 1);
    EXPECT_GE(l * kLL128Words, n);
    EXPECT_LT((l - 1) * kLL128Words, std::max(n, 1ll));
  }
}

// LL flags: never 0; consecutive calls alternate slot parity; a (flag, parity) pair comes back only
// after a restart (a zeroing of every scratch) in between, so no stale line passes for a new one.
TEST(Schedule, LLFlagsAlternateParityAndRestartBeforeRepeating) {
  for (unsigned period : {3u, 5u, 7u, 101u}) {
    std::map<std::pair<unsigned, int>, unsigned long long> last_use;
    unsigned long long last_restart = 0;
    int restarts = 0;
    for (unsigned long long n = 1; n <= 20ull * period + 3; ++n) {
      const unsigned f = ll_flag(n, period);
      EXPECT_NE(f, 0u);
      EXPECT_LE(f, period);
      if (n > 1) EXPECT_NE(ll_parity(n), ll_parity(n - 1)) << "two calls in a row on one slot parity";
      if (ll_restart_at(n, period)) last_restart = n, ++restarts;
      const auto key = std::make_pair(f, ll_parity(n));
      const auto it = last_use.find(key);
      if (it != last_use.end()) EXPECT_GT(last_restart, it->second) << "period " << period << ", call " << n;
      last_use[key] = n;
    }
    EXPECT_EQ(restarts, 10) << period;
  }
  // The period in use: flags 1 .. 2^32 - 1, the first restart at call 2 * (2^32 - 1) + 1.
  EXPECT_EQ(ll_flag(1, kLLFlagPeriod), 1u);
  EXPECT_EQ(ll_flag(kLLFlagPeriod, kLLFlagPeriod), 0xFFFFFFFFu);
  EXPECT_EQ(ll_flag(kLLFlagPeriod + 1ull, kLLFlagPeriod), 1u);
  EXPECT_FALSE(ll_restart_at(1, kLLFlagPeriod));
  EXPECT_FALSE(ll_restart_at(kLLFlagPeriod + 1ull, kLLFlagPeriod));
  EXPECT_TRUE(ll_restart_at(2ull * kLLFlagPeriod + 1, kLLFlagPeriod));
}

// ---------------------------------------------------------------------------------------------
// The push all_reduce's pipeline (push.cuh) as a state machine per (rank, pipe), advanced one
// phase at a time in random order, the waits and signals of the kernel standing for themselves:
// a phase runs only once its waits pass on the counters the signals built. Checked: no deadlock,
// no slot rewritten before its reader signalled it free (nor read before its data arrived), every
// output word written once with the sum (in place too, where peers' writes land in the inputs),
// and the exit waits and final counters equal exactly the signals sent. Several calls in a row
// carry the counters' totals over, as the host's push_steps does.
class PushSim {
 public:
  PushSim(int W, int pipes, long long slot_bytes, int slots, std::mt19937& rng)
      : W_(W), pipes_(pipes), slots_(slots), slot_(slot_bytes), rng_(rng) {
    ctr_.assign(W, std::vector<unsigned long long>(2 * pipes * W, 0));
    const long long regions = push_scratch_bytes(W, pipes, slot_bytes, slots) / slot_bytes;
    scratch_.assign(W, std::vector<int32_t>(regions * slot_bytes / 4, 0));
    tag_.assign(W, std::vector<long long>(regions, -1));
    reading_.assign(W, std::vector<int>(regions, 0));
  }

  void call(long long bytes, long long granule, bool in_place) {
    p_ = plan_push_all_reduce(bytes, W_, pipes_, slot_, slots_, granule);
    ASSERT_GE(p_.steps, 1);
    ASSERT_EQ(p_.chunk % 16, 0);
    ASSERT_LE(p_.chunk, slot_);
    const long long words = bytes / 4;
    in_.assign(W_, std::vector<int32_t>(words));
    out_.assign(W_, std::vector<int32_t>(in_place ? 0 : words, -1));
    writes_.assign(W_, std::vector<int>(words, 0));
    std::vector<int64_t> want(words, 0);
    for (int r = 0; r < W_; ++r)
      for (long long i = 0; i < words; ++i) {
        in_[r][i] = static_cast<int32_t>(rng_() % 1000);
        want[i] += in_[r][i];
      }
    in_place_ = in_place;
    struct State {
      int i = 0, phase = 0;
    };
    std::vector<State> st(W_ * pipes_);
    int left = W_ * pipes_;
    while (left > 0) {
      std::vector<int> ready;
      for (int u = 0; u < W_ * pipes_; ++u)
        if (st[u].phase != 4 && can_run(u / pipes_, u % pipes_, st[u].i, st[u].phase)) ready.push_back(u);
      ASSERT_FALSE(ready.empty()) << "deadlock: no block can move";
      const int u = ready[rng_() % ready.size()];
      State& s = st[u];
      run(u / pipes_, u % pipes_, s.i, s.phase);
      if (::testing::Test::HasFatalFailure()) return;
      if (s.phase == 3) s.phase = 4, --left;
      else if (s.phase == 2) s.phase = ++s.i < p_.steps + kPushLag ? 0 : 3;
      else ++s.phase;
    }
    base_ += p_.steps;
    for (int r = 0; r < W_; ++r)
      for (int c = 0; c < 2 * pipes_ * W_; ++c) {
        const bool own = c % W_ == r;  // nobody signals itself
        ASSERT_EQ(ctr_[r][c], own ? 0 : base_) << "counter " << c << " on rank " << r;
      }
    for (int r = 0; r < W_; ++r)
      for (long long i = 0; i < words; ++i) {
        ASSERT_EQ(writes_[r][i], 1) << "rank " << r << " output word " << i;
        ASSERT_EQ(result(r)[i], want[i]) << "rank " << r << " output word " << i;
      }
  }

 private:
  std::vector<int32_t>& result(int r) { return in_place_ ? in_[r] : out_[r]; }
  int peer(int r, int k) const { return staggered(r, k, W_); }
  bool can_run(int r, int b, int i, int phase) const {
    for (int k = 0; k + 1 < W_; ++k) {
      const int q = peer(r, k);
      if (phase == 0 && i < p_.steps && ctr_[r][push_free_counter(b, q, W_, pipes_)] < push_free_expect(p_, base_, i))
        return false;
      if (phase == 1 && i >= kPushLag &&
          ctr_[r][push_data_counter(b, q, W_)] < push_data_expect(base_, i - kPushLag))
        return false;
      if (phase == 3 && ctr_[r][push_free_counter(b, q, W_, pipes_)] < base_ + p_.steps) return false;
    }
    return true;
  }
  void run(int r, int b, int i, int phase) {
    const int j = i - kPushLag;
    if (phase == 0 && i < p_.steps)
      for (int k = 0; k + 1 < W_; ++k) {  // push step i of peer q's slab into q's scratch
        const int q = peer(r, k);
        const Range pc = push_piece(p_, q, b, i);
        const long long off = push_slot(p_, W_, r, q, b, base_ + i), s = off / slot_;
        ASSERT_EQ(off % slot_, 0);
        ASSERT_LE(pc.size, slot_);
        ASSERT_LE(pc.begin + pc.size, p_.slab[q + 1]) << "piece past its slab";
        ASSERT_EQ(reading_[q][s], 0) << "slot rewritten while its reader still uses it";
        for (long long x = 0; x < pc.size; x += 4) scratch_[q][(off + x) / 4] = in_[r][(pc.begin + x) / 4];
        tag_[q][s] = static_cast<long long>(base_ + i);
      }
    if (phase == 1 && j >= 0) {  // reduce step j of the own slab into every output
      const Range pc = push_piece(p_, r, b, j);
      for (int k = 0; k + 1 < W_; ++k) {
        const long long s = push_slot(p_, W_, peer(r, k), r, b, base_ + j) / slot_;
        ASSERT_EQ(tag_[r][s], static_cast<long long>(base_ + j)) << "slot holds another step than the one reduced";
        reading_[r][s] = 1;
      }
      for (long long x = 0; x < pc.size; x += 4) {
        int64_t v = 0;
        for (int q = 0; q < W_; ++q)
          v += q == r ? in_[r][(pc.begin + x) / 4]
                      : scratch_[r][(push_slot(p_, W_, q, r, b, base_ + j) + x) / 4];
        for (int q = 0; q < W_; ++q) {
          result(q)[(pc.begin + x) / 4] = static_cast<int32_t>(v);
          writes_[q][(pc.begin + x) / 4]++;
        }
      }
    }
    if (phase == 2)
      for (int k = 0; k + 1 < W_; ++k) {
        const int q = peer(r, k);
        if (i < p_.steps) ctr_[q][push_data_counter(b, r, W_)]++;
        if (j >= 0) {
          ctr_[q][push_free_counter(b, r, W_, pipes_)]++;
          reading_[r][push_slot(p_, W_, q, r, b, base_ + j) / slot_] = 0;
        }
      }
  }

  int W_, pipes_, slots_;
  long long slot_;
  std::mt19937& rng_;
  PushPlan p_;
  unsigned long long base_ = 0;
  bool in_place_ = false;
  std::vector<std::vector<unsigned long long>> ctr_;
  std::vector<std::vector<int32_t>> scratch_, in_, out_;
  std::vector<std::vector<long long>> tag_;
  std::vector<std::vector<int>> reading_, writes_;
};

TEST(Schedule, PushAllReducePipeline) {
  std::mt19937 rng(9);
  for (int W = 2; W <= 8; ++W)
    for (int pipes : {1, 2, 3, 5})
      for (long long slot : {16ll, 48ll, 64ll})
        for (int slots : {kPushLag + 1, 3, 4}) {
          SCOPED_TRACE("W=" + std::to_string(W) + " pipes=" + std::to_string(pipes) + " slot=" + std::to_string(slot) +
                       " slots=" + std::to_string(slots));
          PushSim sim(W, pipes, slot, slots, rng);
          // Ragged sizes (not multiples of 16, of W, or of the chunk), some slabs empty, several
          // calls on the same counters and scratch, in place and not.
          const long long sizes[] = {4, 12, 16ll * W - 4, 16ll * W + 4, 1004, 4 * static_cast<long long>(1 + rng() % 3000),
                                     64ll * W * 7 + 12};
          for (long long bytes : sizes)
            for (bool in_place : {false, true}) {
              sim.call(bytes, 16, in_place);
              if (::testing::Test::HasFatalFailure()) return;
            }
        }
}

// The plan on the real grid (132 SMs x 16 warps): chunks are whole granules within the slot,
// every slab byte in exactly one (pipe, step) piece, and at least kPushMinSteps steps where the
// chunk could shrink.
TEST(Schedule, PushPlanCoversEverySlab) {
  for (int W = 2; W <= 8; ++W)
    for (long long bytes : {16ll, 1000002ll, (8ll << 20) + 6, (64ll << 20) + 2, (1ll << 30) + 14}) {
      const int pipes = W <= 2 ? 132 * 16 : 132 * 8;
      const long long slot = W <= 2 ? 2048 : 1024, granule = 512;
      const PushPlan p = plan_push_all_reduce(bytes, W, pipes, slot, 3, granule);
      EXPECT_EQ(p.chunk % granule, 0);
      EXPECT_LE(p.chunk, slot);
      EXPECT_EQ(p.slab[0], 0);
      EXPECT_EQ(p.slab[W], bytes);
      for (int q = 0; q < W; ++q) {
        EXPECT_EQ(p.slab[q] % 16, 0);
        long long covered = 0;
        for (int k = 0; k < p.steps; ++k)
          for (int b = 0; b < pipes; ++b) {
            const Range pc = push_piece(p, q, b, k);
            if (pc.size) EXPECT_EQ(pc.begin, p.slab[q] + covered) << "pieces out of order";
            covered += pc.size;
          }
        EXPECT_EQ(covered, p.slab[q + 1] - p.slab[q]);
        if (p.chunk > granule) EXPECT_GE(p.steps, kPushMinSteps);
      }
    }
}

// LL128 is allowed only where every pair of GPUs has peer access and native peer atomics (what
// NVLink gives and PCIe peer-to-peer does not); one pair without them rules it out everywhere.
TEST(Choice, LL128NeedsEveryPairNVLinkConnected) {
  for (int W = 1; W <= 8; ++W) {
    std::vector<PeerLink> links(W * W, PeerLink{true, true});
    EXPECT_TRUE(ll128_links_ok(links.data(), W)) << "W=" << W;
    for (int i = 0; i < W; ++i) {
      links[i * W + i] = PeerLink{};  // the diagonal is not a link
      EXPECT_TRUE(ll128_links_ok(links.data(), W));
      links[i * W + i] = PeerLink{true, true};
    }
    for (int i = 0; i < W; ++i)
      for (int j = 0; j < W; ++j) {
        if (i == j) continue;
        for (PeerLink bad : {PeerLink{true, false}, PeerLink{false, true}, PeerLink{false, false}}) {
          links[i * W + j] = bad;
          EXPECT_FALSE(ll128_links_ok(links.data(), W)) << "W=" << W << " pair " << i << "->" << j;
        }
        links[i * W + j] = PeerLink{true, true};
      }
  }
}

namespace {
const AllReduceAlgo kAllReduceAlgos[] = {AllReduceAlgo::automatic, AllReduceAlgo::one_shot, AllReduceAlgo::two_shot,
                                         AllReduceAlgo::ll,        AllReduceAlgo::push,     AllReduceAlgo::ll128};
const ShardAlgo kShardAlgos[] = {ShardAlgo::automatic, ShardAlgo::direct, ShardAlgo::ll, ShardAlgo::ll128};
std::vector<size_t> choice_sizes() {
  std::vector<size_t> v;
  for (size_t b = 4; b <= (size_t(1) << 31); b *= 2)
    for (size_t x : {b - 4, b, b + 4}) v.push_back(x);
  return v;
}
}  // namespace

// Without NVLink between every pair, no setting and no size gives LL128, and every call takes
// what it would take if the LL128 scratch did not fit: the next path down, the same on every rank.
TEST(Choice, WithoutNVLinkLL128FallsBackToTheNextPath) {
  for (int W = 2; W <= 8; ++W)
    for (bool fits : {false, true}) {
      AlgoEnv nvlink{W, true, true, fits}, pcie{W, false, true, fits}, full{W, true, false, fits};
      for (size_t bytes : choice_sizes())
        for (bool in_place : {false, true})
          for (bool aligned : {false, true})
            for (AllReduceAlgo a : kAllReduceAlgos) {
              const AllReduceAlgo got = choose_all_reduce(a, pcie, bytes, in_place, aligned);
              EXPECT_NE(got, AllReduceAlgo::ll128) << "W=" << W << " bytes=" << bytes;
              EXPECT_EQ(got, choose_all_reduce(a, full, bytes, in_place, aligned));
              if (a == AllReduceAlgo::ll128) EXPECT_EQ(got, AllReduceAlgo::two_shot);
            }
      // With NVLink, automatic takes LL128 between LL's limit and its own (the README's table).
      EXPECT_EQ(choose_all_reduce(AllReduceAlgo::automatic, nvlink, size_t(1) << 20, false, true),
                AllReduceAlgo::ll128);
      EXPECT_EQ(choose_all_reduce(AllReduceAlgo::automatic, pcie, size_t(1) << 20, false, true),
                AllReduceAlgo::two_shot);
      EXPECT_EQ(choose_all_reduce(AllReduceAlgo::automatic, pcie, size_t(384) << 10, false, true),
                AllReduceAlgo::one_shot);
      std::mt19937 rng(11);
      for (int trial = 0; trial < 400; ++trial) {
        Shape full_shape = random_shape(rng);
        full_shape.d[full_shape.ndim - 1] *= 1 + rng() % 20000;  // up to tens of MiB
        const int dim = rng() % full_shape.ndim, elt = rng() % 2 ? 2 : 4;
        for (bool gather : {false, true})
          for (bool aligned : {false, true})
            for (ShardAlgo a : kShardAlgos) {
              const ShardAlgo got = choose_shard(a, gather, pcie, full_shape, dim, elt, aligned);
              EXPECT_NE(got, ShardAlgo::ll128);
              EXPECT_EQ(got, choose_shard(a, gather, full, full_shape, dim, elt, aligned));
              if (a == ShardAlgo::ll128) EXPECT_EQ(got, ShardAlgo::direct);
            }
      }
      const Shape s1m = [&] {
        Shape s;
        s.ndim = 2, s.d[0] = 256 * W, s.d[1] = 2048;  // 1 MiB shards in bf16
        return s;
      }();
      EXPECT_EQ(choose_shard(ShardAlgo::automatic, true, nvlink, s1m, 0, 2, true), ShardAlgo::ll128);
      EXPECT_EQ(choose_shard(ShardAlgo::automatic, true, pcie, s1m, 0, 2, true), ShardAlgo::direct);
    }
}

// Overlapping buffers: all_reduce exactly in place; all_gather / reduce_scatter in place only as
// NCCL defines it (the shard is this rank's slice of the full tensor, contiguous there); every
// other overlap is refused.
TEST(Choice, OverlappingBuffersOnlyInPlace) {
  const uintptr_t base = uintptr_t(1) << 40;
  EXPECT_EQ(all_reduce_overlap(base, base, 100), Overlap::in_place);
  EXPECT_EQ(all_reduce_overlap(base, base + 100, 100), Overlap::apart);
  EXPECT_EQ(all_reduce_overlap(base, base + 98, 100), Overlap::bad);
  EXPECT_EQ(all_reduce_overlap(base + 2, base, 100), Overlap::bad);
  EXPECT_FALSE(bytes_overlap(base, 0, base, 10));
  std::mt19937 rng(12);
  for (int W = 2; W <= 8; ++W)
    for (int trial = 0; trial < 300; ++trial) {
      const Shape full = random_shape(rng);
      const int dim = rng() % full.ndim, elt = rng() % 2 ? 2 : 4;
      long long outer = 1;
      for (int i = 0; i < dim; ++i) outer *= full.d[i];
      long long inner = 1;
      for (int i = dim + 1; i < full.ndim; ++i) inner *= full.d[i];
      const long long full_bytes = full.numel() * elt;
      for (int r = 0; r < W; ++r) {
        const Range sh = shard(full.d[dim], W, r);
        const long long shard_bytes = outer * sh.size * inner * elt;
        const uintptr_t slice = base + static_cast<uintptr_t>(sh.begin * inner * elt);
        for (bool gather : {false, true}) {
          auto at = [&](uintptr_t part) {
            return gather ? shard_overlap(true, part, base, full, dim, elt, W, r)
                          : shard_overlap(false, base, part, full, dim, elt, W, r);
          };
          SCOPED_TRACE("W=" + std::to_string(W) + " r=" + std::to_string(r) + " dim=" + std::to_string(dim) +
                       " outer=" + std::to_string(outer) + (gather ? " all_gather" : " reduce_scatter"));
          EXPECT_EQ(at(base + full_bytes), Overlap::apart);
          EXPECT_EQ(at(base - shard_bytes), Overlap::apart);
          if (shard_bytes == 0) {
            EXPECT_EQ(at(slice), Overlap::apart);  // nothing shared
            continue;
          }
          EXPECT_EQ(at(slice), outer == 1 ? Overlap::in_place : Overlap::bad);
          // Anywhere else that shares a byte is refused.
          const uintptr_t e = static_cast<uintptr_t>(elt), end = base + static_cast<uintptr_t>(full_bytes);
          for (uintptr_t part : {slice + e, slice - e, end - e, base - e}) {
            if (part == slice) continue;
            const bool shares = bytes_overlap(part, shard_bytes, base, full_bytes);
            EXPECT_EQ(at(part), shares ? Overlap::bad : Overlap::apart) << "at offset " << (long long)(part - base);
          }
          EXPECT_TRUE(bytes_overlap(slice + elt, shard_bytes, base, full_bytes) || (outer == 1 && sh.size * inner == 1))
              << "the test's offsets must include a refused one";
        }
      }
    }
}
