// The MoE grouped GEMM against an independent float32 reference: cuBLASLt (check/gemm_ref.hpp) on
// each expert's slice of rows with that expert's weight, compared element by element and reported
// per 128 x 128 tile (check/tile_check.hpp), on fresh random inputs with the output poisoned
// first. Every row past sum(counts) must still hold the poison bit pattern (no write outside the
// experts' rows), including the rows of a cut last tile. Routings: balanced, Dirichlet-skewed,
// empty experts, all rows on one expert, counts around tile edges, E = 1, 8, 64, both B layouts,
// N and K not multiples of the tile; 200 back-to-back launches with changing counts and inputs
// (no synchronisation between them; every one checked); counts past the capacity and a negative
// count write nothing and are reported by check_status with the expert and its count.
//
// Why the bound catches a wrong expert or a missing K step: see tests/gemm/test_gemm_gpu.cu (the
// same inputs uniform in [-1, 1) and bound 2^-8 |r| + 2^-10 s); a row computed with the next
// expert's weight is off by ~sqrt(2) |r|, hundreds of bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "check/device_buffer.hpp"
#include "check/error_of.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "check/gemm_baseline.cuh"
#include "moe/grouped_gemm.hpp"
#include "moe/grouped_gemm_schedule.hpp"

using namespace weave;
using bf16 = __nv_bfloat16;

namespace {

template <class T>
using DevBuf = check::DeviceBuffer<T>;

using check::case_seed;

using check::gemm_ref;

std::mt19937_64& rng() {
  static std::mt19937_64 g(check::derive(check::test_seed(), 0x4d6f45));
  return g;
}

// `rows` rows over E experts.
std::vector<int> balanced(int rows, int E) {
  std::vector<int> c(E, rows / E);
  for (int e = 0; e < rows % E; ++e) ++c[e];
  return c;
}
// Expert shares from a symmetric Dirichlet(alpha), each row drawn from them.
std::vector<int> dirichlet(int rows, int E, double alpha) {
  std::vector<double> p(E);
  std::gamma_distribution<double> gam(alpha, 1.0);
  for (double& v : p) v = gam(rng()) + 1e-12;
  std::discrete_distribution<int> pick(p.begin(), p.end());
  std::vector<int> c(E, 0);
  for (int r = 0; r < rows; ++r) ++c[pick(rng())];
  return c;
}
std::vector<int> one_expert(int rows, int E, int e) {
  std::vector<int> c(E, 0);
  c[e] = rows;
  return c;
}
// Every third expert empty, the rest random.
std::vector<int> with_empty(int rows, int E) {
  std::vector<int> c(E, 0);
  std::vector<int> live;
  for (int e = 0; e < E; ++e)
    if (e % 3 != 1) live.push_back(e);
  for (int r = 0; r < rows; ++r) ++c[live[rng()() % live.size()]];
  return c;
}
// Counts one below, at and one past tile edges (127, 128, 129, 255, ...), and 1.
std::vector<int> edges(int E) {
  const int pick[] = {1, 127, 128, 129, 255, 256, 257, 8, 7, 383};
  std::vector<int> c(E);
  for (int e = 0; e < E; ++e) c[e] = pick[(e + int(rng()() % 3)) % 10];
  return c;
}

int total(const std::vector<int>& c) { return std::accumulate(c.begin(), c.end(), 0); }

struct Problem {
  int E, N, K, R_cap;
  gemm::BLayout bl = gemm::BLayout::NK;
};

// Operands of one problem: X (R_cap x K, every row random, the slack too), W, Y, counts.
struct Buffers {
  Problem p;
  DevBuf<bf16> X, W, Y;
  DevBuf<int> counts;
  explicit Buffers(const Problem& pr)
      : p(pr), X(size_t(pr.R_cap) * pr.K), W(size_t(pr.E) * pr.N * pr.K), Y(size_t(pr.R_cap) * pr.N), counts(pr.E) {}
  void fill() {
    gemm::ref::fill_uniform(X.p, X.n, case_seed(1));
    gemm::ref::fill_uniform(W.p, W.n, case_seed(2));
  }
};

// Y against the per-expert float32 reference; the rows past sum(counts) still poison.
void check_output(const Buffers& b, const std::vector<int>& c, const bf16* Y, const std::string& name,
                  cudaStream_t st = nullptr, bool verbose = true) {
  const Problem& p = b.p;
  const int rows = total(c);
  ASSERT_LE(rows, p.R_cap);
  if (rows > 0) {
    DevBuf<float> r(size_t(rows) * p.N), s(size_t(rows) * p.N);
    int off = 0;
    for (int e = 0; e < p.E; ++e) {
      if (c[e] > 0)
        gemm_ref().run(b.X.p + size_t(off) * p.K, b.W.p + size_t(e) * p.N * p.K, c[e], p.N, p.K, p.bl,
                       r.p + size_t(off) * p.N, s.p + size_t(off) * p.N, false, st);
      off += c[e];
    }
    check::sqrt_inplace(s.p, r.n, st);
    const check::Report rep =
        check::compare({Y, p.N}, {r.p, p.N}, {s.p, p.N}, rows, p.N, check::gemm_bound(), 128, 128, st);
    EXPECT_TRUE(rep.ok) << name << ": " << rep.str();
    if (!rep.ok || verbose) std::printf("check %s: %s\n", name.c_str(), rep.str().c_str());
  }
  const size_t tail = size_t(p.R_cap - rows) * p.N;
  if (tail > 0) {
    std::vector<uint16_t> h(tail);
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(h.data(), Y + size_t(rows) * p.N, tail * 2, cudaMemcpyDeviceToHost, st));
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < tail; ++i)
      if (h[i] != 0xFFFF && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0u) << name << ": " << bad << " elements written past sum(counts) = " << rows << " rows, first at row "
                       << rows + first / p.N << " column " << first % p.N;
  }
}

