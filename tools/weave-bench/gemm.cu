// weave-bench gemm: the weave GEMM against cuBLASLt (bf16 in/out, fp32 compute) in the same
// run. Each implementation is timed on inputs that change with every call (at least two sets,
// up to 8 while they would fit in L2 three times), its output poisoned first; the last timed
// call's output is then checked element by element, per 128 x 128 tile, against a float32
// reference of that call's inputs (check/gemm_ref.hpp, check/tile_check.hpp), cuBLAS's rows like
// weave's; weave's then makes one more call on the other input set into a poisoned C, checked the
// same way (a launch that stops writing after the first few is caught even when the last timed
// call's set is the one an early call wrote). Any incorrect row makes the exit status 1. Inputs derive from WEAVE_TEST_SEED (printed).
// A tile that misses one K step fails the bound (2^-8 |r| + 2^-10 s, ~0.005 s): with inputs
// uniform in [-1, 1) the step's 64 products have standard deviation s * 8 / sqrt(K), >= 0.0625 s
// for K <= 16384, 12 bounds.
//
//   weave-bench gemm [--json FILE] [--set core|models|tokens|drawn] [--draw-seed S] [--draws N] [--list] [--shapes MxNxK,...] [--layout kn|nk]
//                    [--a-layout mk|km] [--tile auto|256|192|128|64|swapped|w96..w208|sw32..sw208[c1|c2]|sw256xW] [--group G] [--comm 0,8,16,32]
//                    [--split-k N] [--target-ms T] [--no-balance]
// --set core (the default): the eight shapes the GEMM was tuned on, B as --layout says (nk), A as
// --a-layout says (mk: M x K; km: K x M).
// --set models: shapes of real models' MLP layers in all three layouts of a training step, plus
// ragged ones (below, and kernels/gemm/README.md); --layout kn|nk keeps only the rows of that
// B layout. --set tokens: the models' forward rows at 136-1500 tokens, off the 64-token grid.
// --set drawn: --draws N (48) shapes drawn by issue 20's rule (gemm_drawn.hpp) from --draw-seed S
// (default a fresh seed; printed, and in every row as draw_seed): shapes no one tuned for.
// --split-k: 0 = the planner's choice (the default), 1 = never, N = the last partial
// round's tiles split N ways where the tile allows; the tile column says "/kN" where it split.
// --shapes replaces the set. --list prints the set as JSON lines and exits (no GPU); with --plan-sms N
// each row also names the planner's launch on a device of N SMs (N / 2 2-CTA clusters).
#include <cuda_bf16.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "check/gemm_baseline.cuh"
#include "gemm_sets.hpp"
#include "recheck.hpp"

using namespace weave;
using namespace weave::bench;
using bf16 = __nv_bfloat16;

