// The inter-node fused TP kernels' byte plan (kernels/net_tp/layout.hpp) for 2..8 nodes, ragged
// shapes and chunk sizes, for both kernels: every command a sender queues lands where its
// receiver looks for it (offset, bytes, flag), every byte of every shard a rank receives arrives
// exactly once from each sender it needs, flags are unique within a call slot, and every offset
// stays inside what the path must provide.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
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
// G: ranks per node (AG only; the network moves shards between rail peers, the same local index).
void check_plan(bool ag, int M, int N, int K, int nodes, long long chunk, int G = 1) {
  SCOPED_TRACE(testing::Message() << (ag ? "ag " : "rs ") << M << "x" << N << "x" << K << " nodes " << nodes << " x "
                                  << G << " chunk " << chunk);
  const int world = nodes * G;
  const tn::UnitPlan a = ag ? tn::ag_plan(M, N, K, 2, world, 8, chunk, G) : tn::rs_plan(M, N, nodes, 8, chunk);
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
  // AG at G > 1: the network part between rail peers, every nodes x G up to the TP layout's 8
  // ranks (tp::Layout holds kMaxWorld shards).
  for (int G : {2, 4})
    for (int nodes = 2; nodes * G <= weave::kMaxWorld; ++nodes)
      for (auto [M, N, K] : {std::tuple{3000, 1000, 1000}, std::tuple{nodes * G, 24, 136}, std::tuple{8192, 1024, 1024}})
        for (long long chunk : {4096LL, 1LL << 20}) check_plan(true, M, N, K, nodes, chunk, G);
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
  for (int nodes = 2; nodes <= 8; ++nodes)
    for (long long chunk : {4096LL, 1LL << 20}) {
      const tn::UnitPlan a = tn::rs_plan(3000, 1000, nodes, 8, chunk);
      long long last_dst = 0, last_flag = 0, last_src = 0;
      for (int r = 0; r < nodes; ++r)
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
      for (int r = 0; r < nodes; ++r)
        EXPECT_EQ(tn::ar_commands(a, r), tn::rs_commands(a, r) + tn::nonempty_units(a, r) * tn::steps(a));
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