void upload(DevBuf<int>& d, const std::vector<int>& c, cudaStream_t st = nullptr) {
  WEAVE_CUDA_CHECK(cudaMemcpyAsync(d.p, c.data(), c.size() * sizeof(int), cudaMemcpyHostToDevice, st));
}

std::string describe(const Problem& p, const char* routing, const std::vector<int>& c) {
  int mx = 0, empty = 0;
  for (int v : c) mx = std::max(mx, v), empty += v == 0;
  return std::string(routing) + " E " + std::to_string(p.E) + " N " + std::to_string(p.N) + " K " +
         std::to_string(p.K) + " R_cap " + std::to_string(p.R_cap) + (p.bl == gemm::BLayout::NK ? " NK" : " KN") +
         " rows " + std::to_string(total(c)) + " max " + std::to_string(mx) + " empty " + std::to_string(empty);
}

// The last-round split the device should have chosen for counts c on `workers` compute blocks
// (the schedule's own functions on the host: the tile count, then grouped_split).
gemm::SplitK expected_split(const Problem& p, const std::vector<int>& c, int workers, int split_k) {
  std::vector<int> tb(p.E + 1), rb(p.E + 1);
  EXPECT_EQ(moe::build_prefix(c.data(), p.E, p.R_cap, tb.data(), rb.data()), -1);
  const int items = tb[p.E] * ((p.N + moe::kGroupedBN - 1) / moe::kGroupedBN);
  return moe::grouped_split(items, moe::grouped_k_steps(p.K), workers, split_k, split_k != 1);
}

