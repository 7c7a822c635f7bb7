// moe_dispatch / moe_combine (kernels/moe/exchange.hpp) on W ranks (weave-run), against references
// that every rank builds on the CPU from every rank's inputs (all regenerated from rank 0's seed):
// - dispatch: the grouped buffer's rows [0, R) bit-exact against layout.hpp's plan_dispatch (each
//   (token, slot) routed to this rank holds its token's row, duplicated per expert), rows past R
//   untouched (still poison), the per-expert counts and offsets, and every row's metadata;
// - combine: out[t] = sum_j w[t, j] * Y[row(t, j)] against a float64 sum over expert outputs that
//   any rank regenerates, per element under |out - r| <= 2^-8 |r| + 2^-19 sum_j |w_j y_j|: the
//   kernel's fp32 fma chain of k <= 16 terms is within k 2^-24 sum |w y| <= 2^-20 sum |w y| of the
//   exact sum, and the bf16 rounding adds at most 2^-8 of the result (half an ulp at 8 significand
//   bits). A wrong or missing term (about |w y|, ~0.25 sum / k here) is 100x past the bound.
// Routings: balanced, random, Dirichlet-skewed, half the experts empty, every token on expert 0,
// all of a token's experts on one rank (the duplication pass), repeated ids; k = 1, 2, 4, 8; T
// different on every rank, T = 0 and T = 1 on some; H from 64 to 7168. Outputs are poisoned
// before every checked call. Then 200 dispatch + combine calls back to back (no host sync in
// between) with changing routing and T, every one checked; then an out-of-range id and a
// capacity overflow, each an error with the same message on every rank (check()), zero counts and
// NaN outputs, no hang, and a correct call right after. Then dispatch + combine captured in a CUDA
// graph and replayed with changing routing, eager calls between, every replay checked.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../primitives/common.hpp"
#include "check/seed.hpp"
#include "common.hpp"
#include "layer_check.hpp"
#include "moe/exchange.hpp"
#include "moe/layout.hpp"
#include "routing.hpp"

namespace {

using namespace weave;
using namespace weave::moe;
using bf16 = __nv_bfloat16;

using test::BoundCheck;
using test::comm;
using test::DeviceInput;
using test::DevFree;
using test::make_input;
using test::RankInput;
using test::Routing;
using test::stream;

// Every rank's view of one call: the count matrix, each rank's plan, each rank's expert outputs.
struct Reference {
  Geometry g;
  int k = 0, H = 0;
  std::vector<int> counts;
  std::vector<DispatchPlan> plans;
  std::vector<std::vector<bf16>> y;  // y[d]: rank d's expert output rows (R_d x H)

