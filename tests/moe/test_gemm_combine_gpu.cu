// The fused gemm_combine (kernels/moe/gemm_combine.hpp) on W ranks (weave-run; no NCCL, so
// WEAVE_SHARE_GPUS=1 runs both ranks on one GPU), against float64 references that every rank
// computes on the CPU for its own tokens (check/moe_ref.hpp), and bit for bit against the non-fused
// path on the same rows (the fused path rounds the same bf16 expert rows and sums them with the
// same code, so any difference is a wrong, missing or stale row). The fused layer forward
// (moe_layer_forward_fused, layer.hpp) is checked with the non-fused one in test_moe_layer_gpu
// (every case there runs both paths); here only where gemm_combine's own errors reach it.
//
// gemm_combine alone: after a real dispatch, a test kernel fills every grouped row of the SwiGLU
// buffer with h(home rank, token, slot, f), exact bf16 values that the home rank regenerates; the
// reference is out[t] = sum_j w[t, j] * W_down[e_j] h(t, j) under moe_ref.hpp's bound for exact
// inputs (moe_down_ref with zero input error). The same rows then go through grouped_gemm + moe_combine
// and the two outputs must be identical.
//
// Poisoned (NaN) before the calls: outputs, the landing buffers, the SwiGLU buffer, the exchange's
// buffers; landing rows past a rank's T k must still be poison afterwards. Routings: balanced,
// Dirichlet-skewed, every token's first slot on expert 0, all of a token's experts on one rank
// (duplicated rows), repeated ids; k = 1, 2, 4, 8; T different per rank and not a multiple of 128,
// T = 0 on one rank; H and F multiples of 8 but not of 64 (H = 1032: a column tile of 8 columns).
// Then 200 back-to-back gemm_combine calls with changing routing, T and inputs (no host
// synchronisation in between, every call's output and non-fused output freshly poisoned), each
// checked; argument errors on every rank (a short W_down on one
// rank, for the fused layer and for gemm_combine; a second gemm_combine after one dispatch), and a
// failed dispatch (capacity) giving NaN and the exchange's error on every rank, followed by a
// correct call.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../primitives/common.hpp"
#include "check/error_of.hpp"
#include "check/moe_ref.hpp"
#include "check/seed.hpp"
#include "common.hpp"
#include "layer_check.hpp"
#include "moe/exchange.hpp"
#include "moe/gemm_combine.hpp"
#include "moe/grouped_gemm.hpp"
#include "moe/layer.hpp"
#include "moe/layout.hpp"
#include "routing.hpp"

namespace {

using namespace weave;
using namespace weave::moe;
using namespace weave::moe::test;
using check::error_of;

// The SwiGLU row of (home rank s, token t, slot j), column f: a 7-bit integer / 32, exact in bf16,
// |h| <= 2 (y ~ 1 with W_down ~ sqrt(3 / F)).
__host__ __device__ inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__host__ __device__ inline float h_value(uint64_t seed, int s, int t, int j, int f) {
  const uint64_t key = static_cast<uint64_t>(s) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(t) * 0xD1B54A32D192ED03ull ^
                       static_cast<uint64_t>(j) * 0x8CB92BA72F3D8DD7ull ^ static_cast<uint64_t>(f);
  const uint64_t z = mix(seed ^ mix(key));
  return static_cast<float>(static_cast<int>(z >> 57) - 64) / 32.f;
}

// Every grouped row r < rows (the dispatch's device total) gets h of the (rank, token, slot) its
// metadata names: the rows as the up GEMM and SwiGLU would leave them, with values the home rank knows.
__global__ void fill_h(bf16* h, const RowMeta* meta, const int* rows, int F, uint64_t seed) {
  const long long n = static_cast<long long>(*rows) * F;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / F), f = static_cast<int>(i % F);
    const int4 m = __ldcg(reinterpret_cast<const int4*>(meta + r));
    h[i] = __float2bfloat16_rn(h_value(seed, m.x, m.y, m.w, f));
  }
}