// Runs one launch into a poisoned Y and checks it; returns the split the launch reported (after
// checking it is the one the schedule gives).
int run_case(const Problem& p, const char* routing, const std::vector<int>& c, int split_k = 0) {
  const std::string name = describe(p, routing, c) + " split_k " + std::to_string(split_k);
  SCOPED_TRACE(name);
  Buffers b(p);
  b.fill();
  upload(b.counts, c);
  check::poison(b.Y.p, b.Y.n);
  moe::GroupedGemmOptions o;
  o.layout = p.bl;
  o.split_k = split_k;
  const lcsc::Plan plan = moe::grouped_gemm(b.X.p, b.W.p, b.Y.p, b.counts.p, p.E, p.N, p.K, p.R_cap, nullptr, o);
  const moe::GroupedStatus st = moe::take_status();
  EXPECT_FALSE(st.any()) << st.message();  // no refused launch
  const gemm::SplitK want = expected_split(p, c, plan.compute_blocks, split_k);
  // split_k = 1 runs the kernel without split items, which reports nothing (0).
  EXPECT_EQ(st.splits, split_k == 1 ? 0 : want.splits)
      << "the device chose another split than grouped_split on " << plan.compute_blocks << " workers, " << want.items
      << " tiles";
  check_output(b, c, b.Y.p, name);
  return st.splits;
}

const gemm::BLayout kLayouts[] = {gemm::BLayout::NK, gemm::BLayout::KN};

}  // namespace

TEST(GroupedGemm, Routings) {
  for (gemm::BLayout bl : kLayouts)
    for (int E : {1, 8, 64}) {
      const Problem p{E, 776, 520, 5000, bl};  // N = 3 * 256 + 8, K = 8 * 64 + 8
      const int rows = 4000 + int(rng()() % 900);
      run_case(p, "balanced", balanced(rows, E));
      run_case(p, "dirichlet", dirichlet(rows, E, 0.3));
      run_case(p, "empty", with_empty(rows, E));
      run_case(p, "one", one_expert(rows, E, int(rng()() % E)));
      if (E > 1) {
        const std::vector<int> c = edges(E);  // up to 383 rows each: more than the other cases
        run_case({E, p.N, p.K, std::max(p.R_cap, total(c) + 77), bl}, "edges", c);
      }
      run_case(p, "none", std::vector<int>(E, 0));
    }
}

TEST(GroupedGemm, FullCapacityAndTinyShapes) {
  run_case({8, 8, 8, 1000, gemm::BLayout::NK}, "balanced", balanced(1000, 8));  // sum == R_cap
  run_case({8, 264, 64, 129, gemm::BLayout::KN}, "one", one_expert(129, 8, 7));
  run_case({3, 256, 64, 3, gemm::BLayout::NK}, "ones", {1, 1, 1});
  run_case({1, 520, 1032, 777, gemm::BLayout::NK}, "one", {777});
}

TEST(GroupedGemm, ModelLikeShapes) {
  // DeepSeek-like up projection (N = 2 x 2048 gate+up, K = 7168) and down (N = 7168, K = 2048) at
  // 512 tokens x top-8; Mixtral-like at 1024 tokens x top-2.
  run_case({64, 4096, 7168, 4096, gemm::BLayout::NK}, "dirichlet", dirichlet(4096, 64, 1.0));
  run_case({64, 7168, 2048, 4096, gemm::BLayout::NK}, "balanced", balanced(4096, 64));
  run_case({8, 28672, 4096, 2048, gemm::BLayout::NK}, "dirichlet", dirichlet(2048, 8, 1.0));
  run_case({8, 4096, 14336, 2048, gemm::BLayout::KN}, "one", one_expert(2048, 8, 3));
}

