// The grouped GEMM's work order (kernels/moe/grouped_gemm_schedule.hpp) and host checks, on the
// CPU: every tile of every expert exactly once, expert after expert, rows cut at each expert's
// end; empty experts skipped; the host's grid bound never below the real count; the first bad
// expert named (capacity overflow, negative count); the argument checks and the error text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "check/error_of.hpp"
#include "check/seed.hpp"
#include "moe/grouped_gemm.hpp"
#include "moe/grouped_gemm_schedule.hpp"
#include "weave/common/error.hpp"

using namespace weave;
using namespace weave::moe;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 g(check::derive(check::test_seed(), 0x6767));
  return g;
}

// Counts of several shapes: random, with empty runs, one expert, ragged around tile edges.
std::vector<int> random_counts(int E, int kind) {
  std::vector<int> c(E, 0);
  auto& g = rng();
  switch (kind) {
    case 0:
      for (int& v : c) v = int(g() % 700);
      break;
    case 1:
      for (int& v : c) v = g() % 3 == 0 ? 0 : int(g() % 300);
      break;
    case 2:
      c[g() % E] = 1 + int(g() % 5000);
      break;
    default:
      for (int& v : c) v = std::max(0, 128 * int(g() % 4) + int(g() % 3) - 1);  // 127..129, 255..257, ...
      break;
  }
  return c;
}

void check_order(const std::vector<int>& counts, int tiles_n, int group_m) {
  const int E = int(counts.size());
  std::vector<int> tb(E + 1), rb(E + 1);
  long long total_rows = 0;
  for (int c : counts) total_rows += c;
  ASSERT_EQ(build_prefix(counts.data(), E, int(total_rows) + 1, tb.data(), rb.data()), -1);
  int tiles = 0, rows = 0;
  for (int e = 0; e < E; ++e) {
    ASSERT_EQ(tb[e], tiles);
    ASSERT_EQ(rb[e], rows);
    tiles += tile_rows_of(counts[e]), rows += counts[e];
  }
  ASSERT_EQ(tb[E], tiles);
  ASSERT_EQ(rb[E], rows);
  const long long work = static_cast<long long>(tiles) * tiles_n;
  ASSERT_LE(work, max_work(rows > 0 ? rows : 1, E, tiles_n));
  std::map<std::tuple<int, int, int>, int> seen;
  int prev_e = -1;
  for (int w = 0; w < work; ++w) {
    const GroupedTile t = grouped_tile(w, tb.data(), rb.data(), E, tiles_n, group_m);
    ASSERT_GE(t.expert, prev_e) << "experts out of order at w = " << w;
    prev_e = t.expert;
    ASSERT_GT(counts[t.expert], 0) << "an empty expert got work item " << w;
    ASSERT_LT(t.m, tile_rows_of(counts[t.expert]));
    ASSERT_GE(t.n, 0);
    ASSERT_LT(t.n, tiles_n);
    ASSERT_EQ(t.row0, rb[t.expert] + 128 * t.m);
    ASSERT_EQ(t.rows, std::min(128, counts[t.expert] - 128 * t.m));
    ASSERT_GE(t.rows, 1);
    ASSERT_LE(t.row0 + t.rows, rb[t.expert] + counts[t.expert]) << "a tile writes past its expert";
    ++seen[{t.expert, t.m, t.n}];
  }
  ASSERT_EQ(static_cast<long long>(seen.size()), work) << "a tile was produced twice";
  for (int e = 0; e < E; ++e)
    for (int m = 0; m < tile_rows_of(counts[e]); ++m)
      for (int n = 0; n < tiles_n; ++n) ASSERT_EQ((seen[{e, m, n}]), 1) << e << " " << m << " " << n;
}

}  // namespace

