// weave-bench gemm_fp8 (also `weave-bench gemm --dtype fp8`): weave's fp8 GEMMs against cuBLASLt
// fp8 in the same run. C (bf16, M x N) = A (fp8, M x K) * B (fp8, N x K)^T, the "TN" layout
// cuBLASLt's fp8 kernels take. Rows per shape:
//   cublaslt         per-tensor scales (A/B_SCALE_POINTER), FAST_ACCUM on: all of K in the tensor
//                    core, the accumulation weave's per-tensor kernel does (the baseline of `ratio`)
//   cublaslt_precise the same with FAST_ACCUM off (cuBLASLt promotes partial sums: context only)
//   weave            per-tensor scales
//   weave_block      DeepSeek-V3 block scales (1 x 128 for A, 128 x 128 for B), fp32 promotion
//                    every 128 of K; `ratio_vs_weave` is against weave's per-tensor row and
//                    `ratio_vs_deepgemm` against the 1550 TFLOP/s DeepGEMM reports on H800.
// Method as weave-bench gemm (tools/weave-bench/gemm.cu): every implementation is timed on inputs
// that change with every call (at least two sets, up to 8 while they fit in L2 three times), its
// output poisoned with NaN first; time = median of 5 repeats of ~target-ms; the last timed call's
// output is then checked element by element per 128 x 128 tile against a float32 reference of
// that call's inputs and scales (check/gemm_fp8_ref.hpp, bounds derived there), and so is one more
// call on the next input set into a re-poisoned C (recheck.hpp: a kernel that leaves an earlier
// call's result in place fails it), cuBLASLt's rows like weave's; a row is correct only when both
// checks pass, and any incorrect row makes the exit status 1. Inputs derive from WEAVE_TEST_SEED
// (printed).
//
// Gradient rows (--set models): weave-bench gemm's rows in the other two layouts of a training step
// (gemm_sets.hpp; gemm.cu's models_set: a linear layer Y = X W^T, W stored N_out x K_in), with the
// operands stored as that bench stores them and the same C (M x N) = op(A) op(B), reduction K:
//   kn     (pass dgrad, dX = dY W):    A = dY M x K, B = W stored K x N. The GEMM's B (N x K) is
//          transpose_fp8(B, K rows, N cols).
//   km-kn  (pass wgrad, dW = dY^T X):  A = dY stored K x M, B = X stored K x N (K = the tokens).
//          The GEMM's A (M x K) is transpose_fp8(A, K, M), its B (N x K) transpose_fp8(B, K, N).
// Hopper's fp8 tensor cores and cuBLASLt's fp8 ("TN" only) read both operands K-major, so both
// sides need the copies (kernels/gemm_fp8/README.md, "Gradient layouts"): every timed call of the
// cublaslt, cublaslt_precise and weave rows is the transposes (weave's transpose_fp8, into one
// buffer per operand) then the GEMM on them, so time_us, tflops and the ratio are over the totals;
// `transpose_us` is the transposes alone, timed the same way (the "transposes" line of the table).
// Types: A (dY, the gradient) e5m2, B (W or X) e4m3, unless --types is given, which then applies to
// every row. Per-tensor scales only (weave_block skips them: block-scaled wgrad needs dY and X
// quantised per 128 tokens, a different quantisation, not a transpose). The reference is the same
// float32 one, of operands transposed by a one-byte-per-thread kernel here (not transpose_fp8), so
// a transpose_fp8 fault fails the rows' checks; and once per shape the copies transpose_fp8 left in
// place are compared byte for byte with the stored operands (`transposes_exact`; a mismatch is an
// incorrect row too). A transposed dimension must be a multiple of 16 (transpose_fp8's 16-byte
// vectors): the rows where one is not are listed as unsupported.
//
//   weave-bench gemm_fp8 [--json FILE] [--shapes MxNxK,...] [--set core|models|tokens|drawn [--draw-seed S] [--draws N]] [--list [--plan-sms N]]
//                        [--types e4m3xe4m3|e5m2xe4m3|e4m3xe5m2] [--tile auto|256|256c2|128|64|swapped|w96..w208|sw32..sw208] [--block-tile auto|128|192] [--split-k N] [--lane-scales 0|1|2]
//                        [--impl cublaslt,cublaslt_precise,weave,weave_block] [--target-ms T]
// --set core|models|tokens|drawn: the rows of weave-bench gemm (gemm_sets.hpp): nk (forward) rows as above, and
// for models and drawn the kn and km-kn gradient rows as above. JSON rows carry layout (nk / kn) like weave-bench
// gemm's, and for models a_layout (mk / km) and pass (fwd / dgrad / wgrad). Two geomeans of
// weave/cuBLASLt: over the nk rows (the line printed before the gradient rows existed), and, when
// gradient rows ran, over all rows (transposes included) with the per-layout ones.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "bench.hpp"
#include "check/gemm_fp8_ref.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "gemm_fp8/gemm_fp8.hpp"
#include "check/gemm_fp8_baseline.cuh"
#include "gemm_fp8/transpose.hpp"
#include "gemm_sets.hpp"
#include "recheck.hpp"

