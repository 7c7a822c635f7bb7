// weave-bench moe: the MoE grouped GEMM (kernels/moe/grouped_gemm.hpp) on the issue-21 shapes, one
// GPU, beside a dense weave GEMM of equal flops (the issue's reference ratio); under weave-run -n W
// with W >= 2, moe_dispatch, moe_combine, the layer (non-fused and fused: gemm_combine) and the
// layer's two grouped GEMMs alone on its dispatched rows instead (namespace world below).
//
// Shapes (H hidden, F expert FFN, E experts, top-k): deepseek (7168, 2048, 64, 8), qwen (4096,
// 1536, 64, 8), mixtral (4096, 14336, 8, 2); T tokens in --tokens (4096, 16384), rows = T * k;
// both projections: up (gate and up fused: N = 2F, K = H) and down (N = H, K = F), W[e] stored
// N x K (nn.Linear). Routings (the same generator as bench/torch_moe.py, so both time the same
// counts; each row records routing_hash, FNV-1a 64 of the counts, to compare):
//   balanced   rows / E per expert (the remainder on the first experts);
//   dirichlet  expert shares from a symmetric Dirichlet(1) (normalised -log u, u from splitmix64
//              seeded by --routing-seed, E, k and T), rows by largest remainder, no expert above T
//              (a token picks an expert once; the excess goes to the others in expert order);
//   one        every row on expert 0 (all tokens to one expert).
// Correctness as weave-bench gemm: two input sets (X and W) alternate between timed calls, the
// output is poisoned before timing, and the last timed call's output is compared element by
// element, per 128 x 128 tile, against a float32 cuBLASLt reference of each expert's slice
// (check/gemm_ref.hpp, bound 2^-8 |r| + 2^-10 s); the status words must show no refused launch.
// Then one more call on the other set into a re-poisoned output is checked the same way
// (recheck.hpp: a kernel that leaves an earlier call's result in place fails it), for the dense
// baseline as for the grouped rows; a row is correct only when both checks pass. Any incorrect
// row makes the exit status 1. Inputs derive from WEAVE_TEST_SEED (printed).
//
//   weave-bench moe [--json FILE] [--models deepseek,qwen,mixtral] [--tokens 4096,16384]
//                   [--proj up,down] [--routing balanced,dirichlet,one] [--routing-seed S]
//                   [--target-ms T] [--group G] [--split-k S] [--no-dense] [--list]
//   weave-run -n W -- weave-bench moe [--json FILE] [--models ...] [--tokens ...] [--routing ...]
//                   [--kernels dispatch,combine,layer_gemms,layer,layer_fused,dispatch_gemm]
//                   [--routing-seed S]
//                   [--target-ms T] [--world-rows]
//   --world-rows: the expert-parallel rows also at W = 1 (every row local: the fused kernels'
//                 overlap of the local copies with the GEMMs, measurable on one GPU)
//   weave-bench moe --list --world W    the world rows' routing hashes and capacities, no GPU
//   weave-run -n W -- weave-bench moe --kernels ll --tokens 128 --models deepseek --routing balanced
//                   the low-latency decode mode (kernels/moe/low_latency.hpp; T <= 256 per rank)
// --group: tile rows per raster group inside an expert (0: the dense GEMM's default for K).
// --split-k: GroupedGemmOptions::split_k (0: the device's model (the default), 1: never, S: S ways);
//            each row records the split the launch chose (`splits`).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench.hpp"
#include "check/gemm_ref.hpp"
#include "check/moe_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "check/gemm_baseline.cuh"
#include "moe/dispatch_gemm.hpp"
#include "moe/exchange.hpp"
#include "moe/grouped_gemm.hpp"
#include "moe/layer.hpp"
#include "moe/layout.hpp"
#include "moe/low_latency.hpp"
#include "moe/swiglu.hpp"
#include "recheck.hpp"
#include "weave/runtime/communicator.hpp"
#include "weave/runtime/env.hpp"

using namespace weave;
using namespace weave::bench;
using bf16 = __nv_bfloat16;

namespace {

struct MoeModel {
  const char* name;
  int H, F, E, k;
};
const MoeModel kMoeModels[] = {
    {"deepseek", 7168, 2048, 64, 8},
    {"qwen", 4096, 1536, 64, 8},
    {"mixtral", 4096, 14336, 8, 2},
};

// splitmix64, the generator bench/torch_moe.py reimplements bit for bit.
struct SplitMix {
  uint64_t s;
  uint64_t next() {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }  // (0, 1)
};

uint64_t routing_state(uint64_t seed, int E, int k, int T) {
  return seed * 0x100000001B3ull ^ (static_cast<uint64_t>(E) << 40) ^ (static_cast<uint64_t>(k) << 32) ^
         static_cast<uint64_t>(T);
}

std::vector<int> make_counts(const std::string& routing, int T, int k, int E, uint64_t seed) {
  const long long R = static_cast<long long>(T) * k;
  std::vector<int> c(E, 0);
  if (routing == "balanced") {
    for (int e = 0; e < E; ++e) c[e] = static_cast<int>(R / E + (e < R % E ? 1 : 0));
    return c;
  }
  if (routing == "one") {
    c[0] = static_cast<int>(R);
    return c;
  }
  WEAVE_CHECK(routing == "dirichlet", "unknown routing '", routing, "' (want balanced, dirichlet or one)");
  SplitMix g{routing_state(seed, E, k, T)};
  std::vector<double> p(E);
  double sum = 0;
  for (int e = 0; e < E; ++e) p[e] = -std::log(g.uniform()), sum += p[e];
  std::vector<double> frac(E);
  long long given = 0;
  for (int e = 0; e < E; ++e) {
    const double x = static_cast<double>(R) * (p[e] / sum);
    const double f = std::floor(x);
    c[e] = static_cast<int>(f);
    frac[e] = x - f;
    given += c[e];
  }
  std::vector<int> order(E);
  for (int e = 0; e < E; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return frac[a] > frac[b]; });
  for (long long i = 0; i < R - given; ++i) ++c[order[i % E]];
  long long extra = 0;
  for (int& v : c)
    if (v > T) extra += v - T, v = T;
  for (int e = 0; extra > 0 && e < E; ++e) {
    const long long add = std::min<long long>(extra, T - c[e]);
    c[e] += static_cast<int>(add), extra -= add;
  }
  return c;
}

std::string counts_hash(const std::vector<int>& c) {
  uint64_t h = 1469598103934665603ull;
  for (int v : c) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(v));
    h *= 1099511628211ull;
  }
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

