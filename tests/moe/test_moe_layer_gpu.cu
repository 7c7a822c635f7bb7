// The MoE layer forward (kernels/moe/layer.hpp), both paths: non-fused (moe_layer_forward) and
// fused (moe_layer_forward_fused: gemm_combine) on W ranks (weave-run; WEAVE_SHARE_GPUS=1 runs both
// ranks on one GPU: no NCCL), against a float64 reference that every rank computes on the CPU for
// its own tokens from every rank's inputs and every expert's weights (all regenerated from rank 0's
// seed):
//   r[t] = sum_j w[t, j] * y_e(x_t), e = idx[t, j],  y_e(x) = Wd[e] (silu(g) * u),
//   g = Wg[e] x, u = Wu[e] x  (Wg, Wu: rows 0..F-1 and F..2F-1 of W_up[e]).
//
// The bound, per output element, is derived in check/moe_ref.hpp (with the reference itself).
// At these shapes (|g| ~ 1.7, |h| ~ 1.5, |y| ~ 1.5 rms) the bound is ~0.2 per slot's weight, while a
// wrong expert weight, a swapped gate / up half, a wrong row or a missing slot moves an element
// by ~|w y| ~ 1: many elements of a single wrong tile or token break it.
//
// Every case runs both paths on the same inputs, each on freshly poisoned (NaN) outputs, scratch,
// exchange buffers and landing buffer: the non-fused layer, then the fused one, each against the
// reference (computed once), the fused output also bit for bit against the non-fused one (the fused
// path rounds the same bf16 expert rows and sums them with the same code) and gemm_combine's
// landing rows past T k still poison. Routings: balanced, Dirichlet-skewed, every token's first
// slot on expert 0, all of a token's experts on one rank (duplicated rows), random with repeats;
// k = 1, 2, 4, 8; T different on every rank, not a multiple of 128 (the GEMM tile), 0 on one rank;
// H and F multiples of 64 and ragged ones (multiples of 8 only). Then back-to-back calls (no host
// synchronisation in between) with changing routing, T and tokens, each path's calls each checked
// (6, 8 and 200 calls per path), both paths captured in a CUDA graph and replayed with changing
// routing (every replay checked), and a short weight on one rank refused on every rank.
// gemm_combine's own argument errors and a failed dispatch through the fused layer are
// test_gemm_combine_gpu's.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../primitives/common.hpp"
#include "check/seed.hpp"
#include "common.hpp"
#include "layer_check.hpp"
#include "moe/exchange.hpp"
#include "moe/grouped_gemm.hpp"
#include "moe/layer.hpp"
#include "moe/layout.hpp"
#include "routing.hpp"

namespace {

using namespace weave;
using namespace weave::moe;
using namespace weave::moe::test;

void verify(const Weights& wts, const RankInput& mine, int k, const std::vector<bf16>& out, const std::string& what) {
  verify_layer(wts, mine, k, out, what);
}

// Poisons every buffer the layer writes once no rank's call runs, and lets the next call start
// only when every rank's buffers are poisoned.
void poison_between_calls(Layer& layer) {
  comm().barrier();  // every rank's previous call is over (its stream was synchronised by check())
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();  // nobody pushes into a buffer still being poisoned
}

// One case, both paths on the same inputs: the non-fused layer, then the fused one, each on freshly
// poisoned buffers; both against the reference, the fused one also against the non-fused output
// and its landing tail.
void run_case(const LayerCase& c) {
  const int W = comm().world(), me = comm().rank();
  const Geometry g{W, c.L * W};
  const uint64_t seed = wt::job_seed();
  const Weights wts(seed, g.experts, c.H, c.F);
  std::vector<RankInput> in;
  int maxT = 0;
  for (int s = 0; s < W; ++s) {
    in.push_back(make_input(seed, c.routing, g, tokens_of(c, s), c.k, c.H, s));
    maxT = std::max(maxT, in.back().T);
  }
  const int T = in[me].T;
  const size_t n = static_cast<size_t>(T) * c.H;
  Layer layer(wts, c.k, maxT);
  DevFree mem;
  const DeviceInput d(in[me], c.H, c.k, mem);  // d.out: the non-fused output
  bf16* fused = mem.add<bf16>(n);
  WEAVE_CUDA_CHECK(cudaMemset(fused, 0xff, std::max<size_t>(n, 1) * sizeof(bf16)));
  cudaStream_t s = stream();
  poison_between_calls(layer);
  moe_layer_forward(*layer.ex, *layer.sc, d.x, d.idx, d.w, T, layer.up, layer.down, d.out, s);
  layer.ex->check(s);
  check_status(s);
  poison_between_calls(layer);
  moe_layer_forward_fused(*layer.ex, *layer.gc, *layer.sc, d.x, d.idx, d.w, T, layer.up, layer.down, fused, s);
  layer.ex->check(s);
  check_status(s);
  const std::vector<bf16> plain_out = wt::to_host(d.out, n), fused_out = wt::to_host(fused, n);
  const std::string label = std::string(name(c.routing)) + " E " + std::to_string(g.experts) + " k " +
                            std::to_string(c.k) + " H " + std::to_string(c.H) + " F " + std::to_string(c.F) + " T " +
                            std::to_string(T);
  expect_landing_tail_poisoned(layer, T, "fused layer " + label);
  comm().barrier();
  verify_layer(wts, in[me], c.k, {{&plain_out, "layer " + label}, {&fused_out, "fused layer " + label}});
  expect_identical(fused_out, plain_out, "fused layer " + label);
}

}  // namespace

