// The fused dispatch_gemm (kernels/moe/dispatch_gemm.hpp) on W ranks (weave-run; no NCCL, so
// WEAVE_SHARE_GPUS=1 runs both ranks on one GPU):
// - the grouped rows it leaves against every rank's inputs, which each rank regenerates (row r holds
//   the token its metadata names, and that token's slot names this rank's expert of r's block);
// - bit for bit against the non-fused path on the same inputs and exchange (dispatch, then
//   grouped_gemm): counts, offsets, grouped rows, metadata and the GEMM's output; the GEMM itself is
//   checked against cuBLASLt in test_grouped_gemm_gpu, and the fused layer (which calls
//   dispatch_gemm) against the float64 layer reference in test_moe_layer_gpu;
// - outputs poisoned first (grouped buffer, metadata, Y), Y rows past the rank's rows still poison.
// Routings: balanced, Dirichlet-skewed, every token's first slot on expert 0, all of a token's
// experts on one rank (duplicated rows whose primary is in a later or earlier expert), repeated ids,
// empty experts; k = 1, 2, 8; T different per rank, not a multiple of 128, 0 on one rank, 1; H and
// N multiples of 8 but not of 64. Then 200 fused calls back to back, each followed by the non-fused
// path, routing and T changing every call, no host synchronisation, each pair compared; a bad expert
// id and a capacity overflow failing the call on every rank (nothing computed, the exchange's error
// everywhere) followed by a correct call; a short W on one rank refused on every rank.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../primitives/common.hpp"
#include "check/error_of.hpp"
#include "check/seed.hpp"
#include "common.hpp"
#include "layer_check.hpp"
#include "moe/dispatch_gemm.hpp"
#include "moe/exchange.hpp"
#include "moe/grouped_gemm.hpp"
#include "moe/layout.hpp"
#include "routing.hpp"

namespace {

using namespace weave;
using namespace weave::moe;
using namespace weave::moe::test;
using check::error_of;

// What one path left on this rank.
struct Result {
  std::vector<int> counts, offsets;
  std::vector<bf16> rows, y;
  std::vector<RowMeta> meta;
};

Result read_back(const Layer& layer, const Dispatched& d, const bf16* Y, int N) {
  const ExchangeConfig& cf = layer.ex->config();
  Result r;
  r.counts = wt::to_host(d.counts, d.local_experts);
  r.offsets = wt::to_host(d.offsets, d.local_experts + 1);
  const size_t total = static_cast<size_t>(r.offsets.back());
  r.rows = wt::to_host(d.rows, total * cf.hidden);
  r.meta = wt::to_host(d.meta, total);
  r.y = wt::to_host(Y, static_cast<size_t>(cf.capacity) * N);
  return r;
}

void expect_same(const Result& fused, const Result& plain, int N, const std::string& what) {
  ASSERT_EQ(fused.counts, plain.counts) << what << ": counts";
  ASSERT_EQ(fused.offsets, plain.offsets) << what << ": offsets";
  const size_t total = static_cast<size_t>(plain.offsets.back());
  size_t rows = 0, meta = 0, y = 0, tail = 0;
  for (size_t i = 0; i < plain.rows.size(); ++i) rows += wt::bits(fused.rows[i]) != wt::bits(plain.rows[i]);
  for (size_t i = 0; i < total; ++i) {
    const RowMeta &a = fused.meta[i], &b = plain.meta[i];
    meta += a.src != b.src || a.token != b.token || a.primary != b.primary || a.slot != b.slot;
  }
  for (size_t i = 0; i < total * N; ++i) y += wt::bits(fused.y[i]) != wt::bits(plain.y[i]);
  for (size_t i = total * N; i < fused.y.size(); ++i) tail += wt::bits(fused.y[i]) != 0xffffu;
  EXPECT_EQ(rows, 0u) << what << ": grouped elements differ from the non-fused dispatch's";
  EXPECT_EQ(meta, 0u) << what << ": rows' metadata differ";
  EXPECT_EQ(y, 0u) << what << ": GEMM outputs differ from dispatch + grouped_gemm's (of " << total * N << ")";
  EXPECT_EQ(tail, 0u) << what << ": Y elements past the " << total << " received rows were written";
}

// Every received row holds the token its metadata names, whose slot names this rank's expert of the
// row's block, and the metadata's primary row holds the same token.
void expect_rows_hold_tokens(const Result& r, const std::vector<RankInput>& in, const Geometry& g, int k, int H,
                             const std::string& what) {
  const int me = comm().rank();
  int bad = 0;
  for (int l = 0; l < g.local_experts(); ++l)
    for (int row = r.offsets[l]; row < r.offsets[l + 1]; ++row) {
      const RowMeta& m = r.meta[row];
      bool ok = m.src >= 0 && m.src < g.world && m.token >= 0 && m.token < in[m.src].T && m.slot >= 0 && m.slot < k &&
                in[m.src].idx[static_cast<size_t>(m.token) * k + m.slot] == g.expert(me, l);
      for (int c = 0; ok && c < H; ++c)
        ok = wt::bits(r.rows[static_cast<size_t>(row) * H + c]) ==
             wt::bits(in[m.src].x[static_cast<size_t>(m.token) * H + c]);
      if (!ok && bad++ < 3)
        ADD_FAILURE() << what << ": row " << row << " (expert " << l << ", src " << m.src << " token " << m.token
                      << " slot " << m.slot << ") does not hold its token";
    }
  EXPECT_EQ(bad, 0) << what;
}

void run_case(const LayerCase& spec) {
  const CaseInputs cs(spec);
  const int me = comm().rank(), L = spec.L, T = cs.in[me].T, H = spec.H, N = 2 * spec.F, k = spec.k;
  Layer layer(cs.wts, k, cs.maxT);
  const int R = layer.ex->config().capacity;
  DevFree mem;
  const DeviceInput d(cs.in[me], H, k, mem);
  bf16* Y = layer.sc->up_output();
  bf16* Yplain = mem.add<bf16>(static_cast<size_t>(R) * N);
  const std::string what = std::string(name(spec.routing)) + " L " + std::to_string(L) + " k " + std::to_string(k) +
                           " H " + std::to_string(H) + " N " + std::to_string(N) + " T " + std::to_string(T);
  cudaStream_t s = stream();
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();  // nobody sends into a buffer still being poisoned
  const Dispatched df = dispatch_gemm(*layer.ex, d.x, d.idx, T, layer.up, N, Y, s);
  layer.ex->check(s);
  check_status(s);
  const Result fused = read_back(layer, df, Y, N);
  comm().barrier();  // every rank read its rows before the next call overwrites them
  layer.poison();
  WEAVE_CUDA_CHECK(cudaMemset(Yplain, 0xff, static_cast<size_t>(R) * N * sizeof(bf16)));
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  const Dispatched dp = layer.ex->dispatch(d.x, d.idx, T, s);
  grouped_gemm(dp.rows, layer.up, Yplain, dp.counts, L, N, H, R, s, kUnsplit);
  layer.ex->check(s);
  check_status(s);
  const Result plain = read_back(layer, dp, Yplain, N);
  expect_rows_hold_tokens(fused, cs.in, cs.g, k, H, what);
  expect_same(fused, plain, N, what);
  comm().barrier();
}

}  // namespace

