// CPU tests of the sequence-parallel schedules (gathered_attention/gathered_schedule.hpp,
// ring_attention/schedule.hpp, ulysses/schedule.hpp) for W = 2..8, ragged S, causal and not,
// both ring shardings and Ulysses: every query row is computed by exactly one tile, every tile
// visits (in its rotated order) every key block a row of it can see exactly once and never a
// block none can see, the
// mask runs wherever a key must be hidden, every counter's expected count equals the signals
// the push plans send it, pushes cover every gathered row exactly once, and the only wait that
// depends on compute (Ulysses' o_done) expects exactly the stores the compute makes. Plus the
// host validation of one rank's arguments (bad shapes, options, pointers, overlaps).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ring_attention/ring_attention.hpp"
#include "ring_attention/schedule.hpp"
#include "ulysses/schedule.hpp"
#include "ulysses/ulysses.hpp"

namespace gs = weave::attention::gathered;
namespace ring = weave::sp::ring;
namespace uly = weave::sp::uly;

namespace {

const long long kS[] = {16, 100, 127, 128, 129, 1000, 3001, 4096, 8192 + 77};

// The query chunks of one rank: (global rows) for ring (zigzag or contiguous) or Ulysses
// (the whole sequence, computed by every rank for its heads).
struct Case {
  int W;
  long long S;
  int zigzag;  // ring sharding; -1: Ulysses
};
int n_chunks(const Case& c) { return c.zigzag < 0 ? c.W : ring::num_chunks(c.W, c.zigzag); }
std::vector<gs::Rows> own_chunks(const Case& c, int r) {
  if (c.zigzag < 0) return {uly::shard(c.S, c.W, r)};
  std::vector<gs::Rows> v;
  for (int i = 0; i < ring::chunks_per_rank(c.zigzag); ++i) v.push_back(ring::chunk(c.S, c.W, c.zigzag, r, i));
  return v;
}
std::vector<int> own_chunk_ids(const Case& c, int r) {
  if (c.zigzag < 0) return {r};
  std::vector<int> v;
  for (int i = 0; i < ring::chunks_per_rank(c.zigzag); ++i) v.push_back(ring::chunk_id(c.W, c.zigzag, r, i));
  return v;
}
std::vector<gs::Rows> query_chunks(const Case& c, int r) {
  if (c.zigzag < 0) return {{0, c.S}};
  return own_chunks(c, r);
}

// The kernel's visit of one query tile [qb, qe): key blocks 0 .. visible - 1, and per 64-row half
// whether block n runs the mask. Checks coverage and mask placement for every row.
void check_tile(long long S, long long qb, long long qe, bool causal) {
  const int nv = gs::visible_blocks(S, qe, causal);
  const int all = static_cast<int>((S + 127) / 128);
  for (long long i = qb; i < qe; ++i) {
    const long long last_key = causal ? i : S - 1;
    // Every block holding a key row i sees is visited (exactly once: the loop visits 0..nv-1).
    ASSERT_LT(last_key / 128, nv) << "row " << i << " misses keys";
  }
  ASSERT_LE(nv, all);
  // The visiting order (starting at the tile's own rows, or any row) is a permutation.
  for (long long start_row : {0LL, qb, qe - 1, S - 1}) {
    std::vector<int> seen(nv, 0);
    const int st = gs::first_block(start_row, nv);
    for (int i = 0; i < nv; ++i) ++seen[gs::block_at(i, st, nv)];
    for (int x : seen) ASSERT_EQ(x, 1) << "start row " << start_row;
  }
  // No visited block is invisible to every row of the tile.
  if (causal) ASSERT_LE(static_cast<long long>(nv - 1) * 128, qe - 1);
  for (long long half = qb; half < qe; half += 64) {
    const long long hend = std::min(half + 64, qe);
    for (int n = 0; n < nv; ++n) {
      bool hidden = false;
      for (long long i = half; i < hend && !hidden; ++i)
        for (long long j = n * 128LL; j < (n + 1) * 128LL && !hidden; ++j) hidden = j >= S || (causal && j > i);
      if (hidden) ASSERT_TRUE(gs::block_needs_mask(S, n, half, causal)) << "half " << half << " block " << n;
    }
  }
}

}  // namespace