// The non-fused layer's cases, then the fused layer's former ones (test_gemm_combine_gpu's until
// both paths ran here; BalancedTop2 was in both): every case runs both paths.
TEST(MoeLayer, BalancedTop2) { run_case({Routing::balanced, 4, 2, 256, 128, 333, 17}); }
TEST(MoeLayer, DirichletTop4) { run_case({Routing::dirichlet, 8, 4, 128, 256, 257, -31}); }
TEST(MoeLayer, AllTokensToOneExpert) { run_case({Routing::all_to_one, 4, 2, 256, 128, 300, -37}); }
TEST(MoeLayer, Top1WithAnEmptyRank) { run_case({Routing::balanced, 4, 1, 512, 64, 129, 0, 1}); }
TEST(MoeLayer, Top8ExpertsOnOneRank) { run_case({Routing::same_rank, 8, 8, 128, 128, 100, 9}); }
TEST(MoeLayer, Top8RepeatedIds) { run_case({Routing::random_repeats, 4, 8, 256, 64, 77, 50}); }
TEST(MoeLayer, WiderRows) { run_case({Routing::dirichlet, 4, 4, 1024, 512, 40, 3}); }
TEST(MoeLayer, DirichletTop4Ragged) { run_case({Routing::dirichlet, 8, 4, 200, 136, 257, -31}); }
TEST(MoeLayer, AllTokensToOneExpertRagged) { run_case({Routing::all_to_one, 4, 2, 264, 72, 300, -37}); }
TEST(MoeLayer, Top1WithAnEmptyRankRagged) { run_case({Routing::balanced, 4, 1, 520, 64, 129, 0, 1}); }
TEST(MoeLayer, Top8ExpertsOnOneRankRagged) { run_case({Routing::same_rank, 8, 8, 136, 128, 100, 9}); }
TEST(MoeLayer, Top8RepeatedIdsRagged) { run_case({Routing::random_repeats, 4, 8, 256, 72, 77, 50}); }

