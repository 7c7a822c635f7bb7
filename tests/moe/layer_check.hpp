// What the multi-rank MoE tests share beyond common.hpp (test_moe_layer_gpu: the layer, non-fused
// and fused; test_gemm_combine_gpu: gemm_combine; test_moe_exchange_gpu: the bound counter and the
// device buffers): every expert's weights regenerated from the job's seed, the per-element bound
// counter, the check of one rank's layer output against the float64 reference of
// check/moe_ref.hpp, the fused path's bit-for-bit and landing checks, and the layer's device setup
// on this rank (exchange, scratch, gemm_combine, this rank's weights).
#pragma once
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
#include "common.hpp"
#include "moe/exchange.hpp"
#include "moe/gemm_combine.hpp"
#include "moe/layer.hpp"
#include "routing.hpp"
#include "weave/runtime/env.hpp"

namespace weave::moe::test {

using bf16 = __nv_bfloat16;

// One layer case: routing, L experts per rank, top-k, hidden H, expert FFN F, tokens per rank.
struct LayerCase {
  Routing routing;
  int L, k, H, F;
  int T0, dT;          // rank s has T0 + dT * s tokens
  int zero_rank = -1;  // this rank has none
};
inline int tokens_of(const LayerCase& c, int s) { return s == c.zero_rank ? 0 : std::max(0, c.T0 + c.dT * s); }

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

// Counts outputs past their bound (and non-finite ones) over one rank's T x H outputs.
struct BoundCheck {
  long long over = 0, nonfinite = 0, n = 0;
  double worst = 0;
  std::string worst_at;
  // Output x of token t, column c, against the reference r under `bound` (> 0).
  void add(double x, double r, double bound, int t, int c) {
    ++n;
    if (!std::isfinite(x)) {
      ++nonfinite;
      return;
    }
    const double ratio = std::fabs(x - r) / bound;
    over += ratio > 1;
    if (ratio > worst) {
      worst = ratio;
      worst_at = "token " + std::to_string(t) + " col " + std::to_string(c) + ": " + std::to_string(x) + " vs " +
                 std::to_string(r) + " (bound " + std::to_string(bound) + ")";
    }
  }
  // Token t's H outputs against its check::MoeTokenRef.
  void add(const check::MoeTokenRef& ref, const bf16* got, int t) {
    for (size_t c = 0; c < ref.r.size(); ++c)
      add(wt::to_f(got[c]), ref.r[c], ref.bound(static_cast<int>(c)), t, static_cast<int>(c));
  }
  void expect(const std::string& what) const {
    EXPECT_EQ(nonfinite, 0) << what << ": " << nonfinite << " outputs not finite (never written?)";
    EXPECT_EQ(over, 0) << what << ": " << over << " of " << n << " outputs past the bound, worst ratio " << worst
                       << " at " << worst_at;
    if (comm().rank() == 0 && weave::env::get_bool("WEAVE_TEST_VERBOSE"))
      std::printf("  %s: worst ratio to the bound %.3g\n", what.c_str(), worst);
  }
};

// One layer output of this rank's tokens (T x H) and its name in failure messages.
struct LayerOutput {
  const std::vector<bf16>* out;
  std::string what;
};

// Checks this rank's layer outputs (e.g. the non-fused and the fused path's, on the same inputs)
// against the float64 reference of its own tokens, computed once for all of them.
inline void verify_layer(const Weights& wts, const RankInput& mine, int k, const std::vector<LayerOutput>& outs) {
  const int H = wts.H, F = wts.F;
  std::vector<BoundCheck> chk(outs.size());
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
    for (size_t i = 0; i < outs.size(); ++i) chk[i].add(ref, outs[i].out->data() + static_cast<size_t>(t) * H, t);
  }
  for (size_t i = 0; i < outs.size(); ++i) chk[i].expect(outs[i].what);
}
inline void verify_layer(const Weights& wts, const RankInput& mine, int k, const std::vector<bf16>& out,
                         const std::string& what) {
  verify_layer(wts, mine, k, {LayerOutput{&out, what}});
}

