// weave-bench swapped_sweep: every launch configuration of the swapped decode tile
// (kernels/gemm/swapped_schedule.hpp: strips per block x warps x chunks in flight) on decode
// shapes, beside cuBLASLt and weave's own choice (gemm() with the planner), at power-capped clocks.
// The data swapped::config() was fitted to (docs/perf-notes.md, "swapped").
//
//   weave-bench swapped_sweep [--tokens 1,8,16] [--shapes NxK,...] [--heat N] [--dtype bf16|fp8] [--json FILE]
//
// --dtype fp8: e4m3 x e4m3 with per-tensor scales (the fp8 GEMM's decode path, kernels/gemm_fp8),
// against cuBLASLt fp8 with fast accumulation, checked with the fp8 tensor-core bound.
//
// Inputs rotate over enough sets that no weight byte is an L2 hit; before each shape N calls of a
// cuBLAS 8192^3 GEMM (default 200, ~0.3 s) bring the card to the clocks it runs at inside a
// benchmark set. Each configuration's last timed call is checked (poisoned first) against the fp32
// reference of its inputs, per 128 x 128 tile, like weave-bench gemm; the command exits 1 when any
// row is over the bound.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.hpp"
#include "check/gemm_fp8_ref.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "check/gemm_baseline.cuh"
#include "gemm/swapped_launch.cuh"
#include "gemm_fp8/gemm_fp8.hpp"
#include "check/gemm_fp8_baseline.cuh"