using namespace weave;
using namespace weave::bench;
using bf16 = __nv_bfloat16;
using gemm_fp8::Fp8;

namespace {

struct Row {
  int M, N, K;
  int layout = 1;  // as gemm_shape_rows (gemm_sets.hpp): 1 nk (forward), 0 kn (dgrad), 2 km-kn (wgrad)
};

// The names weave-bench gemm gives these layouts (its JSON "layout", "a_layout" and "pass").
const char* b_layout_name(const Row& r) { return r.layout == 1 ? "nk" : "kn"; }
const char* a_layout_name(const Row& r) { return r.layout == 2 ? "km" : "mk"; }
const char* pass_name(const Row& r) { return r.layout == 1 ? "fwd" : r.layout == 0 ? "dgrad" : "wgrad"; }

// Why a row does not run (empty: it runs).
std::string unsupported(const Row& r) {
  if (r.layout != 1) {
    // The dimensions transpose_fp8 gets: B stored K x N (both gradient layouts), A stored K x M (wgrad).
    std::string bad;
    auto need16 = [&](const char* dim, int v) {
      if (v % 16) bad += std::string(bad.empty() ? "" : ", ") + dim + " = " + std::to_string(v);
    };
    if (r.layout == 2) need16("M", r.M);
    need16("N", r.N);
    need16("K", r.K);
    if (!bad.empty())
      return std::string(r.layout == 2 ? "A stored K x M and B K x N are" : "B stored K x N is") +
             " transposed to K-major first (fp8 wgmma and cuBLASLt fp8 read K-major operands only) and "
             "transpose_fp8 needs multiples of 16: " + bad;
  }
  if (r.K % 16) return "K not a multiple of 16 (fp8 rows need 16-byte TMA pitches)";
  if (r.N % 8) return "N not a multiple of 8";
  return "";
}

// dst (cols x rows) = src^T (rows x cols), one byte per thread: the reference's operands of the
// gradient rows, written without transpose_fp8 (kernels/gemm_fp8/transpose.cu), so that a fault
// there fails the rows' checks instead of entering the reference too.
__global__ void naive_transpose_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int rows,
                                       int cols) {
  const size_t n = size_t(rows) * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t c = i / rows, r = i % rows;  // dst[c][r]
    dst[i] = src[r * cols + c];
  }
}
void naive_transpose(const uint8_t* src, uint8_t* dst, int rows, int cols, cudaStream_t st) {
  naive_transpose_kernel<<<4096, 256, 0, st>>>(src, dst, rows, cols);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

// Bytes of dst (cols x rows) that differ from src^T (src rows x cols); bad[1] gets the smallest
// such dst index (~0 when none).
__global__ void transpose_mismatch_kernel(const uint8_t* __restrict__ src, const uint8_t* __restrict__ dst, int rows,
                                          int cols, unsigned long long* bad) {
  const size_t n = size_t(rows) * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const size_t c = i / rows, r = i % rows;
    if (dst[i] != src[r * cols + c]) {
      atomicAdd(&bad[0], 1ull);
      atomicMin(&bad[1], static_cast<unsigned long long>(i));
    }
  }
}
// Compares dst with src^T byte for byte (synchronises st). Returns the mismatches; *first the
// smallest mismatching dst index.
unsigned long long transpose_mismatches(const uint8_t* src, const uint8_t* dst, int rows, int cols, cudaStream_t st,
                                        unsigned long long* first) {
  unsigned long long* bad = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&bad, 2 * sizeof(unsigned long long)));
  WEAVE_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(unsigned long long), st));
  WEAVE_CUDA_CHECK(cudaMemsetAsync(bad + 1, 0xff, sizeof(unsigned long long), st));
  transpose_mismatch_kernel<<<4096, 256, 0, st>>>(src, dst, rows, cols, bad);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  unsigned long long h[2] = {0, 0};
  WEAVE_CUDA_CHECK(cudaMemcpyAsync(h, bad, sizeof h, cudaMemcpyDeviceToHost, st));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  WEAVE_CUDA_CHECK(cudaFree(bad));
  *first = h[1];
  return h[0];
}

