// The non-fused MoE layer forward (kernels/moe/layer.hpp) on W ranks (weave-run; WEAVE_SHARE_GPUS=1
// runs both ranks on one GPU: no NCCL), against a float64 reference that every rank computes on
// the CPU for its own tokens from every rank's inputs and every expert's weights (all regenerated
// from rank 0's seed):
//   r[t] = sum_j w[t, j] * y_e(x_t), e = idx[t, j],  y_e(x) = Wd[e] (silu(g) * u),
//   g = Wg[e] x, u = Wu[e] x  (Wg, Wu: rows 0..F-1 and F..2F-1 of W_up[e]).
//
// The bound, per output element, is derived in check/moe_ref.hpp (with the reference itself).
// At these shapes (|g| ~ 1.7, |h| ~ 1.5, |y| ~ 1.5 rms) the bound is ~0.2 per slot's weight, while a
// wrong expert weight, a swapped gate / up half, a wrong row or a missing slot moves an element
// by ~|w y| ~ 1: many elements of a single wrong tile or token break it.
//
// Outputs are poisoned (NaN) before every call, and so are the layer's scratch and the exchange's
// buffers. Routings: balanced, Dirichlet-skewed, every token's first slot on expert 0, all of a
// token's experts on one rank (duplicated rows), random with repeats; k = 1, 2, 4, 8; T different
// on every rank, not a multiple of 128 (the GEMM tile), 0 on one rank. Then back-to-back calls
// (no host synchronisation in between) with changing routing, T and tokens, each checked.
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

// The shared pieces (routing.hpp, layer_check.hpp) under the names this file has always used.
void verify(const Weights& wts, const RankInput& mine, int k, const std::vector<bf16>& out, const std::string& what) {
  verify_layer(wts, mine, k, out, what);
}

struct CaseSpec {
  Routing routing;
  int L, k, H, F;
  int T0, dT;          // rank s has T0 + dT * s tokens
  int zero_rank = -1;  // this rank has none
};

int tokens_of(const CaseSpec& c, int s) { return s == c.zero_rank ? 0 : std::max(0, c.T0 + c.dT * s); }

void run_case(const CaseSpec& c) {
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
  Layer layer(wts, c.k, maxT);
  DevFree mem;
  const DeviceInput d(in[me], c.H, c.k, mem);
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();  // nobody pushes into a buffer still being poisoned
  cudaStream_t s = stream();
  moe_layer_forward(*layer.ex, *layer.sc, d.x, d.idx, d.w, in[me].T, layer.up, layer.down, d.out, s);
  layer.ex->check(s);
  check_status(s);
  const std::vector<bf16> out = wt::to_host(d.out, static_cast<size_t>(in[me].T) * c.H);
  comm().barrier();
  verify(wts, in[me], c.k, out,
         std::string(name(c.routing)) + " E " + std::to_string(g.experts) + " k " + std::to_string(c.k) + " H " +
             std::to_string(c.H) + " F " + std::to_string(c.F) + " T " + std::to_string(in[me].T));
}

}  // namespace

TEST(MoeLayer, BalancedTop2) { run_case({Routing::balanced, 4, 2, 256, 128, 333, 17}); }
TEST(MoeLayer, DirichletTop4) { run_case({Routing::dirichlet, 8, 4, 128, 256, 257, -31}); }
TEST(MoeLayer, AllTokensToOneExpert) { run_case({Routing::all_to_one, 4, 2, 256, 128, 300, -37}); }
TEST(MoeLayer, Top1WithAnEmptyRank) { run_case({Routing::balanced, 4, 1, 512, 64, 129, 0, 1}); }
TEST(MoeLayer, Top8ExpertsOnOneRank) { run_case({Routing::same_rank, 8, 8, 128, 128, 100, 9}); }
TEST(MoeLayer, Top8RepeatedIds) { run_case({Routing::random_repeats, 4, 8, 256, 64, 77, 50}); }
TEST(MoeLayer, WiderRows) { run_case({Routing::dirichlet, 4, 4, 1024, 512, 40, 3}); }

// Calls enqueued back to back on one layer (no host synchronisation between them), routing, T and
// tokens changing every call; every call's output checked afterwards.
TEST(MoeLayer, BackToBack) {
  const int W = comm().world(), me = comm().rank(), kCalls = 6, L = 4, k = 4, H = 128, F = 128, maxT = 260;
  const Geometry g{W, L * W};
  const uint64_t seed = wt::job_seed();
  const Weights wts(seed, g.experts, H, F);
  Layer layer(wts, k, maxT);
  const Routing kinds[] = {Routing::balanced, Routing::dirichlet, Routing::all_to_one, Routing::same_rank,
                           Routing::random_repeats};
  DevFree mem;
  std::vector<RankInput> mine;
  std::vector<std::unique_ptr<DeviceInput>> dev;
  for (int c = 0; c < kCalls; ++c) {
    const uint64_t cs = check::derive(seed, 100, c);
    std::mt19937_64 rng(cs);
    std::vector<int> T(W);
    for (int r = 0; r < W; ++r) T[r] = c == 3 && r == 0 ? 0 : static_cast<int>(rng() % (maxT + 1));
    mine.push_back(make_input(cs, kinds[c % 5], g, T[me], k, H, me));
    dev.push_back(std::make_unique<DeviceInput>(mine.back(), H, k, mem));
  }
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  cudaStream_t s = stream();
  for (int c = 0; c < kCalls; ++c)
    moe_layer_forward(*layer.ex, *layer.sc, dev[c]->x, dev[c]->idx, dev[c]->w, mine[c].T, layer.up, layer.down,
                      dev[c]->out, s);
  layer.ex->check(s);
  check_status(s);
  comm().barrier();
  for (int c = 0; c < kCalls; ++c) {
    const std::vector<bf16> out = wt::to_host(dev[c]->out, static_cast<size_t>(mine[c].T) * H);
    verify(wts, mine[c], k, out, "call " + std::to_string(c) + " (" + name(kinds[c % 5]) + ")");
  }
}

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
  layer.poison();
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  comm().barrier();
  moe_layer_forward(*layer.ex, *layer.sc, d.x, d.idx, d.w, T, layer.up, layer.down, d.out, s);
  layer.ex->check(s);
  check_status(s);
  verify(wts, in, k, wt::to_host(d.out, static_cast<size_t>(T) * H), "the call after a rejected one");
  comm().barrier();
}