TEST(DispatchGemm, BalancedTop2) { run_case({Routing::balanced, 4, 2, 200, 136, 333, 17}); }
TEST(DispatchGemm, DirichletTop8) { run_case({Routing::dirichlet, 8, 8, 264, 72, 257, -31}); }
TEST(DispatchGemm, AllTokensToOneExpert) { run_case({Routing::all_to_one, 4, 2, 776, 264, 300, -37}); }
TEST(DispatchGemm, Top1WithAnEmptyRank) { run_case({Routing::balanced, 4, 1, 200, 136, 129, 0, 1}); }
TEST(DispatchGemm, Top8ExpertsOnOneRank) { run_case({Routing::same_rank, 8, 8, 136, 200, 100, 9}); }
TEST(DispatchGemm, Top8RepeatedIds) { run_case({Routing::random_repeats, 4, 8, 264, 72, 77, 50}); }
TEST(DispatchGemm, EmptyExperts) { run_case({Routing::empty_experts, 8, 2, 1032, 40, 150, 3}); }
TEST(DispatchGemm, SingleToken) { run_case({Routing::random_repeats, 2, 2, 8, 8, 1, 0}); }

// Fused and non-fused calls alternating on one exchange, back to back (no host synchronisation), the
// routing, T, tokens and the fused kernel's compute block count (all SMs, 5, 1) changing every call;
// each fused call's GEMM output compared with the non-fused pair that follows it on the same inputs
// (200 fused calls; every call writes its own Y buffers, poisoned before the burst).
TEST(DispatchGemm, BackToBack200) {
  const int W = comm().world(), me = comm().rank(), kCalls = 200, L = 4, k = 4, H = 136, F = 104, N = 2 * F,
            maxT = 260;
  const Geometry g{W, L * W};
  const uint64_t seed = wt::job_seed();
  const Weights wts(seed, g.experts, H, F);
  Layer layer(wts, k, maxT);
  const int R = layer.ex->config().capacity;
  const Routing kinds[] = {Routing::balanced, Routing::dirichlet, Routing::all_to_one, Routing::same_rank,
                           Routing::random_repeats, Routing::empty_experts};
  DevFree mem;
  std::vector<RankInput> mine;
  std::vector<std::unique_ptr<DeviceInput>> dev;
  std::vector<bf16*> yf, yp;
  int* totals = mem.add<int>(2 * kCalls);
  for (int c = 0; c < kCalls; ++c) {
    const uint64_t cs = check::derive(seed, 300, c);
    std::mt19937_64 rng(cs);
    std::vector<int> T(W);
    for (int r = 0; r < W; ++r) T[r] = c % 7 == 3 && r == c % W ? 0 : static_cast<int>(rng() % (maxT + 1));
    mine.push_back(make_input(cs, kinds[c % 6], g, T[me], k, H, me));
    dev.push_back(std::make_unique<DeviceInput>(mine.back(), H, k, mem));
    yf.push_back(mem.add<bf16>(static_cast<size_t>(R) * N));
    yp.push_back(mem.add<bf16>(static_cast<size_t>(R) * N));
    WEAVE_CUDA_CHECK(cudaMemset(yf.back(), 0xff, static_cast<size_t>(R) * N * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMemset(yp.back(), 0xff, static_cast<size_t>(R) * N * sizeof(bf16)));
  }
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  cudaStream_t s = stream();
  for (int c = 0; c < kCalls; ++c) {
    const DeviceInput& d = *dev[c];
    GroupedGemmOptions o;  // the aux warp count changes between calls: the counters' totals follow
    o.lcsc.max_compute_blocks = c % 3 == 1 ? 5 : c % 3 == 2 ? 1 : 0;
    const Dispatched df = dispatch_gemm(*layer.ex, d.x, d.idx, mine[c].T, layer.up, N, yf[c], s, o);
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(totals + 2 * c, df.offsets + L, sizeof(int), cudaMemcpyDeviceToDevice, s));
    const Dispatched dp = layer.ex->dispatch(d.x, d.idx, mine[c].T, s);
    grouped_gemm(dp.rows, layer.up, yp[c], dp.counts, L, N, H, R, s, kUnsplit);
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(totals + 2 * c + 1, dp.offsets + L, sizeof(int), cudaMemcpyDeviceToDevice, s));
  }
  layer.ex->check(s);
  check_status(s);
  const std::vector<int> tot = wt::to_host(totals, 2 * kCalls);
  for (int c = 0; c < kCalls; ++c) {
    const std::string what = "call " + std::to_string(c) + " (" + name(kinds[c % 6]) + ", T " +
                             std::to_string(mine[c].T) + ")";
    ASSERT_EQ(tot[2 * c], tot[2 * c + 1]) << what << ": received rows";
    const std::vector<bf16> a = wt::to_host(yf[c], static_cast<size_t>(R) * N), b = wt::to_host(yp[c], a.size());
    size_t diff = 0, tail = 0;
    for (size_t i = 0; i < static_cast<size_t>(tot[2 * c]) * N; ++i) diff += wt::bits(a[i]) != wt::bits(b[i]);
    for (size_t i = static_cast<size_t>(tot[2 * c]) * N; i < a.size(); ++i) tail += wt::bits(a[i]) != 0xffffu;
    EXPECT_EQ(diff, 0u) << what << ": fused GEMM output differs from the non-fused one";
    EXPECT_EQ(tail, 0u) << what << ": rows past the received ones written";
  }
  comm().barrier();
}