// ---------------------------------------------------------------------------------------------
// World >= 2 (weave-run -n W): moe_dispatch, moe_combine, the non-fused layer (moe_layer) and the
// fused one (moe_layer_fused: dispatch -> up GEMM -> SwiGLU -> gemm_combine; kernels/moe/layer.hpp)
// on the same shapes, T tokens per rank.
//
// Routing per token, from the counts above (bench/torch_moe.py builds the same): rank s's counts
// c[e] are make_counts(routing, T, k, E, seed_s) with seed_s = routing_seed + 7919 s, except
// "one", which puts every token's first slot on expert 0 (c[0] = T) and spreads the other
// T (k - 1) rows as "balanced" over experts 1..E-1 (a token has k distinct experts). Every
// c[e] <= T, so listing the experts' rows in expert order (expert e c[e] times) and giving list
// position p to token p % T, slot p / T gives every token k distinct experts (two positions of
// one expert are less than T apart). Weights w[t, j] = (1 + (t k + j) % 7) / 8.
// x, W_up, W_down and the expert outputs used to check combine are hash-filled bf16 values
// (k - 128) / 128 times a power of two: exact, and any rank recomputes any element on the host.
//
// Bytes that cross NVLink per rank (the issue's algorithmic bandwidth, gbs = bytes / time):
//   dispatch: H x 2 per (token, remote rank holding one of its experts) -- each token crosses
//             once per rank -- plus 16 bytes of row metadata per remote (token, slot);
//   combine:  H x 2 per (token, slot) whose expert is on a remote rank (pulled from there).
// The average over ranks; time is the slowest rank's median. tflops for moe_layer and
// moe_layer_fused counts the two grouped GEMMs of this rank's T k rows: 2 T k (2F H + H F).
//
// Checks, each made twice (recheck.hpp): on the last timed call (input set 0: tokens x, expert
// outputs y), and on one more call on input set 1 (other x and y, hash streams kX2 and kY2) made
// after the output was poisoned again, so that a kernel that leaves an earlier call's result in
// place fails; a row is correct only when both pass.
// dispatch: check() sees no failure, each rank's per-expert counts (device) equal the count
// matrix's, and 64 sampled grouped rows (the buffer poisoned before the fresh call) hold, bit for
// bit, the token of the set that their metadata names, at the row plan_dispatch gives that
// (token, slot); combine: check() sees no failure, every rank's output buffer hash-filled, the
// output (poisoned first) on 64 sampled tokens against float64 under 2^-8 |r| + 2^-19 sum |w y|
// (test_moe_exchange_gpu's bound); layer: the output (poisoned first) on 2 sampled tokens per rank
// against a float64 CPU reference of the whole layer under the bound of check/moe_ref.hpp, and no
// refused grouped GEMM launch; layer_fused: the same, and where the layer row ran too, its sampled
// rows bit for bit equal to the non-fused layer's on the same set (the fused path sums the same
// bf16 expert rows with the same code). Correctness is combined over ranks; rank 0 writes the JSON.
//
// The layer's grouped GEMMs alone (--kernels layer_gemms), for the issue's "the layer >= 0.9x the
// sum of its grouped GEMMs alone": a communication-free denominator needs the GEMMs on exactly the
// rows the layer's own GEMMs see, so each input set is dispatched once (the layer's routing, hence
// its per-expert counts) and its grouped rows copied out, the SwiGLU of their up projection kept
// as the down projection's input. moe_up_gemm (N = 2F, K = H) and moe_down_gemm (N = H, K = F) then
// time grouped_gemm alone on them (split_k 1, as the layers run it; no dispatch, SwiGLU or combine
// in the loop), checked as the one-GPU grouped rows are: every output row of this rank against a
// float32 cuBLASLt reference per expert slice under check::gemm_bound(), no refused launch, on the
// last timed call and on a fresh call on the other set. moe_layer_gemms is their sum, the slowest
// rank's up + down medians (a rank's layer cannot beat its own two GEMMs); tflops of all three use
// the layer's per-rank flop count (2 T k N K), so their ratios are time ratios. The layer rows then
// carry ratio_vs_gemms = moe_layer_gemms time / layer time (>= 0.9 is the target).

namespace world {

struct Hash {
  static __host__ __device__ uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // (k - 128) / 128 * 2^-shift, k the top byte of a splitmix64 step: exact in bf16.
  static __host__ __device__ float value(uint64_t seed, uint64_t stream, uint64_t i, int shift) {
    const uint64_t z = mix(seed ^ (stream * 0xD1B54A32D192ED03ull) ^ ((i + 1) * 0x9E3779B97F4A7C15ull));
    return static_cast<float>(static_cast<int>(z >> 56) - 128) * ldexpf(1.f, -7 - shift);
  }
};

__global__ void fill_hash(bf16* p, size_t n, uint64_t seed, uint64_t stream, uint64_t first, int shift) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16_rn(Hash::value(seed, stream, first + i, shift));
}