namespace {

struct Shape {
  int M, N, K;
};

// --set core: the first target set: geometric mean >= 0.97x cuBLAS, and >= 1.0x at 8192^3.
const std::vector<Shape> kCore = {{4096, 2048, 4096},   {8192, 8192, 8192},   {16384, 16384, 16384},
                                  {16384, 8192, 16384}, {32768, 16384, 4096}, {16384, 16384, 1024},
                                  {16384, 16384, 2048}, {8192, 1024, 8192}};

// One row of a set: the shape, how A and B are stored, and (--set models) where it comes from.
struct Case {
  Shape s;
  gemm::BLayout bl = gemm::BLayout::NK;
  bool a_km = false;  // A stored K x M (the weight gradient)
  const char* model = nullptr;  // null outside --set models
  const char* pass = "";        // fwd, dgrad, wgrad
  const char* proj = "";        // up or down (the MLP projection)
  int tokens = 0;               // T; 0 for the ragged rows
};

// --set models (issue 20). A linear layer Y = X W^T over T tokens, W stored out x in like
// nn.Linear, gives three GEMMs per training step:
//   fwd    Y  = X W^T   M = T,   N = out, K = in    A = X (M x K), B = W (N x K): BLayout::NK
//   dgrad  dX = dY W    M = T,   N = in,  K = out   A = dY (M x K), B = W (K x N): BLayout::KN
//   wgrad  dW = dY^T X  M = out, N = in,  K = T     A = dY stored T x out, i.e. K x M
//          (ALayout::KM, and cuBLAS's transposed operand), B = X (K x N)
// Each model's MLP: up (in = hidden, out = FFN) and down (in = FFN, out = hidden). Forward at
// three token counts per model, chosen so that together they cover decode (1, 16, 64, 128, 256:
// split-K / stream-K territory) and prefill/training (512 to 32768); the backward pass at one
// training token count per model. Then ragged shapes: M, N and K not multiples of 64 (N and K
// multiples of 8, as TMA needs).
struct Model {
  const char* name;
  int hidden, ffn;
  int fwd_tokens[3];
  int bwd_tokens;
};
const Model kModels[] = {
    {"Llama-2 7B", 4096, 11008, {1, 128, 2048}, 8192},
    {"Llama-3 8B / Mistral 7B", 4096, 14336, {16, 256, 8192}, 2048},
    {"Llama-2 13B", 5120, 13824, {64, 512, 32768}, 32768},
    {"DeepSeek-V3 dense FFN", 7168, 18432, {1, 256, 2048}, 2048},
    {"Llama-3 70B", 8192, 28672, {16, 128, 8192}, 8192},
    {"Llama-3 405B", 16384, 53248, {64, 512, 32768}, 2048},
};
const Case kRagged[] = {
    {{77, 14344, 4104}, gemm::BLayout::NK},     {{200, 4104, 11016}, gemm::BLayout::NK},
    {{1000, 13832, 5128}, gemm::BLayout::NK},   {{2047, 5128, 13832}, gemm::BLayout::NK},
    {{3000, 7176, 18440}, gemm::BLayout::NK},   {{8191, 28680, 8200}, gemm::BLayout::NK},
    {{4095, 1000, 8200}, gemm::BLayout::KN},    {{12345, 2056, 1032}, gemm::BLayout::KN},
};

// --set tokens: the forward rows (X W^T, both projections of each model above) at batch sizes off the
// 64-token grid between decode and prefill, where a 128-row token tile pads the most rows (264
// tokens: 384 computed) and cuBLAS fits a swapped tile's token width to M (docs/perf-notes.md,
// 2026-12-04). The models set's forward token counts are multiples of 64 and would not show it.
const int kBandTokens[] = {136, 176, 200, 300, 360, 450, 520, 600, 700, 840, 900, 1000, 1100, 1300, 1500};

// One of model m's GEMMs at T tokens: pass "fwd", "dgrad" or "wgrad", the up or down projection.
Case model_case(const Model& m, const char* pass, int T, bool up) {
  const int in = up ? m.hidden : m.ffn, out = up ? m.ffn : m.hidden;
  Case c;
  c.model = m.name, c.pass = pass, c.proj = up ? "up" : "down", c.tokens = T;
  if (pass[0] == 'f') c.s = {T, out, in}, c.bl = gemm::BLayout::NK;
  else if (pass[0] == 'd') c.s = {T, in, out}, c.bl = gemm::BLayout::KN;
  else c.s = {out, in, T}, c.bl = gemm::BLayout::KN, c.a_km = true;
  return c;
}

std::vector<Case> tokens_set() {
  std::vector<Case> v;
  for (const Model& m : kModels)
    for (int T : kBandTokens)
      for (const bool up : {true, false}) v.push_back(model_case(m, "fwd", T, up));
  return v;
}

std::vector<Case> models_set() {
  std::vector<Case> v;
  for (const Model& m : kModels)
    for (const char* pass : {"fwd", "dgrad", "wgrad"})
      for (int t : {0, 1, 2}) {
        const bool fwd = pass[0] == 'f';
        if (!fwd && t > 0) continue;
        const int T = fwd ? m.fwd_tokens[t] : m.bwd_tokens;
        for (const bool up : {true, false}) v.push_back(model_case(m, pass, T, up));
      }
  for (Case c : kRagged) {
    c.model = "ragged", c.pass = c.bl == gemm::BLayout::NK ? "fwd" : "dgrad";
    v.push_back(c);
  }
  return v;
}

// --set models or tokens (null for another name).
const std::vector<Case>* named_set(const std::string& name) {
  static const std::vector<Case> models = models_set(), tokens = tokens_set();
  return name == "models" ? &models : name == "tokens" ? &tokens : nullptr;
}

const char* layout_name(gemm::BLayout bl) { return bl == gemm::BLayout::KN ? "kn" : "nk"; }

std::vector<Shape> parse_shapes(const std::string& s) {
  std::vector<Shape> v;
  for (const auto& t : parse_gemm_shapes(s)) v.push_back({t[0], t[1], t[2]});
  return v;
}

struct Sets {
  std::vector<bf16*> a, b;
  bf16* c = nullptr;
  ~Sets() {
    for (auto p : a) cudaFree(p);
    for (auto p : b) cudaFree(p);
    cudaFree(c);
  }
};


// --trace N: each implementation, after a second of idle GPU, N back-to-back launches with an
// event between every two, printed per launch. Shows how the time of one launch moves while
// the power controller settles (perf-notes 21: large GEMMs run at the 700 W cap).
void trace_launches(cudaStream_t st, int n, const std::vector<std::pair<const char*, std::function<void()>>>& impls) {
  for (const auto& [name, fn] : impls) {
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::vector<cudaEvent_t> ev(n + 1);
    for (auto& e : ev) WEAVE_CUDA_CHECK(cudaEventCreate(&e));
    WEAVE_CUDA_CHECK(cudaEventRecord(ev[0], st));
    for (int i = 0; i < n; ++i) {
      fn();
      WEAVE_CUDA_CHECK(cudaEventRecord(ev[i + 1], st));
    }
    WEAVE_CUDA_CHECK(cudaEventSynchronize(ev[n]));
    std::printf("trace %s, us per launch after 1 s idle:", name);
    double total = 0;
    for (int i = 0; i < n; ++i) {
      float ms = 0;
      WEAVE_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
      total += ms;
      std::printf("%s%.0f", i % 10 ? " " : i ? "\n  [" : " [", 1e3 * ms);
      if (i % 10 == 9 || i == n - 1) std::printf("] at %.0f ms", total);
    }
    std::printf("\n");
    for (auto& e : ev) WEAVE_CUDA_CHECK(cudaEventDestroy(e));
  }
}

int run_gemm_bench(const Args& args) {
  const std::string set_name = args.has("shapes") ? "custom" : args.get("set", "core");
  const gemm::BLayout layout = args.get("layout", "nk") == "kn" ? gemm::BLayout::KN : gemm::BLayout::NK;
  const std::string a_arg = args.get("a-layout", "mk");
  WEAVE_CHECK(a_arg == "mk" || a_arg == "km", "unknown --a-layout '", a_arg, "' (want mk or km)");
  std::vector<Case> cases;
  uint64_t draw_seed = 0;
  if (const std::vector<Case>* set = named_set(set_name)) {
    for (const Case& c : *set)
      if (!args.has("layout") || c.bl == layout) cases.push_back(c);
  } else if (set_name == "drawn") {
    for (const DrawnGemm& d : drawn_shapes(args, draw_seed)) {
      Case c{{d.M, d.N, d.K}, d.layout == 1 ? gemm::BLayout::NK : gemm::BLayout::KN, d.layout == 2};
      c.model = d.ragged ? "drawn, ragged" : "drawn";
      c.pass = d.layout == 1 ? "fwd" : d.layout == 0 ? "dgrad" : "wgrad";
      c.proj = d.up ? "up" : "down", c.tokens = d.tokens;
      if (!args.has("layout") || c.bl == layout) cases.push_back(c);
    }
    std::fprintf(stderr, "weave-bench gemm --set drawn --draw-seed %llu: %zu shapes\n",
                static_cast<unsigned long long>(draw_seed), cases.size());
  } else {
    WEAVE_CHECK(set_name == "core" || set_name == "custom", "unknown --set '", set_name,
                "' (want core, models, tokens or drawn)");
    for (const Shape& s : set_name == "custom" ? parse_shapes(args.get("shapes")) : kCore) {
      Case c{s, layout};
      c.a_km = a_arg == "km";
      cases.push_back(c);
    }
  }
  WEAVE_CHECK(!cases.empty(), "no shapes to run");
  // The fields every row of a case shares (impl null: the --list row).
  auto case_row = [&](const Case& c, const char* impl) {
    JsonLine j;
    j.add("kernel", "gemm");
    if (impl) j.add("impl", impl);
    j.add("M", c.s.M).add("N", c.s.N).add("K", c.s.K).add("dtype", "bf16").add("layout", layout_name(c.bl));
    if (c.model || c.a_km) j.add("a_layout", c.a_km ? "km" : "mk");
    if (c.model) j.add("pass", c.pass).add("model", c.model);
    if (c.tokens > 0) j.add("proj", c.proj).add("tokens", c.tokens);
    if (set_name == "drawn") j.add("draw_seed", std::to_string(draw_seed));
    return j;
  };
  if (args.has("list")) {  // no GPU needed; --plan-sms N adds the planner's launch on a device of N SMs
    const int plan_sms = static_cast<int>(args.get_int("plan-sms", 0));
    for (const Case& c : cases) {
      JsonLine j = case_row(c, nullptr);
      j.add("set", set_name).add("supported", true);
      if (plan_sms > 0) {
        gemm::Options o;
        if (c.a_km) o.a_layout = gemm::ALayout::KM;
        j.add("plan", gemm::launch_name(gemm::plan_launch(c.s.M, c.s.N, c.s.K, c.bl, plan_sms, plan_sms / 2, o)));
      }
      std::printf("%s\n", j.str().c_str());
    }
    std::fprintf(stderr, "weave-bench gemm --set %s: %zu shapes\n", set_name.c_str(), cases.size());
    return 0;
  }
  JsonSink sink(args);
  gemm::Tile tile = gemm::Tile::Auto;
  if (args.get("tile") == "256") tile = gemm::Tile::M128N256;
  if (args.get("tile") == "128") tile = gemm::Tile::M128N128;
  if (args.get("tile") == "256s4") tile = gemm::Tile::M128N256S4;
  if (args.get("tile") == "256c2") tile = gemm::Tile::M128N256C2;
  if (args.get("tile") == "320c2") tile = gemm::Tile::M128N320C2;
  if (args.get("tile") == "64") tile = gemm::Tile::M64N128;
  if (args.get("tile") == "192") tile = gemm::Tile::M128N192;
  if (args.get("tile") == "swapped") tile = gemm::Tile::Swapped;
  int tile_n = wide_tile_width(args.get("tile"), "gemm");  // --tile w144: the 128 x 144 tile
  if (tile_n < 0) return 2;
  if (tile_n > 0) tile = gemm::Tile::M128Nw;
  int tile_cluster = 0;
  if (args.get("tile").rfind("sw256x", 0) == 0) {  // --tile sw256x144: the swapped 256 x 144 tile
    tile_n = std::atoi(args.get("tile").c_str() + 6);
    if (!gemm::is_swapped256_width(tile_n)) {
      std::fprintf(stderr, "weave-bench gemm: --tile %s: no such width (swapped 256 widths: %s)\n",
                   args.get("tile").c_str(), gemm::swapped256_widths_text().c_str());
      return 2;
    }
    tile = gemm::Tile::SwappedW256;
  } else if (const SwappedTileArg sw = swapped_tile_arg(args.get("tile"), "gemm"); sw.width != 0) {
    if (sw.width < 0) return 2;
    tile_n = sw.width, tile_cluster = sw.cluster, tile = gemm::Tile::SwappedW;
  }
  const int split_k = static_cast<int>(args.get_int("split-k", 0));
  const bool balance = !args.has("no-balance");
  const int group = static_cast<int>(args.get_int("group", 0));
  std::vector<int> comms;
  for (long long c : args.numbers("comm", "0")) comms.push_back(static_cast<int>(c));
  const double target_ms = std::stod(args.get("target-ms", "60"));
  const uint64_t seed = check::test_seed();  // printed; WEAVE_TEST_SEED replays the inputs

  int dev = 0, l2 = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  cudaDeviceProp prop{};
  WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  bool one_layout = true;
  for (const Case& c : cases) one_layout = one_layout && c.bl == cases.front().bl;
  std::printf("gemm bf16 (fp32 accumulate), set %s, B %s, device %s, %d SMs\n", set_name.c_str(),
              !one_layout ? "per row (nk: N x K, kn: K x N)" : cases.front().bl == gemm::BLayout::KN ? "KxN" : "NxK",
              prop.name, prop.multiProcessorCount);
  std::printf("%-20s %-6s %-8s %5s %10s %9s %7s %9s\n", "MxNxK", "impl", "tile", "comm", "time_us", "TFLOP/s",
              "ratio", "worst");
  gemm::ref::CublasLt lt;
  check::GemmRef gref32;
  cudaStream_t st = nullptr;
  double log_ratio_sum = 0;
  int n_ratio = 0;
  std::vector<std::string> wrong;
  for (size_t si = 0; si < cases.size(); ++si) {
    const Case& cs = cases[si];
    const Shape& s = cs.s;
    const gemm::BLayout bl = cs.bl;
    const gemm::ALayout al = cs.a_km ? gemm::ALayout::KM : gemm::ALayout::MK;
    char name[64];
    std::snprintf(name, sizeof name, cs.model || cs.a_km ? "%dx%dx%d %s%s" : "%dx%dx%d", s.M, s.N, s.K,
                  cs.a_km ? "km-" : "", layout_name(bl));
    const size_t na = size_t(s.M) * s.K, nb = size_t(s.K) * s.N, nc = size_t(s.M) * s.N;
    const double bytes_in = 2.0 * (na + nb);
    // At least two sets, so that no timed call repeats the previous call's inputs (a call that
    // reads a stale operand or leaves a tile of the previous output would still look right).
    const int nsets = std::max(2, std::min(8, static_cast<int>(std::ceil(3.0 * l2 / bytes_in))));
    Sets d;
    for (int i = 0; i < nsets; ++i) {
      bf16 *a, *b;
      WEAVE_CUDA_CHECK(cudaMalloc(&a, na * 2));
      WEAVE_CUDA_CHECK(cudaMalloc(&b, nb * 2));
      d.a.push_back(a), d.b.push_back(b);
      gemm::ref::fill_uniform(a, na, check::derive(seed, si, 2 * i));
      gemm::ref::fill_uniform(b, nb, check::derive(seed, si, 2 * i + 1));
    }
    WEAVE_CUDA_CHECK(cudaMalloc(&d.c, nc * 2));
    float *ref_r = nullptr, *ref_s = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&ref_r, nc * sizeof(float)));
    WEAVE_CUDA_CHECK(cudaMalloc(&ref_s, nc * sizeof(float)));
    int ref_set = -1;  // the input set ref_r / ref_s describe
    // d.c against the float32 reference of input set `set` (C = A*B: one bf16 rounding).
    auto check_c = [&](int set) {
      if (ref_set != set) {
        gref32.run(d.a[set], d.b[set], s.M, s.N, s.K, al, bl, ref_r, ref_s, false, st);
        check::sqrt_inplace(ref_s, nc, st);
        ref_set = set;
      }
      return check::compare({d.c, s.N}, {ref_r, s.N}, {ref_s, s.N}, s.M, s.N, check::gemm_bound(), 128, 128, st);
    };
    auto row = [&](const char* impl) { return case_row(cs, impl); };
    const double flop = 2.0 * s.M * s.N * s.K;