TEST(GroupedGemmSchedule, EveryTileOnceExpertAfterExpert) {
  for (int E : {1, 2, 8, 64, 257, 1024})
    for (int kind = 0; kind < 4; ++kind)
      for (int tiles_n : {1, 3, 16})
        for (int group_m : {1, 8, 16}) {
          SCOPED_TRACE("E " + std::to_string(E) + " kind " + std::to_string(kind) + " tiles_n " +
                       std::to_string(tiles_n) + " group_m " + std::to_string(group_m));
          check_order(random_counts(E, kind), tiles_n, group_m);
          if (HasFatalFailure()) return;
        }
}

TEST(GroupedGemmSchedule, EmptyExpertsAreSkipped) {
  const std::vector<int> counts = {0, 300, 0, 0, 129, 0};  // 3 + 2 tile rows
  int tb[7], rb[7];
  ASSERT_EQ(build_prefix(counts.data(), 6, 1000, tb, rb), -1);
  const int want[] = {1, 1, 1, 4, 4};
  for (int q = 0; q < 5; ++q) EXPECT_EQ(expert_of(q * 2, tb, 6, 2), want[q]) << q;
  check_order(counts, 2, 8);
  check_order({0, 0, 0}, 4, 8);  // no work at all
}

TEST(GroupedGemmSchedule, HostBoundCoversEveryCountWithinCapacity) {
  // The worst case for tile rows: every expert one row past a tile edge, or one row each.
  for (int cap : {1, 7, 128, 129, 1000, 32768})
    for (int E : {1, 8, 64, 1024}) {
      std::vector<int> c(E, 0);
      long long left = cap;
      for (int e = 0; e < E && left > 0; ++e) {
        const int v = int(std::min<long long>(left, 129));
        c[e] = v, left -= v;
      }
      int tiles = 0;
      for (int v : c) tiles += tile_rows_of(v);
      EXPECT_LE(tiles, max_work(cap, E, 1)) << cap << " " << E;
      std::vector<int> ones(E, 0);
      for (int e = 0; e < E && e < cap; ++e) ones[e] = 1;
      tiles = 0;
      for (int v : ones) tiles += tile_rows_of(v);
      EXPECT_LE(tiles, max_work(cap, E, 1)) << cap << " " << E;
    }
}

TEST(GroupedGemmSchedule, FirstBadExpertIsNamed) {
  int tb[6], rb[6], why = -1;
  const std::vector<int> over = {100, 200, 300, 400, 500};  // ends 100, 300, 600, 1000, 1500
  EXPECT_EQ(build_prefix(over.data(), 5, 1000, tb, rb, &why), 4);
  EXPECT_EQ(why, kGroupedOverflow);
  EXPECT_EQ(build_prefix(over.data(), 5, 999, tb, rb, &why), 3);
  EXPECT_EQ(build_prefix(over.data(), 5, 1500, tb, rb, &why), -1);
  EXPECT_EQ(why, kGroupedOk);
  const std::vector<int> neg = {5, -1, 5};
  EXPECT_EQ(build_prefix(neg.data(), 3, 1000, tb, rb, &why), 1);
  EXPECT_EQ(why, kGroupedNegativeCount);
  GroupedStatus s;
  s.error = kGroupedOverflow, s.expert = 3, s.count = 400, s.rows = 1000, s.capacity = 999;
  EXPECT_NE(s.message().find("capacity 999 rows exceeded at expert 3 (400 rows"), std::string::npos) << s.message();
  s.error = kGroupedNegativeCount, s.expert = 1, s.count = -1;
  EXPECT_NE(s.message().find("expert 1 has a negative row count (-1)"), std::string::npos) << s.message();
}