TEST(SpSchedule, ChunksPartitionTheSequence) {
  using weave::sp::Sharding;
  for (int W = 2; W <= 8; ++W)
    for (long long S : kS)
      for (Sharding sh : {Sharding::Contiguous, Sharding::Zigzag}) {
        if (S < 2 * W) continue;
        std::vector<int> seen(S, 0);
        long long total = 0;
        for (int r = 0; r < W; ++r) {
          long long mine = 0;
          for (int i = 0; i < weave::sp::chunks_per_rank(sh); ++i) {
            const weave::sp::ChunkRange cr = weave::sp::chunk_range(S, W, sh, r, i);
            ASSERT_GE(cr.rows, 1);
            for (long long x = cr.begin; x < cr.begin + cr.rows; ++x) ++seen[x];
            mine += cr.rows;
          }
          ASSERT_EQ(mine, weave::sp::local_rows(S, W, sh, r));
          total += mine;
        }
        ASSERT_EQ(total, S);
        for (long long x = 0; x < S; ++x) ASSERT_EQ(seen[x], 1) << "row " << x;
        if (sh == Sharding::Zigzag) {  // each rank's causal work (sum of row indices) within 2W rows of the mean
          for (int r = 0; r < W; ++r) {
            long long work = 0, ref = 0;
            for (int i = 0; i < 2; ++i) {
              const auto cr = weave::sp::chunk_range(S, W, sh, r, i);
              for (long long x = cr.begin; x < cr.begin + cr.rows; ++x) work += x;
            }
            const auto c0 = weave::sp::chunk_range(S, W, sh, 0, 0), c1 = weave::sp::chunk_range(S, W, sh, 0, 1);
            for (long long x = c0.begin; x < c0.begin + c0.rows; ++x) ref += x;
            for (long long x = c1.begin; x < c1.begin + c1.rows; ++x) ref += x;
            ASSERT_LE(std::llabs(work - ref), 4 * S) << "W " << W << " S " << S << " r " << r;
          }
        }
      }
  for (int W = 2; W <= 8; ++W)
    for (long long S : kS) {
      if (S < W) continue;
      long long next = 0;
      for (int r = 0; r < W; ++r) {
        const weave::sp::RowShard sh = weave::sp::ulysses_shard(S, W, r);
        ASSERT_EQ(sh.begin, next);
        ASSERT_GE(sh.rows, S / W);
        ASSERT_LE(sh.rows, S / W + 1);
        next += sh.rows;
      }
      ASSERT_EQ(next, S);
    }
}

TEST(SpSchedule, TilesCoverEveryRowAndVisitEveryVisibleKeyOnce) {
  for (int W = 2; W <= 8; ++W)
    for (long long S : kS)
      for (int zz : {-1, 0, 1})
        for (bool causal : {false, true}) {
          const Case c{W, S, zz};
          if (S < n_chunks(c)) continue;
          std::vector<int> rows(S, 0);
          for (int r = 0; r < W; ++r)
            for (const gs::Rows& q : query_chunks(c, r)) {
              for (long long qb = q.begin; qb < q.end(); qb += 128) {
                const long long qe = std::min(qb + 128, q.end());
                for (long long i = qb; i < qe; ++i) ++rows[i];
                check_tile(S, qb, qe, causal);
                if (HasFatalFailure()) return;
              }
            }
          // Ring: each row once over all ranks; Ulysses: each row once per rank (its heads).
          for (long long i = 0; i < S; ++i) ASSERT_EQ(rows[i], zz < 0 ? W : 1) << "row " << i;
        }
}

// A tile's aligned start is the recorded front only when the word is this launch's and the
// block exists; otherwise the tile's own first block. Every start gives a permutation (above).
TEST(SpSchedule, AlignedStartTakesOnlyThisLaunchsFront) {
  for (int n : {1, 2, 5, 64, 1024})
    for (int fallback : {0, n - 1})
      for (unsigned tag : {1u, 7u, 0xFFFFFFFFu})
        for (int block : {0, 3, n - 1, n, n + 5}) {
          const unsigned long long w = gs::front_word(tag, block);
          const int expect = block < n ? block : fallback;
          ASSERT_EQ(gs::aligned_start(w, tag, n, fallback), expect) << n << " " << tag << " " << block;
          ASSERT_EQ(gs::aligned_start(w, tag + 1, n, fallback), fallback);
          ASSERT_EQ(gs::aligned_start(0, tag, n, fallback), fallback);  // the zeroed buffer (tags are never 0)
          const int st = gs::aligned_start(w, tag, n, fallback);
          std::vector<int> seen(n, 0);
          for (int i = 0; i < n; ++i) ++seen[gs::block_at(i, st, n)];
          for (int x : seen) ASSERT_EQ(x, 1);
        }
}