// A bad expert id on one rank, then rows past the capacity: each fails on every rank alike (the
// exchange's error everywhere, Y untouched), and the next call is correct.
TEST(DispatchGemm, FailedCallsThenACorrectOne) {
  const LayerCase spec{Routing::all_to_one, 4, 2, 64, 72, 200, 0};
  const CaseInputs cs(spec);
  const int W = comm().world(), me = comm().rank(), T = cs.in[me].T, H = spec.H, N = 2 * spec.F, k = spec.k, L = 4;
  Layer layer(cs.wts, k, cs.maxT, W * spec.T0 - 1);  // one row short of expert 0's W T rows
  const int R = layer.ex->config().capacity;
  DevFree mem;
  const DeviceInput d(cs.in[me], H, k, mem);
  cudaStream_t s = stream();
  bf16* Y = layer.sc->up_output();
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  auto untouched = [&](const std::string& what) {
    const std::vector<bf16> y = wt::to_host(Y, static_cast<size_t>(R) * N);
    size_t written = 0;
    for (bf16 v : y) written += wt::bits(v) != 0xffffu;
    EXPECT_EQ(written, 0u) << what << ": a failed call wrote Y";
  };
  dispatch_gemm(*layer.ex, d.x, d.idx, T, layer.up, N, Y, s);
  std::string msg = error_of([&] { layer.ex->check(s); });
  EXPECT_NE(msg.find("receive capacity"), std::string::npos) << "rank " << me << ": " << msg;
  untouched("capacity overflow");
  // An out-of-range id on the last rank (its first token's slot 1).
  RankInput bad = make_input(cs.seed, Routing::balanced, cs.g, 50, k, H, me);
  if (me == W - 1) bad.idx[1] = cs.g.experts + 3;
  const DeviceInput db(bad, H, k, mem);
  comm().barrier();
  dispatch_gemm(*layer.ex, db.x, db.idx, bad.T, layer.up, N, Y, s);
  msg = error_of([&] { layer.ex->check(s); });
  EXPECT_NE(msg.find("expert id " + std::to_string(cs.g.experts + 3)), std::string::npos) << "rank " << me << ": " << msg;
  untouched("bad expert id");
  comm().barrier();
  // A routing that fits, checked against the non-fused path.
  const RankInput good = make_input(cs.seed, Routing::balanced, cs.g, spec.T0 / 2, k, H, me);
  const DeviceInput dg(good, H, k, mem);
  bf16* Yplain = mem.add<bf16>(static_cast<size_t>(R) * N);
  const Dispatched df = dispatch_gemm(*layer.ex, dg.x, dg.idx, good.T, layer.up, N, Y, s);
  layer.ex->check(s);
  const Result fused = read_back(layer, df, Y, N);
  comm().barrier();
  WEAVE_CUDA_CHECK(cudaMemset(Yplain, 0xff, static_cast<size_t>(R) * N * sizeof(bf16)));
  const Dispatched dp = layer.ex->dispatch(dg.x, dg.idx, good.T, s);
  grouped_gemm(dp.rows, layer.up, Yplain, dp.counts, L, N, H, R, s, kUnsplit);
  layer.ex->check(s);
  check_status(s);
  expect_same(fused, read_back(layer, dp, Yplain, N), N, "the call after failed ones");
  comm().barrier();
}