  Reference(const std::vector<RankInput>& in, const Geometry& geo, int k_, int H_, uint64_t seed)
      : g(geo), k(k_), H(H_), counts(static_cast<size_t>(geo.world) * geo.experts) {
    for (int s = 0; s < g.world; ++s) count_rows(in[s].idx.data(), in[s].T, k, g, counts.data() + s * g.experts);
    for (int s = 0; s < g.world; ++s) plans.push_back(plan_dispatch(in[s].idx.data(), in[s].T, k, g, s, counts));
    for (int d = 0; d < g.world; ++d)
      y.push_back(wt::random_matrix<bf16>(check::derive(seed, 3, d), 0, static_cast<size_t>(rows(d)) * H));
  }
  int rows(int d) const { return rank_rows(counts.data(), g, d); }
};

struct Snapshot {
  std::vector<bf16> rows;  // the grouped buffer (at least R x H)
  std::vector<int> counts, offsets;
  std::vector<RowMeta> meta;
  std::vector<bf16> out;
};

bool same_bits(bf16 a, bf16 b) { return wt::bits(a) == wt::bits(b); }

// The checks of one call on this rank; `what` names the call in failure messages.
void verify(const Reference& ref, const std::vector<RankInput>& in, const Snapshot& got, bool tail_poisoned,
            const std::string& what) {
  const Geometry& g = ref.g;
  const int me = comm().rank(), L = g.local_experts(), H = ref.H, k = ref.k, R = ref.rows(me);
  // Counts and offsets.
  for (int l = 0; l <= L; ++l) {
    ASSERT_EQ(got.offsets[l], expert_begin(ref.counts.data(), g, me, l)) << what << ": offset of local expert " << l;
    if (l < L)
      ASSERT_EQ(got.counts[l], expert_rows(ref.counts.data(), g, g.expert(me, l))) << what << ": count of local expert " << l;
  }
  // The grouped rows, built independently from every rank's plan.
  std::vector<int> filled(R, 0);
  long long bad_rows = 0;
  std::string first_bad;
  for (int s = 0; s < g.world; ++s)
    for (int t = 0; t < in[s].T; ++t)
      for (int j = 0; j < k; ++j) {
        const size_t i = static_cast<size_t>(t) * k + j;
        if (g.rank_of(in[s].idx[i]) != me) continue;
        const int row = ref.plans[s].row[i];
        ASSERT_TRUE(row >= 0 && row < R) << what << ": reference row " << row;
        ++filled[row];
        const RowMeta& m = got.meta[row];
        const int prow = ref.plans[s].row[static_cast<size_t>(t) * k + ref.plans[s].primary[i]];
        bool ok = m.src == s && m.token == t && m.primary == prow && m.slot == j;
        for (int h = 0; ok && h < H; ++h)
          ok = same_bits(got.rows[static_cast<size_t>(row) * H + h], in[s].x[static_cast<size_t>(t) * H + h]);
        if (!ok && bad_rows++ == 0)
          first_bad = "row " + std::to_string(row) + " (rank " + std::to_string(s) + ", token " + std::to_string(t) +
                      ", slot " + std::to_string(j) + "; meta src " + std::to_string(m.src) + " token " +
                      std::to_string(m.token) + " primary " + std::to_string(m.primary) + " (want " +
                      std::to_string(prow) + ") slot " + std::to_string(m.slot) + ")";
      }
  EXPECT_EQ(bad_rows, 0) << what << ": " << bad_rows << " of " << R << " grouped rows wrong, first " << first_bad;
  for (int r = 0; r < R; ++r) ASSERT_EQ(filled[r], 1) << what << ": reference fills row " << r << " " << filled[r] << "x";
  if (tail_poisoned) {
    long long touched = 0;
    for (size_t i = static_cast<size_t>(R) * H; i < got.rows.size(); ++i) touched += wt::bits(got.rows[i]) != 0xffffu;
    EXPECT_EQ(touched, 0) << what << ": " << touched << " elements past the " << R << " received rows were written";
  }
  // Combine: float64 reference, per-element bound.
  const RankInput& mine = in[me];
  BoundCheck chk;
  for (int t = 0; t < mine.T; ++t)
    for (int h = 0; h < H; ++h) {
      double r = 0, s = 0;
      for (int j = 0; j < k; ++j) {
        const size_t i = static_cast<size_t>(t) * k + j;
        const int d = g.rank_of(mine.idx[i]);
        const double y = wt::to_f(ref.y[d][static_cast<size_t>(ref.plans[me].row[i]) * H + h]);
        r += static_cast<double>(mine.w[i]) * y;
        s += std::fabs(static_cast<double>(mine.w[i]) * y);
      }
      const double bound = std::ldexp(std::fabs(r), -8) + std::ldexp(s, -19);
      chk.add(wt::to_f(got.out[static_cast<size_t>(t) * H + h]), r, bound > 0 ? bound : 1e-30, t, h);
    }
  chk.expect(what + ": combine");
}

struct CaseSpec {
  Routing routing;
  int L, k, H;
  int T0, dT;            // rank s has T0 + dT * s tokens
  int zero_rank = -1;    // this rank has none
  int capacity = 0;      // 0: W * max T * k (any routing fits)
};

int tokens_of(const CaseSpec& c, int s) { return s == c.zero_rank ? 0 : std::max(0, c.T0 + c.dT * s); }

ExchangeConfig config_of(const CaseSpec& c, int W) {
  ExchangeConfig cf;
  cf.experts = c.L * W;
  cf.hidden = c.H;
  cf.topk = c.k;
  int maxT = 0;
  for (int s = 0; s < W; ++s) maxT = std::max(maxT, tokens_of(c, s));
  cf.max_tokens = std::max(maxT, 1);
  cf.capacity = c.capacity > 0 ? c.capacity : std::max(1, W * maxT * c.k);
  return cf;
}

std::vector<RankInput> inputs_of(const CaseSpec& c, const Geometry& g, uint64_t seed) {
  std::vector<RankInput> in;
  for (int s = 0; s < g.world; ++s) in.push_back(make_input(seed, c.routing, g, tokens_of(c, s), c.k, c.H, s));
  return in;
}

// One checked dispatch + combine on `ex`: inputs uploaded, outputs poisoned, the call, snapshots.
Snapshot run_once(MoeExchange& ex, const std::vector<RankInput>& in, const Reference& ref, DevFree& mem) {
  const ExchangeConfig& cf = ex.config();
  const int me = comm().rank(), T = in[me].T, H = cf.hidden, k = cf.topk, R = ref.rows(me);
  cudaStream_t s = stream();
  const DeviceInput in_d(in[me], H, k, mem);  // the output poisoned
  const size_t cap_elems = static_cast<size_t>(cf.capacity) * H;
  WEAVE_CUDA_CHECK(cudaMemset(ex.expert_input(), 0xff, cap_elems * sizeof(bf16)));
  WEAVE_CUDA_CHECK(cudaMemset(ex.expert_output(), 0xff, cap_elems * sizeof(bf16)));
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();  // nobody pushes into a buffer still being poisoned
  const Dispatched d = ex.dispatch(in_d.x, in_d.idx, T, s);
  // The experts' outputs (what a grouped GEMM would write), in stream order after the dispatch.
  if (R)
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(ex.expert_output(), ref.y[me].data(), static_cast<size_t>(R) * H * sizeof(bf16),
                                     cudaMemcpyHostToDevice, s));
  ex.combine(ex.expert_output(), in_d.w, in_d.out, T, s);
  ex.check(s);
  Snapshot snap;
  snap.rows = wt::to_host(d.rows, cap_elems);
  snap.counts = wt::to_host(d.counts, d.local_experts);
  snap.offsets = wt::to_host(d.offsets, d.local_experts + 1);
  snap.meta = wt::to_host(d.meta, cf.capacity);
  snap.out = wt::to_host(in_d.out, static_cast<size_t>(T) * H);
  comm().barrier();
  return snap;
}