TEST(SpSchedule, WaitsExpectExactlyThePushedSignalsAndPushesCoverRowsOnce) {
  for (int W = 2; W <= 8; ++W)
    for (long long S : kS)
      for (int zz : {-1, 0, 1})
        for (int groups : {1, 3})
          for (int skip_self : {0, 1}) {  // 1: a rank's own rows are copied locally before the launch
          const Case c{W, S, zz};
          const int n = n_chunks(c);
          if (S < n) continue;
          const int B = 2, slices = gs::num_slices(S);
          // signals[(dest, counter)], rows[(dest, b, g, row)]
          std::map<std::pair<int, int>, int> sig;
          std::map<std::tuple<int, int, int>, std::vector<int>> cover;
          for (int r = 0; r < W; ++r) {
            const std::vector<int> ids = own_chunk_ids(c, r);
            const int nm = static_cast<int>(ids.size());
            for (int nc : {1, 3, 8}) {  // every unit goes to exactly one communicator
              std::vector<int> taken(gs::num_units(B, groups, slices, nm), 0);
              for (int cc = 0; cc < nc; ++cc)
                for (int u = cc; u < gs::num_units(B, groups, slices, nm); u += nc) ++taken[u];
              for (int t : taken) ASSERT_EQ(t, 1);
            }
            for (int u = 0; u < gs::num_units(B, groups, slices, nm); ++u) {
              const gs::Unit x = gs::unit_at(u, groups, slices, nm);
              ASSERT_LT(x.b, B);
              const gs::Rows p = gs::piece(S, n, ids[x.i], x.s);
              if (p.rows == 0) continue;
              const gs::Rows sl = gs::slice_rows(S, x.s);
              ASSERT_GE(p.begin, sl.begin);
              ASSERT_LE(p.end(), sl.end());
              for (int d = 0; d < W; ++d) {
                if (skip_self && d == r) continue;
                ++sig[{d, gs::counter_index(x.b, x.g, x.s, groups, slices)}];
                auto& v = cover[{d, x.b, x.g}];
                v.resize(S, 0);
                for (long long i = p.begin; i < p.end(); ++i) ++v[i];
              }
            }
          }
          for (int d = 0; d < W; ++d)
            for (int b = 0; b < B; ++b)
              for (int g = 0; g < groups; ++g) {
                const std::vector<int> ids = own_chunk_ids(c, d);
                for (int s = 0; s < slices; ++s) {
                  const int own = skip_self ? gs::own_chunks_in_slice(S, n, s, ids.data(), int(ids.size())) : 0;
                  ASSERT_EQ((sig[{d, gs::counter_index(b, g, s, groups, slices)}]), gs::chunks_in_slice(S, n, s) - own)
                      << "W " << W << " S " << S << " slice " << s;
                }
                auto& v = cover[{d, b, g}];
                v.resize(S, 0);
                if (skip_self)
                  for (const gs::Rows& ch : own_chunks(c, d))
                    for (long long i = ch.begin; i < ch.end(); ++i) ++v[i];
                ASSERT_EQ(static_cast<long long>(v.size()), S);
                for (long long i = 0; i < S; ++i) ASSERT_EQ(v[i], 1) << "row " << i;
              }
          // Key block n and query tile rows wait for the slice that holds all their rows.
          for (int nb = 0; nb * 128LL < S; ++nb) {
            const gs::Rows sl = gs::slice_rows(S, gs::slice_of_block(nb));
            ASSERT_GE(nb * 128LL, sl.begin);
            ASSERT_LE(std::min<long long>(S, (nb + 1) * 128LL), sl.end());
          }
        }
}

TEST(SpSchedule, UlyssesHeadsAndCompletionCounts) {
  for (int W = 2; W <= 8; ++W)
    for (int Hq : {W, 2 * W, 8 * W, 32})
      for (int Hkv = 1; Hkv <= Hq; ++Hkv) {
        if (Hq % W || Hq % Hkv) continue;
        const int group = Hq / Hkv, hp = uly::q_heads(Hq, W);
        for (int r = 0; r < W; ++r) {
          ASSERT_LE(uly::kv_count(Hq, Hkv, W, r), uly::kv_heads_max(Hq, Hkv, W));
          for (int h = 0; h < hp; ++h) {
            const int global = r * hp + h, kv = global / group;
            const int local = kv - uly::kv_first(Hq, Hkv, W, r);
            ASSERT_GE(local, 0);
            ASSERT_LT(local, uly::kv_count(Hq, Hkv, W, r));
          }
        }
      }
  for (int W = 2; W <= 8; ++W)
    for (long long S : kS) {
      if (S < W) continue;
      const int B = 3, Hq = 2 * W;
      std::vector<long long> got(W, 0);
      for (int r = 0; r < W; ++r)  // rank r's tiles: its Hq/W heads over the whole sequence
        for (int b = 0; b < B; ++b)
          for (int h = 0; h < uly::q_heads(Hq, W); ++h)
            for (long long half = 0; half < S; half += 64)
              for (int p = 0; p < W; ++p) {
                const gs::Rows o = uly::shard(S, W, p);
                if (o.begin < std::min(half + 64, S) && o.end() > half) ++got[p];
              }
      for (int p = 0; p < W; ++p) ASSERT_EQ(got[p], uly::o_stores(S, W, B, Hq, p)) << "W " << W << " S " << S;
    }
}

