// weave-bench attention: the single-GPU attention forward (bf16, B*S tokens, H heads), weave
// only; bench/torch_attention.py times cuDNN SDPA for the same shapes into the same JSON file.
// TFLOP/s counts 4*B*S^2*H*D, halved for causal.
//
// Correctness of the timed calls themselves: two input sets (normal, logit spread ~3 so the
// softmax is peaked) alternate by pointer from call to call, so every timed call's inputs differ
// from the previous one's; O and LSE are poisoned (NaN) before timing and the last timed call is
// checked against the cuBLAS float32 reference (check/attention_ref.hpp, no weave code): every
// element of O per tile (128 rows x D of one head) with a per-element bound, and every LSE. A row
// the last call failed to write still holds NaN or the other input set's output and fails; then
// one more call on the other input set into freshly poisoned O and LSE is checked the same way
// (recheck.hpp: a kernel that leaves an earlier call's output in place passes the first check
// whenever the last call's set came round before). All
// rows are checked where the reference is cheap (B*H*S^2 <= 2^36, every default shape); above,
// sampled rows (the first and last 64 and two more pieces of 64, every batch and head), or as
// --check all|sample says. Any wrong row makes the command exit 1. Seeds from WEAVE_TEST_SEED
// (printed; set it to replay).
//
//   weave-bench attention [--json FILE] [--seqs 4096,8192,16384,32768] [--tokens 65536]
//                         [--heads 16] [--kv-heads H] [--d 64,128] [--causal 0,1]
//                         [--variants auto,persistent,pingpong,basic] [--target-ms T]
//                         [--section-heads 0,1,16]  (tile-order sections; 0 = from L2)
//                         [--check auto|all|sample]
// Variants: auto = the library default (Options::Schedule::Auto, ping-pong); persistent =
// ping-pong + persistent CTAs; pingpong = one CTA per tile with ping-pong; basic = one CTA per
// tile, no ping-pong.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attention/attention.hpp"
#include "bench.hpp"
#include "check/attention_ref.hpp"
#include "check/seed.hpp"
#include "recheck.hpp"

using namespace weave;
using namespace weave::bench;
using bf16 = __nv_bfloat16;

namespace {

// Reference work of all rows, in (query row, key, head) triples: 2^36 is about a second.
constexpr double kAllRowsLimit = 68719476736.0;

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
  const std::string check_mode = args.get("check", "auto");
  WEAVE_CHECK(check_mode == "auto" || check_mode == "all" || check_mode == "sample", "unknown --check '", check_mode,
              "' (auto, all, sample)");
  std::vector<std::string> variants;
  {
    std::stringstream ss(args.get("variants", "auto"));
    std::string item;
    while (std::getline(ss, item, ',')) {
      WEAVE_CHECK(item == "auto" || item == "persistent" || item == "pingpong" || item == "basic", "unknown variant '",
                  item, "' (auto, persistent, pingpong, basic)");
      variants.push_back(item);
    }
  }
  std::vector<std::pair<std::string, int>> runs;  // (variant, heads per section), every pair
  for (const std::string& var : variants)
    for (const long long G : sections) runs.emplace_back(var, static_cast<int>(G));