    // Every implementation: output poisoned, then timed on rotating inputs (the rotation is the
    // only work added to the timed loop), then its last timed call's output checked against the
    // reference of the inputs that call used.
    int it = 0, last = -1;
    auto cublas_call = [&] {
      last = it++ % nsets;
      lt.run(d.a[last], d.b[last], d.c, s.M, s.N, s.K, al, bl, false, st);
    };
    // ~target_ms per repeat, at a guessed 600 TFLOP/s.
    const int iters = std::max(3, std::min(200, static_cast<int>(target_ms * 1e-3 / (flop / 600e12))));
    check::poison(d.c, nc, st);
    const double t_cublas = time_us(st, cublas_call, 3, iters, 5);
    const check::Report rep_cublas = check_c(last);
    const double tf_cublas = flop / t_cublas * 1e-6;
    std::printf("%-20s %-6s %-8s %5s %10.1f %9.1f %7s %9.3g%s\n", name, "cublas", "-", "-", t_cublas, tf_cublas, "1.000",
                rep_cublas.worst, rep_cublas.ok ? "" : "  WRONG");
    if (!rep_cublas.ok) {
      std::printf("  cublas %s: %s\n", name, rep_cublas.str().c_str());
      wrong.push_back(std::string("cublas ") + name);
    }
    JsonLine jc = row("cublas");
    jc.add("time_us", t_cublas).add("tflops", tf_cublas).add("correct", rep_cublas.ok).add("seed", std::to_string(seed));
    jc.add("algo", lt.algo());
    sink.write(add_check_worst(jc, rep_cublas.worst));