TEST(GroupedGemmSchedule, RejectsBadArguments) {
  alignas(16) static char buf[64];
  const void* p = buf;
  const int* cnt = reinterpret_cast<const int*>(buf);
  auto expect = [&](const char* what, auto fn) {
    const std::string e = check::error_of(fn);
    EXPECT_NE(e.find(what), std::string::npos) << (e.empty() ? "accepted: " + std::string(what) : e);
  };
  expect("E = 0 experts", [&] { validate_grouped(p, p, p, cnt, 0, 64, 64, 128); });
  expect("E = 1025 experts", [&] { validate_grouped(p, p, p, cnt, 1025, 64, 64, 128); });
  expect("K = 100 is not a multiple of 8", [&] { validate_grouped(p, p, p, cnt, 4, 64, 100, 128); });
  expect("N = 12 is not a multiple of 8", [&] { validate_grouped(p, p, p, cnt, 4, 12, 64, 128); });
  expect("R_cap = 0", [&] { validate_grouped(p, p, p, cnt, 4, 64, 64, 0); });
  expect("null pointer", [&] { validate_grouped(p, nullptr, p, cnt, 4, 64, 64, 128); });
  expect("X is not 16-byte aligned", [&] { validate_grouped(buf + 8, p, p, cnt, 4, 64, 64, 128); });
  expect("Y is not 16-byte aligned", [&] { validate_grouped(p, p, buf + 2, cnt, 4, 64, 64, 128); });
  expect("counts is not 4-byte aligned",
         [&] { validate_grouped(p, p, p, reinterpret_cast<const int*>(buf + 2), 4, 64, 64, 128); });
  validate_grouped(p, p, p, cnt, 1024, 8, 8, 1);  // the limits themselves are accepted
}

// The fixed-stride layout (GroupedGemmOptions::row_stride, the low-latency dispatch's receive
// buffer): every tile of every expert once, expert after expert, each tile inside its expert's
// stride region and cut at its count; empty experts skipped; counts above the stride or negative
// refused at the first such expert; the host checks of the stride.
namespace {

void check_strided_order(const std::vector<int>& counts, int stride, int tiles_n, int group_m) {
  const int E = int(counts.size());
  std::vector<int> tb(E + 1), cnt(E);
  int why = -1;
  ASSERT_EQ(build_prefix_strided(counts.data(), E, stride, tb.data(), cnt.data(), &why), -1);
  ASSERT_EQ(why, kGroupedOk);
  int tiles = 0;
  for (int e = 0; e < E; ++e) {
    ASSERT_EQ(tb[e], tiles);
    ASSERT_EQ(cnt[e], counts[e]);
    tiles += tile_rows_of(counts[e]);
  }
  ASSERT_EQ(tb[E], tiles);
  const long long work = static_cast<long long>(tiles) * tiles_n;
  ASSERT_LE(work, max_work(E * stride, E, tiles_n)) << "the grid bound of R_cap = E x stride";
  std::vector<int> written(static_cast<size_t>(E) * stride * tiles_n, 0);
  int prev_e = -1;
  for (int w = 0; w < work; ++w) {
    const GroupedTile t = grouped_tile_strided(w, tb.data(), cnt.data(), E, tiles_n, group_m, stride);
    ASSERT_GE(t.expert, prev_e) << "experts out of order at w = " << w;
    prev_e = t.expert;
    ASSERT_GT(counts[t.expert], 0) << "an empty expert got work item " << w;
    ASSERT_EQ(t.row0, t.expert * stride + 128 * t.m);
    ASSERT_EQ(t.rows, std::min(128, counts[t.expert] - 128 * t.m));
    ASSERT_GE(t.rows, 1);
    ASSERT_LE(t.row0 + t.rows, t.expert * stride + counts[t.expert]) << "a tile writes past its expert's count";
    for (int r = t.row0; r < t.row0 + t.rows; ++r) ++written[(static_cast<size_t>(r)) * tiles_n + t.n];
  }
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < stride; ++r)
      for (int n = 0; n < tiles_n; ++n)
        ASSERT_EQ(written[(static_cast<size_t>(e) * stride + r) * tiles_n + n], r < counts[e] ? 1 : 0)
            << "expert " << e << " row " << r << " column tile " << n;
}

}  // namespace