namespace {

struct BackToBackSpec {
  int calls, L, k, H, F, maxT;
  uint64_t stream;  // check::derive(seed, stream, c) seeds call c
};

// Calls enqueued back to back on one layer (no host synchronisation between them), routing, T and
// tokens changing every call: all non-fused, then (buffers poisoned again) all fused on the same
// inputs; every call's outputs checked afterwards, the fused ones also against the non-fused ones.
// BackToBackRagged's burst runs more than 16 calls on agreed plans right after its plans' first
// calls: it caught the runtime's mailbox ring race (a rank lapping a peer that had not yet read its
// post of a first call; Communicator::agree_call now waits for every peer to have read it).
void run_back_to_back(const BackToBackSpec& b) {
  const int W = comm().world(), me = comm().rank(), H = b.H, k = b.k;
  const Geometry g{W, b.L * W};
  const uint64_t seed = wt::job_seed();
  const Weights wts(seed, g.experts, H, b.F);
  Layer layer(wts, k, b.maxT);
  const Routing kinds[] = {Routing::balanced, Routing::dirichlet, Routing::all_to_one, Routing::same_rank,
                           Routing::random_repeats};
  DevFree mem;
  std::vector<RankInput> mine;
  std::vector<std::unique_ptr<DeviceInput>> dev;  // dev[c]->out: the non-fused output
  std::vector<bf16*> fused;
  for (int c = 0; c < b.calls; ++c) {
    const uint64_t cs = check::derive(seed, b.stream, c);
    std::mt19937_64 rng(cs);
    std::vector<int> T(W);
    for (int r = 0; r < W; ++r) T[r] = c == 3 && r == 0 ? 0 : static_cast<int>(rng() % (b.maxT + 1));
    mine.push_back(make_input(cs, kinds[c % 5], g, T[me], k, H, me));
    dev.push_back(std::make_unique<DeviceInput>(mine.back(), H, k, mem));
    const size_t n = static_cast<size_t>(T[me]) * H;
    fused.push_back(mem.add<bf16>(n));
    WEAVE_CUDA_CHECK(cudaMemset(fused.back(), 0xff, std::max<size_t>(n, 1) * sizeof(bf16)));
  }
  cudaStream_t s = stream();
  poison_between_calls(layer);
  for (int c = 0; c < b.calls; ++c) {
    moe_layer_forward(*layer.ex, *layer.sc, dev[c]->x, dev[c]->idx, dev[c]->w, mine[c].T, layer.up, layer.down,
                      dev[c]->out, s);
  }
  layer.ex->check(s);
  check_status(s);
  poison_between_calls(layer);
  for (int c = 0; c < b.calls; ++c) {
    moe_layer_forward_fused(*layer.ex, *layer.gc, *layer.sc, dev[c]->x, dev[c]->idx, dev[c]->w, mine[c].T, layer.up,
                            layer.down, fused[c], s);
  }
  layer.ex->check(s);
  check_status(s);
  comm().barrier();
  for (int c = 0; c < b.calls; ++c) {
    const size_t n = static_cast<size_t>(mine[c].T) * H;
    const std::vector<bf16> plain_out = wt::to_host(dev[c]->out, n), fused_out = wt::to_host(fused[c], n);
    const std::string what = "call " + std::to_string(c) + " (" + name(kinds[c % 5]) + ")";
    verify_layer(wts, mine[c], k, {{&plain_out, what}, {&fused_out, "fused " + what}});
    expect_identical(fused_out, plain_out, "fused " + what);
  }
}

}  // namespace

TEST(MoeLayer, BackToBack) { run_back_to_back({6, 4, 4, 128, 128, 260, 100}); }
// The fused layer's former back-to-back case (8 calls, ragged H and F).
TEST(MoeLayer, BackToBackRagged) { run_back_to_back({8, 4, 4, 200, 136, 260, 300}); }
// Issue 21's 200 launches: 200 non-fused calls, then 200 fused ones on the same inputs, every output
// checked against the float64 reference and the fused ones bit for bit against the non-fused ones
// (ragged H and F, smaller than above so that the host's references stay quick).
TEST(MoeLayer, BackToBack200) { run_back_to_back({200, 4, 4, 136, 72, 200, 500}); }

