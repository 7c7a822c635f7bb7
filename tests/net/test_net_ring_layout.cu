// The inter-node ring attention's byte plan (kernels/net_ring_attention/layout.hpp) for 2..8 nodes,
// both shardings, ragged S and batches: every command lands where its receiver looks (offset,
// bytes, flag, sender), each rank receives every row of every other rank's K and V exactly once,
// the units of a slice count up to the readiness counter's expectation (chunks of other ranks in
// the slice, gathered_schedule.hpp), and every offset fits what the path must provide.
#include <gtest/gtest.h>

#include <map>
#include <tuple>
#include <vector>

#include "net_ring_attention/layout.hpp"

namespace rn = weave::net::ring_net;
namespace gs = weave::attention::gathered;
namespace rg = weave::sp::ring;

namespace {

void check_plan(int W, int zz, int B, long long S, long long row_bytes) {
  SCOPED_TRACE(testing::Message() << "W " << W << " zigzag " << zz << " B " << B << " S " << S);
  const rn::RingPlan R = rn::make_plan(W, zz, B, S, row_bytes);
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
          ASSERT_NE(peer, q);
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
  for (int r = 0; r < W; ++r) {
    // rows[b][global row]: how often it arrives; count[b][slice]: units counted in.
    std::vector<std::vector<int>> rows(B, std::vector<int>(S, 0)), count(B, std::vector<int>(R.slices, 0));
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
        for (long long i = x.rows.begin; i < x.rows.end(); ++i) ++rows[x.b][i];
        ++count[x.b][x.slice];
      }
    }
    long long to_me = 0;
    for (const auto& [key, c] : posted) to_me += key.first == r;
    EXPECT_EQ(matched, to_me);
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
        ASSERT_EQ(rows[b][i], own ? 0 : 1) << "row " << i << " of batch " << b;
      }
      for (int sl = 0; sl < R.slices; ++sl)
        EXPECT_EQ(count[b][sl], gs::chunks_in_slice(S, R.n_chunks, sl) -
                                    gs::own_chunks_in_slice(S, R.n_chunks, sl, mine, rg::chunks_per_rank(zz)))
            << "slice " << sl;
    }
  }
}

TEST(NetRingLayout, EveryRowArrivesOnceAndCountsAsTheKernelExpects) {
  for (int W = 2; W <= 8; ++W)
    for (int zz : {0, 1})
      for (auto [B, S] : {std::tuple{1, 1000LL}, std::tuple{2, 3001LL}, std::tuple{1, 512LL * W}, std::tuple{3, 4LL * W},
                          std::tuple{1, 20000LL}})
        check_plan(W, zz, B, S, 4 * 128 * 2);
}

}  // namespace