TEST(GroupedGemmSchedule, StridedEveryRowOnceInsideItsRegion) {
  for (int E : {1, 2, 8, 32, 64})
    for (int stride : {1, 127, 128, 129, 512, 2048})
      for (int kind = 0; kind < 4; ++kind) {
        std::vector<int> c = random_counts(E, kind);
        for (int& v : c) v = std::min(v, stride);  // a valid call: every count within its stride
        if (kind == 3) c[rng()() % E] = stride;     // one expert exactly full
        SCOPED_TRACE("E " + std::to_string(E) + " stride " + std::to_string(stride) + " kind " + std::to_string(kind));
        for (int tiles_n : {1, 3})
          for (int group_m : {1, 8}) {
            check_strided_order(c, stride, tiles_n, group_m);
            if (HasFatalFailure()) return;
          }
      }
  check_strided_order({0, 0, 0, 0}, 256, 2, 8);  // nothing to do
}

TEST(GroupedGemmSchedule, StridedFirstBadExpertIsNamed) {
  int tb[6], cnt[5], why = -1;
  const std::vector<int> c = {10, 300, 256, 257, -1};
  EXPECT_EQ(build_prefix_strided(c.data(), 5, 256, tb, cnt, &why), 1);
  EXPECT_EQ(why, kGroupedStrideOverflow);
  EXPECT_EQ(cnt[1], 256);  // clamped (the launch runs no tiles anyway)
  EXPECT_EQ(build_prefix_strided(c.data(), 5, 300, tb, cnt, &why), 4);  // only the -1 is bad
  EXPECT_EQ(why, kGroupedNegativeCount);
  const std::vector<int> ok = {10, 0, 256};
  EXPECT_EQ(build_prefix_strided(ok.data(), 3, 256, tb, cnt, &why), -1);
  EXPECT_EQ(why, kGroupedOk);
  GroupedStatus s;
  s.error = kGroupedStrideOverflow, s.expert = 1, s.count = 300, s.rows = 556, s.capacity = 256;
  EXPECT_NE(s.message().find("expert 1 has 300 rows, more than its row_stride of 256"), std::string::npos)
      << s.message();
}

TEST(GroupedGemmSchedule, StridedArgumentChecks) {
  auto expect = [&](const char* what, auto fn) {
    const std::string e = check::error_of(fn);
    EXPECT_NE(e.find(what), std::string::npos) << (e.empty() ? "accepted: " + std::string(what) : e);
  };
  expect("row_stride = -1", [&] { validate_row_stride(4, 1024, -1); });
  expect("E x row_stride = 4 x 257 = 1028 rows, more than R_cap = 1024", [&] { validate_row_stride(4, 1024, 257); });
  validate_row_stride(4, 1024, 256);  // exactly fits
  validate_row_stride(4, 1, 0);       // packed: nothing to check
  // The options as a whole (what the layers check before their dispatch).
  GroupedGemmOptions o;
  validate_grouped_options(o, 4, 1024, 132);
  o.row_stride = 257;
  expect("more than R_cap = 1024", [&] { validate_grouped_options(o, 4, 1024, 132); });
  o = {};
  o.lcsc.num_comm_sms = -1;
  expect("num_comm_sms = -1", [&] { validate_grouped_options(o, 4, 1024, 132); });
  o.lcsc.num_comm_sms = 132;
  expect("num_comm_sms = 132", [&] { validate_grouped_options(o, 4, 1024, 132); });
  validate_grouped_options(o, 4, 1024, 0);  // no SM count known: the plan checks the upper bound
  o = {};
  o.lcsc.max_compute_blocks = -2;
  expect("max_compute_blocks = -2", [&] { validate_grouped_options(o, 4, 1024, 132); });
  o = {};
  o.split_k = -1;
  expect("split_k = -1", [&] { validate_grouped_options(o, 4, 1024, 132); });
  o.split_k = kMaxGroupedSplits + 1;
  expect("split_k = 17, want 0 (the model), 1 (never) or up to 16 ways", [&] { validate_grouped_options(o, 4, 1024, 132); });
  o.split_k = kMaxGroupedSplits;
  validate_grouped_options(o, 4, 1024, 132);
  o = {};
  o.lcsc.num_comm_sms = 1, o.lcsc.max_clusters = 1;  // the plan would leave no compute block
  expect("no room for a compute cluster", [&] { validate_grouped_options(o, 4, 1024, 132); });
}