    for (int comm : comms) {
      gemm::Options o;
      o.tile = tile;
      o.group_m = group;
      o.lcsc.num_comm_sms = comm;
      o.lcsc.balance_waves = balance;
      o.lcsc.max_clusters = static_cast<int>(args.get_int("max-clusters", 0));
      o.a_layout = al;
      o.split_k = split_k;
      o.tile_n = tile_n;
      o.tile_cluster = tile_cluster;
      const gemm::Launch choice = gemm::choose_launch(s.M, s.N, s.K, bl, o);
      const std::string used_name = gemm::launch_name(choice);
      const char* used = used_name.c_str();
      gemm::Launch whole = choice;
      whole.splits = 1;
      lcsc::Plan plan{};
      it = 0, last = -1;
      auto weave_call = [&] {
        last = it++ % nsets;
        plan = gemm::gemm(d.a[last], d.b[last], d.c, s.M, s.N, s.K, bl, o, st);
      };
      check::poison(d.c, nc, st);
      const double t = time_us(st, weave_call, 3, iters, 5);
      // The last timed call, then one more on the next input set into a poisoned C (recheck.hpp).
      const check::Report rep = check_last_and_fresh(
          last, nsets, check_c, [&] { check::poison(d.c, nc, st); },
          [&](int set) {
            it = set;
            weave_call();
          });
      const double tf = flop / t * 1e-6;
      const double ratio = t_cublas / t;
      if (comm == comms.front()) {
        log_ratio_sum += std::log(ratio);
        ++n_ratio;
      }
      std::printf("%-20s %-6s %-8s %5d %10.1f %9.1f %7.3f %9.3g %4d blocks%s\n", name, "weave", used,
                  comm, t, tf, ratio, rep.worst, plan.compute_blocks, rep.ok ? "" : "  WRONG");
      if (!rep.ok) {
        std::printf("  weave %s comm %d: %s\n", name, comm, rep.str().c_str());
        wrong.push_back(std::string("weave ") + name + " comm " + std::to_string(comm));
      }
      JsonLine jw = row("weave");
      jw.add("tile", gemm::launch_name(whole))
          .add("splits", choice.splits)
          .add("num_comm_sms", comm)
          .add("compute_blocks", plan.compute_blocks)
          .add("time_us", t)
          .add("tflops", tf)
          .add("ratio_vs_cublas", ratio)
          .add("correct", rep.ok)
          .add("seed", std::to_string(seed));
      sink.write(add_check_worst(jw, rep.worst));
      if (args.has("trace"))
        trace_launches(st, static_cast<int>(args.get_int("trace", 60)), {{"weave", weave_call}, {"cublas", cublas_call}});
      if (args.has("accumulate")) {  // C += A * B: the epilogue's reduce-add stores instead of plain ones
        gemm::Options oa = o;
        oa.accumulate = true;
        it = 0;
        auto acc_call = [&] {
          gemm::gemm(d.a[it % nsets], d.b[it % nsets], d.c, s.M, s.N, s.K, bl, oa, st);
          ++it;
        };
        const double ta = time_us(st, acc_call, 3, iters, 5);
        // The timed loop's output is C0 plus hundreds of products, each rounded into bf16: no
        // useful bound. One more call from a known random C0 is checked instead (two roundings:
        // 2^-8 of |r| each, and 2^-8 |C0| through the scale).
        bf16* c0 = nullptr;
        WEAVE_CUDA_CHECK(cudaMalloc(&c0, nc * 2));
        const int set = it % nsets;
        gemm::ref::fill_uniform(c0, nc, check::derive(seed, si, 1000 + comm), 4.f, st);
        WEAVE_CUDA_CHECK(cudaMemcpyAsync(d.c, c0, nc * 2, cudaMemcpyDeviceToDevice, st));
        gemm::gemm(d.a[set], d.b[set], d.c, s.M, s.N, s.K, bl, oa, st);
        gref32.run(d.a[set], d.b[set], s.M, s.N, s.K, al, bl, ref_r, ref_s, false, st);
        check::sqrt_inplace(ref_s, nc, st);
        check::add_bf16(ref_r, c0, nc, st);
        check::add_abs_bf16(ref_s, c0, 4.f, nc, st);  // k = 4 times gemm_bound's 2^-10 = 2^-8
        ref_set = -1;  // ref_r / ref_s now hold C0 + A*B
        check::Bound b = check::gemm_bound();
        b.rel *= 2;
        const check::Report ra = check::compare({d.c, s.N}, {ref_r, s.N}, {ref_s, s.N}, s.M, s.N, b, 128, 128, st);
        WEAVE_CUDA_CHECK(cudaFree(c0));
        std::printf("%-20s %-6s %-8s %5d %10.1f %9.1f %7.3f %9.3g   (C += A*B)%s\n", name, "weave+",
                    used, comm, ta, flop / ta * 1e-6, t_cublas / ta, ra.worst, ra.ok ? "" : "  WRONG");
        if (!ra.ok) {
          std::printf("  weave C += %s comm %d: %s\n", name, comm, ra.str().c_str());
          wrong.push_back(std::string("weave C += ") + name + " comm " + std::to_string(comm));
        }
      }
    }
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    cudaFree(ref_r);
    cudaFree(ref_s);
  }
  if (n_ratio > 0) std::printf("geomean weave/cuBLAS over %d shapes: %.3f\n", n_ratio, std::exp(log_ratio_sum / n_ratio));
  return exit_status("gemm", wrong, seed);
}

}  // namespace