void run_case(const CaseSpec& c) {
  const int W = comm().world();
  const Geometry g{W, c.L * W};
  const uint64_t seed = wt::job_seed();
  const std::vector<RankInput> in = inputs_of(c, g, seed);
  const Reference ref(in, g, c.k, c.H, seed);
  DevFree mem;
  MoeExchange ex(comm(), config_of(c, W));
  const Snapshot snap = run_once(ex, in, ref, mem);
  verify(ref, in, snap, true,
         std::string(name(c.routing)) + " E " + std::to_string(g.experts) + " k " + std::to_string(c.k) + " H " +
             std::to_string(c.H) + " T0 " + std::to_string(c.T0));
}

}  // namespace

TEST(MoeExchange, Balanced) { run_case({Routing::balanced, 8, 2, 256, 333, 17}); }
TEST(MoeExchange, RandomTop8) { run_case({Routing::random, 32, 8, 512, 1000, -123}); }
TEST(MoeExchange, DirichletSkewed) { run_case({Routing::dirichlet, 16, 4, 128, 513, 91}); }
TEST(MoeExchange, EmptyExperts) { run_case({Routing::empty_experts, 8, 2, 64, 257, 0}); }
TEST(MoeExchange, AllTokensToOneExpert) { run_case({Routing::all_to_one, 4, 2, 128, 300, -37}); }
TEST(MoeExchange, Top1WithAnEmptyRank) { run_case({Routing::random, 4, 1, 256, 129, 0, 1}); }
TEST(MoeExchange, ExpertsOnOneRankDuplicated) { run_case({Routing::same_rank, 8, 8, 64, 200, 5}); }
TEST(MoeExchange, RepeatedIdsTop8) { run_case({Routing::random_repeats, 4, 8, 128, 150, 1}); }
TEST(MoeExchange, OneToken) { run_case({Routing::random, 2, 2, 8, 1, 0}); }
TEST(MoeExchange, DeepSeekRowWidth) { run_case({Routing::random, 32, 8, 7168, 64, 3}); }

