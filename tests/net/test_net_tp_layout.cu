// The inter-node fused TP kernels' byte plan (kernels/net_tp/layout.hpp) for 2..8 nodes of one or
// more ranks, ragged shapes and chunk sizes, for both kernels: every command a sender queues lands
// where its receiver looks for it (offset, bytes, flag), every byte of every shard a rank receives
// arrives exactly once from each sender it needs, flags are unique within a call slot, every offset
// stays inside what the path must provide; at G > 1 also the hierarchical RS / AR's NVLink part.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "net_tp/layout.hpp"

namespace tn = weave::net::tp_net;

namespace {

struct Sent {
  long long src, dst, bytes;
  int sender;
};

// ag: sender q posts its own shard's units to every peer. rs: sender q posts to peer p the units
// of p's shard (its partial of p's rows).
// G: ranks per node (the network moves shards between rail peers, the same local index; RS: the
// sender's node's partial of the receiver's shard).
void check_plan(bool ag, int M, int N, int K, int nodes, long long chunk, int G = 1) {
  SCOPED_TRACE(testing::Message() << (ag ? "ag " : "rs ") << M << "x" << N << "x" << K << " nodes " << nodes << " x "
                                  << G << " chunk " << chunk);
  const int world = nodes * G;
  const tn::UnitPlan a = ag ? tn::ag_plan(M, N, K, 2, world, 8, chunk, G) : tn::rs_plan(M, N, world, 8, chunk, G);
  ASSERT_GE(a.P, 1);
  ASSERT_EQ(a.row_bytes, ag ? 2LL * K : 2LL * N);
  std::map<std::pair<int, int>, Sent> posted;  // (receiver, flag) -> the command
  for (int q = 0; q < world; ++q) {
    long long n = 0;
    for (int s = 0; s < tn::steps(a); ++s) {
      const int peer = tn::send_peer(a, q, s);
      ASSERT_NE(peer / G, q / G);  // another node
      ASSERT_EQ(peer % G, q % G);  // the rail peer
      const int owner = ag ? q : peer;  // whose shard the units cut
      for (int u = 0; u < tn::units(a, owner); ++u) {
        long long b0, b1;
        tn::unit(a, owner, u, &b0, &b1);
        ASSERT_LE(b0, b1);
        if (b1 == b0) continue;
        ASSERT_EQ(b0 % 16, 0);
        const long long src = ag ? b0 : tn::slot_off(a, s, b0);
        ASSERT_LE(src + (b1 - b0), ag ? tn::ag_send_needed(a) : tn::rs_send_needed(a));
        const Sent c{src, tn::slot_off(a, s, b0), b1 - b0, q};
        const int f = tn::flag(a, s, u);
        ASSERT_GE(f, 0);
        ASSERT_LT(f, tn::flags_needed(a));
        ASSERT_LE(c.dst + c.bytes, tn::recv_needed(a));
        ASSERT_TRUE(posted.emplace(std::make_pair(peer, f), c).second) << "flag " << f << " reused at rank " << peer;
        ++n;
      }
    }
    EXPECT_EQ(n, ag ? tn::ag_commands(a, q) : tn::rs_commands(a, q));
  }
  for (int r = 0; r < world; ++r) {
    long long matched = 0;
    std::vector<long long> covered(world, 0);
    // AG: the receive order (step, unit) over the peers' shards. RS: every own unit from each step.
    const long long items = ag ? tn::step_units(a, r, true) : static_cast<long long>(tn::steps(a)) * tn::units(a, r);
    int last_step = -1;
    for (long long j = 0; j < items; ++j) {
      int s = -1, u = -1;
      if (ag) {
        ASSERT_TRUE(tn::nth_unit(a, r, true, j, &s, &u));
      } else {
        s = static_cast<int>(j / tn::units(a, r)), u = static_cast<int>(j % tn::units(a, r));
      }
      ASSERT_GE(s, last_step);
      last_step = s;
      const int from = tn::from_peer(a, r, s);
      EXPECT_EQ(from, (r / G + s + 1) % nodes * G + r % G);
      EXPECT_EQ(tn::send_peer(a, from, s), r) << "rank " << from << " sends step " << s << " elsewhere";
      long long b0, b1;
      tn::unit(a, ag ? from : r, u, &b0, &b1);
      if (ag) {  // the receive kernels' walk
        const tn::StepUnit x = tn::step_unit(a, r, true, j);
        EXPECT_TRUE(x.s == s && x.u == u && x.peer == from && x.b0 == b0 && x.b1 == b1) << "item " << j;
      }
      if (b1 == b0) continue;
      const auto it = posted.find({r, tn::flag(a, s, u)});
      ASSERT_NE(it, posted.end()) << "rank " << r << " waits for a flag nobody raises";
      EXPECT_EQ(it->second.sender, from);
      EXPECT_EQ(it->second.dst, tn::slot_off(a, s, b0));
      EXPECT_EQ(it->second.bytes, b1 - b0);
      covered[from] += b1 - b0;
      ++matched;
    }
    if (ag) {
      int s, u;
      EXPECT_FALSE(tn::nth_unit(a, r, true, items, &s, &u));
    }
    long long to_me = 0;
    for (const auto& [key, c] : posted) to_me += key.first == r;
    EXPECT_EQ(matched, to_me);
    for (int q = 0; q < world; ++q)
      EXPECT_EQ(covered[q], q / G != r / G && q % G == r % G ? weave::tp::shard(M, world, ag ? q : r).size * a.row_bytes : 0)
          << "from " << q << " at rank " << r;
  }
  // Each row tile has P units (the loaders' and receivers' expectation), whole tiles in order.
  for (int q = 0; q < world; ++q) EXPECT_EQ(tn::units(a, q), a.L.tm[q] * a.P);
}

TEST(NetTpLayout, PlansDeliverEveryByteOnce) {
  for (bool ag : {true, false})
    for (int nodes = 2; nodes <= 8; ++nodes)
      for (auto [M, N, K] : {std::tuple{3000, 1000, 1000}, std::tuple{257, 8, 64}, std::tuple{nodes, 24, 136},
                             std::tuple{8192, 8192, 8192}, std::tuple{1000, 264, 8}})
        for (long long chunk : {16LL, 4096LL, 48LL << 10, 1LL << 20, 1LL << 30}) check_plan(ag, M, N, K, nodes, chunk);
  // G > 1: the network part between rail peers, every nodes x G up to the TP layout's 8 ranks
  // (tp::Layout holds kMaxWorld shards).
  for (bool ag : {true, false})
    for (int G : {2, 4})
      for (int nodes = 2; nodes * G <= weave::kMaxWorld; ++nodes)
        for (auto [M, N, K] :
             {std::tuple{3000, 1000, 1000}, std::tuple{nodes * G, 24, 136}, std::tuple{8192, 1024, 1024}})
          for (long long chunk : {4096LL, 1LL << 20}) check_plan(ag, M, N, K, nodes, chunk, G);
}

// The hierarchical GEMM + ReduceScatter / AllReduce at nodes of G > 1 ranks, as the kernel walks
// it (net_gemm_rs_kernel.cuh): every byte of every rank's partial of every shard is summed by
// exactly one rank, the owner's rail peer on the partial's node (its send blocks for a remote
// owner, its receive blocks for its own shard); the GEMM's order is a permutation of the owners,
// the same remote-node order on every rank of a node, node-major in the network step order, and
// every send comes in the GEMM's owner order; AR: every row of every output is written once, by
// the node rank of its owner's local index, and the landed signals equal the expectation.
void check_hier_rs(int M, int N, int nodes, int G, long long chunk) {
  SCOPED_TRACE(testing::Message() << "hier rs " << M << "x" << N << " nodes " << nodes << " x " << G << " chunk "
                                  << chunk);
  const int W = nodes * G;
  const tn::UnitPlan a = tn::rs_plan(M, N, W, 8, chunk, G);
  ASSERT_EQ(tn::nodes(a), nodes);
  const auto shard_bytes = [&](int q) { return weave::tp::shard(M, W, q).size * a.row_bytes; };
  // reads[d][q][byte]: how often rank d's partial of owner q's shard is summed.
  std::vector<std::vector<std::vector<int>>> reads(W, std::vector<std::vector<int>>(W));
  for (int d = 0; d < W; ++d)
    for (int q = 0; q < W; ++q) reads[d][q].assign(shard_bytes(q), 0);
  const auto sum_unit = [&](int c, int q, int u) {  // collector c sums unit u of q over its node
    ASSERT_EQ(tn::collector(a, q), c % G);
    long long b0, b1;
    tn::unit(a, q, u, &b0, &b1);
    ASSERT_LE(b1, shard_bytes(q));
    for (int d = c / G * G; d < c / G * G + G; ++d)
      for (long long i = b0; i < b1; ++i) ++reads[d][q][i];
  };
  for (int c = 0; c < W; ++c) {
    for (long long j = 0; j < tn::step_units(a, c, false); ++j) {
      int s, u;
      ASSERT_TRUE(tn::nth_unit(a, c, false, j, &s, &u));
      const int p = tn::send_peer(a, c, s);
      ASSERT_EQ(p % G, c % G);
      long long b0, b1;
      tn::unit(a, p, u, &b0, &b1);
      const tn::StepUnit x = tn::step_unit(a, c, false, j);  // the send kernel's walk
      EXPECT_TRUE(x.s == s && x.u == u && x.peer == p && x.b0 == b0 && x.b1 == b1) << "item " << j;
      sum_unit(c, p, u);
    }
    for (int u = 0; u < tn::units(a, c); ++u) sum_unit(c, c, u);
  }
  for (int d = 0; d < W; ++d)
    for (int q = 0; q < W; ++q)
      ASSERT_EQ(std::count(reads[d][q].begin(), reads[d][q].end(), 1), shard_bytes(q))
          << "rank " << d << "'s partial of shard " << q;
  // The GEMM's order.
  for (int r = 0; r < W; ++r) {
    std::vector<int> pos(W, -1);
    for (int t = 0; t < W; ++t) {
      const int q = tn::rs_owner(a, r, t);
      ASSERT_TRUE(q >= 0 && q < W && pos[q] < 0) << "owner " << q << " twice in rank " << r << "'s order";
      pos[q] = t;
      if (t < (nodes - 1) * G) {
        EXPECT_EQ(q / G, ((r / G - t / G - 1) % nodes + nodes) % nodes);  // node n - s - 1 at step s
        EXPECT_EQ(q, tn::rs_owner(a, r / G * G, t)) << "node ranks compute remote owners in one order";
      } else {
        EXPECT_EQ(q / G, r / G);
      }
    }
    EXPECT_EQ(pos[r], W - 1) << "the own shard last";
    int last = -1;
    for (long long j = 0; j < tn::step_units(a, r, false); ++j) {
      int s, u;
      tn::nth_unit(a, r, false, j, &s, &u);
      const int t = pos[tn::send_peer(a, r, s)];
      EXPECT_GE(t, last) << "rank " << r << " sends a shard before one the GEMM computes earlier";
      last = t;
    }
    // Every output tile once, owner by owner in that order.
    std::vector<int> tiles(a.L.work(), 0);
    int t_prev = 0;
    for (int w = 0; w < a.L.work(); ++w) {
      const weave::tp::Item it = tn::rs_item(a, r, w);
      EXPECT_GE(pos[it.owner], t_prev);
      t_prev = pos[it.owner];
      ++tiles[it.vrow * a.L.tiles_n + it.n];
    }
    EXPECT_EQ(std::count(tiles.begin(), tiles.end(), 1), a.L.work());
  }
  // AR: rank x writes its own shard's units and those it receives from its rail peers into every
  // rank of its node, signalling landed[vrow] on the others once per unit (empty ones too).
  std::vector<std::vector<int>> writes(W, std::vector<int>(a.L.row_tiles(), 0)), landed = writes;
  for (int x = 0; x < W; ++x) {
    std::vector<int> qs = {x};
    for (int s = 0; s < tn::steps(a); ++s) qs.push_back(tn::from_peer(a, x, s));
    for (int q : qs)
      for (int u = 0; u < tn::units(a, q); ++u)
        for (int d = x / G * G; d < x / G * G + G; ++d) {
          writes[d][a.L.off[q] + u / a.P] += 1;
          if (d != x) landed[d][a.L.off[q] + u / a.P] += 1;
        }
  }
  for (int d = 0; d < W; ++d)
    for (int q = 0; q < W; ++q)
      for (int v = a.L.off[q]; v < a.L.off[q + 1]; ++v) {
        EXPECT_EQ(writes[d][v], a.P) << "rank " << d << " row tile " << v << ": every unit written once";
        EXPECT_EQ(landed[d][v], tn::collector(a, q) == d % G ? 0 : a.P) << "rank " << d << " row tile " << v;
      }
}

TEST(NetTpLayout, HierarchicalRsSumsEveryPartialOnce) {
  for (int G : {2, 4})
    for (int nodes = 2; nodes <= 4 && nodes * G <= weave::kMaxWorld; ++nodes)
      for (auto [M, N] : {std::pair{1000, 264}, std::pair{nodes * G, 24}, std::pair{517, 1000}, std::pair{300, 8}})
        for (long long chunk : {16LL, 4096LL, 48LL << 10, 1LL << 20}) check_hier_rs(M, N, nodes, G, chunk);
}

// At one rank per node the hierarchical order is the single-node chain's (tp::rs_chain_item), so
// the one-rank kernel's schedule did not change.
TEST(NetTpLayout, RsOrderAtOneRankPerNodeIsTheChain) {
  for (int nodes = 2; nodes <= 8; ++nodes) {
    const tn::UnitPlan a = tn::rs_plan(1000, 600, nodes, 8, 1 << 16);
    for (int r = 0; r < nodes; ++r)
      for (int w = 0; w < a.L.work(); ++w) {
        const weave::tp::Item x = tn::rs_item(a, r, w), y = weave::tp::rs_chain_item(a.L, r, w);
        ASSERT_TRUE(x.owner == y.owner && x.vrow == y.vrow && x.n == y.n && x.phase == y.phase && x.a_row == y.a_row)
            << "rank " << r << " tile " << w;
      }
  }
}

// The RS send order walks the owners as the GEMM computes them (tp::rs_chain_item: r - 1 first).
TEST(NetTpLayout, RsSendsInTheGemmsOwnerOrder) {
  for (int nodes = 2; nodes <= 8; ++nodes) {
    const tn::UnitPlan a = tn::rs_plan(1000, 512, nodes, 8, 1 << 16);
    for (int r = 0; r < nodes; ++r)
      for (int s = 0; s < tn::steps(a); ++s) {
        const int first_tile_of_step = [&] {
          int w = 0;
          for (int t = 0; t < s; ++t) w += a.L.tm[tn::send_peer(a, r, t)] * a.L.tiles_n;
          return w;
        }();
        EXPECT_EQ(weave::tp::rs_chain_item(a.L, r, first_tile_of_step).owner, tn::send_peer(a, r, s));
      }
  }
}

// GEMM + AllReduce's gather areas sit after the reduce-scatter's in the send buffer, the receive
// slot and the flags, and hold the AllGather plan of the reduced rows.
TEST(NetTpLayout, AllReduceAreasFollowTheReduceScatters) {
  for (int G : {1, 2, 4})
    for (int nodes = 2; nodes * G <= weave::kMaxWorld; ++nodes)
      for (long long chunk : {4096LL, 1LL << 20}) {
        const int W = nodes * G;
        const tn::UnitPlan a = tn::rs_plan(3000, 1000, W, 8, chunk, G);
        long long last_dst = 0, last_flag = 0, last_src = 0;
        for (int r = 0; r < W; ++r)
          for (int u = 0; u < tn::units(a, r); ++u) {
            long long b0, b1;
            tn::unit(a, r, u, &b0, &b1);
            if (b1 == b0) continue;
            EXPECT_GE(tn::rs_send_needed(a) + b0, tn::rs_send_needed(a));
            last_src = std::max(last_src, tn::rs_send_needed(a) + b1);
            for (int s = 0; s < tn::steps(a); ++s) {
              EXPECT_GE(tn::recv_needed(a) + tn::slot_off(a, s, b0), tn::recv_needed(a));
              last_dst = std::max(last_dst, tn::recv_needed(a) + tn::slot_off(a, s, b0) + (b1 - b0));
              last_flag = std::max(last_flag, tn::flags_needed(a) + tn::flag(a, s, u) + 1);
            }
          }
        EXPECT_LE(last_src, tn::ar_send_needed(a));
        EXPECT_LE(last_dst, tn::ar_recv_needed(a));
        EXPECT_LE(last_flag, tn::ar_flags_needed(a));
        for (int r = 0; r < W; ++r)
          EXPECT_EQ(tn::ar_commands(a, r), tn::rs_commands(a, r) + tn::nonempty_units(a, r) * tn::steps(a));
      }
}

// The adaptive split's communication tasks (one rank per node): every send, own-shard reduction
// and AR gather exactly once, in that order; and handed out in order, each once its input is in
// place, they all complete while the GEMMs run tile by tile on every rank (no task waits for one
// behind it), wherever each rank's GEMM is when the others claim.
TEST(NetTpLayout, AdaptiveCommTasksEachOnceInAnOrderThatCompletes) {
  for (int nodes = 2; nodes <= weave::kMaxWorld; ++nodes)
    for (auto [M, N] : {std::pair{1000, 264}, std::pair{nodes + 1, 24}, std::pair{517, 1000}})
      for (long long chunk : {4096LL, 48LL << 10, 1LL << 20})
        for (bool ar : {false, true}) {
          SCOPED_TRACE(testing::Message() << M << "x" << N << " nodes " << nodes << " chunk " << chunk << (ar ? " ar" : " rs"));
          const tn::UnitPlan a = tn::rs_plan(M, N, nodes, 8, chunk);
          std::vector<std::vector<tn::RsCommTask>> tasks(nodes);
          for (int r = 0; r < nodes; ++r) {
            std::map<std::tuple<int, int, int>, int> seen;
            int last_kind = 0;
            for (long long k = 0; k < tn::rs_comm_tasks(a, r, ar); ++k) {
              const tn::RsCommTask t = tn::rs_comm_task(a, r, ar, k);
              ASSERT_GE(static_cast<int>(t.kind), last_kind) << "task " << k;
              last_kind = static_cast<int>(t.kind);
              ASSERT_TRUE(seen.emplace(std::make_tuple(static_cast<int>(t.kind), t.s, t.u), 1).second) << "task " << k;
              ASSERT_GE(t.s, 0);
              ASSERT_LT(t.s, std::max(1, tn::steps(a)));
              ASSERT_LT(t.u, tn::units(a, tn::comm_owner(a, r, t)));
              tasks[r].push_back(t);
            }
            ASSERT_EQ(static_cast<long long>(seen.size()),
                      tn::step_units(a, r, false) + tn::units(a, r) + (ar ? tn::step_units(a, r, true) : 0));
          }
          // Simulation: per round, every rank computes its next tile (rs_item order) and then claims
          // its next tasks while their inputs are in place.
          std::vector<std::vector<int>> tiles_done(nodes, std::vector<int>(a.L.row_tiles(), 0));
          std::vector<int> computed(nodes, 0);
          std::vector<size_t> claimed(nodes, 0);
          std::set<std::tuple<int, int, int>> sent, reduced;  // (from, s, u) sends; (owner, u) reductions
          const auto row_done = [&](int r, int q, int u) { return tiles_done[r][a.L.off[q] + u / a.P] == a.L.tiles_n; };
          for (int round = 0;; ++round) {
            ASSERT_LT(round, 1 << 20);
            bool progress = false, left = false;
            for (int r = 0; r < nodes; ++r) {
              if (computed[r] < a.L.work()) {
                ++tiles_done[r][tn::rs_item(a, r, computed[r]++).vrow];
                progress = true;
              }
              for (; claimed[r] < tasks[r].size(); ++claimed[r], progress = true) {
                const tn::RsCommTask t = tasks[r][claimed[r]];
                if (t.kind == tn::RsCommKind::Send) {
                  if (!row_done(r, tn::send_peer(a, r, t.s), t.u)) break;
                  sent.insert({r, t.s, t.u});
                } else if (t.kind == tn::RsCommKind::Reduce) {
                  bool in = row_done(r, r, t.u);
                  for (int s = 0; in && s < tn::steps(a); ++s) in = sent.count({tn::from_peer(a, r, s), s, t.u}) > 0;
                  if (!in) break;
                  reduced.insert({r, 0, t.u});
                } else if (!reduced.count({tn::from_peer(a, r, t.s), 0, t.u})) {
                  break;
                }
              }
              left = left || claimed[r] < tasks[r].size() || computed[r] < a.L.work();
            }
            if (!left) break;
            ASSERT_TRUE(progress) << "no rank can go on at round " << round;
          }
        }
}

// The adaptive AG + GEMM's communication tasks (one rank per node; net_ag_adaptive_kernel.cuh):
// every own unit's send, then every peer unit's receive exactly once, in AG's receive order (the
// order in which the GEMM, tp::item's, first needs each peer row tile); handed out in order, each
// once its input is in place (a send: at once; a receive: the peer's send of it done), and the
// tiles claimed in order once their rows are in, every task and tile of every rank completes.
TEST(NetTpLayout, AdaptiveAgCommTasksEachOnceInAnOrderThatCompletes) {
  for (int nodes = 2; nodes <= weave::kMaxWorld; ++nodes)
    for (auto [M, K] : {std::pair{1000, 264}, std::pair{nodes + 1, 24}, std::pair{517, 1000}})
      for (long long chunk : {4096LL, 48LL << 10, 1LL << 20}) {
        SCOPED_TRACE(testing::Message() << M << "x" << K << " nodes " << nodes << " chunk " << chunk);
        const tn::UnitPlan a = tn::ag_plan(M, 1000, K, 2, nodes, 8, chunk);
        std::vector<std::vector<tn::AgCommTask>> tasks(nodes);
        for (int r = 0; r < nodes; ++r) {
          std::set<std::tuple<int, int, int>> seen;  // (kind, peer, u)
          int last_kind = 0;
          int last_first_use = -1;  // the GEMM's first tile of the last receive's row tile
          const auto first_use = [&](int q, int u) {
            for (int i = 0; i < a.L.work(); ++i)
              if (weave::tp::item(a.L, r, i).vrow == a.L.off[q] + u / a.P) return i;
            return -1;
          };
          for (long long k = 0; k < tn::ag_comm_tasks(a, r); ++k) {
            const tn::AgCommTask t = tn::ag_comm_task(a, r, k);
            ASSERT_GE(static_cast<int>(t.kind), last_kind) << "task " << k;
            last_kind = static_cast<int>(t.kind);
            ASSERT_TRUE(seen.insert({static_cast<int>(t.kind), t.peer, t.u}).second) << "task " << k;
            ASSERT_LT(t.u, tn::units(a, t.peer));
            tasks[r].push_back(t);
            if (t.kind == tn::AgCommKind::Send) {
              ASSERT_EQ(t.peer, r);
              continue;
            }
            ASSERT_NE(t.peer, r);
            ASSERT_EQ(t.peer, tn::from_peer(a, r, t.s));
            const int f = first_use(t.peer, t.u);
            ASSERT_GE(f, last_first_use) << "task " << k << " comes after a receive the GEMM needs later";
            last_first_use = f;
          }
          ASSERT_EQ(static_cast<long long>(seen.size()), tn::units(a, r) + tn::step_units(a, r, true));
          for (int q = 0; q < nodes; ++q)
            for (int u = 0; u < tn::units(a, q); ++u)
              ASSERT_EQ(seen.count({q == r ? 0 : 1, q, u}), 1u) << "owner " << q << " unit " << u;
        }
        // Simulation: per round, every rank claims its next tasks while their inputs are in place,
        // then computes its next tile if its rows are in.
        std::vector<std::vector<int>> rows_in(nodes, std::vector<int>(a.L.row_tiles(), 0));
        std::vector<int> computed(nodes, 0);
        std::vector<size_t> claimed(nodes, 0);
        std::set<std::pair<int, int>> posted;  // (sender, unit)
        for (int round = 0;; ++round) {
          ASSERT_LT(round, 1 << 20);
          bool progress = false, left = false;
          for (int r = 0; r < nodes; ++r) {
            for (; claimed[r] < tasks[r].size(); ++claimed[r], progress = true) {
              const tn::AgCommTask t = tasks[r][claimed[r]];
              if (t.kind == tn::AgCommKind::Send) {
                posted.insert({r, t.u});
                continue;
              }
              if (!posted.count({t.peer, t.u})) break;
              ++rows_in[r][a.L.off[t.peer] + t.u / a.P];
            }
            if (computed[r] < a.L.work()) {
              const weave::tp::Item it = weave::tp::item(a.L, r, computed[r]);
              if (it.owner == r || rows_in[r][it.vrow] == a.P) ++computed[r], progress = true;
            }
            left = left || claimed[r] < tasks[r].size() || computed[r] < a.L.work();
          }
          if (!left) break;
          ASSERT_TRUE(progress) << "no rank can go on at round " << round;
        }
      }
}

TEST(NetTpLayout, SlicesFollowTheChunk) {
  EXPECT_EQ(tn::net_slices(8192 * 2, 1 << 20), 2);  // a 2 MiB row tile in 1 MiB chunks
  EXPECT_EQ(tn::net_slices(8192 * 2, 1 << 30), 1);
  EXPECT_EQ(tn::net_slices(8192 * 2, 16), 64);  // at most 64
  EXPECT_EQ(tn::net_slices(16, 16), 64);        // 2 KB tile: 64 slices of 32 bytes
  EXPECT_EQ(tn::net_slices(16, 1 << 10), 2);
}

}  // namespace