WEAVE_BENCH(gemm,
            "bf16 GEMM: weave vs cuBLASLt (--set core|models|tokens|drawn: the 8 tuned shapes (default), real models' MLP "
            "shapes in all three training layouts plus ragged ones, their forward rows at 136-1500 tokens, or "
            "--draws N shapes drawn by the same rule from --draw-seed S; --list prints the set, no GPU needed, --plan-sms N with the planner's launch on N SMs; "
            "--shapes MxNxK,... --layout kn|nk --a-layout mk|km --tile auto|256|128|192|256s4|256c2|320c2|64|swapped|w96|w112|w144|w160|w176|w208|sw32..sw208[c1|c2]|sw256x96..sw256x176 --split-k N --group G --comm 0,8 --no-balance "
            "--accumulate --trace N)",
            run_gemm_bench);

namespace weave::bench {
std::vector<std::array<int, 3>> parse_gemm_shapes(const std::string& list) {
  std::vector<std::array<int, 3>> v;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::array<int, 3> t{};
    WEAVE_CHECK(std::sscanf(item.c_str(), "%dx%dx%d", &t[0], &t[1], &t[2]) == 3, "bad shape '", item,
                "' (want MxNxK)");
    v.push_back(t);
  }
  return v;
}

std::vector<DrawnGemm> drawn_shapes(const Args& args, uint64_t& seed) {
  seed = args.has("draw-seed") ? static_cast<uint64_t>(parse_count("gemm", "draw-seed", args.get("draw-seed"), 0,
                                                                    std::numeric_limits<long long>::max()))
                               : std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32);
  seed &= 0x7fffffffffffffffull;  // replayable through --draw-seed
  const int n = static_cast<int>(args.has("draws") ? parse_count("gemm", "draws", args.get("draws"), 1, 10000) : 48);
  return draw_gemm_shapes(seed, n);
}