// 200 launches, 20 at a time on one stream without synchronising, each with its own counts,
// output and one of two input sets; all checked after each group.
TEST(GroupedGemm, BackToBackChangingCounts) {
  const Problem p{8, 264, 136, 1500, gemm::BLayout::NK};
  constexpr int kGroup = 20, kRounds = 10;
  Buffers a(p), b(p);
  a.fill();
  b.fill();
  std::vector<DevBuf<int>*> counts;
  std::vector<DevBuf<bf16>*> outs;
  for (int i = 0; i < kGroup; ++i) {
    counts.push_back(new DevBuf<int>(p.E));
    outs.push_back(new DevBuf<bf16>(size_t(p.R_cap) * p.N));
  }
  cudaStream_t st;
  WEAVE_CUDA_CHECK(cudaStreamCreate(&st));
  int checked = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::vector<int>> cs;
    for (int i = 0; i < kGroup; ++i) {
      const int rows = int(rng()() % (p.R_cap + 1));
      const int kind = int(rng()() % 4);
      cs.push_back(kind == 0 ? balanced(rows, p.E)
                   : kind == 1 ? dirichlet(rows, p.E, 0.5)
                   : kind == 2 ? with_empty(rows, p.E)
                               : one_expert(rows, p.E, int(rng()() % p.E)));
      upload(*counts[i], cs.back(), st);
      check::poison(outs[i]->p, outs[i]->n, st);
    }
    moe::GroupedGemmOptions o;
    for (int i = 0; i < kGroup; ++i) {
      const Buffers& in = i % 2 ? b : a;
      // Forced 2 and 3 ways (the model never splits 3 K steps: a partial's exchange costs more), so
      // every launch with rows splits and its counters must start at zero.
      o.split_k = 2 + i % 2;
      moe::grouped_gemm(in.X.p, in.W.p, outs[i]->p, counts[i]->p, p.E, p.N, p.K, p.R_cap, st, o);
    }
    moe::check_status(st);
    for (int i = 0; i < kGroup; ++i) {
      check_output(i % 2 ? b : a, cs[i], outs[i]->p, "launch " + std::to_string(round * kGroup + i), st, i == 0);
      ++checked;
    }
    if (HasFailure()) break;
  }
  EXPECT_EQ(checked, kGroup * kRounds);
  for (auto* c : counts) delete c;
  for (auto* o : outs) delete o;
  WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
}

TEST(GroupedGemm, CapacityOverflowIsReportedAndWritesNothing) {
  const Problem p{8, 264, 128, 1000, gemm::BLayout::NK};
  Buffers b(p);
  b.fill();
  // Ends at 100, 300, 600, 1000, 1500: expert 4 is the first past 1000 rows.
  const std::vector<int> c = {100, 200, 300, 400, 500, 0, 0, 0};
  upload(b.counts, c);
  check::poison(b.Y.p, b.Y.n);
  DevBuf<int> status(8);
  WEAVE_CUDA_CHECK(cudaMemset(status.p, 0, 8 * sizeof(int)));
  moe::GroupedGemmOptions o;
  o.status = status.p;
  moe::grouped_gemm(b.X.p, b.W.p, b.Y.p, b.counts.p, p.E, p.N, p.K, p.R_cap, nullptr, o);
  // A second refused launch does not overwrite the first report.
  const std::vector<int> c2 = {2000, 0, 0, 0, 0, 0, 0, 0};
  DevBuf<int> counts2(8);
  upload(counts2, c2);
  moe::grouped_gemm(b.X.p, b.W.p, b.Y.p, counts2.p, p.E, p.N, p.K, p.R_cap, nullptr, o);
  try {
    moe::check_status(nullptr, status.p);
    ADD_FAILURE() << "overflow not reported";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("capacity 1000 rows exceeded at expert 4 (500 rows; rows end at 1500)"), std::string::npos) << m;
  }
  moe::check_status(nullptr, status.p);  // cleared by the read
  std::vector<uint16_t> h(b.Y.n);
  WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), b.Y.p, h.size() * 2, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::count(h.begin(), h.end(), uint16_t(0xFFFF)), static_cast<long>(h.size())) << "a refused launch wrote Y";
  // The device's own status words, and a negative count.
  const std::vector<int> neg = {10, 10, -5, 10, 0, 0, 0, 0};
  upload(b.counts, neg);
  moe::grouped_gemm(b.X.p, b.W.p, b.Y.p, b.counts.p, p.E, p.N, p.K, p.R_cap);
  const moe::GroupedStatus s = moe::take_status();
  EXPECT_EQ(s.error, moe::kGroupedNegativeCount);
  EXPECT_EQ(s.expert, 2);
  EXPECT_EQ(s.count, -5);
  EXPECT_FALSE(moe::take_status().any());
  // The next good launch is unaffected.
  run_case(p, "after overflow", balanced(1000, 8));
}

