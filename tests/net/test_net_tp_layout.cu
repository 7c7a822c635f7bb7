// The inter-node AG+GEMM's byte plan (kernels/net_tp/ag_layout.hpp) for 2..8 nodes, ragged shapes
// and chunk sizes: every command a sender queues lands where its receiver looks for it (offset,
// bytes, flag), every byte of every peer shard arrives exactly once, flags are unique within a
// call slot, and every offset stays inside what the path must provide.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "net_tp/ag_layout.hpp"

namespace tn = weave::net::tp_net;

namespace {

struct Sent {
  long long src, dst, bytes;
  int flag;
};

void check_plan(int M, int N, int K, int nodes, long long chunk) {
  SCOPED_TRACE(testing::Message() << M << "x" << N << "x" << K << " nodes " << nodes << " chunk " << chunk);
  const tn::AgLayout a = tn::make_ag_layout(M, N, K, 2, nodes, 8, chunk);
  ASSERT_GE(a.P, 1);
  // What each sender posts to each receiver: (receiver, flag) -> the command.
  std::map<std::pair<int, int>, Sent> posted;
  for (int q = 0; q < nodes; ++q) {
    long long n = 0;
    for (int u = 0; u < tn::ag_owner_units(a, q); ++u) {
      long long b0, b1;
      tn::ag_unit(a, q, u, &b0, &b1);
      ASSERT_LE(b0, b1);
      if (b1 == b0) continue;
      ASSERT_EQ(b0 % 16, 0);
      ASSERT_LE(b1, tn::ag_send_needed(a));  // the send buffer holds the shard at shard offsets
      for (int s = 0; s < tn::ag_steps(a); ++s) {
        const int peer = tn::ag_send_peer(a, q, s);
        ASSERT_NE(peer, q);
        const Sent c{b0, tn::ag_recv_off(a, s, b0), b1 - b0, tn::ag_flag(a, s, u)};
        ASSERT_GE(c.flag, 0);
        ASSERT_LT(c.flag, tn::ag_flags_needed(a));
        ASSERT_LE(c.dst + c.bytes, tn::ag_recv_needed(a));
        ASSERT_TRUE(posted.emplace(std::make_pair(peer, c.flag), c).second) << "flag reused at rank " << peer;
        ++n;
      }
    }
    EXPECT_EQ(n, tn::ag_commands(a, q));
  }
  // Each receiver: its items (step, unit) in order cover exactly the commands sent to it, and the
  // bytes of every peer shard once; owners in the GEMM's order (r + 1, r + 2, ...).
  for (int r = 0; r < nodes; ++r) {
    long long items = 0, matched = 0;
    std::vector<long long> covered(nodes, 0);
    int last_step = -1;
    for (long long j = 0; j < tn::ag_recv_items(a, r); ++j) {
      int s = -1, u = -1;
      ASSERT_TRUE(tn::ag_recv_item(a, r, j, &s, &u));
      ASSERT_GE(s, last_step);
      last_step = s;
      const int q = tn::ag_recv_owner(a, r, s);
      EXPECT_EQ(q, (r + s + 1) % nodes);
      EXPECT_EQ(tn::ag_send_peer(a, q, s), r) << "owner " << q << " sends step " << s << " elsewhere";
      long long b0, b1;
      tn::ag_unit(a, q, u, &b0, &b1);
      ++items;
      if (b1 == b0) continue;
      const auto it = posted.find({r, tn::ag_flag(a, s, u)});
      ASSERT_NE(it, posted.end()) << "rank " << r << " waits for a flag nobody raises";
      EXPECT_EQ(it->second.dst, tn::ag_recv_off(a, s, b0));
      EXPECT_EQ(it->second.bytes, b1 - b0);
      EXPECT_EQ(it->second.src, b0);
      covered[q] += b1 - b0;
      ++matched;
    }
    int dummy_s, dummy_u;
    EXPECT_FALSE(tn::ag_recv_item(a, r, tn::ag_recv_items(a, r), &dummy_s, &dummy_u));
    long long to_me = 0;
    for (const auto& [key, c] : posted) to_me += key.first == r;
    EXPECT_EQ(matched, to_me);
    for (int q = 0; q < nodes; ++q)
      if (q != r) EXPECT_EQ(covered[q], weave::tp::shard(M, nodes, q).size * a.row_bytes) << "owner " << q;
    // Units per row tile: P (the loader's expectation), every row tile of every peer.
    EXPECT_EQ(items, [&] {
      long long n = 0;
      for (int q = 0; q < nodes; ++q)
        if (q != r) n += static_cast<long long>(a.L.tm[q]) * a.P;
      return n;
    }());
  }
}

TEST(NetTpLayout, AgPlanDeliversEveryByteOnce) {
  for (int nodes = 2; nodes <= 8; ++nodes)
    for (auto [M, N, K] : {std::tuple{3000, 1000, 1000}, std::tuple{257, 8, 64}, std::tuple{nodes, 24, 136},
                           std::tuple{8192, 8192, 8192}, std::tuple{1000, 264, 8}})
      for (long long chunk : {16LL, 4096LL, 48LL << 10, 1LL << 20, 1LL << 30}) check_plan(M, N, K, nodes, chunk);
}

TEST(NetTpLayout, SlicesFollowTheChunk) {
  EXPECT_EQ(tn::ag_net_slices(8192 * 2, 1 << 20), 2);   // a 2 MiB row tile in 1 MiB chunks
  EXPECT_EQ(tn::ag_net_slices(8192 * 2, 1 << 30), 1);
  EXPECT_EQ(tn::ag_net_slices(8192 * 2, 16), 64);        // at most 64
  EXPECT_EQ(tn::ag_net_slices(16, 16), 64);              // 2 KB tile: 64 slices of 32 bytes
  EXPECT_EQ(tn::ag_net_slices(16, 1 << 10), 2);
}

}  // namespace