std::vector<std::array<int, 4>> gemm_shape_rows(const std::string& set) {
  std::vector<std::array<int, 4>> v;
  if (set == "core") {
    for (const Shape& s : kCore) v.push_back({s.M, s.N, s.K, 1});
  } else if (const std::vector<Case>* cases = named_set(set)) {
    for (const Case& c : *cases) v.push_back({c.s.M, c.s.N, c.s.K, c.a_km ? 2 : c.bl == gemm::BLayout::NK ? 1 : 0});
  } else {
    WEAVE_CHECK(false, "weave-bench gemm: unknown --set '", set, "' (core, models, tokens or drawn)");
  }
  return v;
}

int wide_tile_width(const std::string& tile, const char* suite) {
  if (tile.rfind("w", 0) != 0) return 0;
  const int w = std::atoi(tile.c_str() + 1);
  if (gemm::is_wide_width(w)) return w;
  std::fprintf(stderr, "weave-bench %s: --tile %s: no such width (widths: %s)\n", suite, tile.c_str(),
               gemm::wide_widths_text().c_str());
  return -1;
}

SwappedTileArg swapped_tile_arg(const std::string& tile, const char* suite) {
  if (tile.rfind("sw", 0) != 0 || tile == "swapped") return {};
  char* end = nullptr;
  const long w = std::strtol(tile.c_str() + 2, &end, 10);
  const std::string rest = end;
  const int cluster = rest.empty() ? 0 : rest == "c1" ? 1 : rest == "c2" ? 2 : rest == "c4" ? 4 : -1;
  if (cluster >= 0 && gemm::is_swapped_width(static_cast<int>(w))) return {static_cast<int>(w), cluster};
  std::fprintf(stderr, "weave-bench %s: --tile %s: no such width (swapped widths: %s; c1, c2 or c4 after one forces its "
               "CTAs per cluster)\n", suite, tile.c_str(), gemm::swapped_widths_text().c_str());
  return {-1, 0};
}
}  // namespace weave::bench