namespace weave::bench {
namespace {

using bf16 = __nv_bfloat16;
using gemm::swapped::Config;
using gemm::swapped::Params;

template <class Op, int NB, int S, int W, int D>
void launch_v(const Params& p, cudaStream_t st) {
  gemm::swapped::run<Op, NB, S, W, D, bf16>(p, st);
}
using Fp8Op = gemm::swapped::Fp8Op<false, false>;
struct Variant {
  Config c;
  void (*one)(const Params&, cudaStream_t);  // one token block, bf16
  void (*two)(const Params&, cudaStream_t);  // two
  void (*one8)(const Params&, cudaStream_t);  // fp8 e4m3
  void (*two8)(const Params&, cudaStream_t);
};
#define WEAVE_SWAPPED_VARIANT(S, W, D)                                                                 \
  Variant {                                                                                            \
    {S, W, D}, launch_v<gemm::swapped::Bf16Op, 1, S, W, D>, launch_v<gemm::swapped::Bf16Op, 2, S, W, D>, \
        launch_v<Fp8Op, 1, S, W, D>, launch_v<Fp8Op, 2, S, W, D>                                       \
  }
const Variant kVariants[] = {WEAVE_SWAPPED_VARIANT(1, 4, 1), WEAVE_SWAPPED_VARIANT(1, 8, 1),
                             WEAVE_SWAPPED_VARIANT(1, 16, 1), WEAVE_SWAPPED_VARIANT(1, 4, 2),
                             WEAVE_SWAPPED_VARIANT(1, 8, 2), WEAVE_SWAPPED_VARIANT(1, 16, 2),
                             WEAVE_SWAPPED_VARIANT(2, 4, 1), WEAVE_SWAPPED_VARIANT(2, 8, 1),
                             WEAVE_SWAPPED_VARIANT(2, 16, 1), WEAVE_SWAPPED_VARIANT(2, 4, 2),
                             WEAVE_SWAPPED_VARIANT(2, 8, 2), WEAVE_SWAPPED_VARIANT(2, 16, 2)};
#undef WEAVE_SWAPPED_VARIANT

std::string config_name(const Config& c) {
  return "s" + std::to_string(c.strips_per_block) + "w" + std::to_string(c.warps) + "d" + std::to_string(c.depth);
}

int run(const Args& args) {
  std::vector<long long> tokens = args.numbers("tokens", "1,8,16");
  std::vector<std::pair<int, int>> nk;
  if (args.has("shapes")) {
    std::string s = args.get("shapes");
    for (size_t pos = 0; pos < s.size();) {
      const size_t end = std::min(s.find(',', pos), s.size());
      const std::string t = s.substr(pos, end - pos);
      const size_t x = t.find('x');
      WEAVE_CHECK(x != std::string::npos, "swapped_sweep: --shapes wants NxK,..., got ", t);
      nk.push_back({std::stoi(t.substr(0, x)), std::stoi(t.substr(x + 1))});
      pos = end + 1;
    }
  } else {
    nk = {{11008, 4096}, {4096, 11008}, {14336, 4096}, {4096, 14336}, {18432, 7168}, {7168, 18432}, {28672, 8192},
          {8192, 28672}, {13824, 5120}, {5120, 13824}, {53248, 16384}, {16384, 53248}, {2048, 8192}, {1024, 8192}};
  }
  for (long long M : tokens)
    WEAVE_CHECK(M >= 1 && M <= gemm::swapped::kMaxTokens, "swapped_sweep: --tokens must be 1..",
                gemm::swapped::kMaxTokens, ", got ", M);
  const int heat_calls = static_cast<int>(args.get_int("heat", 200));
  const std::string dtype = args.get("dtype", "bf16");
  WEAVE_CHECK(dtype == "bf16" || dtype == "fp8", "swapped_sweep: --dtype bf16 or fp8, got ", dtype);
  const bool fp8 = dtype == "fp8";
  const int eb = fp8 ? 1 : 2;  // bytes per element
  const gemm_fp8::ref::Lt lt8(64ull << 20);
  check::Fp8GemmRef ref8;
  float* one = nullptr;  // the per-tensor scales, 1.0 (the kernel reads them on the device)
  WEAVE_CUDA_CHECK(cudaMalloc(&one, sizeof(float)));
  const float h1 = 1.f;
  WEAVE_CUDA_CHECK(cudaMemcpy(one, &h1, sizeof(float), cudaMemcpyHostToDevice));
  JsonSink sink(args);
  const uint64_t seed = check::test_seed();
  cudaStream_t st = nullptr;
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  gemm::ref::CublasLt lt;
  check::GemmRef gref32;
  const size_t hn = size_t(8192) * 8192;
  bf16 *ha, *hb, *hc;
  WEAVE_CUDA_CHECK(cudaMalloc(&ha, hn * 2));
  WEAVE_CUDA_CHECK(cudaMalloc(&hb, hn * 2));
  WEAVE_CUDA_CHECK(cudaMalloc(&hc, hn * 2));
  gemm::ref::fill_uniform(ha, hn, 1), gemm::ref::fill_uniform(hb, hn, 2);
  auto heat = [&](int n) {
    for (int i = 0; i < n; ++i) lt.run(ha, hb, hc, 8192, 8192, 8192, gemm::BLayout::NK, false, st);
  };
  heat(10 * heat_calls);
  std::printf("swapped decode tile sweep, %d SMs (us; the configuration swapped::config picks is marked *)\n", sms);
  std::vector<std::string> wrong;
  for (size_t si = 0; si < tokens.size() * nk.size(); ++si) {
    const int M = static_cast<int>(tokens[si / nk.size()]), N = nk[si % nk.size()].first, K = nk[si % nk.size()].second;
    const size_t wbytes = size_t(N) * K * eb, nc = size_t(M) * N;
    const int sets = std::max<int>(2, static_cast<int>((size_t(200) << 20) / wbytes) + 1);
    std::vector<bf16*> W(sets), X(sets);  // fp8: the same buffers hold bytes
    for (int i = 0; i < sets; ++i) {
      WEAVE_CUDA_CHECK(cudaMalloc(&W[i], wbytes));
      WEAVE_CUDA_CHECK(cudaMalloc(&X[i], size_t(M) * K * eb));
      if (fp8) {
        check::fill_fp8_uniform(W[i], false, size_t(N) * K, check::derive(seed, si, 2 * i), 4.f);
        check::fill_fp8_uniform(X[i], false, size_t(M) * K, check::derive(seed, si, 2 * i + 1), 4.f);
      } else {
        gemm::ref::fill_uniform(W[i], size_t(N) * K, check::derive(seed, si, 2 * i));
        gemm::ref::fill_uniform(X[i], size_t(M) * K, check::derive(seed, si, 2 * i + 1));
      }
    }
    bf16* C = nullptr;
    float *ref_r = nullptr, *ref_s = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&C, nc * 2));
    WEAVE_CUDA_CHECK(cudaMalloc(&ref_r, nc * 4));
    WEAVE_CUDA_CHECK(cudaMalloc(&ref_s, nc * 4));
    int last = -1, it = 0;
    auto timed = [&](auto&& call) {
      it = 0;
      check::poison(C, nc, st);
      return time_us(
          st, [&] { call(last = it++ % sets); }, 5, 200, 3);
    };
    auto check_last = [&] {
      if (fp8)
        ref8.run(X[last], false, W[last], false, M, N, K, one, one, ref_r, ref_s, st);
      else
        gref32.run(X[last], W[last], M, N, K, gemm::ALayout::MK, gemm::BLayout::NK, ref_r, ref_s, false, st);
      check::sqrt_inplace(ref_s, nc, st);
      return check::compare({C, N}, {ref_r, N}, {ref_s, N}, M, N,
                            fp8 ? check::fp8_tensor_core_bound(K) : check::gemm_bound(), 128, 128, st);
    };
    auto emit = [&](const char* impl, const std::string& config, double t, const check::Report& rep) {
      JsonLine j;
      j.add("kernel", "gemm_swapped_sweep").add("impl", impl).add("dtype", dtype).add("M", M).add("N", N).add("K", K);
      j.add("config", config).add("time_us", t).add("gbs", wbytes / t * 1e-3).add("correct", rep.ok);
      j.add("seed", std::to_string(seed));
      sink.write(add_check_worst(j, rep.worst));
      if (!rep.ok) wrong.push_back(std::string(impl) + " " + config + " " + std::to_string(M) + "x" + std::to_string(N) +
                                   "x" + std::to_string(K));
    };
    heat(heat_calls);
    double tl = 0, ta = 0;
    std::string used;
    if (fp8) {
      const gemm_fp8::ref::TnMatmul m8(lt8, M, N, K, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, true,
                                       {gemm_fp8::ref::Scales{one, one}});
      WEAVE_CHECK(m8.ok(), "swapped_sweep: no cuBLASLt fp8 algorithm for ", M, "x", N, "x", K);
      tl = timed([&](int i) { m8.run(X[i], W[i], C, st); });
      emit("cublaslt", "-", tl, check_last());
      const gemm_fp8::Options o8;
      used = gemm_fp8::launch_name(gemm_fp8::choose_launch(M, N, K, o8));
      ta = timed([&](int i) {
        gemm_fp8::gemm(X[i], gemm_fp8::Fp8::E4M3, W[i], gemm_fp8::Fp8::E4M3, C, M, N, K, one, one, o8, st);
      });
    } else {
      tl = timed([&](int i) { lt.run(X[i], W[i], C, M, N, K, gemm::BLayout::NK, false, st); });
      emit("cublas", "-", tl, check_last());
      gemm::Options o;
      used = gemm::launch_name(gemm::choose_launch(M, N, K, gemm::BLayout::NK, o));
      ta = timed([&](int i) { gemm::gemm(X[i], W[i], C, M, N, K, gemm::BLayout::NK, o, st); });
    }
    emit("weave", used, ta, check_last());
    std::printf("%3dx%6dx%6d %s %7.1f weave(%s) %7.1f |", M, N, K, fp8 ? "cublaslt" : "cublas", tl, used.c_str(), ta);
    const Config pick = fp8 ? gemm::swapped::config_fp8(M, N, K, sms) : gemm::swapped::config(M, N, K, sms);
    for (const Variant& v : kVariants) {
      auto f = gemm::swapped::token_blocks(M) == 1 ? (fp8 ? v.one8 : v.one) : (fp8 ? v.two8 : v.two);
      const double t = timed([&](int i) {
        f(Params{X[i], W[i], C, nullptr, 0, 0, M, N, K, fp8 ? one : nullptr, fp8 ? one : nullptr}, st);
      });
      WEAVE_CUDA_CHECK(cudaGetLastError());
      const check::Report rep = check_last();
      const bool picked = v.c.strips_per_block == pick.strips_per_block && v.c.warps == pick.warps &&
                          v.c.depth == pick.depth;
      emit("variant", config_name(v.c) + (picked ? "*" : ""), t, rep);
      std::printf(" %s%s %.1f%s", config_name(v.c).c_str(), picked ? "*" : "", t, rep.ok ? "" : " WRONG");
    }
    std::printf("\n");
    std::fflush(stdout);
    for (int i = 0; i < sets; ++i) cudaFree(W[i]), cudaFree(X[i]);
    cudaFree(C), cudaFree(ref_r), cudaFree(ref_s);
  }
  cudaFree(ha), cudaFree(hb), cudaFree(hc), cudaFree(one);
  return exit_status("swapped_sweep", wrong, seed);
}

}  // namespace

WEAVE_BENCH(swapped_sweep,
            "every launch configuration of the swapped decode GEMM tile on decode shapes, beside cuBLASLt and the "
            "planner's choice (--tokens 1,8,16 --shapes NxK,... --heat N --dtype bf16|fp8)",
            run);

}  // namespace weave::bench