// 200 calls enqueued back to back (no host synchronization between them), routing, T and inputs
// changing every call; each call's grouped rows, counts, offsets and metadata are copied out in
// stream order before the next dispatch overwrites them, then every call is checked.
TEST(MoeExchange, BackToBack200) {
  const int W = comm().world(), kCalls = 200, L = 8, k = 4, H = 128, maxT = 300;
  const Geometry g{W, L * W};
  ExchangeConfig cf;
  cf.experts = g.experts, cf.hidden = H, cf.topk = k, cf.max_tokens = maxT, cf.capacity = W * maxT * k;
  MoeExchange ex(comm(), cf);
  cudaStream_t s = stream();
  DevFree mem;
  struct Call {
    std::vector<RankInput> in;
    std::unique_ptr<Reference> ref;
    bf16 *x, *y, *rows, *out;
    int *idx, *counts, *offsets;
    float* w;
    RowMeta* meta;
  };
  std::vector<Call> calls(kCalls);
  const uint64_t seed = wt::job_seed();
  const Routing kinds[] = {Routing::balanced,   Routing::random,    Routing::dirichlet,     Routing::empty_experts,
                           Routing::all_to_one, Routing::same_rank, Routing::random_repeats};
  const int me = comm().rank();
  WEAVE_CUDA_CHECK(cudaMemset(ex.expert_input(), 0xff, static_cast<size_t>(cf.capacity) * H * sizeof(bf16)));
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  for (int c = 0; c < kCalls; ++c) {
    Call& call = calls[c];
    const uint64_t cs = check::derive(seed, 100, c);
    std::mt19937_64 rng(cs);
    const Routing kind = kinds[c % 7];
    for (int r = 0; r < W; ++r) {
      const int T = c % 23 == 5 ? 0 : static_cast<int>(rng() % (maxT + 1));
      call.in.push_back(make_input(cs, kind, g, T, k, H, r));
    }
    call.ref = std::make_unique<Reference>(call.in, g, k, H, cs);
    const int T = call.in[me].T, R = call.ref->rows(me);
    call.x = mem.add<bf16>(static_cast<size_t>(T) * H);
    call.idx = mem.add<int>(static_cast<size_t>(T) * k);
    call.w = mem.add<float>(static_cast<size_t>(T) * k);
    call.y = mem.add<bf16>(static_cast<size_t>(R) * H);
    call.out = mem.add<bf16>(static_cast<size_t>(T) * H);
    call.rows = mem.add<bf16>(static_cast<size_t>(R) * H);
    call.counts = mem.add<int>(L);
    call.offsets = mem.add<int>(L + 1);
    call.meta = mem.add<RowMeta>(R);
    if (T) {
      wt::to_device(call.x, call.in[me].x);
      wt::to_device(call.idx, call.in[me].idx);
      wt::to_device(call.w, call.in[me].w);
      WEAVE_CUDA_CHECK(cudaMemset(call.out, 0xff, static_cast<size_t>(T) * H * sizeof(bf16)));
    }
    if (R) wt::to_device(call.y, call.ref->y[me]);
  }
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  // The calls, back to back.
  for (int c = 0; c < kCalls; ++c) {
    Call& call = calls[c];
    const int T = call.in[me].T, R = call.ref->rows(me);
    const Dispatched d = ex.dispatch(call.x, call.idx, T, s);
    if (R) {
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(call.rows, d.rows, static_cast<size_t>(R) * H * sizeof(bf16),
                                       cudaMemcpyDeviceToDevice, s));
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(call.meta, d.meta, static_cast<size_t>(R) * sizeof(RowMeta),
                                       cudaMemcpyDeviceToDevice, s));
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(ex.expert_output(), call.y, static_cast<size_t>(R) * H * sizeof(bf16),
                                       cudaMemcpyDeviceToDevice, s));
    }
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(call.counts, d.counts, L * sizeof(int), cudaMemcpyDeviceToDevice, s));
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(call.offsets, d.offsets, (L + 1) * sizeof(int), cudaMemcpyDeviceToDevice, s));
    ex.combine(ex.expert_output(), call.w, call.out, T, s);
  }
  ex.check(s);
  comm().barrier();
  for (int c = 0; c < kCalls; ++c) {
    const Call& call = calls[c];
    const int T = call.in[me].T, R = call.ref->rows(me);
    Snapshot snap;
    snap.rows = wt::to_host(call.rows, static_cast<size_t>(R) * H);
    snap.meta = wt::to_host(call.meta, R);
    snap.counts = wt::to_host(call.counts, L);
    snap.offsets = wt::to_host(call.offsets, L + 1);
    snap.out = wt::to_host(call.out, static_cast<size_t>(T) * H);
    verify(*call.ref, call.in, snap, false, "call " + std::to_string(c) + " (" + name(kinds[c % 7]) + ")");
    if (HasFatalFailure() || HasNonfatalFailure()) break;
  }
}