// A rank whose weight is too short: every rank throws before anything is launched (the plan's
// first call, so agree_call makes every rank wait for the verdict), and the layer stays usable.
TEST(MoeLayer, ShortWeightIsAnErrorOnEveryRank) {
  const int W = comm().world(), me = comm().rank(), L = 2, k = 2, H = 128, F = 256, T = 50;
  const Geometry g{W, L * W};
  const uint64_t seed = wt::job_seed();
  const Weights wts(seed, g.experts, H, F);
  Layer layer(wts, k, T);
  DevFree mem;
  const RankInput in = make_input(seed, Routing::balanced, g, T, k, H, me);
  const DeviceInput d(in, H, k, mem);
  bf16* short_up = mem.add<bf16>(1024);  // W_up needs 256 KB (as test_grouped_gemm_gpu's short buffers)
  cudaStream_t s = stream();
  comm().barrier();
  std::string msg;
  try {
    moe_layer_forward(*layer.ex, *layer.sc, d.x, d.idx, d.w, T, me == W - 1 ? short_up : layer.up, layer.down,
                      d.out, s);
  } catch (const Error& e) {
    msg = e.what();
  }
  // The short rank names its argument; its peers say that a rank rejected its arguments.
  EXPECT_NE(msg.find(me == W - 1 ? "W_up" : "rejected its arguments"), std::string::npos) << "rank " << me << ": " << msg;
  // The GEMMs' options, bad on one rank only: refused on every rank before the dispatch (they were
  // found by the first grouped_gemm, after the dispatch, and the peers waited in their combine).
  // The plan's first call was refused, so this one is checked together again; on an agreed plan
  // the refusing rank would stop its launched peers through their abort words instead.
  msg.clear();
  try {
    GroupedGemmOptions o;
    if (me == W - 1) o.lcsc.num_comm_sms = -1;
    moe_layer_forward(*layer.ex, *layer.sc, d.x, d.idx, d.w, T, layer.up, layer.down, d.out, s, o);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(me == W - 1 ? "num_comm_sms" : "rejected its arguments"), std::string::npos)
      << "rank " << me << ": " << msg;
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  moe_layer_forward(*layer.ex, *layer.sc, d.x, d.idx, d.w, T, layer.up, layer.down, d.out, s);
  layer.ex->check(s);
  check_status(s);
  verify(wts, in, k, wt::to_host(d.out, static_cast<size_t>(T) * H), "the call after a rejected one");
  comm().barrier();
}

// Both paths captured in one CUDA graph after an eager call of each, then replayed with fresh
// routing and tokens copied into the captured inputs (T is the graph's, fixed per rank; not a
// multiple of the GEMM tile), the outputs poisoned before each replay and checked against the
// float64 reference, the fused one also bit for bit against the non-fused one; eager calls between
// and after (layer_check.hpp's captured_replays).
TEST(MoeLayer, CapturedReplays) {
  const int W = comm().world(), me = comm().rank(), L = 4, k = 4, H = 200, F = 136, kReplays = 12;
  const Geometry g{W, L * W};
  const uint64_t seed = wt::job_seed();
  const Weights wts(seed, g.experts, H, F);
  std::vector<int> Ts(W);
  for (int r = 0; r < W; ++r) Ts[r] = 203 + 61 * r;
  const int T = Ts[me];
  const size_t n = static_cast<size_t>(T) * H;
  Layer layer(wts, k, *std::max_element(Ts.begin(), Ts.end()));
  DevFree mem;
  DeviceInput d(T, H, k, mem);  // d.out: the non-fused output
  bf16* fused = mem.add<bf16>(n);
  cudaStream_t s = stream();
  const Routing kinds[] = {Routing::balanced, Routing::dirichlet, Routing::all_to_one, Routing::same_rank,
                           Routing::random_repeats};
  auto prepare = [&](int c) {
    RankInput in = make_input(check::derive(seed, 600, c), kinds[c % 5], g, T, k, H, me);
    comm().barrier();  // every rank's previous call is over (check() synchronised its stream)
    d.load(in);
    WEAVE_CUDA_CHECK(cudaMemset(fused, 0xff, n * sizeof(bf16)));
    layer.poison();
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    comm().barrier();  // nobody pushes into a buffer still being poisoned
    return in;
  };
  auto enqueue = [&] {
    moe_layer_forward(*layer.ex, *layer.sc, d.x, d.idx, d.w, T, layer.up, layer.down, d.out, s);
    moe_layer_forward_fused(*layer.ex, *layer.gc, *layer.sc, d.x, d.idx, d.w, T, layer.up, layer.down, fused, s);
  };
  auto check_call = [&](const RankInput& in, const std::string& what) {
    layer.ex->check(s);
    check_status(s);
    const std::vector<bf16> plain_out = wt::to_host(d.out, n), fused_out = wt::to_host(fused, n);
    verify_layer(wts, in, k, {{&plain_out, what}, {&fused_out, "fused " + what}});
    expect_identical(fused_out, plain_out, "fused " + what);
  };
  captured_replays(s, kReplays, prepare, enqueue, check_call,
                   [&](int c) { return std::string(name(kinds[c % 5])); });
}