cudaDataType_t lt_type(Fp8 t) { return t == Fp8::E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

struct Sets {
  std::vector<uint8_t*> a, b;  // as stored: A M x K (K x M for wgrad), B N x K (K x N for the gradient rows)
  std::vector<float*> sa, sb, bsa, bsb;  // per-tensor scales (1 float), block scales
  bf16* c = nullptr;
  // Gradient rows: the K-major copies (A M x K for wgrad, B N x K) that every timed call writes with
  // transpose_fp8 and its GEMM reads, and the reference's copies (naive_transpose).
  uint8_t *at = nullptr, *bt = nullptr, *ref_at = nullptr, *ref_bt = nullptr;
  ~Sets() {
    for (auto* v : {&sa, &sb, &bsa, &bsb})
      for (float* p : *v) cudaFree(p);
    for (auto p : a) cudaFree(p);
    for (auto p : b) cudaFree(p);
    for (auto p : {at, bt, ref_at, ref_bt}) cudaFree(p);
    cudaFree(c);
  }
};

JsonLine& add_worst(JsonLine& j, double worst) {
  if (std::isfinite(worst)) return j.add("worst", worst);
  return j.add("worst", std::isnan(worst) ? "nan" : "inf");
}

Fp8 parse_type(const std::string& s) {
  WEAVE_CHECK(s == "e4m3" || s == "e5m2", "unknown fp8 type '", s, "' (want e4m3 or e5m2)");
  return s == "e5m2" ? Fp8::E5M2 : Fp8::E4M3;
}

int run_gemm_fp8_bench(const Args& args) {
  const std::string set_name = args.has("shapes") ? "custom" : args.get("set", "core");
  std::vector<Row> rows;
  uint64_t draw_seed = 0;
  if (set_name == "custom") {
    for (const auto& t : parse_gemm_shapes(args.get("shapes"))) rows.push_back({t[0], t[1], t[2]});
  } else if (set_name == "drawn") {
    for (const DrawnGemm& d : drawn_shapes(args, draw_seed)) rows.push_back({d.M, d.N, d.K, d.layout});
    std::fprintf(stderr, "weave-bench gemm_fp8 --set drawn --draw-seed %llu: %zu shapes\n",
                static_cast<unsigned long long>(draw_seed), rows.size());
  } else {
    for (const auto& r : gemm_shape_rows(set_name)) rows.push_back({r[0], r[1], r[2], r[3]});
  }
  WEAVE_CHECK(!rows.empty(), "no shapes to run");
  const std::string types = args.get("types", "e4m3xe4m3");
  const size_t x = types.find('x');
  WEAVE_CHECK(x != std::string::npos, "bad --types '", types, "' (want e4m3xe4m3, e5m2xe4m3 or e4m3xe5m2)");
  const Fp8 ta = parse_type(types.substr(0, x)), tb = parse_type(types.substr(x + 1));
  gemm_fp8::validate_types(ta, tb);
  const std::string dtype = std::string(gemm_fp8::type_name(ta)) + "x" + gemm_fp8::type_name(tb);
  // A row's operand types: --types; the gradient rows e5m2 (A = dY, the gradient) x e4m3 (W or X)
  // unless --types is given.
  const bool types_given = args.has("types");
  auto row_types = [&](const Row& r) {
    return r.layout == 1 || types_given ? std::pair{ta, tb} : std::pair{Fp8::E5M2, Fp8::E4M3};
  };
  auto base_row = [&](const Row& r, const char* impl) {
    const auto [rta, rtb] = row_types(r);
    JsonLine j;
    j.add("kernel", "gemm_fp8");
    if (impl) j.add("impl", impl);
    j.add("M", r.M).add("N", r.N).add("K", r.K);
    j.add("dtype", std::string(gemm_fp8::type_name(rta)) + "x" + gemm_fp8::type_name(rtb)).add("set", set_name);
    j.add("layout", b_layout_name(r));
    if (set_name == "models" || set_name == "drawn" || r.layout == 2)
      j.add("a_layout", a_layout_name(r)).add("pass", pass_name(r));
    if (set_name == "drawn") j.add("draw_seed", std::to_string(draw_seed));
    return j;
  };
  if (args.has("list")) {  // no GPU needed; --plan-sms N adds the per-tensor planner's launch on N SMs
    const int plan_sms = static_cast<int>(args.get_int("plan-sms", 0));
    for (const Row& r : rows) {
      const std::string why = unsupported(r);
      JsonLine j = base_row(r, nullptr);
      j.add("supported", why.empty());
      if (!why.empty()) j.add("reason", why);
      if (why.empty() && plan_sms > 0) {
        const auto [rta, rtb] = row_types(r);
        const gemm_fp8::Launch l =
            gemm_fp8::plan_launch(r.M, r.N, r.K, plan_sms, {}, gemm_fp8::wide_pair(rta, rtb), plan_sms / 2);
        j.add("plan", gemm_fp8::launch_name(l));
      }
      std::printf("%s\n", j.str().c_str());
    }
    return 0;
  }
  std::vector<std::string> impls = args.names("impl", "cublaslt,cublaslt_precise,weave,weave_block");
  auto wants = [&](const char* i) {
    for (const auto& s : impls)
      if (s == i) return true;
    return false;
  };
  gemm_fp8::Options opt;
  if (args.get("tile") == "256") opt.tile = gemm_fp8::Tile::M128N256;
  if (args.get("tile") == "256c2") opt.tile = gemm_fp8::Tile::M128N256C2;
  if (args.get("tile") == "128") opt.tile = gemm_fp8::Tile::M128N128;
  if (args.get("tile") == "swapped") opt.tile = gemm_fp8::Tile::Swapped;
  if (args.get("tile") == "64") opt.tile = gemm_fp8::Tile::M64N128;
  opt.tile_n = wide_tile_width(args.get("tile"), "gemm_fp8");  // --tile w144: the 128 x 144 tile
  if (opt.tile_n < 0) return 2;
  if (opt.tile_n > 0) opt.tile = gemm_fp8::Tile::M128Nw;
  if (const SwappedTileArg sw = swapped_tile_arg(args.get("tile"), "gemm_fp8"); sw.width != 0) {  // --tile sw96
    if (sw.width < 0) return 2;
    if (sw.cluster != 0) {
      std::fprintf(stderr, "weave-bench gemm_fp8: --tile %s: the fp8 swapped tile runs in single CTAs (no c1 / c2)\n",
                   args.get("tile").c_str());
      return 2;
    }
    opt.tile_n = sw.width, opt.tile = gemm_fp8::Tile::SwappedW;
  }
  const std::string bt = args.get("block-tile", "auto");  // the block-scaled rows' tile
  if (bt != "auto" && bt != "128" && bt != "192") {
    std::fprintf(stderr, "weave-bench gemm_fp8: --block-tile takes auto, 128 or 192, got %s\n", bt.c_str());
    return 2;
  }
  const gemm_fp8::Tile block_tile_opt = bt == "128"   ? gemm_fp8::Tile::M128N128
                                        : bt == "192" ? gemm_fp8::Tile::M128N192
                                                      : gemm_fp8::Tile::Auto;
  opt.group_m = static_cast<int>(args.get_int("group", 0));
  opt.split_k = static_cast<int>(args.get_int("split-k", 0));
  opt.lane_scales = static_cast<int>(args.get_int("lane-scales", 0));  // block scales' B loads (0 auto)
  const double target_ms = std::stod(args.get("target-ms", "60"));
  const uint64_t seed = check::test_seed();
  JsonSink sink(args);

  int dev = 0, l2 = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  cudaDeviceProp prop{};
  WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf("gemm fp8 %s -> bf16 (A M x K, B N x K), set %s, device %s, %d SMs\n", dtype.c_str(), set_name.c_str(),
              prop.name, prop.multiProcessorCount);
  bool any_grad = false;
  for (const Row& r : rows) any_grad = any_grad || (r.layout != 1 && unsupported(r).empty());
  if (any_grad)
    std::printf("gradient rows (kn: dgrad, B stored K x N; km-kn: wgrad, A K x M and B K x N): %s, both sides "
                "transposing to K-major (transpose_fp8) in every timed call: time_us = transposes + GEMM; "
                "the transposes alone on their own line (worst: the byte check)\n",
                types_given ? dtype.c_str() : "e5m2xe4m3");
  std::printf("%-20s %-17s %-8s %10s %9s %7s %9s\n", "MxNxK", "impl", "tile", "time_us", "TFLOP/s", "ratio", "worst");
  check::Fp8GemmRef ref;
  const gemm_fp8::ref::Lt lt_handle(64ull << 20);  // the cuBLASLt rows' handle and workspace
  cudaStream_t st = nullptr;
  std::vector<std::string> wrong;
  double log_tensor = 0, log_block = 0;  // log_tensor: the nk rows only
  int n_tensor = 0, n_block = 0;
  double log_all = 0, log_layout[3] = {0, 0, 0};  // every row (gradient rows with their transposes), per layout
  int n_all = 0, n_layout[3] = {0, 0, 0};
  for (size_t si = 0; si < rows.size(); ++si) {
    const Row& s = rows[si];
    const bool grad = s.layout != 1;
    const Fp8 rta = row_types(s).first, rtb = row_types(s).second;
    const bool ea = rta == Fp8::E5M2, eb = rtb == Fp8::E5M2;
    char name[64];
    if (grad) std::snprintf(name, sizeof name, "%dx%dx%d %s", s.M, s.N, s.K, s.layout == 2 ? "km-kn" : "kn");
    else std::snprintf(name, sizeof name, "%dx%dx%d", s.M, s.N, s.K);
    const std::string why = unsupported(s);
    if (!why.empty()) {
      std::printf("%-20s unsupported: %s\n", name, why.c_str());
      sink.write(base_row(s, "weave").add("supported", false).add("reason", why));
      continue;
    }
    // A's and B's bytes, the same in every layout (stored K x M or K x N for the gradient rows).
    const size_t na = size_t(s.M) * s.K, nb = size_t(s.N) * s.K, nc = size_t(s.M) * s.N;
    const size_t nsa = gemm_fp8::block_scale_a_count(s.M, s.K), nsb = gemm_fp8::block_scale_b_count(s.N, s.K);
    const int nsets = std::max(2, std::min(8, static_cast<int>(std::ceil(3.0 * l2 / double(na + nb)))));
    Sets d;
    for (int i = 0; i < nsets; ++i) {
      uint8_t *a, *b;
      float *sa, *sb, *bsa, *bsb;
      WEAVE_CUDA_CHECK(cudaMalloc(&a, na));
      WEAVE_CUDA_CHECK(cudaMalloc(&b, nb));
      WEAVE_CUDA_CHECK(cudaMalloc(&sa, sizeof(float)));
      WEAVE_CUDA_CHECK(cudaMalloc(&sb, sizeof(float)));
      WEAVE_CUDA_CHECK(cudaMalloc(&bsa, nsa * sizeof(float)));
      WEAVE_CUDA_CHECK(cudaMalloc(&bsb, nsb * sizeof(float)));
      d.a.push_back(a), d.b.push_back(b), d.sa.push_back(sa), d.sb.push_back(sb), d.bsa.push_back(bsa),
          d.bsb.push_back(bsb);
      // Operands spread over most of e4m3's range, scales as a quantiser would pick them.
      check::fill_fp8_uniform(a, ea, na, check::derive(seed, si, 6 * i), 256.f);
      check::fill_fp8_uniform(b, eb, nb, check::derive(seed, si, 6 * i + 1), 256.f);
      check::fill_log_uniform(sa, 1, check::derive(seed, si, 6 * i + 2), 1e-3f, 1e-2f);
      check::fill_log_uniform(sb, 1, check::derive(seed, si, 6 * i + 3), 1e-3f, 1e-2f);
      check::fill_log_uniform(bsa, nsa, check::derive(seed, si, 6 * i + 4), 1e-3f, 1e-1f);
      check::fill_log_uniform(bsb, nsb, check::derive(seed, si, 6 * i + 5), 1e-3f, 1e-1f);
    }
    WEAVE_CUDA_CHECK(cudaMalloc(&d.c, nc * 2));
    if (grad) {
      WEAVE_CUDA_CHECK(cudaMalloc(&d.bt, nb));
      WEAVE_CUDA_CHECK(cudaMalloc(&d.ref_bt, nb));
      if (s.layout == 2) {
        WEAVE_CUDA_CHECK(cudaMalloc(&d.at, na));
        WEAVE_CUDA_CHECK(cudaMalloc(&d.ref_at, na));
      }
    }
    // The gradient rows' transposes of set `set` into d.at / d.bt (nothing for nk rows), and the
    // operands the GEMM then reads (M x K and N x K).
    auto transposes = [&](int set) {
      if (s.layout == 2) gemm_fp8::transpose_fp8(d.a[set], d.at, s.K, s.M, st);
      if (grad) gemm_fp8::transpose_fp8(d.b[set], d.bt, s.K, s.N, st);
    };
    auto op_a = [&](int set) -> const uint8_t* { return s.layout == 2 ? d.at : d.a[set]; };
    auto op_b = [&](int set) -> const uint8_t* { return grad ? d.bt : d.b[set]; };
    // The reference's operands of set `set`: as stored (nk), or naive_transpose's copies.
    int ref_copies = -1;  // the set whose copies d.ref_at / d.ref_bt hold
    auto ref_operands = [&](int set) -> std::pair<const uint8_t*, const uint8_t*> {
      if (!grad) return {d.a[set], d.b[set]};
      if (ref_copies != set) {
        if (s.layout == 2) naive_transpose(d.a[set], d.ref_at, s.K, s.M, st);
        naive_transpose(d.b[set], d.ref_bt, s.K, s.N, st);
        ref_copies = set;
      }
      return {s.layout == 2 ? d.ref_at : d.a[set], d.ref_bt};
    };
    // Two references (r and sqrt(s2)) kept, keyed by 2 * set + block: an implementation's checks
    // (its last timed call's set and the fresh call's) and the next implementation's share them.
    struct RefSlot {
      float *r = nullptr, *s = nullptr;
      int key = -1;
    } slots[2];
    for (RefSlot& sl : slots) {
      WEAVE_CUDA_CHECK(cudaMalloc(&sl.r, nc * sizeof(float)));
      WEAVE_CUDA_CHECK(cudaMalloc(&sl.s, nc * sizeof(float)));
    }
    int next_slot = 0;  // the slot the next missing reference replaces (the older one)
    auto check_c = [&](int set, bool block) {
      const int key = 2 * set + block;
      RefSlot* sl = slots[0].key == key ? &slots[0] : slots[1].key == key ? &slots[1] : nullptr;
      if (!sl) {
        sl = &slots[next_slot];
        next_slot ^= 1;
        if (block) ref.run_block(d.a[set], ea, d.b[set], eb, s.M, s.N, s.K, d.bsa[set], d.bsb[set], sl->r, sl->s, st);
        else {
          const auto [ra, rb] = ref_operands(set);
          ref.run(ra, ea, rb, eb, s.M, s.N, s.K, d.sa[set], d.sb[set], sl->r, sl->s, st);
        }
        check::sqrt_inplace(sl->s, nc, st);
        sl->key = key;
      }
      const check::Bound b = block ? check::fp8_promoted_bound() : check::fp8_tensor_core_bound(s.K);
      return check::compare({d.c, s.N}, {sl->r, s.N}, {sl->s, s.N}, s.M, s.N, b, 128, 128, st);
    };
    const double flop = 2.0 * s.M * s.N * s.K;
    // ~target_ms per repeat at a guessed 1200 TFLOP/s.
    const int iters = std::max(3, std::min(400, static_cast<int>(target_ms * 1e-3 / (flop / 1200e12))));
    int it = 0, last = -1;
    // Gradient rows: the transposes alone, timed as the rows are (rotating input sets, median of 5
    // repeats of ~target_ms at a guessed 3.5 TB/s), then the copies they left (set `last`) compared
    // byte for byte with the stored operands.
    double t_tr = 0;
    bool tr_exact = true;
    if (grad) {
      const double tr_bytes = 2.0 * double((s.layout == 2 ? na : 0) + nb);  // read + write
      const int tr_iters = std::max(3, std::min(1000, static_cast<int>(target_ms * 1e-3 / (tr_bytes / 3.5e12))));
      t_tr = time_us(st, [&] {
        last = it++ % nsets;
        transposes(last);
      }, 3, tr_iters, 5);
      std::string bad;
      auto compare_copy = [&](const char* what, const uint8_t* src, const uint8_t* dst, int src_rows, int src_cols) {
        unsigned long long first = 0;
        const unsigned long long n = transpose_mismatches(src, dst, src_rows, src_cols, st, &first);
        if (n)  // the copy is src_cols x src_rows
          bad += std::string(bad.empty() ? "" : "; ") + what + ": " + std::to_string(n) + " of " +
                 std::to_string(size_t(src_rows) * src_cols) + " bytes differ, the first at row " +
                 std::to_string(first / src_rows) + ", column " + std::to_string(first % src_rows) + " of the copy";
      };
      if (s.layout == 2) compare_copy("A (K x M -> M x K)", d.a[last], d.at, s.K, s.M);
      compare_copy("B (K x N -> N x K)", d.b[last], d.bt, s.K, s.N);
      tr_exact = bad.empty();
      std::printf("%-20s %-17s %-8s %10.1f %9s %7s %9s  %.0f GB/s%s\n", name, "transposes", "-", t_tr, "-", "-",
                  tr_exact ? "exact" : "-", tr_bytes / t_tr * 1e-3, tr_exact ? "" : "  WRONG");
      if (!tr_exact) {
        std::printf("  transpose_fp8 %s: %s\n", name, bad.c_str());
        wrong.push_back(std::string("transpose_fp8 ") + name);
      }
    }
    // Times fn (which calls on set it % nsets and sets `last` to it; for the gradient rows the
    // transposes and the GEMM), checks the last timed call and one fresh call on the next set into
    // a re-poisoned C (recheck.hpp), prints and writes the row; returns the time in µs.
    auto measure = [&](const char* impl, const char* tile, bool block, auto&& fn, double base_us,
                       const char* ratio_key) -> double {
      it = 0, last = -1;
      check::poison(d.c, nc, st);
      const double t = time_us(st, fn, 3, iters, 5);
      const check::Report rep = check_last_and_fresh(
          last, nsets, [&](int set) { return check_c(set, block); }, [&] { check::poison(d.c, nc, st); },
          [&](int set) {
            it = set;
            fn();
          });
      const double tf = flop / t * 1e-6;
      const double ratio = base_us > 0 ? base_us / t : 0;
      char rs[16] = "-";
      if (base_us > 0) std::snprintf(rs, sizeof rs, "%.3f", ratio);
      std::printf("%-20s %-17s %-8s %10.1f %9.1f %7s %9.3g%s\n", name, impl, tile, t, tf, rs, rep.worst,
                  rep.ok ? "" : "  WRONG");
      if (!rep.ok) {
        std::printf("  %s %s: %s\n", impl, name, rep.str().c_str());
        wrong.push_back(std::string(impl) + " " + name);
      }
      JsonLine j = base_row(s, impl);
      j.add("scales", block ? "block" : "tensor").add("tile", tile).add("time_us", t).add("tflops", tf);
      if (grad) j.add("transpose_us", t_tr).add("transposes_exact", tr_exact);
      if (base_us > 0) j.add(ratio_key, ratio);
      if (block) j.add("ratio_vs_deepgemm", tf / 1550.0);
      j.add("correct", rep.ok).add("seed", std::to_string(seed));
      sink.write(add_worst(j, rep.worst));
      return t;
    };
    double t_lt = 0, t_weave = 0;
    // cuBLASLt's descriptors, one per input set (each set has its own per-tensor scales).
    std::vector<gemm_fp8::ref::Scales> lt_scales;
    for (int i = 0; i < nsets; ++i) lt_scales.push_back({d.sa[i], d.sb[i]});
    for (bool fast : {true, false}) {
      const char* impl = fast ? "cublaslt" : "cublaslt_precise";
      if (!wants(impl)) continue;
      const gemm_fp8::ref::TnMatmul lt(lt_handle, s.M, s.N, s.K, lt_type(rta), lt_type(rtb), CUDA_R_16BF, fast,
                                       lt_scales);
      if (!lt.ok()) {
        std::printf("%-20s %-17s no cuBLASLt fp8 algorithm for this shape\n", name, impl);
        sink.write(base_row(s, impl).add("supported", false).add("reason", "cuBLASLt heuristic found no algorithm"));
        continue;
      }
      const double t = measure(impl, "-", false, [&] {
        last = it++ % nsets;
        transposes(last);
        lt.run(op_a(last), op_b(last), d.c, st, last);
      }, 0, "");
      if (fast) t_lt = t;
    }
    if (wants("weave") && (opt.tile == gemm_fp8::Tile::M128Nw || opt.tile == gemm_fp8::Tile::SwappedW) &&
        !gemm_fp8::wide_pair(rta, rtb)) {
      // --types e4m3xe5m2 under --tile wNNN / swNNN.
      const char* why_w = "the 128 x w tiles take an e4m3 B only";
      std::printf("%-20s %-17s unsupported: %s\n", name, "weave", why_w);
      sink.write(base_row(s, "weave").add("supported", false).add("reason", why_w));
    } else if (wants("weave")) {
      const gemm_fp8::Launch used = gemm_fp8::choose_launch(s.M, s.N, s.K, opt, rta, rtb);
      const std::string used_name = gemm_fp8::launch_name(used);
      t_weave = measure("weave", used_name.c_str(), false, [&] {
        last = it++ % nsets;
        transposes(last);
        gemm_fp8::gemm(op_a(last), rta, op_b(last), rtb, d.c, s.M, s.N, s.K, d.sa[last], d.sb[last], opt, st);
      }, t_lt, "ratio_vs_cublas");
      if (t_lt > 0) {
        const double l = std::log(t_lt / t_weave);
        if (!grad) log_tensor += l, ++n_tensor;
        log_all += l, ++n_all;
        log_layout[s.layout] += l, ++n_layout[s.layout];
      }
    }
    if (wants("weave_block") && grad) {
      const char* why_b = "gradient rows run per-tensor scales only (block-scaled wgrad needs dY and X quantised "
                          "per 128 tokens, not a transpose of the forward's)";
      std::printf("%-20s %-17s unsupported: %s\n", name, "weave_block", why_b);
      sink.write(base_row(s, "weave_block").add("supported", false).add("reason", why_b));
    } else if (wants("weave_block")) {
      gemm_fp8::Options ob = opt;
      ob.tile = block_tile_opt;
      const std::string block_tile = gemm_fp8::launch_name(gemm_fp8::choose_block_launch(s.M, s.N, s.K, ob));
      const double t = measure("weave_block", block_tile.c_str(), true, [&] {
        last = it++ % nsets;
        gemm_fp8::gemm_block_scaled(d.a[last], ta, d.b[last], tb, d.c, s.M, s.N, s.K, d.bsa[last], d.bsb[last], ob,
                                    st);
      }, t_weave, "ratio_vs_weave");
      if (t_weave > 0) log_block += std::log(t_weave / t), ++n_block;
    }
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    for (RefSlot& sl : slots) cudaFree(sl.r), cudaFree(sl.s);
  }
  // The nk rows' geomean, as before the gradient rows ran (docs cite this line).
  if (n_tensor) std::printf("geomean weave/cuBLASLt (fast accumulation) over %d shapes: %.3f\n", n_tensor,
                            std::exp(log_tensor / n_tensor));
  if (n_all > n_tensor) {
    std::string per;
    for (int l : {1, 0, 2}) {
      char b[64];
      const char* ln = l == 1 ? "nk" : l == 0 ? "kn" : "km-kn";
      if (n_layout[l]) std::snprintf(b, sizeof b, "%s%s %d: %.3f", per.empty() ? "" : ", ", ln, n_layout[l],
                                     std::exp(log_layout[l] / n_layout[l]));
      else std::snprintf(b, sizeof b, "%s%s 0: -", per.empty() ? "" : ", ", ln);
      per += b;
    }
    std::printf("geomean weave/cuBLASLt (fast accumulation) over all %d rows, gradient rows with their transposes: "
                "%.3f (%s)\n", n_all, std::exp(log_all / n_all), per.c_str());
  }
  if (n_block) std::printf("geomean weave block-scaled / weave per-tensor over %d shapes: %.3f\n", n_block,
                           std::exp(log_block / n_block));
  return exit_status("gemm_fp8", wrong, seed);
}

}  // namespace

// `weave-bench gemm --dtype fp8` reaches this entry through main.cpp's hook.
WEAVE_BENCH(gemm_fp8,
            "fp8 GEMM (A M x K, B N x K, bf16 out): weave per-tensor and block-scaled vs cuBLASLt fp8 "
            "(--shapes MxNxK,... or --set core|models|tokens|drawn (drawn: --draws N shapes by the models rule from --draw-seed S; models adds the dgrad / wgrad rows: transpose_fp8 copies "
            "then the GEMM, e5m2 x e4m3, for both sides), --list (--plan-sms N: with the per-tensor planner's launch on N SMs), --types e4m3xe4m3|e5m2xe4m3|e4m3xe5m2, "
            "--tile auto|256|128|64|swapped|w96..w208|sw32..sw208, --block-tile auto|128|192, --split-k N (0 planner, 1 never), --lane-scales 0|1|2 (block scales' B loads: auto, uniform, per lane), --impl cublaslt,cublaslt_precise,weave,weave_block, --target-ms T); "
            "also `weave-bench gemm --dtype fp8`",
            run_gemm_fp8_bench);