// The fused and non-fused outputs, element for element.
inline void expect_identical(const std::vector<bf16>& fused, const std::vector<bf16>& plain, const std::string& what) {
  ASSERT_EQ(fused.size(), plain.size());
  long long diff = 0;
  size_t first = 0;
  for (size_t i = 0; i < fused.size(); ++i)
    if (wt::bits(fused[i]) != wt::bits(plain[i]) && diff++ == 0) first = i;
  EXPECT_EQ(diff, 0) << what << ": " << diff << " outputs differ from the non-fused path's, first at element "
                     << first << " (" << wt::to_f(fused[first]) << " vs " << wt::to_f(plain[first]) << ")";
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

// The layer's setup on this rank: exchange (capacity for any routing unless given), scratch, the
// fused combine, this rank's experts' weights.
// This rank's L experts' weights on the device (experts rank L .. rank L + L - 1), freed with `mem`.
struct RankWeights {
  bf16 *up = nullptr, *down = nullptr;
  RankWeights(const Weights& wts, int L, DevFree& mem) {
    const int me = comm().rank();
    const size_t nu = static_cast<size_t>(L) * 2 * wts.F * wts.H, nd = static_cast<size_t>(L) * wts.H * wts.F;
    up = mem.add<bf16>(nu);
    down = mem.add<bf16>(nd);
    WEAVE_CUDA_CHECK(cudaMemcpy(up, wts.up_of(me * L), nu * sizeof(bf16), cudaMemcpyHostToDevice));
    WEAVE_CUDA_CHECK(cudaMemcpy(down, wts.down_of(me * L), nd * sizeof(bf16), cudaMemcpyHostToDevice));
  }
};

// The CUDA-graph check of the MoE operators: call 0 eager, then `enqueue` captured into a graph;
// calls 1..replays are replays of it, every fourth an eager call of `enqueue` instead (the signal
// rounds and expected totals then advance on the device), a second graph is captured halfway and
// never replayed (it must leave no count behind), and an eager call comes last. Before each call
// one rank (c mod W) holds its stream for 2 ms, so that the others reach every wait first: a wait
// for a stale count passes at once and reads what the late rank has not written yet. prepare(c)
// puts call c's inputs into the captured buffers and poisons the outputs, once every rank's
// previous call is over, and returns what check(prepared, what) verifies after the call; label(c)
// names call c's routing.
template <class Prepare, class Enqueue, class Check, class Label>
void captured_replays(cudaStream_t s, int replays, Prepare&& prepare, Enqueue&& enqueue, Check&& check,
                      Label&& label) {
  auto hold = [&](int c) {
    if (comm().rank() == c % comm().world()) wt::spin_ns<<<1, 1, 0, s>>>(2'000'000ull);
  };
  {
    const auto in = prepare(0);
    hold(0);
    enqueue();
    check(in, "the eager call before the capture");
  }
  wt::Graph graph(s, enqueue);
  for (int c = 1; c <= replays && !::testing::Test::HasFailure(); ++c) {
    const auto in = prepare(c);
    const bool eager = c % 4 == 0;
    hold(c);
    if (eager) enqueue();
    else graph.launch(s);
    check(in, std::string(eager ? "eager call " : "replay ") + std::to_string(c) + " (" + label(c) + ")");
    if (c == replays / 2) wt::Graph never(s, enqueue);
  }
  const auto in = prepare(replays + 1);
  hold(replays + 1);
  enqueue();
  check(in, "the eager call after the replays");
}

struct Layer {
  std::unique_ptr<MoeExchange> ex;
  std::unique_ptr<MoeLayerScratch> sc;
  std::unique_ptr<MoeGemmCombine> gc;
  bf16 *up = nullptr, *down = nullptr;
  DevFree mem;
  Layer(const Weights& wts, int k, int max_tokens, int capacity = 0) {
    const int W = comm().world(), L = wts.E / W;
    ExchangeConfig cf;
    cf.experts = wts.E, cf.hidden = wts.H, cf.topk = k, cf.max_tokens = std::max(max_tokens, 1);
    cf.capacity = capacity > 0 ? capacity : std::max(1, W * max_tokens * k);
    ex = std::make_unique<MoeExchange>(comm(), cf);
    sc = std::make_unique<MoeLayerScratch>(*ex, wts.F);
    gc = std::make_unique<MoeGemmCombine>(*ex);
    const RankWeights rw(wts, L, mem);
    up = rw.up, down = rw.down;
  }
  // Poisons every buffer the layer writes (scratch, exchange buffers, landing buffer), so that
  // reading stale or unwritten data shows.
  void poison() {
    const ExchangeConfig& cf = ex->config();
    const size_t cap = static_cast<size_t>(cf.capacity);
    WEAVE_CUDA_CHECK(cudaMemset(ex->expert_input(), 0xff, cap * cf.hidden * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMemset(ex->expert_output(), 0xff, cap * cf.hidden * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMemset(sc->up_output(), 0xff, cap * 2 * sc->ffn() * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMemset(sc->swiglu_output(), 0xff, cap * sc->ffn() * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMemset(gc->landing(), 0xff,
                                static_cast<size_t>(cf.max_tokens) * cf.topk * cf.hidden * sizeof(bf16)));
  }
};

// Landing rows past this rank's T k: nobody may write there (gemm_combine's landing buffer,
// poisoned by Layer::poison).
inline void expect_landing_tail_poisoned(const Layer& layer, int T, const std::string& what) {
  const ExchangeConfig& cf = layer.ex->config();
  const size_t row = static_cast<size_t>(cf.hidden), all = static_cast<size_t>(cf.max_tokens) * cf.topk * row;
  const std::vector<bf16> land = wt::to_host(layer.gc->landing(), all);
  long long touched = 0;
  for (size_t i = static_cast<size_t>(T) * cf.topk * row; i < all; ++i) touched += wt::bits(land[i]) != 0xffffu;
  EXPECT_EQ(touched, 0) << what << ": " << touched << " landing elements past T k were written";
}

// One case's inputs on every rank (each rank regenerates all of them from the job's seed, so that
// it can check what arrives from its peers): the experts' weights and every rank's tokens and router
// output.
struct CaseInputs {
  LayerCase c;
  Geometry g;
  uint64_t seed;
  Weights wts;
  std::vector<RankInput> in;
  int maxT = 0;
  explicit CaseInputs(const LayerCase& spec)
      : c(spec), g{comm().world(), spec.L * comm().world()}, seed(wt::job_seed()), wts(seed, g.experts, c.H, c.F) {
    for (int s = 0; s < g.world; ++s) {
      in.push_back(make_input(seed, c.routing, g, tokens_of(c, s), c.k, c.H, s));
      maxT = std::max(maxT, in.back().T);
    }
  }
};

// One rank's inputs of a call on the device, the output poisoned.
struct DeviceInput {
  bf16 *x, *out;
  int* idx;
  float* w;
  int T, H;
  // Buffers for T tokens, filled by load() (a captured call's: every call reuses them).
  DeviceInput(int T_, int H_, int k, DevFree& mem) : T(T_), H(H_) {
    x = mem.add<bf16>(static_cast<size_t>(T) * H);
    out = mem.add<bf16>(static_cast<size_t>(T) * H);
    idx = mem.add<int>(static_cast<size_t>(T) * k);
    w = mem.add<float>(static_cast<size_t>(T) * k);
  }
  DeviceInput(const RankInput& in, int H_, int k, DevFree& mem) : DeviceInput(in.T, H_, k, mem) { load(in); }
  // `in`'s tokens, ids and weights uploaded (its T must be the buffers'), the output poisoned.
  void load(const RankInput& in) {
    ASSERT_EQ(in.T, T) << "DeviceInput: the buffers hold " << T << " tokens";
    if (T) {
      wt::to_device(x, in.x);
      wt::to_device(idx, in.idx);
      wt::to_device(w, in.w);
    }
    WEAVE_CUDA_CHECK(cudaMemset(out, 0xff, std::max<size_t>(static_cast<size_t>(T) * H, 1) * sizeof(bf16)));
  }
};

}  // namespace weave::moe::test