// Host validation (ring_attention.cu, ulysses.cu): what one rank finds wrong with its own
// arguments, before any launch. forward() makes it a collective error (every rank throws), so
// a rank never launches a kernel that waits for a peer that threw. Fake, never dereferenced,
// addresses far apart stand for separate buffers.
namespace {

const char* fake(int i, uintptr_t plus = 0) { return reinterpret_cast<const char*>((uintptr_t(i + 1) << 40) + plus); }
constexpr int kSms = 132;

bool mentions(const std::string& problem, const char* what) { return problem.find(what) != std::string::npos; }

}  // namespace

TEST(SpValidation, RingRejectsBadArgumentsAndAcceptsGoodOnes) {
  using weave::sp::detail::ring_input_problem;
  using weave::sp::RingOptions;
  using weave::sp::RingShape;
  using weave::sp::Sharding;
  const char *q = fake(0), *k = fake(1), *v = fake(2), *o = fake(3), *lse = fake(4);
  for (int W = 2; W <= 8; ++W)
    for (Sharding sh : {Sharding::Zigzag, Sharding::Contiguous})
      for (int r = 0; r < W; ++r) {
        RingOptions opt;
        opt.sharding = sh;
        const RingShape s{2, 3001, 8, 2, 128};
        ASSERT_EQ(ring_input_problem(s, opt, W, r, kSms, q, k, v, o, lse), "") << "W " << W << " r " << r;
        ASSERT_EQ(ring_input_problem(s, opt, W, r, kSms, q, k, v, o, nullptr), "");
        ASSERT_EQ(ring_input_problem(s, opt, W, r, kSms, q, k, v, q, lse), "") << "in place (o = q) is allowed";
        // The shortest sequence: one row per chunk.
        const int n = sh == Sharding::Zigzag ? 2 * W : W;
        ASSERT_EQ(ring_input_problem({1, n, 2, 2, 64}, opt, W, r, kSms, q, k, v, o, lse), "");
        ASSERT_TRUE(mentions(ring_input_problem({1, n - 1, 2, 2, 64}, opt, W, r, kSms, q, k, v, o, lse), "S = "));
        // o over k or v (read by the pushes while o is written), shifted over q, lse over o.
        const long long L = weave::sp::local_rows(s.S, W, sh, r);
        const size_t o_bytes = size_t(s.B) * L * s.Hq * s.D * 2, kv_bytes = size_t(s.B) * L * s.Hkv * s.D * 2;
        ASSERT_TRUE(mentions(ring_input_problem(s, opt, W, r, kSms, q, k, v, k + kv_bytes - 16, lse), "overlaps k"));
        ASSERT_EQ(ring_input_problem(s, opt, W, r, kSms, q, k, v, k + kv_bytes, lse), "") << "adjacent: no overlap";
        ASSERT_TRUE(mentions(ring_input_problem(s, opt, W, r, kSms, q, k, v, v - o_bytes + 16, lse), "overlaps k"));
        ASSERT_EQ(ring_input_problem(s, opt, W, r, kSms, q, k, v, v - o_bytes, lse), "");
        ASSERT_TRUE(mentions(ring_input_problem(s, opt, W, r, kSms, q, k, v, q + 16, lse), "overlaps q"));
        ASSERT_TRUE(mentions(ring_input_problem(s, opt, W, r, kSms, q, k, v, o, o + o_bytes - 4), "lse overlaps"));
      }
  const RingShape s{1, 1000, 4, 2, 64};
  const int W = 2;
  RingOptions opt;
  auto problem = [&](const RingShape& sh, const RingOptions& op, const void* qq = nullptr) {
    return ring_input_problem(sh, op, W, 0, kSms, qq ? qq : q, k, v, o, lse);
  };
  EXPECT_TRUE(mentions(problem({1, 1000, 4, 2, 96}, opt), "head dim"));
  EXPECT_TRUE(mentions(problem({1, 1000, 3, 2, 64}, opt), "not a multiple"));
  EXPECT_TRUE(mentions(problem({0, 1000, 4, 2, 64}, opt), "positive"));
  EXPECT_TRUE(mentions(problem({1, 1ll << 30, 4, 2, 64}, opt), "2^30"));
  EXPECT_TRUE(mentions(problem(s, opt, fake(0, 8)), "16-byte aligned"));
  EXPECT_TRUE(mentions(ring_input_problem(s, opt, W, 0, kSms, q, k, v, o, fake(4, 2)), "4-byte aligned"));
  EXPECT_TRUE(mentions(ring_input_problem(s, opt, W, 0, kSms, q, nullptr, v, o, lse), "null"));
  RingOptions bad = opt;
  bad.softmax_scale = -1.f;
  EXPECT_TRUE(mentions(problem(s, bad), "softmax_scale"));
  bad = opt;
  bad.softmax_scale = std::nanf("");
  EXPECT_TRUE(mentions(problem(s, bad), "softmax_scale"));
  bad = opt;
  bad.sharding = static_cast<Sharding>(7);
  EXPECT_TRUE(mentions(problem(s, bad), "sharding"));
  // num_comm_sms: < 0 (tuner) or 1 .. half the SMs (launch_gathered's bound, now checked before
  // any round is taken).
  for (int nc : {-1, 1, kSms / 2}) {
    bad = opt;
    bad.num_comm_sms = nc;
    EXPECT_EQ(problem(s, bad), "") << nc;
  }
  for (int nc : {0, kSms / 2 + 1, kSms}) {
    bad = opt;
    bad.num_comm_sms = nc;
    EXPECT_TRUE(mentions(problem(s, bad), "num_comm_sms")) << nc;
  }
}

