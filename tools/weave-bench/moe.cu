// weave-bench moe: the MoE grouped GEMM (kernels/moe/grouped_gemm.hpp) on the issue-21 shapes, one
// GPU, beside a dense weave GEMM of equal flops (the issue's reference ratio).
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
// Any incorrect row makes the exit status 1. Inputs derive from WEAVE_TEST_SEED (printed).
//
//   weave-bench moe [--json FILE] [--models deepseek,qwen,mixtral] [--tokens 4096,16384]
//                   [--proj up,down] [--routing balanced,dirichlet,one] [--routing-seed S]
//                   [--target-ms T] [--group G] [--no-dense] [--list]
// --group: tile rows per raster group inside an expert (0: the dense GEMM's default for K).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "gemm/reference.cuh"
#include "moe/grouped_gemm.hpp"

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

struct Case {
  const MoeModel* m;
  int T;
  bool up;
  int N() const { return up ? 2 * m->F : m->H; }
  int K() const { return up ? m->H : m->F; }
  int rows() const { return T * m->k; }
};

int run_moe_bench(const Args& args) {
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
      gref.run(X[last], W[last], R, N, K, gemm::BLayout::NK, ref_r, ref_s, false, st);
      check::sqrt_inplace(ref_s, ny, st);
      const check::Report rep = check::compare({Y, N}, {ref_r, N}, {ref_s, N}, R, N, check::gemm_bound(), 128, 128, st);
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
      const moe::GroupedStatus status = moe::take_status(st);
      int off = 0;
      for (int e = 0; e < E; ++e) {
        if (counts[e] > 0)
          gref.run(X[last] + size_t(off) * K, W[last] + size_t(e) * N * K, counts[e], N, K, gemm::BLayout::NK,
                   ref_r + size_t(off) * N, ref_s + size_t(off) * N, false, st);
        off += counts[e];
      }
      check::sqrt_inplace(ref_s, ny, st);
      const check::Report rep = check::compare({Y, N}, {ref_r, N}, {ref_s, N}, R, N, check::gemm_bound(), 128, 128, st);
      const bool ok = rep.ok && !status.any();
      const double tf = flop / t * 1e-6;
      const double vs_dense = dense ? t_dense / t : 0;
      char vd[16];
      std::snprintf(vd, sizeof vd, dense ? "%.3f" : "-", vs_dense);
      std::printf("%-9s %6d %-4s %-10s %-11s %6d %6d %10.1f %9.1f %8s %9.3g %4d blocks%s\n", c.m->name, c.T,
                  c.up ? "up" : "down", routing.c_str(), "weave", N, K, t, tf, vd, rep.worst, plan.compute_blocks,
                  ok ? "" : "  WRONG");
      if (!ok)
        wrong.push_back(std::string("weave ") + label + " " + routing + ": " +
                        (status.any() ? status.message() : rep.str()));
      JsonLine j = base_row(c, "weave", routing);
      j.add("time_us", t).add("tflops", tf).add("correct", ok).add("seed", std::to_string(seed));
      j.add("routing_hash", counts_hash(counts)).add("max_count", *std::max_element(counts.begin(), counts.end()));
      j.add("compute_blocks", plan.compute_blocks);
      if (dense) j.add("ratio_vs_dense", vs_dense);
      sink.write(add_check_worst(j, rep.worst));
    }
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    for (int i = 0; i < kSets; ++i) cudaFree(X[i]), cudaFree(W[i]);
    cudaFree(Y), cudaFree(ref_r), cudaFree(ref_s), cudaFree(dcounts);
  }
  if (!wrong.empty()) {
    std::fprintf(stderr, "weave-bench moe: %zu incorrect row(s) (replay with WEAVE_TEST_SEED=%llu):\n", wrong.size(),
                 static_cast<unsigned long long>(seed));
    for (const auto& w : wrong) std::fprintf(stderr, "  %s\n", w.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

WEAVE_BENCH(moe,
            "MoE grouped GEMM (one GPU) on DeepSeek/Qwen/Mixtral-like shapes, up and down projections, balanced, "
            "Dirichlet and all-to-one routings, beside a dense GEMM of equal flops (--models --tokens --proj "
            "--routing --routing-seed --target-ms --group G --no-dense; --list prints the rows and routing hashes, no GPU)",
            run_moe_bench);
