// weave-bench tp: the tensor-parallel fused kernels (ag_gemm, gemm_rs, gemm_ar) against weave's
// own GEMM alone on the same local shape (the ceiling) and cuBLAS + NCCL unfused, in one run,
// under weave-run. Shapes (world W): AG+GEMM local GEMM S x (S/W) x S after gathering A;
// GEMM+RS and GEMM+AR local GEMM S x S x (S/W). The slowest rank's time decides.
//   --sizes 2048,...,32768   --kernels ag_gemm,gemm_rs,gemm_ar    --num-comm-sms N (no tuner)
//   --sweep 0,4,8,16,32,64   (ag_gemm and gemm_ar at --sweep-sizes, default 4096,16384)
//   --table3                 (gemm_rs M = N = 16384, K_local 512..8192: overlap fraction)
#include <cuda_bf16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "ag_gemm/ag_gemm.hpp"
#include "bench.hpp"
#include "gemm/gemm.hpp"
#include "gemm_ar/gemm_ar.hpp"
#include "gemm_rs/gemm_rs.hpp"
#include "../../bench/nccl_comm.hpp"
#include "gemm/reference.cuh"
#include "weave/runtime/communicator.hpp"

namespace {

using namespace weave;
using tp::bf16;

namespace gref = gemm::ref;


struct Ctx {
  runtime::Communicator& c;
  bench::NcclComm& nccl;
  gref::CublasLt& blas;
  bench::JsonSink& json;
  cudaStream_t st;
  int W, rank;
  bool host_us = false;  // --host-us: also the host's time to issue one fused call
};

// Implementations timed in turns, median per implementation, slowest rank (each rank times its
// loop after a host barrier), so that clock and power drift during a run lands on all of them
// alike instead of on whichever was timed last (perf-notes 14).
//
// From S = 4096 the GEMMs run at the 700 W power cap, where the SM clock swings between about
// 1200 and 1850 MHz (nvidia-smi, perf-notes 21), and what a sample measures depends on what ran
// just before it: after a pause or a lighter implementation the clock starts high and drops
// ~15 % after 40-60 ms. So every sample is kSteadyWarmUs (~100 ms) of warm-up calls of the same
// implementation followed by ~50 ms of timed calls (the steady state a training loop sees; the
// tuner and bench/torch_tp.py sample the same way), and the order of the turns runs through
// every permutation, so that each implementation follows each other one equally often (a
// rotation keeps the cyclic order: it had GEMM alone always right after cuBLAS + NCCL).
std::vector<double> timed_turns(Ctx& x, const std::vector<std::function<void()>>& fns) {
  std::vector<SamplePlan> plan;
  for (const auto& fn : fns) plan.push_back(steady_plan(tp::slowest_call_us(x.c, x.st, fn), 50e3, 2000, 1000));
  const int repeats = fns.size() >= 3 ? 6 : 3;  // 3! orders
  x.c.barrier();
  std::vector<std::vector<double>> t(fns.size());
  std::vector<size_t> order(fns.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (int rep = 0; rep < repeats; ++rep, std::next_permutation(order.begin(), order.end()))
    for (size_t i : order) {
      t[i].push_back(bench::time_us(x.st, fns[i], plan[i].warm, plan[i].iters, 1));
      x.c.barrier();  // every rank starts the next implementation together
    }
  std::vector<double> out;
  for (auto& v : t) {
    double m = bench::median(v);
    std::vector<double> all(x.W);
    x.c.bootstrap().all_gather(&m, all.data(), sizeof m);
    for (double y : all) m = y > m ? y : m;
    out.push_back(m);
  }
  return out;
}

bool all_ok(Ctx& x, bool ok) {
  int mine = ok ? 1 : 0;
  std::vector<int> all(x.W);
  x.c.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  for (int v : all) ok = ok && v;
  return ok;
}

struct Row {
  std::string kernel, impl;
  int S, M, N, K;
  double us;
  int ncomm;
  bool correct;
  double err;
  int variant = 0;
};

void emit(Ctx& x, const Row& r, const char* extra_key = nullptr, double extra = 0) {
  const double tf = 2.0 * r.M * r.N * r.K / (r.us * 1e-6) / 1e12;
  if (x.rank == 0) {
    bench::JsonLine j;
    j.add("kernel", r.kernel).add("impl", r.impl).add("S", r.S).add("M", r.M).add("N", r.N).add("K", r.K);
    j.add("world", x.W).add("time_us", r.us).add("tflops", tf).add("num_comm_sms", r.ncomm).add("correct", r.correct);
    j.add("rel_err", r.err).add("variant", r.variant);
    if (extra_key) j.add(extra_key, extra);
    x.json.write(j);
  }
}

// One kernel at one size: GEMM alone, fused, cuBLAS + NCCL; returns the fused row.
Row run_one(Ctx& x, const std::string& kernel, int S, int fixed_comm, bool print, bool baselines = true,
            int K_override = 0, int variant = -1) {
  const int W = x.W, r = x.rank;
  const bool ag = kernel == "ag_gemm";
  const int M = S, N = ag ? S / W : S, K = ag ? S : (K_override ? K_override : S / W);
  const uint64_t seed = 12345 + 7919 * r;
  tp::Options o;
  o.num_comm_sms = fixed_comm;
  o.variant = variant;
  Row fused{kernel, "weave", S, M, N, K, 0, 0, false, 0}, alone = fused, base = fused;
  alone.impl = "weave-gemm-alone";
  base.impl = "cublas+nccl";
  bf16 *A = nullptr, *B = nullptr, *Cref = nullptr, *Cloc = nullptr;
  // Times the checked fused call (the launch info it fills is read after the timing), then, with
  // baselines, cuBLAS + NCCL and weave's GEMM alone on the same local shape.
  auto measure = [&](auto& fused_fn, auto& ref, auto&& alone_fn, const tp::LaunchInfo& li) {
    if (baselines) {
      const std::vector<double> t = timed_turns(x, {fused_fn, ref, alone_fn});
      fused.us = t[0], base.us = t[1], alone.us = t[2];
      base.correct = alone.correct = true;
    } else {
      fused.us = timed_turns(x, {fused_fn})[0];
    }
    fused.ncomm = li.num_comm_sms;
    fused.variant = li.variant;
    if (x.host_us) {  // the same calls on the host clock: when this is the time per call, the host sets the pace
      constexpr int n = 20;
      x.c.sync(x.st);
      x.c.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) fused_fn();
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
      x.c.sync(x.st);
      if (x.rank == 0) std::printf("    %s S=%d host us per fused call (rank 0): %.1f (device %.1f)\n", kernel.c_str(), S, us, fused.us);
    }
  };
  WEAVE_CUDA_CHECK(cudaMalloc(&B, size_t(K) * N * sizeof(bf16)));
  gref::fill_uniform(B, size_t(K) * N, seed + 2);
  if (ag) {
    const tp::Range sh = tp::shard(M, W, r);
    bf16* G = static_cast<bf16*>(x.c.alloc(size_t(M) * K * sizeof(bf16)));
    bf16 *Ash, *Gref;
    WEAVE_CUDA_CHECK(cudaMalloc(&Ash, size_t(sh.size) * K * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMalloc(&Gref, size_t(M) * K * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMalloc(&Cref, size_t(M) * N * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMalloc(&Cloc, size_t(M) * N * sizeof(bf16)));
    gref::fill_uniform(Ash, size_t(sh.size) * K, seed + 1);
    tp::AgGemm op(x.c);
    auto ref = [&] {
      WEAVE_NCCL_CHECK(ncclAllGather(Ash, Gref, size_t(sh.size) * K, ncclBfloat16, x.nccl.get(), x.st));
      x.blas.run(Gref, B, Cref, M, N, K, gemm::BLayout::KN, false, x.st);
    };
    tp::LaunchInfo li{};
    auto fused_fn = [&] { li = op.run(Ash, G, B, Cloc, M, N, K, o, x.st); };
    gref::poison(Cloc, size_t(M) * N, x.st);
    fused_fn();
    ref();
    const double eg = gref::rel_error(G, Gref, size_t(M) * K, x.st), ec = gref::rel_error(Cloc, Cref, size_t(M) * N, x.st);
    fused.err = ec;
    fused.correct = all_ok(x, eg == 0.0 && ec < 1e-2);
    measure(fused_fn, ref, [&] { gemm::gemm(Gref, B, Cref, M, N, K, gemm::BLayout::KN, {}, x.st); }, li);
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    x.c.barrier();
    x.c.free(G);
    cudaFree(Ash);
    cudaFree(Gref);
  } else {
    const bool rs = kernel == "gemm_rs";
    WEAVE_CUDA_CHECK(cudaMalloc(&A, size_t(M) * K * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMalloc(&Cref, size_t(M) * N * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMalloc(&Cloc, size_t(M) * N * sizeof(bf16)));
    gref::fill_uniform(A, size_t(M) * K, seed + 1);
    const size_t out_n = rs ? tp::GemmRS::out_elems(M, N, W) : size_t(M) * N;
    bf16* out = static_cast<bf16*>(x.c.alloc(out_n * sizeof(bf16)));
    const tp::Range sh = tp::shard(M, W, r);
    tp::GemmRS rsop(x.c);
    tp::GemmAR arop(x.c);
    tp::LaunchInfo li{};
    auto fused_fn = [&] {
      if (rs) li = rsop.run(A, B, out, M, N, K, o, x.st);
      else li = arop.run(A, B, out, M, N, K, o, x.st);
    };
    // Unfused: the local GEMM, then NCCL (reduce-scatter of equal row blocks, or all-reduce).
    bf16* rsout = Cloc;
    auto ref = [&] {
      x.blas.run(A, B, Cref, M, N, K, gemm::BLayout::KN, false, x.st);
      if (rs) WEAVE_NCCL_CHECK(ncclReduceScatter(Cref, rsout, size_t(M / W) * N, ncclBfloat16, ncclSum, x.nccl.get(), x.st));
      else WEAVE_NCCL_CHECK(ncclAllReduce(Cref, Cref, size_t(M) * N, ncclBfloat16, ncclSum, x.nccl.get(), x.st));
    };
    gref::poison(out, out_n, x.st);
    fused_fn();
    ref();
    const double e = rs ? gref::rel_error(out, rsout, size_t(sh.size) * N, x.st) : gref::rel_error(out, Cref, size_t(M) * N, x.st);
    fused.err = e;
    fused.correct = all_ok(x, e < 1e-2);
    measure(fused_fn, ref, [&] { gemm::gemm(A, B, Cref, M, N, K, gemm::BLayout::KN, {}, x.st); }, li);
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    x.c.barrier();
    x.c.free(out);
    cudaFree(A);
  }
  cudaFree(B);
  cudaFree(Cref);
  cudaFree(Cloc);
  if (baselines) {
    emit(x, alone);
    emit(x, base);
  }
  emit(x, fused, baselines ? nullptr : "sweep", 1);  // sweep rows: a fixed num_comm_sms / variant
  if (print && x.rank == 0) {
    auto tf = [&](double us) { return 2.0 * M * N * K / (us * 1e-6) / 1e12; };
    if (baselines)
      std::printf("| %s | %d | %dx%dx%d | %.1f / %.0f | %.1f / %.0f | %.1f / %.0f | %d (v%d) | %.3f | %.3f | %s %.1e |\n",
                  kernel.c_str(), S, M, N, K, alone.us, tf(alone.us), base.us, tf(base.us), fused.us, tf(fused.us),
                  fused.ncomm, fused.variant, fused.us > 0 ? alone.us / fused.us : 0, fused.us > 0 ? base.us / fused.us : 0,
                  fused.correct ? "ok" : "WRONG", fused.err);
    else
      std::printf("| %s | %d | %dx%dx%d | %d | %d | %.1f | %.0f | %s |\n", kernel.c_str(), S, M, N, K, fused.variant,
                  fused.ncomm, fused.us, tf(fused.us), fused.correct ? "ok" : "WRONG");
    std::fflush(stdout);
  }
  if (baselines) fused.err = alone.us;  // hand the GEMM-alone time to Table 3
  return fused;
}

int run(const bench::Args& a) {
  const auto sizes = a.numbers("sizes", "2048,4096,8192,16384,32768");
  const auto kernels = a.names("kernels", "ag_gemm,gemm_rs,gemm_ar");
  const int fixed = static_cast<int>(a.get_int("num-comm-sms", -1));
  const int variant = static_cast<int>(a.get_int("variant", -1));
  long long maxS = 0;
  for (long long s : sizes) maxS = s > maxS ? s : maxS;
  if (a.has("table3") || a.has("sweep")) maxS = maxS > 16384 ? maxS : 16384;
  runtime::CommOptions co;
  co.heap_bytes = 3 * size_t(maxS) * maxS * 2 + (size_t(256) << 20);  // + gemm_rs v2's M x N scratch
  runtime::Communicator c(co);
  bench::NcclComm nccl(c);
  gref::CublasLt blas;
  bench::JsonSink json(a);
  cudaStream_t st;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  Ctx x{c, nccl, blas, json, st, c.world(), c.rank()};
  x.host_us = a.has("host-us");
  if (x.rank == 0) {
    std::printf("weave-bench tp: world %d, %s, %d SMs; times in us (slowest rank) / TFLOP/s of the local GEMM\n", x.W,
                c.props().name, c.sm_count());
    std::printf("| kernel | S | local MxNxK | GEMM alone | cuBLAS+NCCL | weave fused | comm SMs | fused/alone | fused/cuBLAS+NCCL | check |\n|---|---|---|---|---|---|---|---|---|---|\n");
  }
  if (!a.has("only-extra"))
    for (const auto& k : kernels)
      for (long long S : sizes) run_one(x, k, static_cast<int>(S), fixed, true, true, 0, variant);
  if (a.has("sweep")) {
    auto counts = a.numbers("sweep", "");
    if (counts.empty()) counts = {0, 4, 8, 16, 32, 64};  // bare --sweep
    const auto ss = a.numbers("sweep-sizes", "4096,16384");
    if (x.rank == 0) std::printf("\nnum_comm_sms sweep\n| kernel | S | local MxNxK | variant | comm SMs | us | TFLOP/s | check |\n|---|---|---|---|---|---|---|---|\n");
    for (const char* k : {"ag_gemm", "gemm_ar"})
      for (long long S : ss)
        for (long long n : counts) {
          const bool ag = std::string(k) == "ag_gemm";
          if (n == 0)  // no communicator SM: ag_gemm's aux-warp pushes 2..6, copy engine 7, 8, all_gather 9;
                       // gemm_ar's 1
            for (int v = ag ? 2 : 1; v <= (ag ? 9 : 1); ++v) run_one(x, k, static_cast<int>(S), 0, true, false, 0, v);
          else
            for (int v = 0; v < (ag ? 2 : 1); ++v) run_one(x, k, static_cast<int>(S), static_cast<int>(n), true, false, 0, v);
        }
  }
  if (a.has("table3")) {
    const double Bw = 370e9;  // usable NVLink bandwidth per direction (shared/HARDWARE.md)
    if (x.rank == 0)
      std::printf("\nTable 3: GEMM+RS, M = N = 16384, world %d\n| K_local | GEMM alone us | fused us | non-overlapped (fused-alone)/fused | R TFLOP/s | predicted K >= s*R/(2B) |\n|---|---|---|---|---|---|\n", x.W);
    for (int K : {512, 1024, 2048, 4096, 8192}) {
      Row r = run_one(x, "gemm_rs", 16384, -1, false, true, K);
      const double alone = r.err, R = 2.0 * 16384.0 * 16384.0 * K / (alone * 1e-6);
      const double frac = (r.us - alone) / r.us, thr = 2.0 * R / (2.0 * Bw);
      if (x.rank == 0) {
        std::printf("| %d | %.1f | %.1f | %.3f | %.0f | %.0f |\n", K, alone, r.us, frac, R / 1e12, thr);
        std::fflush(stdout);
        json.write(bench::JsonLine().add("kernel", "gemm_rs").add("impl", "table3").add("M", 16384).add("N", 16384)
                       .add("K", K).add("world", x.W).add("alone_us", alone).add("fused_us", r.us)
                       .add("non_overlapped", frac).add("k_threshold", thr));
      }
    }
  }
  WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
  return 0;
}

}  // namespace

WEAVE_BENCH(tp,
            "TP fused kernels (ag_gemm, gemm_rs, gemm_ar) vs GEMM alone and cuBLAS+NCCL, 2+ ranks (--sizes "
            "2048,...,32768 --kernels ag_gemm,gemm_rs,gemm_ar --num-comm-sms N --variant V --sweep 0,4,...,64 "
            "--sweep-sizes 4096,16384 --table3 --only-extra --host-us)",
            run);