TEST(SpValidation, UlyssesRejectsBadArgumentsAndAcceptsGoodOnes) {
  using weave::sp::detail::ulysses_input_problem;
  using weave::sp::UlyssesOptions;
  using weave::sp::UlyssesShape;
  const char *q = fake(0), *k = fake(1), *v = fake(2), *o = fake(3);
  const UlyssesOptions opt;
  for (int W = 2; W <= 8; ++W)
    for (int r = 0; r < W; ++r) {
      const UlyssesShape s{2, 3001, 2 * W, 1, 128};  // Hkv = 1 < W: replicated kv head
      ASSERT_EQ(ulysses_input_problem(s, opt, W, r, kSms, q, k, v, o), "") << "W " << W << " r " << r;
      ASSERT_EQ(ulysses_input_problem({1, W, W, W, 64}, opt, W, r, kSms, q, k, v, o), "");
      ASSERT_TRUE(mentions(ulysses_input_problem({1, W - 1, W, W, 64}, opt, W, r, kSms, q, k, v, o), "S = "));
      ASSERT_TRUE(mentions(ulysses_input_problem({1, 1000, W + 1, 1, 64}, opt, W, r, kSms, q, k, v, o),
                           "multiple of the world size"));
      // Peers write o while q, k, v are still being pushed: no overlap at all, not even o = q.
      const size_t o_bytes = size_t(s.B) * weave::sp::ulysses_shard(s.S, W, r).rows * s.Hq * s.D * 2;
      ASSERT_TRUE(mentions(ulysses_input_problem(s, opt, W, r, kSms, q, k, v, q), "overlaps"));
      ASSERT_TRUE(mentions(ulysses_input_problem(s, opt, W, r, kSms, q, k, v, k - o_bytes + 16), "overlaps"));
      ASSERT_EQ(ulysses_input_problem(s, opt, W, r, kSms, q, k, v, k - o_bytes), "");
      ASSERT_TRUE(mentions(ulysses_input_problem(s, opt, W, r, kSms, q, k, v, v + 16), "overlaps"));
    }
  const UlyssesShape s{1, 1000, 4, 2, 64};
  EXPECT_TRUE(mentions(ulysses_input_problem({1, 1000, 4, 2, 96}, opt, 2, 0, kSms, q, k, v, o), "head dim"));
  EXPECT_TRUE(mentions(ulysses_input_problem(s, opt, 2, 0, kSms, q, k, fake(2, 4), o), "16-byte aligned"));
  EXPECT_TRUE(mentions(ulysses_input_problem(s, opt, 2, 0, kSms, q, k, v, nullptr), "null"));
  for (int nc : {0, kSms / 2 + 1}) {
    UlyssesOptions bad;
    bad.num_comm_sms = nc;
    EXPECT_TRUE(mentions(ulysses_input_problem(s, bad, 2, 0, kSms, q, k, v, o), "num_comm_sms")) << nc;
  }
}