void fill(bf16* p, size_t n, uint64_t seed, uint64_t stream, uint64_t first, int shift, cudaStream_t st) {
  if (n == 0) return;
  fill_hash<<<1024, 256, 0, st>>>(p, n, seed, stream, first, shift);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

// Streams of the hash fill (per rank r, x and y use stream + 16 r); kX2 and kY2 are input set 1,
// the fresh calls' tokens and expert outputs.
constexpr uint64_t kX = 1, kUp = 2, kDown = 3, kY = 4, kX2 = 5, kY2 = 6;

std::vector<int> layer_counts(const std::string& routing, int T, int k, int E, uint64_t seed, int rank) {
  if (routing != "one") return make_counts(routing, T, k, E, seed + 7919ull * rank);
  std::vector<int> c(E, 0);
  c[0] = T;
  const long long rest = static_cast<long long>(T) * (k - 1);
  for (int e = 1; e < E && rest > 0; ++e) c[e] = static_cast<int>(rest / (E - 1) + (e - 1 < rest % (E - 1) ? 1 : 0));
  return c;
}

std::vector<int> topk_from_counts(const std::vector<int>& c, int T, int k) {
  std::vector<int> idx(static_cast<size_t>(T) * k);
  long long p = 0;
  for (int e = 0; e < static_cast<int>(c.size()); ++e)
    for (int n = 0; n < c[e]; ++n, ++p) idx[static_cast<size_t>(p % T) * k + p / T] = e;
  return idx;
}

float weight_of(long long i) { return static_cast<float>(1 + i % 7) / 8.f; }

// Power-of-two scales: W_up entries ~ 4.5 / sqrt(H) (g, u ~1.5 rms for x in [-1, 1)), W_down ~
// sqrt(3 / F) (y of the order of h).
int up_shift(int H) { return static_cast<int>(std::lround(std::log2(std::sqrt(double(H)) / 4.5))); }
int down_shift(int F) { return static_cast<int>(std::lround(std::log2(std::sqrt(double(F) / 3)))); }

struct Setup {
  const MoeModel* m;
  int T, W;
  std::string routing;
  std::vector<std::vector<int>> idx;  // every rank's topk_idx
  std::vector<int> matrix;            // W x E counts
  int capacity = 0;
};

Setup make_setup(const MoeModel* m, int T, int W, const std::string& routing, uint64_t rseed) {
  Setup s{m, T, W, routing, {}, {}, 0};
  const moe::Geometry g{W, m->E};
  s.matrix.assign(static_cast<size_t>(W) * m->E, 0);
  for (int r = 0; r < W; ++r) {
    s.idx.push_back(topk_from_counts(layer_counts(routing, T, m->k, m->E, rseed, r), T, m->k));
    moe::count_rows(s.idx[r].data(), T, m->k, g, s.matrix.data() + static_cast<size_t>(r) * m->E);
  }
  for (int d = 0; d < W; ++d) s.capacity = std::max(s.capacity, moe::rank_rows(s.matrix.data(), g, d));
  s.capacity = std::max(s.capacity, 1);
  return s;
}

// float64 reference of one token through the layer with its bound (check/moe_ref.hpp); returns
// the worst |out - r| / bound over the token's H outputs (inf for a non-finite output).
double layer_token_ratio(const MoeModel& m, uint64_t seed, uint64_t x_stream, int rank, int t, const int* ids,
                         const float* ws, const bf16* got) {
  const int H = m.H, F = m.F, k = m.k, su = up_shift(H), sd = down_shift(F);
  std::vector<double> x(H);
  for (int c = 0; c < H; ++c) x[c] = Hash::value(seed, x_stream + 16 * rank, static_cast<uint64_t>(t) * H + c, 0);
  check::MoeTokenRef ref(H);
  std::vector<int> seen;
  for (int j = 0; j < k; ++j) {
    const int e = ids[j];
    if (std::find(seen.begin(), seen.end(), e) != seen.end()) continue;  // its slots are summed below
    seen.push_back(e);
    double we = 0;
    for (int i = 0; i < k; ++i)
      if (ids[i] == e) we += ws[i];
    const uint64_t up0 = static_cast<uint64_t>(e) * 2 * F * H, dn0 = static_cast<uint64_t>(e) * H * F;
    const auto up = [&](int row, int c) {
      return Hash::value(seed, kUp, up0 + static_cast<uint64_t>(row) * H + c, su);
    };
    const auto down = [&](int c, int f) {
      return Hash::value(seed, kDown, dn0 + static_cast<uint64_t>(c) * F + f, sd);
    };
    ref.add(we, check::moe_expert_ref(x, H, F, up, down));
  }
  double worst = 0;
  for (int c = 0; c < H; ++c) {
    const double v = __bfloat162float(got[c]);
    if (!std::isfinite(v)) return INFINITY;
    worst = std::max(worst, std::fabs(v - ref.r[c]) / ref.bound(c));
  }
  return worst;
}

// The two tokens per rank the layer rows check against float64 (the reference costs ~3 k H F per
// token): T / 3 and the last.
int sampled_token(int T, int i) { return std::min(i == 0 ? T / 3 : T - 1, T - 1); }

template <class T>
T* dmalloc(size_t n) {
  T* p = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

// --list --world W: the world rows' routing fingerprints (no GPU), to compare with
// bench/torch_moe.py --list --world W.
int list(const Args& args, int W) {
  const uint64_t rseed = static_cast<uint64_t>(args.get_int("routing-seed", 1));
  for (const std::string& name : args.names("models", "deepseek,qwen,mixtral")) {
    const MoeModel* m = nullptr;
    for (const MoeModel& x : kMoeModels)
      if (name == x.name) m = &x;
    WEAVE_CHECK(m, "unknown model '", name, "' (want deepseek, qwen or mixtral)");
    for (long long T : args.numbers("tokens", "4096,16384"))
      for (const std::string& r : args.names("routing", "balanced,dirichlet,one")) {
        const Setup s = make_setup(m, static_cast<int>(T), W, r, rseed);
        JsonLine j;
        j.add("kernel", "moe_layer").add("model", m->name).add("T", s.T).add("world", W).add("routing", r);
        j.add("routing_hash", counts_hash(s.matrix)).add("capacity", s.capacity);
        std::printf("%s\n", j.str().c_str());
      }
  }
  return 0;
}

int run(const Args& args, int W) {
  const auto models = args.names("models", "deepseek,qwen,mixtral");
  const auto tokens = args.numbers("tokens", "4096,16384");
  const auto routings = args.names("routing", "balanced,dirichlet,one");
  const auto kernels = args.names("kernels", "dispatch,combine,layer_gemms,layer,layer_fused,dispatch_gemm");
  const uint64_t rseed = static_cast<uint64_t>(args.get_int("routing-seed", 1));
  const double target_ms = std::stod(args.get("target-ms", "60"));
  auto want = [&](const char* k) { return std::find(kernels.begin(), kernels.end(), k) != kernels.end(); };
  std::vector<Setup> setups;
  size_t heap = 0;
  for (const std::string& name : models) {
    const MoeModel* m = nullptr;
    for (const MoeModel& x : kMoeModels)
      if (name == x.name) m = &x;
    WEAVE_CHECK(m, "unknown model '", name, "' (want deepseek, qwen or mixtral)");
    WEAVE_CHECK(m->E % W == 0, "moe: ", m->E, " experts do not divide among ", W, " ranks");
    for (long long T : tokens)
      for (const std::string& r : routings) {
        setups.push_back(make_setup(m, static_cast<int>(T), W, r, rseed));
        const size_t cap = setups.back().capacity;
        // The exchange's two buffers and metadata, and gemm_combine's landing buffer (T k rows).
        heap = std::max(heap, 2 * cap * m->H * sizeof(bf16) + cap * sizeof(moe::RowMeta) +
                                  size_t(T) * m->k * m->H * sizeof(bf16));
      }
  }
  runtime::CommOptions co;
  co.heap_bytes = heap + (size_t(512) << 20);  // + the count matrices, signals and alignment
  runtime::Communicator comm(co);
  const int me = comm.rank();
  uint64_t seed = me == 0 ? check::test_seed() : 0;  // rank 0's seed everywhere
  {
    std::vector<uint64_t> all(W);
    comm.bootstrap().all_gather(&seed, all.data(), sizeof seed);
    seed = all[0];
  }
  JsonSink sink(args);
  cudaStream_t st;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  if (me == 0) {
    std::printf("moe expert parallel, world %d (dispatch / combine: GB/s of NVLink bytes per rank; layer, layer_fused: "
                "TFLOP/s of the two grouped GEMMs per rank; slowest rank's time)\n",
                W);
    std::printf("%-9s %6s %-10s %-15s %10s %10s %9s %9s\n", "model", "T", "routing", "kernel", "time_us", "GB/s",
                "TFLOP/s", "worst");
  }
  std::vector<std::string> wrong;
  auto slowest = [&](double t) {
    std::vector<double> all(W);
    comm.bootstrap().all_gather(&t, all.data(), sizeof t);
    return *std::max_element(all.begin(), all.end());
  };
  auto worst_all = [&](double v) { return slowest(std::isnan(v) ? INFINITY : v); };
  for (const Setup& s : setups) {
    const MoeModel& m = *s.m;
    const int T = s.T, H = m.H, F = m.F, E = m.E, k = m.k, L = E / W;
    const moe::Geometry g{W, E};
    moe::ExchangeConfig cf;
    cf.experts = E, cf.hidden = H, cf.topk = k, cf.max_tokens = T, cf.capacity = s.capacity;
    moe::MoeExchange ex(comm, cf);
    moe::MoeLayerScratch scratch(ex, F);
    std::unique_ptr<moe::MoeGemmCombine> gc;  // collective: every rank has the same --kernels
    if (want("layer_fused")) gc = std::make_unique<moe::MoeGemmCombine>(ex);
    bf16* x = dmalloc<bf16>(size_t(T) * H);
    bf16* x2 = dmalloc<bf16>(size_t(T) * H);  // input set 1: the fresh calls' tokens
    bf16* out = dmalloc<bf16>(size_t(T) * H);
    bf16* wup = dmalloc<bf16>(size_t(L) * 2 * F * H);
    bf16* wdown = dmalloc<bf16>(size_t(L) * H * F);
    int* idx = dmalloc<int>(size_t(T) * k);
    float* w = dmalloc<float>(size_t(T) * k);
    std::vector<float> hw(size_t(T) * k);
    for (size_t i = 0; i < hw.size(); ++i) hw[i] = weight_of(static_cast<long long>(i));
    WEAVE_CUDA_CHECK(cudaMemcpy(idx, s.idx[me].data(), hw.size() * sizeof(int), cudaMemcpyHostToDevice));
    WEAVE_CUDA_CHECK(cudaMemcpy(w, hw.data(), hw.size() * sizeof(float), cudaMemcpyHostToDevice));
    fill(x, size_t(T) * H, seed, kX + 16 * me, 0, 0, st);
    fill(x2, size_t(T) * H, seed, kX2 + 16 * me, 0, 0, st);
    fill(wup, size_t(L) * 2 * F * H, seed, kUp, size_t(me) * L * 2 * F * H, up_shift(H), st);
    fill(wdown, size_t(L) * H * F, seed, kDown, size_t(me) * L * H * F, down_shift(F), st);
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    // NVLink bytes of this rank, then their average over ranks.
    double bd = 0, bc = 0;
    for (int r = 0; r < W; ++r)
      for (int t = 0; t < T; ++t) {
        const int* row = s.idx[r].data() + size_t(t) * k;
        for (int j = 0; j < k; ++j) {
          if (g.rank_of(row[j]) == r) continue;
          bc += 2.0 * H;
          bd += 16;
          if (moe::primary_slot(row, k, g, j) == j) bd += 2.0 * H;
        }
      }
    bd /= W, bc /= W;
    const double flop = 2.0 * T * k * (2.0 * F * H + double(H) * F);
    char label[128];
    std::snprintf(label, sizeof label, "%s T %d %s", m.name, T, s.routing.c_str());
    auto row = [&](const char* kernel) {
      JsonLine j;
      j.add("kernel", kernel).add("impl", "weave").add("model", m.name).add("T", T).add("H", H).add("F", F);
      j.add("E", E).add("k", k).add("world", W).add("routing", s.routing).add("capacity", s.capacity);
      j.add("routing_hash", counts_hash(s.matrix)).add("seed", std::to_string(seed));
      return j;
    };
    auto time_here = [&](auto&& fn, double est_us) {  // this rank's median
      const int iters = std::max(3, std::min(200, static_cast<int>(target_ms * 1e3 / std::max(est_us, 1.0))));
      comm.barrier();
      return time_us(st, fn, 2, iters, 3);
    };
    auto timed = [&](auto&& fn, double est_us) { return slowest(time_here(fn, est_us)); };
    auto print = [&](const char* kernel, double t, double gbs, double tf, double worst, bool ok) {
      if (me != 0) return;
      char b1[32] = "-", b2[32] = "-";
      if (gbs > 0) std::snprintf(b1, sizeof b1, "%.1f", gbs);
      if (tf > 0) std::snprintf(b2, sizeof b2, "%.1f", tf);
      std::printf("%-9s %6d %-10s %-15s %10.1f %10s %9s %9.3g%s\n", m.name, T, s.routing.c_str(), kernel, t, b1, b2,
                  worst, ok ? "" : "  WRONG");
    };
    // Rough time estimates (µs) to size the timed loops: 200 GB/s over NVLink, 500 TFLOP/s.
    const double est_comm = std::max(bd, bc) / 200e3 + 20, est_layer = flop / 500e6 + 2 * est_comm;

    // Every row is timed on input set 0 and then checked twice (recheck.hpp): its last timed call,
    // and one fresh call on set 1 (other tokens x, other expert outputs y) into a re-poisoned
    // output. Each check is combined over ranks, so every rank takes the same path.
    struct Verdict {
      bool ok = true;
      double worst = 0;
      std::string why;
    };
    bf16* const xs[2] = {x, x2};
    const uint64_t x_stream[2] = {kX, kX2}, y_stream[2] = {kY, kY2};
    auto settle = [&] {  // no rank's call runs, every rank past this point
      WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
      comm.barrier();
    };
    auto poison_out = [&] {
      WEAVE_CUDA_CHECK(cudaMemsetAsync(out, 0xff, size_t(T) * H * sizeof(bf16), st));
      settle();
    };
    // The exchange's verdict since the last look (check()), and with `gemm` the grouped GEMMs'
    // status words: a refused call makes the row incorrect.
    auto errors = [&](bool gemm) {
      Verdict v;
      try {
        ex.check(st);
        if (gemm) moe::check_status(st);
      } catch (const Error& e) {
        v.ok = false, v.why = e.what();
      }
      return v;
    };
    auto failed = [&](const char* kernel, const Verdict& v) {
      if (!v.ok) wrong.push_back(std::string(kernel) + " " + label + (v.why.empty() ? "" : ": " + v.why));
    };

    // A combine's output (out) on 64 sampled tokens against float64, as a ratio to the bound
    // 2^-8 |r| + 2^-19 sum |w y| (test_moe_exchange_gpu's): the expert output rows y of every rank
    // a hash of input set `set` (rank, row, column), row_of(q) the row of (token, slot) q on its
    // expert's rank.
    auto combine_worst = [&](int set, auto&& row_of) {
      double worst = 0;
      std::vector<bf16> o(H);
      const int samples = std::min(T, 64);
      for (int i = 0; i < samples; ++i) {
        const int tok = samples == T ? i : static_cast<int>((static_cast<long long>(i) * 2654435761ll) % T);
        WEAVE_CUDA_CHECK(cudaMemcpy(o.data(), out + size_t(tok) * H, H * sizeof(bf16), cudaMemcpyDeviceToHost));
        for (int c = 0; c < H; ++c) {
          double r = 0, a = 0;
          for (int j = 0; j < k; ++j) {
            const size_t q = size_t(tok) * k + j;
            const int dr = g.rank_of(s.idx[me][q]);
            const double y = Hash::value(seed, y_stream[set] + 16 * dr, size_t(row_of(q)) * H + c, 0);
            r += hw[q] * y, a += std::fabs(hw[q] * y);
          }
          const double val = __bfloat162float(o[c]);
          const double bound = std::ldexp(std::fabs(r), -8) + std::ldexp(a, -19) + 1e-30;
          worst = std::isfinite(val) ? std::max(worst, std::fabs(val - r) / bound) : INFINITY;
        }
      }
      return worst;
    };

    // Dispatch. Checked: check() sees no failure, each local expert's count equals the count
    // matrix's, and 64 sampled grouped rows hold the token of set `set` their metadata names, at
    // the row plan_dispatch gives that (token, slot).
    moe::Dispatched d{};
    if (want("dispatch") || want("combine")) {
      const double t = timed([&] { d = ex.dispatch(x, idx, T, st); }, est_comm);
      std::vector<moe::DispatchPlan> plans;
      for (int r = 0; r < W; ++r) plans.push_back(moe::plan_dispatch(s.idx[r].data(), T, k, g, r, s.matrix));
      const int R = moe::rank_rows(s.matrix.data(), g, me);
      auto check_set = [&](int set) {
        Verdict v = errors(false);
        std::vector<int> got(L);
        WEAVE_CUDA_CHECK(cudaMemcpy(got.data(), d.counts, L * sizeof(int), cudaMemcpyDeviceToHost));
        for (int l = 0; l < L && v.ok; ++l)
          if (got[l] != moe::expert_rows(s.matrix.data(), g, g.expert(me, l)))
            v.ok = false, v.why = "count of local expert " + std::to_string(l);
        const int samples = std::min(R, 64);
        std::vector<bf16> rv(H);
        for (int i = 0; i < samples && v.ok; ++i) {
          const int r = samples == 1 ? 0 : static_cast<int>(static_cast<long long>(i) * (R - 1) / (samples - 1));
          moe::RowMeta mt{};
          WEAVE_CUDA_CHECK(cudaMemcpy(&mt, d.meta + r, sizeof mt, cudaMemcpyDeviceToHost));
          WEAVE_CUDA_CHECK(cudaMemcpy(rv.data(), d.rows + size_t(r) * H, H * sizeof(bf16), cudaMemcpyDeviceToHost));
          const size_t q = size_t(mt.token) * k + mt.slot;
          bool good = mt.src >= 0 && mt.src < W && mt.token >= 0 && mt.token < T && mt.slot >= 0 && mt.slot < k &&
                      g.rank_of(s.idx[mt.src][q]) == me && plans[mt.src].row[q] == r;
          int c = 0;
          for (; c < H && good; ++c)
            good = __bfloat162float(rv[c]) ==
                   Hash::value(seed, x_stream[set] + 16 * mt.src, size_t(mt.token) * H + c, 0);
          if (!good)
            v.ok = false, v.why = "grouped row " + std::to_string(r) + " (meta src " + std::to_string(mt.src) +
                                  " token " + std::to_string(mt.token) + " slot " + std::to_string(mt.slot) + ")" +
                                  (c > 0 ? ", column " + std::to_string(c - 1) : "");
        }
        v.ok = all_ranks_ok(comm, v.ok);
        return v;
      };
      const Verdict v = check_last_and_fresh(
          0, 2, check_set,
          [&] {
            WEAVE_CUDA_CHECK(
                cudaMemsetAsync(ex.expert_input(), 0xff, size_t(s.capacity) * H * sizeof(bf16), st));
            settle();
          },
          [&](int set) { d = ex.dispatch(xs[set], idx, T, st); });
      if (want("dispatch")) {
        print("moe_dispatch", t, bd / t * 1e-3, 0, 0, v.ok);
        failed("moe_dispatch", v);
        JsonLine j = row("moe_dispatch");
        j.add("time_us", t).add("gbs", bd / t * 1e-3).add("bytes", bd).add("correct", v.ok);
        if (me == 0) sink.write(j);
      }
    }
    // Combine, after the last dispatch: every rank's output buffer hash-filled (set 0 for the
    // timed calls); check() sees no failure, the output on 64 sampled tokens against float64.
    if (want("combine")) {
      auto fill_y = [&](int set) {
        fill(ex.expert_output(), size_t(s.capacity) * H, seed, y_stream[set] + 16 * me, 0, 0, st);
      };
      fill_y(0);
      poison_out();
      const double t = timed([&] { ex.combine(ex.expert_output(), w, out, T, st); }, est_comm);
      WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
      const moe::DispatchPlan plan = moe::plan_dispatch(s.idx[me].data(), T, k, g, me, s.matrix);
      auto check_set = [&](int set) {
        // ex.check synchronises st (the fresh call is still running when this is called: the
        // copies below are on the legacy stream, which does not wait for the non-blocking st) and
        // reports the exchange's verdict.
        Verdict v = errors(false);
        v.worst = worst_all(combine_worst(set, [&](size_t q) { return plan.row[q]; }));
        v.ok = all_ranks_ok(comm, v.ok) && v.worst <= 1;
        return v;
      };
      const Verdict v = check_last_and_fresh(0, 2, check_set, poison_out, [&](int set) {
        fill_y(set);
        settle();  // every rank's outputs are set `set`'s before any rank reads them
        ex.combine(ex.expert_output(), w, out, T, st);
      });
      print("moe_combine", t, bc / t * 1e-3, 0, v.worst, v.ok);
      failed("moe_combine", v);
      JsonLine j = row("moe_combine");
      j.add("time_us", t).add("gbs", bc / t * 1e-3).add("bytes", bc).add("correct", v.ok);
      if (me == 0) sink.write(add_check_worst(j, v.worst));
    }
    // The layer's two grouped GEMMs alone (--kernels layer_gemms; the header comment says why and
    // how they are checked). Before the layer rows, so that those can carry ratio_vs_gemms; their
    // buffers are freed before the layer runs.
    double t_gemms = 0;  // the slowest rank's up + down medians; 0: not run
    if (want("layer_gemms")) {
      const int Rme = moe::rank_rows(s.matrix.data(), g, me);
      std::vector<int> hc(L + 1);  // the layer's rows per local expert, then their total (SwiGLU's)
      for (int l = 0; l < L; ++l) hc[l] = moe::expert_rows(s.matrix.data(), g, g.expert(me, l));
      hc[L] = Rme;
      int* dc = dmalloc<int>(L + 1);
      WEAVE_CUDA_CHECK(cudaMemcpy(dc, hc.data(), (L + 1) * sizeof(int), cudaMemcpyHostToDevice));
      const size_t cap = s.capacity;
      bf16* gx[2] = {dmalloc<bf16>(cap * H), dmalloc<bf16>(cap * H)};  // the dispatched rows of each set
      bf16* gh[2] = {dmalloc<bf16>(cap * F), dmalloc<bf16>(cap * F)};  // their SwiGLU(up projection)
      float* ref_r = dmalloc<float>(cap * std::max(2 * F, H));
      float* ref_s = dmalloc<float>(cap * std::max(2 * F, H));
      moe::GroupedGemmOptions o;
      o.split_k = 1;  // the layers run the default 0 as 1 (layer.hpp): time the kernel they launch
      bf16* const G = scratch.up_output();
      bf16* const Y = ex.expert_output();  // where the layer's down GEMM writes
      // Each set's rows come from a real dispatch (the copy keeps them past the next dispatch); the
      // rows past Rme only feed discarded outputs, zeroed so that no stale bits reach a tile.
      Verdict prep;
      for (int set = 0; set < 2; ++set) {
        WEAVE_CUDA_CHECK(cudaMemsetAsync(gx[set], 0, cap * H * sizeof(bf16), st));
        WEAVE_CUDA_CHECK(cudaMemsetAsync(gh[set], 0, cap * F * sizeof(bf16), st));
        const moe::Dispatched dd = ex.dispatch(xs[set], idx, T, st);
        WEAVE_CUDA_CHECK(
            cudaMemcpyAsync(gx[set], dd.rows, size_t(Rme) * H * sizeof(bf16), cudaMemcpyDeviceToDevice, st));
        moe::grouped_gemm(gx[set], wup, G, dc, L, 2 * F, H, s.capacity, st, o);
        moe::swiglu(G, gh[set], dc + L, s.capacity, F, st);
        settle();
        const Verdict e = errors(true);
        if (!e.ok && prep.ok) prep = e;
      }
      prep.ok = all_ranks_ok(comm, prep.ok);
      struct GemmResult {
        double t_here;
        Verdict v;
      };
      auto gemm_row = [&](const char* kernel, const char* proj, bf16* const* in, const bf16* wt, bf16* y, int N,
                          int K) {
        const double fl = 2.0 * T * k * double(N) * K;
        lcsc::Plan plan{};
        moe::GroupedStatus stat{};
        auto call = [&](int set) { plan = moe::grouped_gemm(in[set], wt, y, dc, L, N, K, s.capacity, st, o); };
        auto poison_y = [&] {
          check::poison(y, cap * N, st);
          settle();
        };
        poison_y();
        const double th = time_here([&] { call(0); }, fl / 500e6);
        const double t = slowest(th);
        auto check_set = [&](int set) {
          Verdict v = prep;
          stat = moe::take_status(st);
          if (stat.any() && v.ok) v.ok = false, v.why = stat.message();
          check::Report rep;
          if (Rme > 0) {
            size_t off = 0;
            for (int l = 0; l < L; ++l) {
              if (hc[l] > 0)
                check::gemm_ref().run(in[set] + off * K, wt + size_t(l) * N * K, hc[l], N, K, gemm::BLayout::NK,
                                      ref_r + off * N, ref_s + off * N, false, st);
              off += hc[l];
            }
            check::sqrt_inplace(ref_s, size_t(Rme) * N, st);
            rep = check::compare({y, N}, {ref_r, N}, {ref_s, N}, Rme, N, check::gemm_bound(), 128, 128, st);
          }
          if (!rep.ok && v.ok) v.ok = false, v.why = rep.str();
          v.worst = worst_all(rep.worst);
          v.ok = all_ranks_ok(comm, v.ok);
          return v;
        };
        const Verdict v = check_last_and_fresh(0, 2, check_set, poison_y, call);
        print(kernel, t, 0, fl / t * 1e-6, v.worst, v.ok);
        failed(kernel, v);
        JsonLine j = row(kernel);
        j.add("time_us", t).add("tflops", fl / t * 1e-6).add("correct", v.ok);
        j.add("proj", proj).add("N", N).add("K", K).add("rows", T * k).add("layout", "nk");
        j.add("compute_blocks", plan.compute_blocks).add("split_k", o.split_k).add("splits", stat.splits);
        if (me == 0) sink.write(add_check_worst(j, v.worst));
        return GemmResult{th, v};
      };
      const GemmResult up = gemm_row("moe_up_gemm", "up", gx, wup, G, 2 * F, H);
      const GemmResult down = gemm_row("moe_down_gemm", "down", gh, wdown, Y, H, F);
      t_gemms = slowest(up.t_here + down.t_here);
      const bool ok = up.v.ok && down.v.ok;
      const double worst = std::max(up.v.worst, down.v.worst);
      print("moe_layer_gemms", t_gemms, 0, flop / t_gemms * 1e-6, worst, ok);
      JsonLine j = row("moe_layer_gemms");
      j.add("time_us", t_gemms).add("tflops", flop / t_gemms * 1e-6).add("correct", ok);
      j.add("sum_of", "moe_up_gemm+moe_down_gemm");
      if (me == 0) sink.write(add_check_worst(j, worst));
      settle();
      cudaFree(dc), cudaFree(gx[0]), cudaFree(gx[1]), cudaFree(gh[0]), cudaFree(gh[1]);
      cudaFree(ref_r), cudaFree(ref_s);
    }
    // The layer rows, non-fused (moe_layer) and fused (moe_layer_fused, gemm_combine), one code
    // path given the forward call: 2 sampled tokens per rank against the float64 layer reference,
    // no refused launch, and for the fused row (where the non-fused one ran) its sampled rows bit
    // for bit equal to the non-fused layer's on the same input set, kept here per set and sample.
    std::vector<bf16> layer_rows[2][2];
    auto layer_row = [&](const char* kernel, bool fused, auto&& forward /* (const bf16* x) */) {
      poison_out();
      const double t = timed([&] { forward(x); }, est_layer);
      auto check_set = [&](int set) {
        Verdict v = errors(true);
        std::vector<bf16> o(H);
        for (int i = 0; i < 2 && T > 0; ++i) {
          const int tt = sampled_token(T, i);
          WEAVE_CUDA_CHECK(cudaMemcpy(o.data(), out + size_t(tt) * H, H * sizeof(bf16), cudaMemcpyDeviceToHost));
          const size_t q = size_t(tt) * k;
          v.worst = std::max(v.worst,
                             layer_token_ratio(m, seed, x_stream[set], me, tt, s.idx[me].data() + q, hw.data() + q, o.data()));
          const std::vector<bf16>& plain = layer_rows[set][i];
          if (!fused) layer_rows[set][i] = o;
          else if (v.ok && plain.size() == o.size())
            for (int c = 0; c < H && v.ok; ++c)
              if (__bfloat16_as_ushort(o[c]) != __bfloat16_as_ushort(plain[c]))
                v.ok = false, v.why = "set " + std::to_string(set) + " token " + std::to_string(tt) + " column " +
                                      std::to_string(c) + " differs from the non-fused layer's";
        }
        v.worst = worst_all(v.worst);
        v.ok = all_ranks_ok(comm, v.ok) && v.worst <= 1;
        return v;
      };
      const Verdict v = check_last_and_fresh(0, 2, check_set, poison_out, [&](int set) { forward(xs[set]); });
      print(kernel, t, 0, flop / t * 1e-6, v.worst, v.ok);
      if (t_gemms > 0 && me == 0)
        std::printf("%-9s %6d %-10s %-15s %10.3f = moe_layer_gemms time / %s time (target >= 0.9)\n", m.name, T,
                    s.routing.c_str(), "  vs_gemms", t_gemms / t, kernel);
      failed(kernel, v);
      JsonLine j = row(kernel);
      j.add("time_us", t).add("tflops", flop / t * 1e-6).add("correct", v.ok);
      if (t_gemms > 0) j.add("ratio_vs_gemms", t_gemms / t);
      if (me == 0) sink.write(add_check_worst(j, v.worst));
    };
    if (want("layer"))
      layer_row("moe_layer", false, [&](const bf16* xin) {
        moe::moe_layer_forward(ex, scratch, xin, idx, w, T, wup, wdown, out, st);
      });
    if (want("layer_fused"))
      layer_row("moe_layer_fused", true, [&](const bf16* xin) {
        moe::moe_layer_forward_fused(ex, *gc, scratch, xin, idx, w, T, wup, wdown, out, st);
      });
    // The fused dispatch + up GEMM (--kernels dispatch_gemm; kernels/moe/dispatch_gemm.hpp):
    // moe_dispatch_gemm, and the same two steps unfused (moe_dispatch_up: dispatch, then
    // grouped_gemm) beside it; TFLOP/s of the up GEMM (2 T k 2F H per rank). Each checked on its last
    // timed call and a fresh one on input set 1 (recheck.hpp): no failure, and 16 sampled grouped
    // rows x 64 columns of the output against float64 (the row's token from its metadata, the
    // expert from the rank's offsets), under 2^-8 |r| + 2^-16 sum |x w| (a missing K step or a wrong
    // token is far outside it).
    if (want("dispatch_gemm")) {
      const double flop_up = 2.0 * T * k * 2.0 * F * H;
      const int su = up_shift(H);
      bf16* yup = scratch.up_output();
      auto poison_y = [&] {
        WEAVE_CUDA_CHECK(cudaMemsetAsync(yup, 0xff, size_t(s.capacity) * 2 * F * sizeof(bf16), st));
        settle();
      };
      auto up_row = [&](const char* kernel, auto&& call /* (const bf16* x) -> Dispatched */) {
        moe::Dispatched dd{};
        poison_y();
        const double t = timed([&] { dd = call(x); }, flop_up / 500e6 + est_comm);
        auto check_set = [&](int set) {
          Verdict v = errors(true);
          std::vector<int> offs(L + 1);
          WEAVE_CUDA_CHECK(cudaMemcpy(offs.data(), dd.offsets, (L + 1) * sizeof(int), cudaMemcpyDeviceToHost));
          const int R = offs[L], samples = std::min(R, 16);
          std::vector<bf16> yr(2 * F);
          for (int i = 0; i < samples && v.ok; ++i) {
            const int r = samples == 1 ? 0 : static_cast<int>(static_cast<long long>(i) * (R - 1) / (samples - 1));
            moe::RowMeta mt{};
            WEAVE_CUDA_CHECK(cudaMemcpy(&mt, dd.meta + r, sizeof mt, cudaMemcpyDeviceToHost));
            WEAVE_CUDA_CHECK(cudaMemcpy(yr.data(), yup + size_t(r) * 2 * F, 2 * F * sizeof(bf16), cudaMemcpyDeviceToHost));
            if (mt.src < 0 || mt.src >= W || mt.token < 0 || mt.token >= T) {
              v.ok = false, v.why = "grouped row " + std::to_string(r) + " has no token";
              break;
            }
            const int l = static_cast<int>(std::upper_bound(offs.begin(), offs.end(), r) - offs.begin()) - 1;
            const uint64_t up0 = static_cast<uint64_t>(me * L + l) * 2 * F * H;
            for (int q = 0; q < 64; ++q) {
              const int n = static_cast<int>(static_cast<long long>(q) * (2 * F - 1) / 63);
              double ref = 0, mag = 0;
              for (int c = 0; c < H; ++c) {
                const double xv = Hash::value(seed, x_stream[set] + 16 * mt.src, size_t(mt.token) * H + c, 0);
                const double wv = Hash::value(seed, kUp, up0 + static_cast<uint64_t>(n) * H + c, su);
                ref += xv * wv, mag += std::fabs(xv * wv);
              }
              const double val = __bfloat162float(yr[n]);
              const double bound = std::ldexp(std::fabs(ref), -8) + std::ldexp(mag, -16) + 1e-30;
              v.worst = std::isfinite(val) ? std::max(v.worst, std::fabs(val - ref) / bound) : INFINITY;
            }
          }
          v.worst = worst_all(v.worst);
          v.ok = all_ranks_ok(comm, v.ok) && v.worst <= 1;
          return v;
        };
        const Verdict v = check_last_and_fresh(0, 2, check_set, poison_y, [&](int set) { dd = call(xs[set]); });
        print(kernel, t, 0, flop_up / t * 1e-6, v.worst, v.ok);
        failed(kernel, v);
        JsonLine j = row(kernel);
        j.add("time_us", t).add("tflops", flop_up / t * 1e-6).add("correct", v.ok);
        if (me == 0) sink.write(add_check_worst(j, v.worst));
      };
      up_row("moe_dispatch_up", [&](const bf16* xin) {
        const moe::Dispatched dd = ex.dispatch(xin, idx, T, st);
        moe::grouped_gemm(dd.rows, wup, yup, dd.counts, L, 2 * F, H, s.capacity, st);
        return dd;
      });
      up_row("moe_dispatch_gemm",
             [&](const bf16* xin) { return moe::dispatch_gemm(ex, xin, idx, T, wup, 2 * F, yup, st); });
    }
    // The low-latency (decode) mode (--kernels ll; kernels/moe/low_latency.hpp), T <= 256 tokens per
    // rank, max_tokens = T: moe_ll is a dispatch + combine pair timed back to back (the issue's
    // decode figure), moe_ll_dispatch / moe_ll_combine the same loop split by events between the two
    // kernels (an event between them may cost the PDL overlap: their sum can exceed moe_ll).
    // NVLink bytes per rank: dispatch H x 2 per (token, remote rank holding one of its experts)
    // plus 4 k bytes of route codes per (token, remote rank); combine H x 2 per remote (token, slot).
    // Checked on its last timed call and a fresh one on input set 1 (recheck.hpp): no failure in
    // check(), every local expert's count, 64 sampled receive rows bit for bit at ll_plan's row
    // (and their metadata), 64 sampled tokens of the combine's output against float64 under
    // test_moe_exchange_gpu's bound, the expert outputs y a hash of (rank, row, column).
    if (want("ll") && T > moe::kLlMaxTokens && me == 0)
      std::printf("%-9s %6d %-10s %-15s skipped: the low-latency mode takes at most %d tokens per rank\n", m.name, T,
                  s.routing.c_str(), "moe_ll", moe::kLlMaxTokens);
    if (want("ll") && T <= moe::kLlMaxTokens) {
      moe::MoeLowLatency ll(comm, moe::LowLatencyConfig{E, H, k, T});
      const int S = ll.row_stride();
      const size_t ny = size_t(L) * S * H;
      bf16* y = dmalloc<bf16>(ny);
      std::vector<const int*> ptrs;
      for (int r = 0; r < W; ++r) ptrs.push_back(s.idx[r].data());
      const moe::LlPlan plan = moe::ll_plan(ptrs, std::vector<int>(W, T), k, g, T);
      double ld = 0, lc = 0;  // NVLink bytes, averaged over ranks
      for (int r = 0; r < W; ++r)
        for (int t = 0; t < T; ++t) {
          const int* ids = s.idx[r].data() + size_t(t) * k;
          const unsigned mask = moe::ll_dest_mask(ids, k, g);
          for (int d = 0; d < W; ++d)
            if (d != r) ld += 4.0 * k + ((mask >> d & 1u) ? 2.0 * H : 0.0);
          for (int j = 0; j < k; ++j) lc += g.rank_of(ids[j]) != r ? 2.0 * H : 0.0;
        }
      ld /= W, lc /= W;
      auto fill_y = [&](int set) { fill(y, ny, seed, y_stream[set] + 16 * me, 0, 0, st); };
      moe::LowLatencyDispatched dl{};  // pointers owned by ll, the same every call
      auto pair = [&](const bf16* xin) {
        dl = ll.dispatch(xin, idx, T, st);
        ll.combine(y, w, out, T, st);
      };
      fill_y(0);
      poison_out();
      const double t = timed([&] { pair(x); }, 2 * est_comm);
      // The same loop split by events (median over iterations of each kernel's share).
      double t_disp = 0, t_comb = 0;
      {
        const int iters = 50;
        std::vector<cudaEvent_t> ev(3 * iters);
        for (cudaEvent_t& e : ev) WEAVE_CUDA_CHECK(cudaEventCreate(&e));
        comm.barrier();
        for (int i = 0; i < iters; ++i) {
          WEAVE_CUDA_CHECK(cudaEventRecord(ev[3 * i], st));
          ll.dispatch(x, idx, T, st);
          WEAVE_CUDA_CHECK(cudaEventRecord(ev[3 * i + 1], st));
          ll.combine(y, w, out, T, st);
          WEAVE_CUDA_CHECK(cudaEventRecord(ev[3 * i + 2], st));
        }
        WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
        std::vector<double> td, tc;
        for (int i = 0; i < iters; ++i) {
          float a = 0, b = 0;
          WEAVE_CUDA_CHECK(cudaEventElapsedTime(&a, ev[3 * i], ev[3 * i + 1]));
          WEAVE_CUDA_CHECK(cudaEventElapsedTime(&b, ev[3 * i + 1], ev[3 * i + 2]));
          td.push_back(a * 1e3), tc.push_back(b * 1e3);
        }
        for (cudaEvent_t e : ev) cudaEventDestroy(e);
        t_disp = slowest(median(td)), t_comb = slowest(median(tc));
      }
      // The entries of every rank routed to this rank (the sampled receive rows come from them).
      std::vector<std::pair<int, int>> mine;  // (source rank, t k + j)
      for (int r = 0; r < W; ++r)
        for (int q = 0; q < T * k; ++q)
          if (g.rank_of(s.idx[r][q]) == me) mine.emplace_back(r, q);
      auto check_set = [&](int set) {
        Verdict v;
        try {
          ll.check(st);
        } catch (const Error& e) {
          v.ok = false, v.why = e.what();
        }
        std::vector<int> got(L);
        WEAVE_CUDA_CHECK(cudaMemcpy(got.data(), dl.counts, L * sizeof(int), cudaMemcpyDeviceToHost));
        for (int l = 0; l < L && v.ok; ++l)
          if (got[l] != plan.rows_of(me, l)) v.ok = false, v.why = "count of local expert " + std::to_string(l);
        const int samples = std::min<int>(static_cast<int>(mine.size()), 64);
        std::vector<bf16> rv(H);
        for (int i = 0; i < samples && v.ok; ++i) {
          const auto [src, q] = mine[samples == 1 ? 0 : static_cast<size_t>(i) * (mine.size() - 1) / (samples - 1)];
          const int r = plan.row[src][q], tok = q / k;
          moe::LlRowMeta mt{};
          WEAVE_CUDA_CHECK(cudaMemcpy(&mt, dl.meta + r, sizeof mt, cudaMemcpyDeviceToHost));
          WEAVE_CUDA_CHECK(cudaMemcpy(rv.data(), dl.rows + size_t(r) * H, H * sizeof(bf16), cudaMemcpyDeviceToHost));
          bool good = mt.src == src && mt.token == tok && mt.slot == q % k && mt.expert == s.idx[src][q];
          int c = 0;
          for (; c < H && good; ++c)
            good = __bfloat162float(rv[c]) == Hash::value(seed, x_stream[set] + 16 * src, size_t(tok) * H + c, 0);
          if (!good)
            v.ok = false, v.why = "receive row " + std::to_string(r) + " (rank " + std::to_string(src) + " token " +
                                  std::to_string(tok) + " slot " + std::to_string(q % k) + ")" +
                                  (c > 0 ? ", column " + std::to_string(c - 1) : "");
        }
        v.worst = worst_all(std::max(v.worst, combine_worst(set, [&](size_t q) { return plan.row[me][q]; })));
        v.ok = all_ranks_ok(comm, v.ok) && v.worst <= 1;
        return v;
      };
      const Verdict v = check_last_and_fresh(
          0, 2, check_set,
          [&] {
            WEAVE_CUDA_CHECK(cudaMemsetAsync(ll.receive_buffer(), 0xff, ny * sizeof(bf16), st));
            poison_out();
          },
          [&](int set) {
            fill_y(set);
            settle();
            pair(xs[set]);
          });
      const double gd = ld / t_disp * 1e-3, gc = lc / t_comb * 1e-3, gp = (ld + lc) / t * 1e-3;
      print("moe_ll_dispatch", t_disp, gd, 0, 0, v.ok);
      print("moe_ll_combine", t_comb, gc, 0, v.worst, v.ok);
      print("moe_ll", t, gp, 0, v.worst, v.ok);
      failed("moe_ll", v);
      const struct {
        const char* kernel;
        double t, gbs, bytes;
      } rows_ll[] = {{"moe_ll_dispatch", t_disp, gd, ld}, {"moe_ll_combine", t_comb, gc, lc}, {"moe_ll", t, gp, ld + lc}};
      for (const auto& rl : rows_ll) {
        JsonLine j = row(rl.kernel);
        j.add("time_us", rl.t).add("gbs", rl.gbs).add("bytes", rl.bytes).add("correct", v.ok);
        j.add("max_tokens", T).add("blocks", ll.blocks());
        if (me == 0) sink.write(add_check_worst(j, v.worst));
      }
      WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
      comm.barrier();
      cudaFree(y);
    }
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    comm.barrier();  // no rank frees what a peer's call may still read
    cudaFree(x), cudaFree(x2), cudaFree(out), cudaFree(wup), cudaFree(wdown), cudaFree(idx), cudaFree(w);
  }
  return exit_status("moe", wrong, seed, me == 0);
}

}  // namespace world

struct Case {
  const MoeModel* m;
  int T;
  bool up;
  int N() const { return up ? 2 * m->F : m->H; }
  int K() const { return up ? m->H : m->F; }
  int rows() const { return T * m->k; }
};

int run_moe_bench(const Args& args) {
  // Under weave-run -n W (W >= 2, or --world-rows): the expert-parallel rows; one rank: the grouped
  // GEMM rows below.
  const auto ws = weave::env::raw("WEAVE_WORLD_SIZE");  // set by weave-run; malformed: an error naming it
  const int world_size = ws ? weave::env::parse_int("WEAVE_WORLD_SIZE", *ws) : 1;
  if ((world_size > 1 || args.has("world-rows")) && !args.has("list")) return world::run(args, world_size);
  if (args.has("list") && args.has("world")) return world::list(args, static_cast<int>(args.get_int("world", 2)));
  std::vector<Case> cases;
  const auto models = args.names("models", "deepseek,qwen,mixtral");
  const auto tokens = args.numbers("tokens", "4096,16384");
  const auto projs = args.names("proj", "up,down");
  const auto routings = args.names("routing", "balanced,dirichlet,one");
  const uint64_t rseed = static_cast<uint64_t>(args.get_int("routing-seed", 1));
  for (const std::string& name : models) {
    const MoeModel* m = nullptr;
    for (const MoeModel& x : kMoeModels)
      if (name == x.name) m = &x;
    WEAVE_CHECK(m, "unknown model '", name, "' (want deepseek, qwen or mixtral)");
    for (long long T : tokens)
      for (const std::string& pj : projs) {
        WEAVE_CHECK(pj == "up" || pj == "down", "unknown --proj '", pj, "' (want up or down)");
        cases.push_back({m, static_cast<int>(T), pj == "up"});
      }
  }
  auto base_row = [&](const Case& c, const char* impl, const std::string& routing) {
    JsonLine j;
    j.add("kernel", "grouped_gemm").add("impl", impl).add("model", c.m->name).add("T", c.T).add("H", c.m->H);
    j.add("F", c.m->F).add("E", c.m->E).add("k", c.m->k).add("world", 1).add("routing", routing);
    j.add("proj", c.up ? "up" : "down").add("N", c.N()).add("K", c.K()).add("rows", c.rows()).add("layout", "nk");
    return j;
  };
  if (args.has("list")) {  // no GPU needed: the rows and the counts' fingerprints
    for (const Case& c : cases)
      for (const std::string& r : routings) {
        const auto counts = make_counts(r, c.T, c.m->k, c.m->E, rseed);
        JsonLine j = base_row(c, "weave", r);
        j.add("routing_hash", counts_hash(counts)).add("max_count", *std::max_element(counts.begin(), counts.end()));
        std::printf("%s\n", j.str().c_str());
      }
    return 0;
  }
  JsonSink sink(args);
  const double target_ms = std::stod(args.get("target-ms", "60"));
  const bool dense = !args.has("no-dense");
  moe::GroupedGemmOptions gopt;
  gopt.group_m = static_cast<int>(args.get_int("group", 0));
  gopt.split_k = static_cast<int>(args.get_int("split-k", gopt.split_k));
  const uint64_t seed = check::test_seed();
  cudaDeviceProp prop{};
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("moe grouped GEMM bf16 (fp32 accumulate), W[e] N x K, device %s, %d SMs\n", prop.name,
              prop.multiProcessorCount);
  std::printf("%-9s %6s %-4s %-10s %-11s %6s %6s %10s %9s %8s %9s\n", "model", "T", "proj", "routing", "impl", "N",
              "K", "time_us", "TFLOP/s", "vs_dense", "worst");
  check::GemmRef gref;
  cudaStream_t st = nullptr;
  std::vector<std::string> wrong;
  constexpr int kSets = 2;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    const int E = c.m->E, N = c.N(), K = c.K(), R = c.rows();
    const size_t nx = size_t(R) * K, nw = size_t(E) * N * K, ny = size_t(R) * N;
    std::vector<bf16*> X(kSets), W(kSets);
    for (int i = 0; i < kSets; ++i) {
      WEAVE_CUDA_CHECK(cudaMalloc(&X[i], nx * 2));
      WEAVE_CUDA_CHECK(cudaMalloc(&W[i], nw * 2));
      gemm::ref::fill_uniform(X[i], nx, check::derive(seed, ci, 2 * i));
      gemm::ref::fill_uniform(W[i], nw, check::derive(seed, ci, 2 * i + 1));
    }
    bf16* Y = nullptr;
    float *ref_r = nullptr, *ref_s = nullptr;
    int* dcounts = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&Y, ny * 2));
    WEAVE_CUDA_CHECK(cudaMalloc(&ref_r, ny * sizeof(float)));
    WEAVE_CUDA_CHECK(cudaMalloc(&ref_s, ny * sizeof(float)));
    WEAVE_CUDA_CHECK(cudaMalloc(&dcounts, E * sizeof(int)));
    const double flop = 2.0 * R * double(N) * K;
    const int iters = std::max(3, std::min(200, static_cast<int>(target_ms * 1e-3 / (flop / 600e12))));
    char label[96];
    std::snprintf(label, sizeof label, "%s T %d %s", c.m->name, c.T, c.up ? "up" : "down");

    // Dense GEMM of equal flops: X (R x K) times expert 0's weight.
    double t_dense = 0;
    if (dense) {
      int it = 0, last = 0;
      auto call = [&] {
        last = it++ % kSets;
        gemm::gemm(X[last], W[last], Y, R, N, K, gemm::BLayout::NK, {}, st);
      };
      check::poison(Y, ny, st);
      t_dense = time_us(st, call, 3, iters, 5);
      auto check_set = [&](int set) {
        gref.run(X[set], W[set], R, N, K, gemm::BLayout::NK, ref_r, ref_s, false, st);
        check::sqrt_inplace(ref_s, ny, st);
        return check::compare({Y, N}, {ref_r, N}, {ref_s, N}, R, N, check::gemm_bound(), 128, 128, st);
      };
      const check::Report rep = check_last_and_fresh(last, kSets, check_set, [&] { check::poison(Y, ny, st); },
                                                     [&](int set) {
                                                       it = set;
                                                       call();
                                                     });
      std::printf("%-9s %6d %-4s %-10s %-11s %6d %6d %10.1f %9.1f %8s %9.3g%s\n", c.m->name, c.T, c.up ? "up" : "down",
                  "-", "weave_dense", N, K, t_dense, flop / t_dense * 1e-6, "1.000", rep.worst, rep.ok ? "" : "  WRONG");
      if (!rep.ok) wrong.push_back(std::string("weave_dense ") + label + ": " + rep.str());
      JsonLine j = base_row(c, "weave_dense", "none");
      j.add("time_us", t_dense).add("tflops", flop / t_dense * 1e-6).add("correct", rep.ok);
      j.add("seed", std::to_string(seed));
      sink.write(add_check_worst(j, rep.worst));
    }

    for (const std::string& routing : routings) {
      const std::vector<int> counts = make_counts(routing, c.T, c.m->k, E, rseed);
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(dcounts, counts.data(), E * sizeof(int), cudaMemcpyHostToDevice, st));
      int it = 0, last = 0;
      lcsc::Plan plan{};
      auto call = [&] {
        last = it++ % kSets;
        plan = moe::grouped_gemm(X[last], W[last], Y, dcounts, E, N, K, R, st, gopt);
      };
      check::poison(Y, ny, st);
      const double t = time_us(st, call, 3, iters, 5);
      // The output against each expert's slice of set `set`, and no refused launch since the last look.
      struct Checked {
        bool ok;
        double worst;
        check::Report rep;
        moe::GroupedStatus status;
      };
      auto check_set = [&](int set) {
        const moe::GroupedStatus status = moe::take_status(st);
        int off = 0;
        for (int e = 0; e < E; ++e) {
          if (counts[e] > 0)
            gref.run(X[set] + size_t(off) * K, W[set] + size_t(e) * N * K, counts[e], N, K, gemm::BLayout::NK,
                     ref_r + size_t(off) * N, ref_s + size_t(off) * N, false, st);
          off += counts[e];
        }
        check::sqrt_inplace(ref_s, ny, st);
        const check::Report rep =
            check::compare({Y, N}, {ref_r, N}, {ref_s, N}, R, N, check::gemm_bound(), 128, 128, st);
        return Checked{rep.ok && !status.any(), rep.worst, rep, status};
      };
      const Checked chk = check_last_and_fresh(last, kSets, check_set, [&] { check::poison(Y, ny, st); },
                                               [&](int set) {
                                                 it = set;
                                                 call();
                                               });
      const check::Report& rep = chk.rep;
      const moe::GroupedStatus& status = chk.status;
      const bool ok = chk.ok;
      const double tf = flop / t * 1e-6;
      const double vs_dense = dense ? t_dense / t : 0;
      char vd[16];
      std::snprintf(vd, sizeof vd, dense ? "%.3f" : "-", vs_dense);
      std::printf("%-9s %6d %-4s %-10s %-11s %6d %6d %10.1f %9.1f %8s %9.3g %4d blocks, split %d%s\n", c.m->name,
                  c.T, c.up ? "up" : "down", routing.c_str(), "weave", N, K, t, tf, vd, rep.worst, plan.compute_blocks,
                  status.splits, ok ? "" : "  WRONG");
      if (!ok)
        wrong.push_back(std::string("weave ") + label + " " + routing + ": " +
                        (status.any() ? status.message() : rep.str()));
      JsonLine j = base_row(c, "weave", routing);
      j.add("time_us", t).add("tflops", tf).add("correct", ok).add("seed", std::to_string(seed));
      j.add("routing_hash", counts_hash(counts)).add("max_count", *std::max_element(counts.begin(), counts.end()));
      j.add("compute_blocks", plan.compute_blocks).add("split_k", gopt.split_k).add("splits", status.splits);
      if (dense) j.add("ratio_vs_dense", vs_dense);
      sink.write(add_check_worst(j, rep.worst));
    }
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    for (int i = 0; i < kSets; ++i) cudaFree(X[i]), cudaFree(W[i]);
    cudaFree(Y), cudaFree(ref_r), cudaFree(ref_s), cudaFree(dcounts);
  }
  return exit_status("moe", wrong, seed);
}

}  // namespace

WEAVE_BENCH(moe,
            "MoE grouped GEMM (one GPU) on DeepSeek/Qwen/Mixtral-like shapes, up and down projections, balanced, "
            "Dirichlet and all-to-one routings, beside a dense GEMM of equal flops (--models --tokens --proj "
            "--routing --routing-seed --target-ms --group G --split-k S --no-dense; --list prints the rows and routing hashes, no GPU); "
            "under weave-run -n W >= 2: moe_dispatch / moe_combine (GB/s) and the layer, non-fused and fused "
            "(gemm_combine), the layer's up and down grouped GEMMs alone on its dispatched rows, dispatch_gemm "
            "(--kernels dispatch,combine,layer_gemms,layer,layer_fused,dispatch_gemm; --world-rows: at W = 1 too)"
            "; --kernels ll: the low-latency decode mode's dispatch + combine (--tokens <= 256)",
            run_moe_bench);