// The last-round split the kernel chooses on the device (grouped_split): the dense GEMM's model
// where it gains, never where no workspace was given or split_k = 1, forced counts capped at the
// K steps, and never more split items than the workspace holds (grouped_split_slots per worker).
TEST(GroupedGemmSchedule, LastRoundSplit) {
  // The bench's Mixtral T 4096 Dirichlet down row: 1104 tiles of 224 K steps on 132 SMs, 8 whole
  // rounds and 48 tiles, which 2 ways fill as 96 half items (measured 4.1-7.5 % faster than unsplit).
  gemm::SplitK s = grouped_split(1104, 224, 132, 0, true);
  EXPECT_EQ(s.splits, 2);
  EXPECT_EQ(s.dp_items, 1056);
  EXPECT_EQ(gemm::num_work(s), 1056 + 96);
  // Its balanced row: 1024 tiles, a tail of 100 (measured 3 % slower split 2 ways): no room for 2.
  EXPECT_EQ(grouped_split(1024, 224, 132, 0, true).splits, 1);
  // A tail of 32: 4 ways fill one round of 128 quarter items.
  EXPECT_EQ(grouped_split(1088, 224, 132, 0, true).splits, 4);
  // Many whole rounds before the tail: splitting it saves under 5 % (the Mixtral T 16384 balanced
  // down row, 4096 tiles: 31 rounds and 4).
  EXPECT_EQ(grouped_split(4096, 224, 132, 0, true).splits, 1);
  EXPECT_EQ(grouped_split(1088, 224, 132, 0, false).splits, 1);  // no workspace
  EXPECT_EQ(grouped_split(1088, 224, 132, 1, true).splits, 1);   // never
  EXPECT_EQ(grouped_split(1056, 224, 132, 0, true).splits, 1);   // whole rounds only
  EXPECT_EQ(grouped_split(1056 + 100, 224, 132, 0, true).splits, 1);  // 100 tail tiles: no room for 2 ways
  EXPECT_EQ(grouped_split(1056 + 100, 224, 132, 3, true).splits, 3);  // forced
  EXPECT_EQ(grouped_split(1056 + 100, 2, 132, 3, true).splits, 2);    // capped at the K steps
  EXPECT_EQ(grouped_split(0, 224, 132, 0, true).splits, 1);
  EXPECT_EQ(gemm::num_work(grouped_split(0, 224, 132, 4, true)), 0);
  // Short K: the exchange costs more than the round it saves.
  EXPECT_EQ(grouped_split(133, 2, 132, 0, true).splits, 1);
  // Every item covered once, and the workspace bound, over random inputs.
  for (int trial = 0; trial < 20000; ++trial) {
    const int workers = 1 + int(rng()() % 200), items = int(rng()() % 2000), iters = 1 + int(rng()() % 300);
    const int forced = int(rng()() % 9);
    s = grouped_split(items, iters, workers, forced, true);
    ASSERT_LE(static_cast<long long>(gemm::tail_items(s)) * s.splits,
              static_cast<long long>(workers) * grouped_split_slots(forced))
        << items << " items, " << workers << " workers, forced " << forced;
    ASSERT_LE(s.splits, std::max(1, std::min(iters, forced > 1 ? forced : 4)));
    std::vector<int> steps(items, 0);
    for (int w = 0; w < gemm::num_work(s); ++w) {
      const gemm::Segment g = gemm::segment(s, w);
      ASSERT_GE(g.item, 0);
      ASSERT_LT(g.item, items);
      steps[g.item] += g.k_iters;
    }
    for (int i = 0; i < items; ++i) ASSERT_EQ(steps[i], iters) << "item " << i;
  }
}