  const uint64_t seed = check::test_seed();
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("attention forward bf16, %lld tokens, H=%d (kv %d), device %s, %d SMs\n", tokens, H, Hkv, prop.name,
              prop.multiProcessorCount);
  std::printf("%4s %6s %3s %7s %-6s %-10s %10s %9s %8s %8s %6s\n", "D", "S", "B", "causal", "impl", "var", "time_us",
              "TFLOP/s", "o_ratio", "lse_rat", "rows");
  cudaStream_t st = nullptr;
  check::AttentionRef ref;
  bool all_ok = true;
  for (const long long D_ : ds)
    for (const long long S_ : seqs) {
      const int D = static_cast<int>(D_), S = static_cast<int>(S_);
      const int B = static_cast<int>(std::max(1LL, tokens / S));
      const attention::Shape sh{B, S, H, Hkv, D};
      const size_t nq = size_t(B) * S * H * D, nk = size_t(B) * S * Hkv * D, nl = size_t(B) * H * S;
      bf16 *q[2], *k[2], *v[2], *o;
      float* lse;
      const float sd = float(check::qk_std(D, 0.f));
      for (int s = 0; s < 2; ++s) {
        WEAVE_CUDA_CHECK(cudaMalloc(&q[s], nq * 2));
        WEAVE_CUDA_CHECK(cudaMalloc(&k[s], nk * 2));
        WEAVE_CUDA_CHECK(cudaMalloc(&v[s], nk * 2));
        const uint64_t base = check::derive(seed, uint64_t(D) << 32 | uint64_t(S), s);
        check::fill_normal(q[s], B, S, H * D, check::derive(base, 1), sd, st);
        check::fill_normal(k[s], B, S, Hkv * D, check::derive(base, 2), sd, st);
        check::fill_normal(v[s], B, S, Hkv * D, check::derive(base, 3), 1.f, st);
      }
      WEAVE_CUDA_CHECK(cudaMalloc(&o, nq * 2));
      WEAVE_CUDA_CHECK(cudaMalloc(&lse, nl * 4));
      const bool all_rows =
          check_mode == "all" || (check_mode == "auto" && double(B) * H * double(S) * double(S) <= kAllRowsLimit);
      const std::vector<check::RowRange> rows =
          all_rows ? check::all_rows(0, 0, 0, S) : check::sample_rows(0, 0, 0, S, check::derive(seed, 0x5A, S));
      long long nrows = 0;
      for (const auto& r : rows) nrows += r.rows;
      for (const long long causal_ : causals) {
        const int causal = static_cast<int>(causal_);
        check::AttnProblem p;
        p.B = B, p.Hq = H, p.Hkv = Hkv, p.D = D, p.Skv = S, p.Lq = S, p.Lo = S, p.causal = causal != 0;
        std::map<int, check::AttnRefRows> refs;  // per input set, computed when first needed
        for (const auto& [var, G] : runs) {
          attention::Options opt;
          opt.heads_per_section = G;
          opt.causal = causal != 0;
          opt.pingpong = var != "basic";
          opt.schedule = var == "auto"         ? attention::Options::Schedule::Auto
                         : var == "persistent" ? attention::Options::Schedule::Persistent
                                               : attention::Options::Schedule::PerTile;
          check::poison(o, nq, st);
          check::poison(lse, nl, st);
          long long calls = 0;
          auto fn = [&] {
            const int s = static_cast<int>(calls++ % 2);
            attention::forward(q[s], k[s], v[s], o, lse, sh, opt, st);
          };
          const double flop = attention::flops(sh, opt.causal);
          const int iters = std::max(2, std::min(100, static_cast<int>(target_ms * 1e-3 / (flop / 550e12))));
          const double t = time_us(st, fn, 2, iters, 3);
          WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
          struct Checked {
            check::AttnReport rep;
            bool ok;
            double worst;
          };
          auto check_set = [&](int set) {
            auto it = refs.find(set);
            if (it == refs.end()) it = refs.emplace(set, ref.compute(p, q[set], k[set], v[set], rows, st)).first;
            const check::AttnReport r = check::AttentionRef::compare(p, it->second, o, lse, check::attention_o_bound(),
                                                                     check::attention_lse_bound(), st);
            return Checked{r, r.ok(), std::max(r.o.worst, r.lse.worst)};
          };
          const Checked chk = check_last_and_fresh(
              static_cast<int>((calls - 1) % 2), 2, check_set,
              [&] {
                check::poison(o, nq, st);
                check::poison(lse, nl, st);
              },
              [&](int set) { attention::forward(q[set], k[set], v[set], o, lse, sh, opt, st); });
          const check::AttnReport& rep = chk.rep;
          const bool ok = chk.ok;
          all_ok = all_ok && ok;
          const double tf = flop / t * 1e-6;
          const std::string label = G > 0 ? var + "/G" + std::to_string(G) : var;
          std::printf("%4d %6d %3d %7d %-6s %-10s %10.1f %9.1f %8.3f %8.3f %6lld%s\n", D, S, B, causal, "weave",
                      label.c_str(), t, tf, rep.o.worst, rep.lse.worst, nrows, ok ? "" : "  WRONG");
          if (!ok) std::printf("    %s\n", rep.str().c_str());
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
                         .add("check", all_rows ? "last timed call and a fresh one, every row vs cuBLAS fp32"
                                                : "last timed call and a fresh one, sampled rows (all batches, "
                                                  "heads) vs cuBLAS fp32")
                         .add("checked_rows", nrows)
                         .add("o_err_ratio", rep.o.worst)
                         .add("o_bad_tiles", rep.o.bad_tiles)
                         .add("lse_err_ratio", rep.lse.worst)
                         .add("seed", std::to_string(seed))
                         .add("correct", ok));
        }
      }
      for (int s = 0; s < 2; ++s) cudaFree(q[s]), cudaFree(k[s]), cudaFree(v[s]);
      cudaFree(o), cudaFree(lse);
    }
  std::printf(all_ok ? "all results correct\n" : "SOME RESULTS WRONG\n");
  return all_ok ? 0 : 1;
}

}  // namespace

WEAVE_BENCH(attention,
            "attention forward, single GPU (--seqs 4096,... --tokens 65536 --heads 16 --kv-heads H --d 64,128 "
            "--causal 0,1 --variants auto,persistent,pingpong,basic --section-heads 0,1,... --check auto|all|sample)",
            run_attention_bench);
