// weave-bench attention: the single-GPU attention forward (bf16, B*S tokens, H heads), weave
// only; bench/torch_attention.py times cuDNN SDPA for the same shapes into the same JSON file.
// Correctness first on every shape (output poisoned, every element finite, sampled rows and
// their LSE against float64 on the CPU), then timing. TFLOP/s counts 4*B*S^2*H*D, halved for
// causal.
//
//   weave-bench attention [--json FILE] [--seqs 4096,8192,16384,32768] [--tokens 65536]
//                         [--heads 16] [--kv-heads H] [--d 64,128] [--causal 0,1]
//                         [--variants auto,persistent,pingpong,basic] [--target-ms T]
//                         [--section-heads 0,1,16]  (tile-order sections; 0 = from L2)
// Variants: auto = the library default (Options::Schedule::Auto, ping-pong); persistent =
// ping-pong + persistent CTAs; pingpong = one CTA per tile with ping-pong; basic = one CTA per
// tile, no ping-pong.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attention/attention.hpp"
#include "bench.hpp"
#include "gemm/reference.cuh"
#include "nonfinite.cuh"

using namespace weave;
using namespace weave::bench;
using bf16 = __nv_bfloat16;

namespace {


// Max abs error of sampled O rows and max relative error of their LSE against float64.
void check_rows(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse,
                const attention::Shape& s, bool causal, double& o_err, double& l_err) {
  std::mt19937 g(s.S * 31 + s.D + causal);
  const int D = s.D, grp = s.Hq / s.Hkv;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<bf16> kr(size_t(s.S) * D), vr(size_t(s.S) * D), qr(D), orow(D);
  o_err = l_err = 0;
  for (int t = 0; t < 6; ++t) {
    const int b = g() % s.B, h = g() % s.Hq, hk = h / grp;
    const int i = t == 0 ? s.S - 1 : (t == 1 ? 0 : int(g() % s.S));
    const size_t kv_pitch = size_t(s.Hkv) * D * 2, q_pitch = size_t(s.Hq) * D * 2;
    WEAVE_CUDA_CHECK(cudaMemcpy2D(kr.data(), D * 2, k + (size_t(b) * s.S * s.Hkv + hk) * D, kv_pitch, D * 2, s.S,
                                  cudaMemcpyDeviceToHost));
    WEAVE_CUDA_CHECK(cudaMemcpy2D(vr.data(), D * 2, v + (size_t(b) * s.S * s.Hkv + hk) * D, kv_pitch, D * 2, s.S,
                                  cudaMemcpyDeviceToHost));
    const size_t row = (size_t(b) * s.S + i) * s.Hq + h;
    WEAVE_CUDA_CHECK(cudaMemcpy(qr.data(), q + row * D, D * 2, cudaMemcpyDeviceToHost));
    WEAVE_CUDA_CHECK(cudaMemcpy(orow.data(), o + row * D, D * 2, cudaMemcpyDeviceToHost));
    float l = 0;
    WEAVE_CUDA_CHECK(cudaMemcpy(&l, lse + (size_t(b) * s.Hq + h) * s.S + i, 4, cudaMemcpyDeviceToHost));
    (void)q_pitch;
    const int jmax = causal ? i : s.S - 1;
    std::vector<double> sc(jmax + 1), acc(D, 0.0);
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j <= jmax; ++j) {
      double a = 0;
      for (int d = 0; d < D; ++d) a += double(__bfloat162float(qr[d])) * __bfloat162float(kr[size_t(j) * D + d]);
      sc[j] = a * scale;
      mx = std::max(mx, sc[j]);
    }
    for (int j = 0; j <= jmax; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
    for (int j = 0; j <= jmax; ++j)
      for (int d = 0; d < D; ++d) acc[d] += sc[j] / sum * __bfloat162float(vr[size_t(j) * D + d]);
    for (int d = 0; d < D; ++d) {
      const double x = __bfloat162float(orow[d]);
      o_err = std::isfinite(x) ? std::max(o_err, std::fabs(x - acc[d])) : INFINITY;
    }
    const double rl = mx + std::log(sum);
    l_err = std::max(l_err, std::isfinite(l) ? std::fabs(l - rl) / std::max(1.0, std::fabs(rl)) : INFINITY);
  }
}

int run_attention_bench(const Args& args) {
  JsonSink sink(args);
  const auto seqs = args.numbers("seqs", "4096,8192,16384,32768");
  const auto ds = args.numbers("d", "128,64");
  const auto causals = args.numbers("causal", "0,1");
  const long long tokens = args.get_int("tokens", 65536);
  const int H = static_cast<int>(args.get_int("heads", 16));
  const int Hkv = static_cast<int>(args.get_int("kv-heads", H));
  const double target_ms = std::stod(args.get("target-ms", "40"));
  const auto sections = args.numbers("section-heads", "0");
  std::vector<std::string> variants;
  {
    std::stringstream ss(args.get("variants", "auto"));
    std::string item;
    while (std::getline(ss, item, ',')) {
      WEAVE_CHECK(item == "auto" || item == "persistent" || item == "pingpong" || item == "basic",
                  "unknown variant '", item, "' (auto, persistent, pingpong, basic)");
      variants.push_back(item);
    }
  }
  std::vector<std::pair<std::string, int>> runs;  // (variant, heads per section), every pair
  for (const std::string& var : variants)
    for (const long long G : sections) runs.emplace_back(var, static_cast<int>(G));

  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("attention forward bf16, %lld tokens, H=%d (kv %d), device %s, %d SMs\n", tokens, H, Hkv, prop.name,
              prop.multiProcessorCount);
  std::printf("%4s %6s %3s %7s %-6s %-10s %10s %9s %9s %9s\n", "D", "S", "B", "causal", "impl", "var", "time_us",
              "TFLOP/s", "o_err", "lse_err");
  cudaStream_t st = nullptr;
  bool all_ok = true;
  for (const long long D_ : ds)
    for (const long long S_ : seqs) {
      const int D = static_cast<int>(D_), S = static_cast<int>(S_);
      const int B = static_cast<int>(std::max(1LL, tokens / S));
      const attention::Shape sh{B, S, H, Hkv, D};
      const size_t nq = size_t(B) * S * H * D, nk = size_t(B) * S * Hkv * D, nl = size_t(B) * H * S;
      bf16 *q, *k, *v, *o;
      float* lse;
      WEAVE_CUDA_CHECK(cudaMalloc(&q, nq * 2));
      WEAVE_CUDA_CHECK(cudaMalloc(&k, nk * 2));
      WEAVE_CUDA_CHECK(cudaMalloc(&v, nk * 2));
      WEAVE_CUDA_CHECK(cudaMalloc(&o, nq * 2));
      WEAVE_CUDA_CHECK(cudaMalloc(&lse, nl * 4));
      gemm::ref::fill_uniform(q, nq, 11 + S + D);
      gemm::ref::fill_uniform(k, nk, 12 + S + D);
      gemm::ref::fill_uniform(v, nk, 13 + S + D);
      for (const long long causal_ : causals) {
        const int causal = static_cast<int>(causal_);
        for (const auto& [var, G] : runs) {
          attention::Options opt;
          opt.heads_per_section = G;
          opt.causal = causal != 0;
          opt.pingpong = var != "basic";
          opt.schedule = var == "auto"         ? attention::Options::Schedule::Auto
                         : var == "persistent" ? attention::Options::Schedule::Persistent
                                               : attention::Options::Schedule::PerTile;
          gemm::ref::poison(o, nq);
          WEAVE_CUDA_CHECK(cudaMemset(lse, 0xFF, nl * 4));
          attention::forward(q, k, v, o, lse, sh, opt, st);
          const unsigned long long bad = count_nonfinite(o, nq, st);
          double o_err = 0, l_err = 0;
          check_rows(q, k, v, o, lse, sh, opt.causal, o_err, l_err);
          const bool ok = bad == 0 && o_err < 2e-2 && l_err < 2e-3;
          all_ok = all_ok && ok;
          const double flop = attention::flops(sh, opt.causal);
          const int iters = std::max(2, std::min(100, static_cast<int>(target_ms * 1e-3 / (flop / 550e12))));
          const double t = time_us(st, [&] { attention::forward(q, k, v, o, lse, sh, opt, st); }, 2, iters, 3);
          const double tf = flop / t * 1e-6;
          const std::string label = G > 0 ? var + "/G" + std::to_string(G) : var;
          std::printf("%4d %6d %3d %7d %-6s %-10s %10.1f %9.1f %9.2e %9.2e%s\n", D, S, B, causal, "weave",
                      label.c_str(), t, tf, o_err, l_err, ok ? "" : (bad ? "  NONFINITE" : "  WRONG"));
          std::fflush(stdout);
          sink.write(JsonLine()
                         .add("kernel", "attention")
                         .add("impl", "weave")
                         .add("variant", var)
                         .add("heads_per_section", G)
                         .add("B", B)
                         .add("S", S)
                         .add("H", H)
                         .add("H_kv", Hkv)
                         .add("D", D)
                         .add("causal", causal != 0)
                         .add("world", 1)
                         .add("time_us", t)
                         .add("tflops", tf)
                         .add("o_max_err", o_err)
                         .add("lse_rel_err", l_err)
                         .add("correct", ok));
        }
      }
      cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse);
    }
  return all_ok ? 0 : 1;
}

}  // namespace

WEAVE_BENCH(attention,
            "attention forward, single GPU (--seqs 4096,... --tokens 65536 --heads 16 --kv-heads H --d 64,128 "
            "--causal 0,1 --variants auto,persistent,pingpong,basic --section-heads 0,1,...)",
            run_attention_bench);