// A short W on one rank: every rank refuses the call before launching anything; then a correct call.
TEST(DispatchGemm, ArgumentErrorsOnEveryRank) {
  const LayerCase spec{Routing::balanced, 2, 2, 128, 64, 50, 0};
  const CaseInputs cs(spec);
  const int W = comm().world(), me = comm().rank(), T = cs.in[me].T, H = spec.H, N = 2 * spec.F, k = spec.k;
  Layer layer(cs.wts, k, cs.maxT);
  DevFree mem;
  const DeviceInput d(cs.in[me], H, k, mem);
  bf16* short_w = mem.add<bf16>(1024);
  const bf16* w = me == W - 1 ? short_w : layer.up;
  const std::string want = me == W - 1 ? "W" : "rejected its arguments";
  cudaStream_t s = stream();
  comm().barrier();
  std::string msg = error_of([&] { dispatch_gemm(*layer.ex, d.x, d.idx, T, w, N, layer.sc->up_output(), s); });
  EXPECT_NE(msg.find(want), std::string::npos) << "rank " << me << ": " << msg;
  msg = error_of([&] {
    GroupedGemmOptions o;
    o.lcsc.num_comm_sms = 4;
    dispatch_gemm(*layer.ex, d.x, d.idx, T, layer.up, N, layer.sc->up_output(), s, o);
  });
  EXPECT_NE(msg.find("num_comm_sms"), std::string::npos) << "rank " << me << ": " << msg;
  // One rank alone with a num_comm_sms that leaves no compute SM (the launch plan itself would
  // refuse it): every rank refuses, none waits for it.
  msg = error_of([&] {
    GroupedGemmOptions o;
    if (me == W - 1) o.lcsc.num_comm_sms = comm().sm_count();
    dispatch_gemm(*layer.ex, d.x, d.idx, T, layer.up, N, layer.sc->up_output(), s, o);
  });
  EXPECT_NE(msg.find(me == W - 1 ? "num_comm_sms" : "rejected its arguments"), std::string::npos)
      << "rank " << me << ": " << msg;
  dispatch_gemm(*layer.ex, d.x, d.idx, T, layer.up, N, layer.sc->up_output(), s);
  layer.ex->check(s);
  check_status(s);
  comm().barrier();
}