// Dispatch and combine captured in one CUDA graph after an eager call, then replayed with fresh
// routing, tokens, weights and expert outputs copied into the captured buffers (T is the graph's,
// fixed per rank), every replay's rows, metadata, counts, offsets and outputs checked on freshly
// poisoned copies, with eager calls between and after (layer_check.hpp's captured_replays).
TEST(MoeExchange, CapturedReplays) {
  const int W = comm().world(), me = comm().rank(), L = 8, k = 4, H = 136, kReplays = 24;
  const Geometry g{W, L * W};
  std::vector<int> Ts(W);
  for (int r = 0; r < W; ++r) Ts[r] = r == 1 ? 0 : 150 + 37 * r;  // rank 1 sends nothing, still receives
  const int T = Ts[me], maxT = *std::max_element(Ts.begin(), Ts.end());
  ExchangeConfig cf;
  cf.experts = g.experts, cf.hidden = H, cf.topk = k, cf.max_tokens = maxT, cf.capacity = W * maxT * k;
  MoeExchange ex(comm(), cf);
  cudaStream_t s = stream();
  DevFree mem;
  const size_t cap = static_cast<size_t>(cf.capacity);
  DeviceInput io(T, H, k, mem);
  bf16* ybuf = mem.add<bf16>(cap * H);  // the call's expert outputs, uploaded before it
  bf16* rows = mem.add<bf16>(cap * H);  // copies of what the call left, made in stream order
  RowMeta* meta = mem.add<RowMeta>(cap);
  int* counts = mem.add<int>(L);
  int* offsets = mem.add<int>(L + 1);
  const uint64_t seed = wt::job_seed();
  const Routing kinds[] = {Routing::balanced,   Routing::random,    Routing::dirichlet,     Routing::empty_experts,
                           Routing::all_to_one, Routing::same_rank, Routing::random_repeats};
  // Call c's inputs on every rank and its reference; this rank's uploaded, its outputs poisoned.
  auto prepare = [&](int c) {
    const uint64_t cs = check::derive(seed, 300, c);
    std::vector<RankInput> in;
    for (int r = 0; r < W; ++r) in.push_back(make_input(cs, kinds[c % 7], g, Ts[r], k, H, r));
    auto ref = std::make_unique<Reference>(in, g, k, H, cs);
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    io.load(in[me]);
    if (ref->rows(me)) wt::to_device(ybuf, ref->y[me]);
    WEAVE_CUDA_CHECK(cudaMemset(rows, 0xff, cap * H * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMemset(meta, 0xff, cap * sizeof(RowMeta)));
    WEAVE_CUDA_CHECK(cudaMemset(counts, 0xff, L * sizeof(int)));
    WEAVE_CUDA_CHECK(cudaMemset(offsets, 0xff, (L + 1) * sizeof(int)));
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    comm().barrier();  // every rank's previous call is over and its inputs are in place
    return std::make_pair(std::move(in), std::move(ref));
  };
  auto enqueue = [&] {
    const Dispatched d = ex.dispatch(io.x, io.idx, T, s);
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(rows, d.rows, cap * H * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(meta, d.meta, cap * sizeof(RowMeta), cudaMemcpyDeviceToDevice, s));
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(counts, d.counts, L * sizeof(int), cudaMemcpyDeviceToDevice, s));
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(offsets, d.offsets, (L + 1) * sizeof(int), cudaMemcpyDeviceToDevice, s));
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(ex.expert_output(), ybuf, cap * H * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
    ex.combine(ex.expert_output(), io.w, io.out, T, s);
  };
  auto check_call = [&](const auto& call, const std::string& what) {
    ex.check(s);
    Snapshot snap;
    snap.rows = wt::to_host(rows, cap * H);
    snap.meta = wt::to_host(meta, cap);
    snap.counts = wt::to_host(counts, L);
    snap.offsets = wt::to_host(offsets, L + 1);
    snap.out = wt::to_host(io.out, static_cast<size_t>(T) * H);
    verify(*call.second, call.first, snap, false, what);
  };
  test::captured_replays(s, kReplays, prepare, enqueue, check_call,
                         [&](int c) { return std::string(name(kinds[c % 7])); });
}