// The last partial round split along K: forced 2-7 ways and the model's own choice, on tile
// counts one tile past whole rounds (the model splits: one tile would otherwise run alone for a
// whole round) and with cut tiles of <= 64 rows (a consumer half without rows), ragged N and K.
TEST(GroupedGemm, LastRoundSplit) {
  int sms = 0;
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int split_runs = 0;
  for (gemm::BLayout bl : kLayouts) {
    // One expert whose rows make sms + 1 tiles of one column (N <= 256), the last cut at 78 rows.
    const int rows = 128 * sms + 78;
    const Problem one{1, 200, 2056, rows + 100, bl};
    split_runs += run_case(one, "sms+1 tiles", {rows}) > 1;
    for (int f : {2, 3, 7}) split_runs += run_case(one, "sms+1 tiles", {rows}, f) > 1;
    EXPECT_EQ(run_case(one, "sms+1 tiles", {rows}, 1), 0);  // the kernel without split items
    // Several experts, every one with a cut last tile, 3 column tiles (the last 8 wide).
    const Problem many{8, 520, 1032, 6000, bl};
    const std::vector<int> c = {700, 33, 0, 1000, 65, 129, 2000, 64};
    for (int f : {0, 2, 4}) split_runs += run_case(many, "cut tiles", c, f) > 1;
    split_runs += run_case(many, "dirichlet", dirichlet(5000, 8, 0.3), 3) > 1;
  }
  EXPECT_GE(split_runs, 10) << "too few launches split: the test does not exercise the split";
  // More splits than K steps: capped at the steps.
  EXPECT_EQ(run_case({2, 256, 120, 300, gemm::BLayout::NK}, "short K", {150, 100}, 5), 2);
}

TEST(GroupedGemm, RejectsShortBuffers) {
  const Problem p{8, 264, 128, 1000, gemm::BLayout::NK};
  Buffers b(p);
  DevBuf<bf16> small(1024);
  DevBuf<int> few(4);
  auto expect = [&](const char* what, auto fn) {
    const std::string e = check::error_of(fn);
    EXPECT_NE(e.find(what), std::string::npos) << (e.empty() ? "accepted: " + std::string(what) : e);
  };
  expect("X needs", [&] { moe::grouped_gemm(small.p, b.W.p, b.Y.p, b.counts.p, p.E, p.N, p.K, p.R_cap); });
  expect("W needs", [&] { moe::grouped_gemm(b.X.p, small.p, b.Y.p, b.counts.p, p.E, p.N, p.K, p.R_cap); });
  expect("Y needs", [&] { moe::grouped_gemm(b.X.p, b.W.p, small.p, b.counts.p, p.E, p.N, p.K, p.R_cap); });
  expect("counts needs", [&] { moe::grouped_gemm(b.X.p, b.W.p, b.Y.p, few.p, p.E, p.N, p.K, p.R_cap); });
  expect("K = 100 is not a multiple of 8", [&] { moe::grouped_gemm(b.X.p, b.W.p, b.Y.p, b.counts.p, p.E, p.N, 100, 8); });
  moe::GroupedGemmOptions o;
  o.split_k = 17;
  expect("split_k = 17", [&] { moe::grouped_gemm(b.X.p, b.W.p, b.Y.p, b.counts.p, p.E, p.N, p.K, p.R_cap, nullptr, o); });
}
