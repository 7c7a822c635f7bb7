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
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../primitives/common.hpp"
#include "check/moe_ref.hpp"
#include "check/seed.hpp"
#include "moe/exchange.hpp"
#include "moe/grouped_gemm.hpp"
#include "moe/layer.hpp"
#include "moe/layout.hpp"
#include "common.hpp"

namespace {

using namespace weave;
using namespace weave::moe;
using bf16 = __nv_bfloat16;

using test::comm;
using test::stream;
using test::draw_distinct;

enum class Routing { balanced, dirichlet, all_to_one, same_rank, random_repeats };
const char* name(Routing r) {
  static const char* n[] = {"balanced", "dirichlet", "all_to_one", "same_rank", "random_repeats"};
  return n[static_cast<int>(r)];
}

std::vector<int> route(Routing kind, const Geometry& g, int T, int k, int rank, std::mt19937_64& rng) {
  const int E = g.experts, L = g.local_experts();
  std::vector<int> idx(static_cast<size_t>(T) * k);
  std::vector<double> pop;
  if (kind == Routing::dirichlet) {  // expert popularity ~ Dirichlet(0.3): a few hot experts
    std::gamma_distribution<double> gam(0.3, 1.0);
    pop.resize(E);
    for (double& x : pop) x = gam(rng) + 1e-12;
  }
  for (int t = 0; t < T; ++t) {
    int* row = idx.data() + static_cast<size_t>(t) * k;
    switch (kind) {
      case Routing::balanced:
        for (int j = 0; j < k; ++j) row[j] = (t * k + j + rank) % E;
        break;
      case Routing::dirichlet:
        draw_distinct(rng, E, k, pop, row);
        break;
      case Routing::all_to_one:  // slot 0 on expert 0 for every token of every rank
        draw_distinct(rng, E, k, {}, row);
        for (int j = 1; j < k; ++j)
          if (row[j] == 0) row[j] = row[0];
        row[0] = 0;
        break;
      case Routing::same_rank: {  // every expert of the token on one rank
        const int r = static_cast<int>(rng() % g.world);
        std::vector<int> loc(L);
        draw_distinct(rng, L, std::min(k, L), {}, loc.data());
        for (int j = 0; j < k; ++j) row[j] = g.expert(r, loc[j % std::min(k, L)]);
        break;
      }
      case Routing::random_repeats:  // ids drawn independently: a token may pick one expert twice
        for (int j = 0; j < k; ++j) row[j] = static_cast<int>(rng() % E);
        break;
    }
  }
  return idx;
}

using test::RankInput;

RankInput make_input(uint64_t seed, Routing kind, const Geometry& g, int T, int k, int H, int s) {
  return test::make_rank_input(seed, T, k, H, s, [&](int t, int kk, int ss, std::mt19937_64& rng) {
    return route(kind, g, t, kk, ss, rng);
  });
}

// Every expert's weights (E x 2F x H and E x H x F, bf16), uniform in +-a: a_up = 3 sqrt(3 / H)
// makes g and u ~1.7 rms for x uniform in [-1, 1] (silu well into its curved part), a_down =
// sqrt(3 / F) keeps y of the order of h.
struct Weights {
  int E = 0, H = 0, F = 0;
  std::vector<bf16> up, down;
  Weights(uint64_t seed, int E_, int H_, int F_) : E(E_), H(H_), F(F_) {
    std::mt19937_64 rng(check::derive(seed, 7, 0));
    const float a_up = 3.f * std::sqrt(3.f / H), a_down = std::sqrt(3.f / F);
    std::uniform_real_distribution<float> uu(-a_up, a_up), ud(-a_down, a_down);
    up.resize(static_cast<size_t>(E) * 2 * F * H);
    down.resize(static_cast<size_t>(E) * H * F);
    for (bf16& v : up) v = __float2bfloat16_rn(uu(rng));
    for (bf16& v : down) v = __float2bfloat16_rn(ud(rng));
  }
  const bf16* up_of(int e) const { return up.data() + static_cast<size_t>(e) * 2 * F * H; }
  const bf16* down_of(int e) const { return down.data() + static_cast<size_t>(e) * H * F; }
};

// Checks this rank's layer output against the float64 reference of its own tokens.
void verify(const Weights& wts, const RankInput& mine, int k, const std::vector<bf16>& out, const std::string& what) {
  const int H = wts.H, F = wts.F;
  long long over = 0, nonfinite = 0;
  double worst = 0;
  std::string worst_at;
  for (int t = 0; t < mine.T; ++t) {
    const int* ids = mine.idx.data() + static_cast<size_t>(t) * k;
    const float* ws = mine.w.data() + static_cast<size_t>(t) * k;
    std::vector<int> experts;  // distinct experts of the token, in first-seen order
    for (int j = 0; j < k; ++j)
      if (std::find(experts.begin(), experts.end(), ids[j]) == experts.end()) experts.push_back(ids[j]);
    std::vector<double> xv(H);
    for (int c = 0; c < H; ++c) xv[c] = wt::to_f(mine.x[static_cast<size_t>(t) * H + c]);
    check::MoeTokenRef ref(H);
    for (int e : experts) {
      double we = 0;  // the summed weight of the token's slots on e
      for (int j = 0; j < k; ++j)
        if (ids[j] == e) we += ws[j];
      const bf16* wu = wts.up_of(e);
      const bf16* wd = wts.down_of(e);
      const auto up = [&](int row, int c) { return double(wt::to_f(wu[static_cast<size_t>(row) * H + c])); };
      const auto down = [&](int c, int f) { return double(wt::to_f(wd[static_cast<size_t>(c) * F + f])); };
      ref.add(we, check::moe_expert_ref(xv, H, F, up, down));
    }
    for (int c = 0; c < H; ++c) {
      const double r = ref.r[c], bound = ref.bound(c);
      const double x = wt::to_f(out[static_cast<size_t>(t) * H + c]);
      if (!std::isfinite(x)) {
        ++nonfinite;
        continue;
      }
      const double ratio = std::fabs(x - r) / bound;
      over += ratio > 1;
      if (ratio > worst) {
        worst = ratio;
        worst_at = "token " + std::to_string(t) + " col " + std::to_string(c) + ": " + std::to_string(x) + " vs " +
                   std::to_string(r) + " (bound " + std::to_string(bound) + ")";
      }
    }
  }
  EXPECT_EQ(nonfinite, 0) << what << ": " << nonfinite << " outputs not finite (never written?)";
  EXPECT_EQ(over, 0) << what << ": " << over << " of " << static_cast<long long>(mine.T) * H
                     << " outputs past the bound, worst ratio " << worst << " at " << worst_at;
  if (comm().rank() == 0 && std::getenv("WEAVE_TEST_VERBOSE"))
    std::printf("  %s: worst ratio to the bound %.3g\n", what.c_str(), worst);
}

struct DevFree {
  std::vector<void*> ptrs;
  ~DevFree() {
    cudaDeviceSynchronize();
    for (void* p : ptrs) cudaFree(p);
  }
  template <class T>
  T* add(size_t n) {
    T* p = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    ptrs.push_back(p);
    return p;
  }
};

struct CaseSpec {
  Routing routing;
  int L, k, H, F;
  int T0, dT;          // rank s has T0 + dT * s tokens
  int zero_rank = -1;  // this rank has none
};

int tokens_of(const CaseSpec& c, int s) { return s == c.zero_rank ? 0 : std::max(0, c.T0 + c.dT * s); }

// The layer's setup on this rank: exchange, scratch, this rank's experts' weights.
struct Layer {
  std::unique_ptr<MoeExchange> ex;
  std::unique_ptr<MoeLayerScratch> sc;
  bf16 *up = nullptr, *down = nullptr;
  DevFree mem;
  Layer(const Weights& wts, int k, int max_tokens) {
    const int W = comm().world(), me = comm().rank(), L = wts.E / W;
    ExchangeConfig cf;
    cf.experts = wts.E, cf.hidden = wts.H, cf.topk = k, cf.max_tokens = std::max(max_tokens, 1);
    cf.capacity = std::max(1, W * max_tokens * k);  // any routing fits
    ex = std::make_unique<MoeExchange>(comm(), cf);
    sc = std::make_unique<MoeLayerScratch>(*ex, wts.F);
    const size_t nu = static_cast<size_t>(L) * 2 * wts.F * wts.H, nd = static_cast<size_t>(L) * wts.H * wts.F;
    up = mem.add<bf16>(nu);
    down = mem.add<bf16>(nd);
    WEAVE_CUDA_CHECK(cudaMemcpy(up, wts.up_of(me * L), nu * sizeof(bf16), cudaMemcpyHostToDevice));
    WEAVE_CUDA_CHECK(cudaMemcpy(down, wts.down_of(me * L), nd * sizeof(bf16), cudaMemcpyHostToDevice));
  }
  // Poisons every buffer the layer writes (scratch, exchange buffers), so that reading stale or
  // unwritten data shows.
  void poison() {
    const ExchangeConfig& cf = ex->config();
    const size_t cap = static_cast<size_t>(cf.capacity);
    WEAVE_CUDA_CHECK(cudaMemset(ex->expert_input(), 0xff, cap * cf.hidden * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMemset(ex->expert_output(), 0xff, cap * cf.hidden * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMemset(sc->up_output(), 0xff, cap * 2 * sc->ffn() * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMemset(sc->swiglu_output(), 0xff, cap * sc->ffn() * sizeof(bf16)));
  }
};

struct DeviceInput {
  bf16 *x, *out;
  int* idx;
  float* w;
  DeviceInput(const RankInput& in, int H, int k, DevFree& mem) {
    x = mem.add<bf16>(static_cast<size_t>(in.T) * H);
    out = mem.add<bf16>(static_cast<size_t>(in.T) * H);
    idx = mem.add<int>(static_cast<size_t>(in.T) * k);
    w = mem.add<float>(static_cast<size_t>(in.T) * k);
    if (in.T) {
      wt::to_device(x, in.x);
      wt::to_device(idx, in.idx);
      wt::to_device(w, in.w);
    }
    WEAVE_CUDA_CHECK(cudaMemset(out, 0xff, std::max<size_t>(static_cast<size_t>(in.T) * H, 1) * sizeof(bf16)));
  }
};

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