namespace {

// A call that every rank must reject alike: check() throws `want` on every rank, counts are zero,
// combine's output is NaN (it was zero before), and a good call on the same exchange right after
// is correct.
void expect_failed_call(MoeExchange& ex, const std::vector<RankInput>& in, const std::string& want,
                        const CaseSpec& good) {
  const int me = comm().rank(), T = in[me].T, H = ex.config().hidden, k = ex.config().topk;
  cudaStream_t s = stream();
  DevFree mem;
  const DeviceInput in_d(in[me], H, k, mem);
  bf16* out = in_d.out;
  WEAVE_CUDA_CHECK(cudaMemset(out, 0, static_cast<size_t>(T) * H * sizeof(bf16)));  // zero: NaN must be written
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  const Dispatched d = ex.dispatch(in_d.x, in_d.idx, T, s);
  ex.combine(ex.expert_output(), in_d.w, out, T, s);
  std::string msg;
  try {
    ex.check(s);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg, want) << "rank " << me;
  const std::vector<int> counts = wt::to_host(d.counts, d.local_experts);
  EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](int c) { return c == 0; })) << "counts of a failed call";
  const std::vector<bf16> o = wt::to_host(out, static_cast<size_t>(T) * H);
  long long finite = 0;
  for (bf16 v : o) finite += std::isfinite(wt::to_f(v)) ? 1 : 0;
  EXPECT_EQ(finite, 0) << "a failed call's combine must write NaN everywhere";
  ex.check(s);  // reported once: the error is cleared
  comm().barrier();
  // The exchange is still usable.
  const int W = comm().world();
  const Geometry g{W, good.L * W};
  const uint64_t seed = wt::job_seed();
  const std::vector<RankInput> gin = inputs_of(good, g, seed);
  const Reference ref(gin, g, good.k, good.H, seed);
  DevFree mem2;
  const Snapshot snap = run_once(ex, gin, ref, mem2);
  verify(ref, gin, snap, true, "the call after a failed one");
}

}  // namespace

TEST(MoeExchange, OutOfRangeExpertIsAnErrorOnEveryRank) {
  const int W = comm().world(), bad_rank = W - 1;
  const CaseSpec c{Routing::random, 4, 2, 64, 50, 0};
  const Geometry g{W, c.L * W};
  MoeExchange ex(comm(), config_of(c, W));
  const uint64_t seed = wt::job_seed();
  std::vector<RankInput> in = inputs_of(c, g, seed);
  in[bad_rank].idx[7 * c.k + 1] = g.experts + 5;  // token 7, slot 1
  in[bad_rank].idx[20 * c.k] = -1;                // a later one: the first is named
  const std::string want = "moe dispatch: expert id " + std::to_string(g.experts + 5) + " on rank " +
                           std::to_string(bad_rank) + " (token 7, slot 1) is outside 0..E-1; nothing was dispatched";
  expect_failed_call(ex, in, want, c);
}

TEST(MoeExchange, CapacityOverflowIsAnErrorOnEveryRank) {
  const int W = comm().world();
  // All tokens on expert 0: rank 0 receives W * T rows there, past a balanced capacity.
  CaseSpec c{Routing::all_to_one, 4, 2, 64, 200, 0};
  const Geometry g{W, c.L * W};
  c.capacity = W * c.T0 - 1;  // one row short of expert 0's
  MoeExchange ex(comm(), config_of(c, W));
  const uint64_t seed = wt::job_seed();
  const std::vector<RankInput> in = inputs_of(c, g, seed);
  std::vector<int> counts(static_cast<size_t>(W) * g.experts);
  for (int s = 0; s < W; ++s) count_rows(in[s].idx.data(), in[s].T, c.k, g, counts.data() + s * g.experts);
  const Overflow o = check_capacity(counts, g, c.capacity);
  ASSERT_TRUE(o.any()) << "the test's routing must overflow";
  ASSERT_EQ(o.expert, 0);
  CaseSpec good = c;
  good.routing = Routing::balanced;  // T0 k rows per rank: fits the same capacity
  good.T0 = c.T0 / 2;
  expect_failed_call(ex, in, o.message() + "; nothing was dispatched", good);
}
