// The inter-node ring attention's byte plan (kernels/net_ring_attention/layout.hpp) for 2..8 nodes
// of one rank and 2..4 nodes of G = 2 or 4 ranks (W <= 8), both shardings, ragged S and batches,
// as the kernel's roles move the bytes (net_ring_kernel.cuh: network sends between rail peers; the
// receive blocks' copy into every gathered K/V of the node, the push blocks' own units into the
// node peers'): every command lands where its receiver looks (offset, bytes, flag, sender; flags
// unique per receiver), between rail peers only; every rank's gathered K and V get every row of
// every other rank exactly once and none of its own, inside the buffers; the units counted in on a
// slice equal the readiness counter's expectation (chunks of other ranks in the slice,
// gathered_schedule.hpp); every offset fits what the path must provide; and the receive blocks
// take the remote nodes in the order the compute's key rotation meets them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <vector>

#include "net_ring_attention/layout.hpp"

namespace rn = weave::net::ring_net;
namespace gs = weave::attention::gathered;
namespace rg = weave::sp::ring;

namespace {

void check_plan(int W, int zz, int B, long long S, long long row_bytes, int G = 1) {
  SCOPED_TRACE(testing::Message() << "W " << W << " G " << G << " zigzag " << zz << " B " << B << " S " << S);
  const rn::RingPlan R = rn::make_plan(W, zz, B, S, row_bytes, G);
  ASSERT_EQ(rn::nodes(R) * G, W);
  struct Sent {
    long long src, dst, bytes;
    int sender;
  };
  std::map<std::pair<int, int>, Sent> posted;  // (receiver, flag)
  for (int q = 0; q < W; ++q) {
    long long n = 0;
    const long long L = rg::local_rows(S, W, zz, q);
    for (int u = 0; u < rn::units(R); ++u) {
      const rn::UnitBytes x = rn::unit(R, q, u);
      if (x.bytes == 0) continue;
      ASSERT_EQ(x.off % 16, 0);
      ASSERT_LE(x.off + x.bytes, B * L * row_bytes);  // inside q's local K (V)
      for (int s = 0; s < rn::steps(R); ++s)
        for (int t = 0; t < 2; ++t) {
          const int peer = rn::send_peer(R, q, s), f = rn::flag(R, s, u, t);
          ASSERT_NE(peer / G, q / G);  // another node,
          ASSERT_EQ(peer % G, q % G);  // the rail peer
          ASSERT_LT(f, rn::flags_needed(R));
          ASSERT_LE(rn::send_off(R, t, x.off) + x.bytes, rn::send_needed(R));
          ASSERT_LE(rn::recv_off(R, s, t, x.off) + x.bytes, rn::recv_needed(R));
          ASSERT_TRUE(posted.emplace(std::make_pair(peer, f), Sent{rn::send_off(R, t, x.off), rn::recv_off(R, s, t, x.off),
                                                                    x.bytes, q})
                          .second);
          ++n;
        }
    }
    EXPECT_EQ(n, rn::commands(R, q));
  }
  // rows[d][b][global row]: how often rank d's gathered K/V get it; count[d][b][slice]: units
  // counted in on rank d.
  using Grid = std::vector<std::vector<int>>;
  std::vector<Grid> rows(W, Grid(B, std::vector<int>(S, 0))), count(W, Grid(B, std::vector<int>(R.slices, 0)));
  const long long gathered_bytes = B * S * row_bytes;
  auto land = [&](int d, const rn::UnitBytes& x) {
    const long long off = rn::gathered_off(R, x);
    ASSERT_EQ(off, (x.b * S + x.rows.begin) * row_bytes);
    ASSERT_LE(off + x.bytes, gathered_bytes);
    for (long long i = x.rows.begin; i < x.rows.end(); ++i) ++rows[d][x.b][i];
    ++count[d][x.b][x.slice];
  };
  for (int r = 0; r < W; ++r) {
    // The receive blocks: per (step, unit) from the rail peer, into every gathered K/V of the node.
    long long matched = 0;
    for (int s = 0; s < rn::steps(R); ++s) {
      const int q = rn::from_peer(R, r, s);
      EXPECT_EQ(rn::send_peer(R, q, s), r);
      for (int u = 0; u < rn::units(R); ++u) {
        const rn::UnitBytes x = rn::unit(R, q, u);
        if (x.bytes == 0) continue;
        for (int t = 0; t < 2; ++t) {
          const auto it = posted.find({r, rn::flag(R, s, u, t)});
          ASSERT_NE(it, posted.end());
          EXPECT_EQ(it->second.sender, q);
          EXPECT_EQ(it->second.dst, rn::recv_off(R, s, t, x.off));
          EXPECT_EQ(it->second.bytes, x.bytes);
          ++matched;
        }
        EXPECT_EQ(x.bytes, x.rows.rows * row_bytes);
        for (int d = r / G * G; d < (r / G + 1) * G; ++d) land(d, x);
      }
    }
    long long to_me = 0;
    for (const auto& [key, c] : posted) to_me += key.first == r;
    EXPECT_EQ(matched, to_me);
    // The push blocks (G > 1): the own units into every node peer's gathered K/V.
    for (int u = 0; u < rn::units(R); ++u) {
      const rn::UnitBytes x = rn::unit(R, r, u);
      if (x.bytes == 0) continue;
      for (int d = r / G * G; d < (r / G + 1) * G; ++d)
        if (d != r) land(d, x);
    }
  }
  for (int r = 0; r < W; ++r) {
    int mine[2];
    for (int i = 0; i < rg::chunks_per_rank(zz); ++i) mine[i] = rg::chunk_id(W, zz, r, i);
    for (int b = 0; b < B; ++b) {
      for (long long i = 0; i < S; ++i) {
        const bool own = [&] {
          for (int c = 0; c < rg::chunks_per_rank(zz); ++c) {
            const auto ch = rg::chunk(S, W, zz, r, c);
            if (i >= ch.begin && i < ch.end()) return true;
          }
          return false;
        }();
        ASSERT_EQ(rows[r][b][i], own ? 0 : 1) << "rank " << r << " row " << i << " of batch " << b;
      }
      for (int sl = 0; sl < R.slices; ++sl)
        EXPECT_EQ(count[r][b][sl], gs::chunks_in_slice(S, R.n_chunks, sl) -
                                       gs::own_chunks_in_slice(S, R.n_chunks, sl, mine, rg::chunks_per_rank(zz)))
            << "rank " << r << " slice " << sl;
    }
  }
}

// The remote nodes in the order a query tile of chunk i of rank r meets their keys: its key
// rotation (the gathered kernel's, all keys visible) starts at the chunk's first row and wraps.
std::vector<int> key_node_order(const rn::RingPlan& R, int r, int i) {
  std::vector<int> owner(R.n_chunks), order;
  for (int q = 0; q < R.W; ++q)
    for (int c = 0; c < rg::chunks_per_rank(R.zz); ++c) owner[rg::chunk_id(R.W, R.zz, q, c)] = q;
  const long long first = rg::chunk(R.S, R.W, R.zz, r, i).begin;
  for (long long k = 0; k < R.S; ++k) {
    const int node = owner[gs::chunk_of_row(R.S, R.n_chunks, (first + k) % R.S)] / R.G;
    if (node != r / R.G && std::find(order.begin(), order.end(), node) == order.end()) order.push_back(node);
  }
  return order;
}

TEST(NetRingLayout, EveryRowArrivesOnceAndCountsAsTheKernelExpects) {
  for (int W = 2; W <= 8; ++W)
    for (int zz : {0, 1})
      for (auto [B, S] : {std::tuple{1, 1000LL}, std::tuple{2, 3001LL}, std::tuple{1, 512LL * W}, std::tuple{3, 4LL * W},
                          std::tuple{1, 20000LL}})
        check_plan(W, zz, B, S, 4 * 128 * 2);
}

TEST(NetRingLayout, HierarchicalEveryRowReachesEveryNodeRankOnce) {
  for (auto [N, G] : {std::pair{2, 2}, std::pair{3, 2}, std::pair{4, 2}, std::pair{2, 4}})
    for (int zz : {0, 1})
      for (auto [B, S] : {std::tuple{1, 1000LL}, std::tuple{2, 3001LL}, std::tuple{1, 512LL * N * G},
                          std::tuple{3, 4LL * N * G}, std::tuple{1, 20000LL}})
        check_plan(N * G, zz, B, S, 4 * 128 * 2, G);
}

// Contiguous sharding: every query tile meets the remote nodes' keys in the receive blocks' step
// order (node n + 1 first): the rotation from its own rows runs up the sequence, and the nodes'
// rows follow each other in node order. Zigzag: the first own chunk's tiles meet nodes n + 1 ..
// N - 1 first, in step order; past the end of the sequence no single order fits both chunks (the
// second chunk's tiles meet the nodes downwards), so the steps keep node order.
TEST(NetRingLayout, ReceiveOrderIsTheComputesKeyOrder) {
  for (auto [N, G] : {std::pair{2, 1}, std::pair{5, 1}, std::pair{8, 1}, std::pair{2, 2}, std::pair{3, 2},
                      std::pair{4, 2}, std::pair{2, 4}})
    for (int zz : {0, 1})
      for (long long S : {1000LL, 3001LL, 20000LL}) {
        const int W = N * G;
        const rn::RingPlan R = rn::make_plan(W, zz, 1, S, 4 * 128 * 2, G);
        for (int r = 0; r < W; ++r) {
          SCOPED_TRACE(testing::Message() << "N " << N << " G " << G << " zigzag " << zz << " S " << S << " rank " << r);
          std::vector<int> steps;
          for (int s = 0; s < rn::steps(R); ++s) steps.push_back(rn::from_peer(R, r, s) / G);
          const std::vector<int> keys = key_node_order(R, r, 0);
          ASSERT_EQ(keys.size(), steps.size());
          const size_t agree = zz ? static_cast<size_t>(N - 1 - r / G) : steps.size();
          for (size_t j = 0; j < agree; ++j) EXPECT_EQ(keys[j], steps[j]) << "node " << j;
        }
      }
}

}  // namespace