void fill_rows(const Layer& layer, const Dispatched& d, int F, uint64_t seed, cudaStream_t s) {
  fill_h<<<128, 256, 0, s>>>(layer.sc->swiglu_output(), d.meta, d.offsets + d.local_experts, F, seed);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

// This rank's gemm_combine output against out[t] = sum_j w[t, j] W_down[e_j] h(me, t, j).
void verify_down(const Weights& wts, const RankInput& mine, int k, uint64_t hseed, const std::vector<bf16>& out,
                 const std::string& what) {
  const int me = comm().rank(), H = wts.H, F = wts.F;
  BoundCheck chk;
  std::vector<double> h(F);
  const std::vector<double> exact(F, 0.0);
  for (int t = 0; t < mine.T; ++t) {
    check::MoeTokenRef ref(H);
    for (int j = 0; j < k; ++j) {
      const size_t i = static_cast<size_t>(t) * k + j;
      for (int f = 0; f < F; ++f) h[f] = h_value(hseed, me, t, j, f);
      const bf16* wd = wts.down_of(mine.idx[i]);
      const auto down = [&](int c, int f) { return double(wt::to_f(wd[static_cast<size_t>(c) * F + f])); };
      ref.add(mine.w[i], check::moe_down_ref(h, exact, H, F, down));
    }
    chk.add(ref, out.data() + static_cast<size_t>(t) * H, t);
  }
  chk.expect(what);
}

// Every grouped row this rank computed, as the non-fused GEMM wrote it into the expert output
// buffer, against the landing row its metadata names on its home rank (read through the peer
// mapping): bit-identical, the same GEMM tile. Names the first rows that differ (row, tile,
// what landed) so that a push to the wrong place or of the wrong tile shows where it went wrong.
void expect_rows_landed(const Layer& layer, const Dispatched& dd, const std::string& what) {
  const ExchangeConfig& cf = layer.ex->config();
  const int H = cf.hidden, k = cf.topk;
  int total = 0;
  WEAVE_CUDA_CHECK(cudaMemcpy(&total, dd.offsets + dd.local_experts, sizeof total, cudaMemcpyDeviceToHost));
  const std::vector<RowMeta> meta = wt::to_host(dd.meta, static_cast<size_t>(total));
  const std::vector<bf16> y = wt::to_host(layer.ex->expert_output(), static_cast<size_t>(total) * H);
  const runtime::PeerPtrs land = comm().peers(layer.gc->landing(), static_cast<size_t>(cf.max_tokens) * k * H * 2);
  std::vector<bf16> row(H);
  int bad = 0, nan_rows = 0;
  for (int r = 0; r < total; ++r) {
    const RowMeta& m = meta[r];
    const bf16* src = static_cast<const bf16*>(land[m.src]) + (static_cast<size_t>(m.token) * k + m.slot) * H;
    WEAVE_CUDA_CHECK(cudaMemcpy(row.data(), src, H * sizeof(bf16), cudaMemcpyDeviceToHost));
    int diff = 0, nan = 0;
    for (int c = 0; c < H; ++c) {
      diff += wt::bits(row[c]) != wt::bits(y[static_cast<size_t>(r) * H + c]);
      nan += wt::bits(row[c]) == 0xffffu;
    }
    nan_rows += nan == H;
    if (diff && bad++ < 4)
      ADD_FAILURE() << what << ": grouped row " << r << " (tile row " << r / 128 << ", src " << m.src << " token "
                    << m.token << " slot " << m.slot << "): " << diff << " of " << H << " columns differ from the GEMM's row ("
                    << nan << " never written)";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << total << " grouped rows did not land as computed (" << nan_rows
                    << " not written at all)";
}

std::string label(const LayerCase& c, const Geometry& g, int T) {
  return std::string(name(c.routing)) + " E " + std::to_string(g.experts) + " k " + std::to_string(c.k) + " H " +
         std::to_string(c.H) + " F " + std::to_string(c.F) + " T " + std::to_string(T);
}

// gemm_combine after a dispatch, then grouped_gemm + moe_combine on the same rows.
void run_combine_case(const LayerCase& spec) {
  const CaseInputs cs(spec);
  const int me = comm().rank(), L = spec.L, T = cs.in[me].T, H = spec.H, F = spec.F, k = spec.k;
  Layer layer(cs.wts, k, cs.maxT);
  DevFree mem;
  const DeviceInput d(cs.in[me], H, k, mem);
  bf16* plain = mem.add<bf16>(static_cast<size_t>(T) * H);
  WEAVE_CUDA_CHECK(cudaMemset(plain, 0xff, std::max<size_t>(static_cast<size_t>(T) * H, 1) * sizeof(bf16)));
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();  // nobody pushes into a buffer still being poisoned
  cudaStream_t s = stream();
  const uint64_t hseed = check::derive(cs.seed, 11, 0);
  const Dispatched dd = layer.ex->dispatch(d.x, d.idx, T, s);
  fill_rows(layer, dd, F, hseed, s);
  gemm_combine(*layer.gc, dd, layer.sc->swiglu_output(), layer.down, F, d.w, d.out, T, s);
  grouped_gemm(layer.sc->swiglu_output(), layer.down, layer.ex->expert_output(), dd.counts, L, H, F,
               layer.ex->config().capacity, s, kUnsplit);
  layer.ex->combine(layer.ex->expert_output(), d.w, plain, T, s);
  layer.ex->check(s);
  check_status(s);
  const std::vector<bf16> out = wt::to_host(d.out, static_cast<size_t>(T) * H);
  const std::vector<bf16> ref = wt::to_host(plain, static_cast<size_t>(T) * H);
  const std::string what = "gemm_combine " + label(spec, cs.g, T);
  expect_rows_landed(layer, dd, what);
  expect_landing_tail_poisoned(layer, T, what);
  comm().barrier();
  verify_down(cs.wts, cs.in[me], k, hseed, out, what);
  expect_identical(out, ref, what);
}

}  // namespace

TEST(GemmCombine, BalancedTop2) { run_combine_case({Routing::balanced, 4, 2, 200, 136, 333, 17}); }
TEST(GemmCombine, DirichletTop4) { run_combine_case({Routing::dirichlet, 8, 4, 264, 72, 257, -31}); }
TEST(GemmCombine, AllTokensToOneExpert) { run_combine_case({Routing::all_to_one, 4, 2, 776, 520, 300, -37}); }
TEST(GemmCombine, Top1WithAnEmptyRank) { run_combine_case({Routing::balanced, 4, 1, 200, 136, 129, 0, 1}); }
TEST(GemmCombine, Top8ExpertsOnOneRank) { run_combine_case({Routing::same_rank, 8, 8, 136, 200, 100, 9}); }
TEST(GemmCombine, Top8RepeatedIds) { run_combine_case({Routing::random_repeats, 4, 8, 264, 72, 77, 50}); }
TEST(GemmCombine, WideRowsOneNarrowColumnTile) { run_combine_case({Routing::dirichlet, 4, 4, 1032, 520, 40, 3}); }
TEST(GemmCombine, SingleToken) { run_combine_case({Routing::random_repeats, 2, 2, 8, 8, 1, 0}); }

// 200 gemm_combine calls enqueued back to back on one exchange (no host synchronisation between
// them), routing, T, tokens and rows changing every call, each checked afterwards against the
// reference and the non-fused path (which runs after each, on the same rows); every call writes
// its own outputs, poisoned before the burst.
TEST(GemmCombine, BackToBack200) {
  const int W = comm().world(), me = comm().rank(), kCalls = 200, L = 4, k = 4, H = 136, F = 200, maxT = 260;
  const Geometry g{W, L * W};
  const uint64_t seed = wt::job_seed();
  const Weights wts(seed, g.experts, H, F);
  Layer layer(wts, k, maxT);
  const Routing kinds[] = {Routing::balanced, Routing::dirichlet, Routing::all_to_one, Routing::same_rank,
                           Routing::random_repeats};
  DevFree mem;
  std::vector<RankInput> mine;
  std::vector<std::unique_ptr<DeviceInput>> dev;
  std::vector<bf16*> plain;
  for (int c = 0; c < kCalls; ++c) {
    const uint64_t cs = check::derive(seed, 100, c);
    std::mt19937_64 rng(cs);
    std::vector<int> T(W);
    for (int r = 0; r < W; ++r) T[r] = c % 7 == 3 && r == c % W ? 0 : static_cast<int>(rng() % (maxT + 1));
    mine.push_back(make_input(cs, kinds[c % 5], g, T[me], k, H, me));
    dev.push_back(std::make_unique<DeviceInput>(mine.back(), H, k, mem));
    plain.push_back(mem.add<bf16>(static_cast<size_t>(T[me]) * H));
    WEAVE_CUDA_CHECK(cudaMemset(plain.back(), 0xff, std::max<size_t>(static_cast<size_t>(T[me]) * H, 1) * sizeof(bf16)));
  }
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  cudaStream_t s = stream();
  const int R = layer.ex->config().capacity;
  for (int c = 0; c < kCalls; ++c) {
    const DeviceInput& d = *dev[c];
    const Dispatched dd = layer.ex->dispatch(d.x, d.idx, mine[c].T, s);
    fill_rows(layer, dd, F, check::derive(seed, 200, c), s);
    gemm_combine(*layer.gc, dd, layer.sc->swiglu_output(), layer.down, F, d.w, d.out, mine[c].T, s);
    grouped_gemm(layer.sc->swiglu_output(), layer.down, layer.ex->expert_output(), dd.counts, L, H, F, R, s, kUnsplit);
    layer.ex->combine(layer.ex->expert_output(), d.w, plain[c], mine[c].T, s);
  }
  layer.ex->check(s);
  check_status(s);
  comm().barrier();
  for (int c = 0; c < kCalls; ++c) {
    const size_t n = static_cast<size_t>(mine[c].T) * H;
    const std::vector<bf16> out = wt::to_host(dev[c]->out, n);
    const std::string what = "call " + std::to_string(c) + " (" + name(kinds[c % 5]) + ", T " +
                             std::to_string(mine[c].T) + ")";
    verify_down(wts, mine[c], k, check::derive(seed, 200, c), out, what);
    expect_identical(out, wt::to_host(plain[c], n), what);
  }
}

// A short W_down on one rank: every rank throws before anything is launched, for the fused layer
// (before its dispatch) and for gemm_combine (after a dispatch); a second gemm_combine after one
// dispatch is refused on every rank; then correct calls.
TEST(GemmCombine, ArgumentErrorsOnEveryRank) {
  const LayerCase spec{Routing::balanced, 2, 2, 128, 256, 50, 0};
  const CaseInputs cs(spec);
  const int W = comm().world(), me = comm().rank(), T = cs.in[me].T, H = spec.H, F = spec.F, k = spec.k;
  Layer layer(cs.wts, k, cs.maxT);
  DevFree mem;
  const DeviceInput d(cs.in[me], H, k, mem);
  bf16* short_down = mem.add<bf16>(1024);  // W_down needs L H F = 64 K elements
  bf16* down = me == W - 1 ? short_down : layer.down;
  const std::string want = me == W - 1 ? "W_down" : "rejected its arguments";
  cudaStream_t s = stream();
  comm().barrier();
  std::string msg = error_of([&] {
    moe_layer_forward_fused(*layer.ex, *layer.gc, *layer.sc, d.x, d.idx, d.w, T, layer.up, down, d.out, s);
  });
  EXPECT_NE(msg.find(want), std::string::npos) << "fused layer, rank " << me << ": " << msg;
  const Dispatched dd = layer.ex->dispatch(d.x, d.idx, T, s);
  fill_rows(layer, dd, F, 1, s);
  msg = error_of([&] { gemm_combine(*layer.gc, dd, layer.sc->swiglu_output(), down, F, d.w, d.out, T, s); });
  EXPECT_NE(msg.find(want), std::string::npos) << "gemm_combine, rank " << me << ": " << msg;
  // One rank alone with a num_comm_sms the launch plan itself would refuse: refused everywhere.
  msg = error_of([&] {
    GroupedGemmOptions o;
    if (me == W - 1) o.lcsc.num_comm_sms = -1;
    gemm_combine(*layer.gc, dd, layer.sc->swiglu_output(), layer.down, F, d.w, d.out, T, s, o);
  });
  EXPECT_NE(msg.find(me == W - 1 ? "num_comm_sms" : "rejected its arguments"), std::string::npos)
      << "gemm_combine, rank " << me << ": " << msg;
  // The same dispatch, correct arguments: accepted (the refused call consumed nothing) ...
  gemm_combine(*layer.gc, dd, layer.sc->swiglu_output(), layer.down, F, d.w, d.out, T, s);
  // ... once: a second gemm_combine on it is refused everywhere.
  msg = error_of([&] { gemm_combine(*layer.gc, dd, layer.sc->swiglu_output(), layer.down, F, d.w, d.out, T, s); });
  EXPECT_NE(msg.find("already combined"), std::string::npos) << "rank " << me << ": " << msg;
  // A correct fused layer call afterwards, on poisoned buffers (once no rank's call runs).
  layer.ex->check(s);
  comm().barrier();
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  moe_layer_forward_fused(*layer.ex, *layer.gc, *layer.sc, d.x, d.idx, d.w, T, layer.up, layer.down, d.out, s);
  layer.ex->check(s);
  check_status(s);
  verify_layer(cs.wts, cs.in[me], k, wt::to_host(d.out, static_cast<size_t>(T) * H), "the call after refused ones");
  comm().barrier();
}

// Rows past the capacity: the dispatch fails on every rank, gemm_combine computes nothing and
// writes NaN, the exchange reports the overflow on every rank; the next call is correct.
TEST(GemmCombine, FailedDispatchWritesNaN) {
  const LayerCase spec{Routing::all_to_one, 4, 2, 64, 72, 200, 0};
  const CaseInputs cs(spec);
  const int W = comm().world(), me = comm().rank(), T = cs.in[me].T, H = spec.H, k = spec.k;
  Layer layer(cs.wts, k, cs.maxT, W * spec.T0 - 1);  // one row short of expert 0's W T rows
  DevFree mem;
  const DeviceInput d(cs.in[me], H, k, mem);
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  cudaStream_t s = stream();
  moe_layer_forward_fused(*layer.ex, *layer.gc, *layer.sc, d.x, d.idx, d.w, T, layer.up, layer.down, d.out, s);
  const std::string msg = error_of([&] { layer.ex->check(s); });
  EXPECT_NE(msg.find("receive capacity"), std::string::npos) << "rank " << me << ": " << msg;
  const std::vector<bf16> o = wt::to_host(d.out, static_cast<size_t>(T) * H);
  long long finite = 0;
  for (bf16 v : o) finite += std::isfinite(wt::to_f(v)) ? 1 : 0;
  EXPECT_EQ(finite, 0) << "a failed call's output must be NaN everywhere";
  expect_landing_tail_poisoned(layer, 0, "failed call");  // nothing landed anywhere
  comm().barrier();
  // A routing that fits: balanced, half the tokens.
  LayerCase good = spec;
  good.routing = Routing::balanced;
  good.T0 = spec.T0 / 2;
  const RankInput in = make_input(cs.seed, good.routing, cs.g, good.T0, k, H, me);
  const DeviceInput d2(in, H, k, mem);
  moe_layer_forward_fused(*layer.ex, *layer.gc, *layer.sc, d2.x, d2.idx, d2.w, in.T, layer.up, layer.down, d2.out, s);
  layer.ex->check(s);
  check_status(s);
  verify_layer(cs.wts, in, k, wt::to_host(d2.out, static_cast<size_t>(in.T) * H), "the call after a failed one");
  comm().barrier();
}
