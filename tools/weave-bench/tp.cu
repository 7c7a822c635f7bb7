// weave-bench tp: the tensor-parallel fused kernels (ag_gemm, gemm_rs, gemm_ar) against weave's
// own GEMM alone on the same local shape (the ceiling) and cuBLAS + NCCL unfused, in one run,
// under weave-run. Shapes (world W): AG+GEMM local GEMM S x (S/W) x S after gathering A;
// GEMM+RS and GEMM+AR local GEMM S x S x (S/W). The slowest rank's time decides.
//   --sizes 2048,...,32768   --kernels ag_gemm,gemm_rs,gemm_ar    --num-comm-sms N (no tuner)
//   --variant V              every listed kernel restricted to its variant V (tp_common/variants.hpp;
//                            V must be one of each kernel's); the adaptive splits (ag_gemm 10,
//                            gemm_rs 6, gemm_ar 2) run only when named, bf16 only
//   --sweep 0,4,8,16,32,64   at --sweep-sizes (default 4096,16384), for the kernels of an explicit
//                            --kernels (else all three), the fused call alone, rows with "sweep": 1:
//                            ag_gemm v0 and v1 at each count > 0, v2..v9 and (bf16) the
//                            adaptive v10 at 0; gemm_ar v0 at each count > 0, v1 and the adaptive v2
//                            at 0; gemm_rs (bf16) v2 at each count > 0, the adaptive v6 at 0. Then, in
//                            bf16 with 0 and a count > 0 in the list, one tuned call per kernel and
//                            size (the tuner's own pick: "sweep": 0) and the row "impl":
//                            "adaptive-vs-fixed": adaptive_us, best_fixed_us (the fastest of those
//                            splits: best_fixed_comm_sms, best_fixed_variant), ratio (adaptive /
//                            best fixed), tuned_us, tuned_variant, tuned_comm_sms, ratio_tuned
//                            (adaptive / tuned), early_reductions, peak_comm_blocks (Row says what)
//   --table3                 (gemm_rs M = N = 16384, K_local 512..8192: overlap fraction)
//   --only-extra             no default rows, only the sweep and / or --table3; the sweep alone
//                            (no --table3) starts no NCCL
// Under weave-run --share-gpus (ranks sharing a GPU; NCCL refuses them) the default rows are weave's
// fused calls alone, without the cuBLAS + NCCL and GEMM-alone rows, checked as always (their times
// mean nothing: the ranks time-slice; their JSON lines carry "shared_gpu": true), and --table3,
// which times GEMM alone beside the fused call, is refused.
// Every row, weave's and the baselines', is checked on its last timed call and on one more call on
// the other input set into re-poisoned outputs (recheck.hpp's rule), against a float32 reference
// every rank computes without NCCL (run_one says how); a row is correct only when both checks pass
// on every rank, and any incorrect row makes the command exit 1 after listing them. Inputs derive
// from rank 0's WEAVE_TEST_SEED (printed; set it to replay a run).
//   --dtype bf16|fp8         fp8: e4m3 A and B (B N x K) with per-tensor scales, bf16 out, for
//                            ag_gemm and gemm_rs (gemm_ar has none), against weave's fp8 GEMM alone
//                            and cuBLASLt fp8 + NCCL; rows carry "dtype": "e4m3xe4m3" (run_one)
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "ag_gemm/ag_gemm.hpp"
#include "bench.hpp"
#include "bitwise.cuh"
#include "check/gemm_fp8_ref.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "recheck.hpp"
#include "gemm_fp8/gemm_fp8.hpp"
#include "check/gemm_fp8_baseline.cuh"
#include "gemm_ar/gemm_ar.hpp"
#include "gemm_rs/gemm_rs.hpp"
#include "../../bench/nccl_comm.hpp"
#include "shared_gpu.hpp"
#include "check/gemm_baseline.cuh"
#include "weave/runtime/communicator.hpp"

namespace {

using namespace weave;
using tp::bf16;
using f8 = __nv_fp8_e4m3;

namespace gref = gemm::ref;

constexpr const char* kFp8Dtype = "e4m3xe4m3";  // the "dtype" of fp8 rows (as weave-bench gemm_fp8's)


struct Ctx {
  runtime::Communicator& c;
  // The baselines' NCCL; null where no row has baselines (--only-extra without --table3: the
  // sweep alone, which also runs with ranks sharing a GPU, where NCCL refuses to start).
  bench::NcclComm* nccl;
  gref::CublasLt& blas;
  bench::JsonSink& json;
  cudaStream_t st;
  int W, rank;
  check::GemmRef& ref;   // the float32 reference of every check
  uint64_t seed = 0;     // rank 0's check::test_seed()
  uint64_t calls = 0;    // run_one calls so far (the same on every rank): each gets its own inputs
  bool host_us = false;  // --host-us: also the host's time to issue one fused call
  gemm::BLayout bl = gemm::BLayout::KN;  // --b-layout: B as K x N, or N x K (an nn.Linear weight)
  std::vector<std::string> wrong;  // incorrect rows (every rank lists the same ones)
  bool fp8 = false;                   // --dtype fp8 (then also fref and lt)
  check::Fp8GemmRef* fref = nullptr;  // the float32 reference of the fp8 checks
  const gemm_fp8::ref::Lt* lt = nullptr;  // the cuBLASLt fp8 baseline's handle and workspace
  bool shared = false;  // ranks share a GPU: no NCCL, weave's rows only (shared_gpu.hpp)
  bool sweep = false;   // run_one's rows are --sweep's (their JSON lines carry "sweep")
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
  for (const auto& fn : fns) plan.push_back(steady_plan(runtime::slowest_call_us(x.c, x.st, fn), 50e3, 2000, 1000));
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

struct Row {
  std::string kernel, impl;
  int S, M, N, K;
  double us = 0;
  int ncomm = 0;
  bool correct = false;
  double worst = 0;  // the checker's worst |x - r| / bound over ranks and checks (> 1: wrong)
  int checks = 0;    // settle_check calls so far (the last timed call's, then the fresh call's)
  int variant = 0;
  double alone_us = 0;  // the fused row of run_one: GEMM alone's time (Table 3)
  // The adaptive split's statistics (gemm_rs v6, gemm_ar v2, ag_gemm v10), rank 0 over the row's
  // calls (the tuner's samples included): the share of its communication tasks handed out while
  // tiles were still unclaimed, and the most blocks communicating then (-1: not an adaptive row).
  // The tasks are gemm_rs / gemm_ar's reductions of the tiles the rank owns and, under the same
  // JSON name, ag_gemm's push units of the rank's shard (its row tiles x ag_slices each).
  double early_reductions = -1;
  long long peak_comm_blocks = -1;
};

void emit(Ctx& x, const Row& r, const char* extra_key = nullptr, double extra = 0) {
  const double tf = 2.0 * r.M * r.N * r.K / (r.us * 1e-6) / 1e12;
  if (!r.correct) x.wrong.push_back(r.kernel + (x.fp8 ? " fp8 " : " ") + r.impl + " S=" + std::to_string(r.S) + " (" +
                                    std::to_string(r.M) + "x" + std::to_string(r.N) + "x" + std::to_string(r.K) +
                                    ", variant " + std::to_string(r.variant) + ", comm " + std::to_string(r.ncomm) + ")");
  if (x.rank == 0) {
    bench::JsonLine j;
    j.add("kernel", r.kernel).add("impl", r.impl).add("S", r.S).add("M", r.M).add("N", r.N).add("K", r.K);
    j.add("layout", x.bl == gemm::BLayout::NK ? "nk" : "kn").add("world", x.W).add("time_us", r.us);
    if (x.fp8) j.add("dtype", kFp8Dtype);
    j.add("tflops", tf).add("num_comm_sms", r.ncomm).add("correct", r.correct);
    bench::add_check_worst(j, r.worst).add("variant", r.variant).add("seed", std::to_string(x.seed));
    if (extra_key) j.add(extra_key, extra);
    if (r.early_reductions >= 0) j.add("early_reductions", r.early_reductions).add("peak_comm_blocks", r.peak_comm_blocks);
    if (x.shared) j.add("shared_gpu", true);
    x.json.write(j);
  }
}

unsigned long long mismatches(const bf16* a, const bf16* b, size_t n, cudaStream_t st) {
  return weave::bench::mismatches_bits(reinterpret_cast<const uint16_t*>(a), reinterpret_cast<const uint16_t*>(b), n, st);
}
unsigned long long mismatches(const f8* a, const f8* b, size_t n, cudaStream_t st) {
  return weave::bench::mismatches_bits(reinterpret_cast<const uint8_t*>(a), reinterpret_cast<const uint8_t*>(b), n, st);
}

template <class T>
struct DevBuf {
  T* p = nullptr;
  explicit DevBuf(size_t n) { WEAVE_CUDA_CHECK(cudaMalloc(&p, (n ? n : 1) * sizeof(T))); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

// One check's verdict over every rank (what check_last_and_fresh reads).
struct Settled {
  bool ok;
  double worst;
};

// A check of a row from this rank's report, the same on every rank (wrong anywhere: wrong
// everywhere), folded into the row's earlier checks (a failure of either fails the row; worst over
// both); a wrong report is printed by the rank that saw it. Collective: every rank settles the
// same rows in the same order.
Settled settle_check(Ctx& x, Row& row, const check::Report& rep, bool also_ok = true, const std::string& also = "") {
  const bool ok = rep.ok && also_ok;
  if (!ok)
    std::printf("    rank %d: %s %s S=%d (%s): %s%s\n", x.rank, row.kernel.c_str(), row.impl.c_str(), row.S,
                row.checks ? "fresh call" : "last timed call", rep.str().c_str(), also.c_str());
  const Settled now{bench::all_ranks_ok(x.c, ok), bench::worst_over_ranks(x.c, also_ok ? rep.worst : INFINITY)};
  if (row.checks++ == 0) {
    row.correct = now.ok, row.worst = now.worst;
  } else {
    row.correct = row.correct && now.ok;
    row.worst = std::isnan(row.worst) || std::isnan(now.worst) ? NAN : std::max(row.worst, now.worst);
  }
  return now;
}

// One implementation of a row in recheck(): the input set of its last call (which its call keeps
// up to date), its outputs' poison, one more call, and its check against the reference in place.
struct Recheck {
  const int* last;
  std::function<void()> poison, call, check;
  int done = 0;  // checks made; after the first, its fresh call has been made
};

// recheck.hpp's rule for the implementations of a row that share a reference (not
// check_last_and_fresh, which takes one implementation and a reference per check: here a set's
// reference, the expensive part at S = 32768, serves every check on that set). Each
// implementation's last timed call is checked against its set's reference, then it makes one call
// on the other set into re-poisoned outputs, checked against that set's. `reference(i)` puts set
// i's (rooted) into ref_r and ref_s: 2 references where every implementation's last call used the
// same set, else 3 (the fresh calls of the first set's implementations are checked beside the
// other set's last calls). The sequence depends only on the last sets, the same on every rank
// (one sample plan for all), never on a verdict, so every rank makes the same calls and barriers.
void recheck(Ctx& x, std::vector<Recheck>& impls, const std::function<void(int)>& reference) {
  auto pending = [&](int set) {
    for (const Recheck& m : impls)
      if (m.done < 2 && *m.last == set) return true;
    return false;
  };
  for (int set = impls.empty() ? 0 : *impls[0].last; pending(set); set ^= 1) {
    reference(set);
    std::vector<Recheck*> fresh;
    for (Recheck& m : impls)
      if (m.done < 2 && *m.last == set) {
        m.check();
        if (++m.done == 1) fresh.push_back(&m);
      }
    if (fresh.empty()) continue;
    for (Recheck* m : fresh) m->poison();
    x.c.sync(x.st);
    x.c.barrier();  // every rank's outputs poisoned before any peer's fresh call writes into them
    for (Recheck* m : fresh) {
      m->call();
      // Every rank's call done (peers' writes into this rank's outputs included) before the next
      // implementation's: as in the timing, no two implementations overlap across ranks.
      x.c.sync(x.st);
      x.c.barrier();
    }
  }
}

// One kernel at one size: GEMM alone, fused, cuBLAS + NCCL; returns the fused row.
//
// Inputs: two sets per rank (A or the A shard, and B), alternated by pointer from one call to
// the next in every implementation's timed loop, so no call sees the inputs of the call before
// it (a kernel that read the previous call's gathered A, partials or output tile would be
// wrong). They derive from the run's seed, the call of run_one, the set and the rank, so every
// rank regenerates every rank's inputs: the reference (check/gemm_ref.hpp, float32 cuBLASLt) is
// the full-K sum (gemm_rs, gemm_ar) or the product with the whole gathered A (ag_gemm), computed
// on each rank without NCCL. Every output is poisoned before timing; after it, each
// implementation's last timed call is compared with the reference of the set it used, per
// element and per 128 x 128 tile (check/tile_check.hpp): fused and cuBLAS + NCCL against the
// TP result (gemm_rs, gemm_ar: W bf16 partials, check::partial_sum_bound; ag_gemm: one rounding,
// check::gemm_bound, and the gathered A bit for bit), GEMM alone against its local product. Then
// its outputs (all that check reads) are poisoned again and it makes one more call on the other
// set, checked the same way (recheck(), recheck.hpp): a row is correct only when both pass.
//
// The bounds fail a 128 x 128 tile that misses one K step (64) or one rank's part at every size
// here: with inputs uniform in [-1, 1), s ~ sqrt(K_full)/3 and a missing sum of n products has
// standard deviation s sqrt(n / K_full), while |r| ~ s. ag_gemm's bound is ~0.005 s and a K step
// of K <= 32768 is >= 0.044 s (9 bounds). gemm_rs / gemm_ar's is 2^-7 |r| + W/64 s: one rank's
// part (s / sqrt(W)) is 22 bounds at W = 2 and 2.8 at W = 8; one K step of K_full <= 32768 is
// 1.2 bounds per standard deviation at W = 2, and 0.35 at W = 8, where 0.27 % of a tile's 16384
// elements (~44) still land past 3 standard deviations.
Row run_one(Ctx& x, const std::string& kernel, int S, int fixed_comm, bool print, bool baselines = true,
            int K_override = 0, int variant = -1) {
  const int W = x.W, r = x.rank;
  const bool ag = kernel == "ag_gemm";
  const int M = S, N = ag ? S / W : S, K = ag ? S : (K_override ? K_override : S / W);
  WEAVE_CHECK(!baselines || x.nccl, "weave-bench tp: a row with baselines needs NCCL");
  const uint64_t call = check::derive(x.seed, x.calls++);
  enum What : int { kA = 1, kB = 2, kScaleA = 3, kScaleB = 4 };  // scales: fp8 only
  auto seed_of = [&](int set, int q, What w) { return check::derive(call, uint64_t(set) * 64 + q, w); };
  tp::Options o;
  o.num_comm_sms = fixed_comm;
  o.variant = variant;
  o.b = x.bl;
  Row fused{kernel, "weave", S, M, N, K}, alone = fused, base = fused;
  alone.impl = "weave-gemm-alone";
  base.impl = x.fp8 ? "cublaslt+nccl" : "cublas+nccl";
  const size_t nc = size_t(M) * N;
  // Times the fused call (the launch info it fills is read after the timing), then, with
  // baselines, cuBLAS + NCCL and weave's GEMM alone on the same local shape.
  auto measure = [&](auto& fused_fn, auto& ref, auto& alone_fn, const tp::LaunchInfo& li) {
    x.c.sync(x.st);
    x.c.barrier();  // every rank's outputs poisoned before any peer writes into them
    if (baselines) {
      const std::vector<double> t = timed_turns(x, {fused_fn, ref, alone_fn});
      fused.us = t[0], base.us = t[1], alone.us = t[2];
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
    x.c.sync(x.st);
    x.c.barrier();
  };
  DevBuf<bf16> B0(x.fp8 ? 0 : size_t(K) * N), B1(x.fp8 ? 0 : size_t(K) * N);
  bf16* B[2] = {B0.p, B1.p};
  DevBuf<float> ref_r(nc), ref_s(nc);
  DevBuf<bf16> Cf(ag ? nc : 0), Cb(baselines ? nc : 0), Ca(baselines ? nc : 0);
  if (!x.fp8)
    for (int i = 0; i < 2; ++i) gref::fill_uniform(B[i], size_t(K) * N, seed_of(i, r, kB), 1.f, x.st);
  int nf = 0, nb = 0, na = 0, last_f = -1, last_b = -1, last_a = -1;  // calls made, set of the last one
  // ag_gemm's checks after the timing, for either input type (recheck(); f, b, a: the fused row's,
  // cuBLAS + NCCL's and GEMM alone's set, poison and call): reference(i) fills ref_r and ref_s
  // (squared, rooted here) with set i's product; the fused C with its gathered A (every element
  // equal to Gfull[i]'s) and the baselines' C, per tile within `bound`.
  auto check_ag = [&](const auto* G, const auto& Gfull, check::Bound bound, auto&& reference, Recheck f, Recheck b,
                      Recheck a) {
    auto cmp = [&](const bf16* C) {
      return check::compare({C, N}, {ref_r.p, N}, {ref_s.p, N}, M, N, bound, 128, 128, x.st);
    };
    f.check = [&] {
      const unsigned long long bad = mismatches(G, Gfull[last_f], size_t(M) * K, x.st);
      settle_check(x, fused, cmp(Cf.p), bad == 0, bad ? "; gathered A: " + std::to_string(bad) + " elements differ" : "");
    };
    b.check = [&] { settle_check(x, base, cmp(Cb.p)); };
    a.check = [&] { settle_check(x, alone, cmp(Ca.p)); };
    std::vector<Recheck> impls{f};
    if (baselines) impls.push_back(b), impls.push_back(a);
    recheck(x, impls, [&](int i) {
      reference(i);
      check::sqrt_inplace(ref_s.p, nc, x.st);
    });
  };
  // gemm_rs's and gemm_ar's GEMM alone, against its local product (local_ref(i): set i's into
  // ref_r, ref_s squared): one implementation, no reference to share, no peer, so recheck.hpp's
  // helper itself; it reads the verdict over ranks, so every rank skips the fresh call alike.
  auto check_alone = [&](auto&& local_ref, auto&& poison_a, auto&& alone_fn, check::Bound bound) {
    weave::bench::check_last_and_fresh(
        last_a, 2,
        [&](int i) {
          local_ref(i);
          check::sqrt_inplace(ref_s.p, nc, x.st);
          const check::Mat<bf16> c{Ca.p, N};
          return settle_check(x, alone, check::compare(c, {ref_r.p, N}, {ref_s.p, N}, M, N, bound, 128, 128, x.st));
        },
        poison_a,
        [&](int i) {
          alone_fn();
          WEAVE_CHECK(last_a == i, "weave-bench tp: GEMM alone's fresh call used set ", last_a, ", not ", i);
        });
  };
  if (x.fp8) {
    // fp8: the same rows and checks as the bf16 ones below, on e4m3 operands (uniform in
    // [-256, 256) rounded to e4m3, most of its range, as weave-bench gemm_fp8), B N x K, and
    // per-tensor scales log-uniform in [0.5, 2] (device floats), one pair per input set. ag_gemm's
    // scale_a is the whole gathered A's: it derives from the set alone, the same on every rank;
    // scale_b is each rank's own (its own B). gemm_rs: both scales are each rank's own.
    // Baseline: cuBLASLt fp8 (FAST_ACCUM on, all of K in the tensor core as weave's per-tensor
    // kernel; bf16 out) + NCCL: ag_gemm all-gathers the fp8 bytes first, gemm_rs reduce-scatters
    // the bf16 M x N partial after. GEMM alone: gemm_fp8::gemm on the local shape.
    // Reference: check::Fp8GemmRef (the fp8 values decoded to float times their scales, then a
    // float32 cuBLASLt product), gemm_rs's summed over the ranks with each rank's own scales on its
    // own K slice. Bounds:
    // - one product (ag_gemm's three rows, gemm_rs's GEMM alone): check::fp8_tensor_core_bound(K),
    //   one bf16 rounding of the scaled fp32 sum plus the fp8 tensor core's truncating
    //   accumulation (below 2^-13 T times the running sum's largest excursion, T = K / 32
    //   instructions; check/gemm_fp8_ref.hpp derives it).
    // - gemm_rs's sum of W partials: check::partial_sum_bound(W) for the W bf16 roundings and the
    //   bf16 sum, plus each partial's own tensor-core loss, which fp8_tensor_core_bound(K_local)
    //   puts below 2^-13 T (2 s_q + |r_q| / 2) for that partial's r_q, s_q (T = K_local / 32).
    //   Over the ranks: sum_q s_q <= sqrt(W) s (Cauchy-Schwarz, s^2 = sum_q s_q^2); sum_q |r_q| is
    //   |r| where the partials drift one way and about sum_q s_q where they have random signs
    //   (taken as |r| + 2 sqrt(W) s). Total 2^-14 T |r| + 3 * 2^-13 T sqrt(W) s, added to
    //   partial_sum_bound's rel and scale. That has every rank's loss at its maximum and of one
    //   sign; the partials' signs are independent, so a correct kernel sits well below it.
    // What this misses at the large sizes: the tensor-core term grows with K, so at S = 32768 a
    // missing 128-K block (sqrt(128 / K) s = 0.06 s) is below the bound (~0.3 s, as for
    // weave-bench gemm_fp8 at that K), while a missing rank's part (s / sqrt(W)) still breaks it;
    // ag_gemm's gathered A is compared byte for byte besides.
    auto fill8 = [&](f8* p, size_t n, uint64_t sd) { check::fill_fp8_uniform(p, false, n, sd, 256.f, x.st); };
    auto fill_scale = [&](float* p, uint64_t sd) { check::fill_log_uniform(p, 1, sd, 0.5f, 2.f, x.st); };
    DevBuf<f8> B80(size_t(N) * K), B81(size_t(N) * K);
    f8* B8[2] = {B80.p, B81.p};
    // The scales of set i: sa[i] and sb[i], each float at its own 256 bytes (cuBLASLt's fp8 matmul
    // returned CUBLAS_STATUS_NOT_SUPPORTED on an H200 for scales packed 4 bytes apart).
    constexpr int kScaleGap = 64;
    DevBuf<float> scale_buf(4 * kScaleGap), s_q(2 * kScaleGap);  // s_q: another rank's (gemm_rs check)
    float* sa[2] = {scale_buf.p, scale_buf.p + kScaleGap};
    float* sb[2] = {scale_buf.p + 2 * kScaleGap, scale_buf.p + 3 * kScaleGap};
    for (int i = 0; i < 2; ++i) {
      fill8(B8[i], size_t(N) * K, seed_of(i, r, kB));
      fill_scale(sa[i], seed_of(i, ag ? 0 : r, kScaleA));  // ag_gemm: rank-independent
      fill_scale(sb[i], seed_of(i, r, kScaleB));
    }
    const gemm_fp8::ref::TnMatmul lt(*x.lt, M, N, K, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, CUDA_R_16BF, true,
                                     {gemm_fp8::ref::Scales{sa[0], sb[0]}, gemm_fp8::ref::Scales{sa[1], sb[1]}});
    if (baselines)
      WEAVE_CHECK(lt.ok(), "weave-bench tp: cuBLASLt found no fp8 algorithm for ", M, "x", N, "x", K,
                  " (heuristic status ", static_cast<int>(lt.status()), ")");
    const check::Bound one_bound = check::fp8_tensor_core_bound(K);
    auto reference = [&](const f8* a, const f8* b, const float* pa, const float* pb, float* rr, float* ss) {
      x.fref->run(a, false, b, false, M, N, K, pa, pb, rr, ss, x.st);
    };
    if (ag) {
      const tp::Range sh = tp::shard(M, W, r);
      f8* G = static_cast<f8*>(x.c.alloc(size_t(M) * K * sizeof(f8)));
      DevBuf<f8> Ash0(size_t(sh.size) * K), Ash1(size_t(sh.size) * K), Gfull0(size_t(M) * K), Gfull1(size_t(M) * K),
          Gref(baselines ? size_t(M) * K : 0);
      f8 *Ash[2] = {Ash0.p, Ash1.p}, *Gfull[2] = {Gfull0.p, Gfull1.p};
      for (int i = 0; i < 2; ++i) {
        fill8(Ash[i], size_t(sh.size) * K, seed_of(i, r, kA));
        for (int q = 0; q < W; ++q) {
          const tp::Range sq = tp::shard(M, W, q);
          fill8(Gfull[i] + size_t(sq.begin) * K, size_t(sq.size) * K, seed_of(i, q, kA));
        }
      }
      tp::AgGemm op(x.c);
      auto ref = [&] {
        const int i = last_b = nb++ & 1;
        WEAVE_NCCL_CHECK(ncclAllGather(Ash[i], Gref.p, size_t(sh.size) * K, ncclUint8, x.nccl->get(), x.st));
        lt.run(Gref.p, B8[i], Cb.p, x.st, i);
      };
      tp::LaunchInfo li{};
      auto fused_fn = [&] {
        const int i = last_f = nf++ & 1;
        li = op.run(Ash[i], G, B8[i], sa[i], sb[i], Cf.p, M, N, K, o, x.st);
      };
      auto alone_fn = [&] {
        const int i = last_a = na++ & 1;
        gemm_fp8::gemm(Gfull[i], B8[i], Ca.p, M, N, K, sa[i], sb[i], {}, x.st);
      };
      auto poison_f = [&] {
        WEAVE_CUDA_CHECK(cudaMemsetAsync(G, 0xff, size_t(M) * K, x.st));  // e4m3 NaN: the fills never make it
        weave::check::poison(Cf.p, nc, x.st);
      };
      auto poison_b = [&] { weave::check::poison(Cb.p, nc, x.st); };
      auto poison_a = [&] { weave::check::poison(Ca.p, nc, x.st); };
      poison_f();
      if (baselines) poison_b(), poison_a();
      measure(fused_fn, ref, alone_fn, li);
      check_ag(G, Gfull, one_bound, [&](int i) { reference(Gfull[i], B8[i], sa[i], sb[i], ref_r.p, ref_s.p); },
               {&last_f, poison_f, fused_fn, {}}, {&last_b, poison_b, ref, {}}, {&last_a, poison_a, alone_fn, {}});
      WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
      x.c.barrier();
      x.c.free(G);
    } else {
      const tp::Range sh = tp::shard(M, W, r);
      const int nccl_rows = M / W;  // as the bf16 rows: S a multiple of W
      DevBuf<f8> A80(size_t(M) * K), A81(size_t(M) * K), a_q(size_t(M) * K), b_q(size_t(N) * K);
      DevBuf<float> tmp_r(nc), tmp_s(nc);  // another rank's partial's r and s2
      DevBuf<bf16> rsout(baselines ? size_t(nccl_rows) * N : 0);
      f8* A8[2] = {A80.p, A81.p};
      for (int i = 0; i < 2; ++i) fill8(A8[i], size_t(M) * K, seed_of(i, r, kA));
      const size_t out_n = tp::GemmRS::out_elems(M, N, W);
      bf16* out = static_cast<bf16*>(x.c.alloc(out_n * sizeof(bf16)));
      tp::GemmRS rsop(x.c);
      tp::LaunchInfo li{};
      auto fused_fn = [&] {
        const int i = last_f = nf++ & 1;
        li = rsop.run(A8[i], B8[i], sa[i], sb[i], out, M, N, K, o, x.st);
      };
      auto ref = [&] {
        const int i = last_b = nb++ & 1;
        lt.run(A8[i], B8[i], Cb.p, x.st, i);
        WEAVE_NCCL_CHECK(ncclReduceScatter(Cb.p, rsout.p, size_t(nccl_rows) * N, ncclBfloat16, ncclSum, x.nccl->get(), x.st));
      };
      auto alone_fn = [&] {
        const int i = last_a = na++ & 1;
        gemm_fp8::gemm(A8[i], B8[i], Ca.p, M, N, K, sa[i], sb[i], {}, x.st);
      };
      auto poison_f = [&] { weave::check::poison(out, out_n, x.st); };
      auto poison_b = [&] {
        weave::check::poison(Cb.p, nc, x.st);
        weave::check::poison(rsout.p, size_t(nccl_rows) * N, x.st);
      };
      auto poison_a = [&] { weave::check::poison(Ca.p, nc, x.st); };
      poison_f();
      if (baselines) poison_b(), poison_a();
      measure(fused_fn, ref, alone_fn, li);
      const double T = K / 32.0;  // the tensor core's m64nNk32 steps over one partial's K
      check::Bound sum_bound = check::partial_sum_bound(W);
      sum_bound.rel += std::ldexp(T, -14);
      sum_bound.scale += 3.0 * std::ldexp(T, -13) * std::sqrt(double(W));
      auto cmp_rows = [&](const bf16* C, int row0, int rows, check::Bound b) {
        return check::compare({C, N}, {ref_r.p + size_t(row0) * N, N}, {ref_s.p + size_t(row0) * N, N}, rows, N, b,
                              128, 128, x.st);
      };
      auto sum_reference = [&](int i) {
        for (int q = 0; q < W; ++q) {  // sum over ranks of sa_q sb_q A_q B_q^T, each with its own scales
          const f8 *aq = A8[i], *bq = B8[i];
          const float *pa = sa[i], *pb = sb[i];
          if (q != r) {
            fill8(a_q.p, size_t(M) * K, seed_of(i, q, kA));
            fill8(b_q.p, size_t(N) * K, seed_of(i, q, kB));
            fill_scale(s_q.p, seed_of(i, q, kScaleA));
            fill_scale(s_q.p + kScaleGap, seed_of(i, q, kScaleB));
            aq = a_q.p, bq = b_q.p, pa = s_q.p, pb = s_q.p + kScaleGap;
          }
          if (q == 0) {
            reference(aq, bq, pa, pb, ref_r.p, ref_s.p);
          } else {
            reference(aq, bq, pa, pb, tmp_r.p, tmp_s.p);
            check::add_f32(ref_r.p, tmp_r.p, nc, x.st);
            check::add_f32(ref_s.p, tmp_s.p, nc, x.st);
          }
        }
        check::sqrt_inplace(ref_s.p, nc, x.st);
      };
      std::vector<Recheck> impls{
          {&last_f, poison_f, fused_fn, [&] { settle_check(x, fused, cmp_rows(out, sh.begin, sh.size, sum_bound)); }}};
      if (baselines)
        impls.push_back({&last_b, poison_b, ref,
                         [&] { settle_check(x, base, cmp_rows(rsout.p, r * nccl_rows, nccl_rows, sum_bound)); }});
      recheck(x, impls, sum_reference);
      if (baselines)  // GEMM alone: this rank's local product only, with its own scales
        check_alone([&](int i) { reference(A8[i], B8[i], sa[i], sb[i], ref_r.p, ref_s.p); }, poison_a, alone_fn,
                    one_bound);
      WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
      x.c.barrier();
      x.c.free(out);
    }
  } else if (ag) {
    const tp::Range sh = tp::shard(M, W, r);
    bf16* G = static_cast<bf16*>(x.c.alloc(size_t(M) * K * sizeof(bf16)));
    // Ash[i]: this rank's shard of set i; Gfull[i]: every rank's shards of set i, regenerated
    // here (the reference's operand and GEMM alone's A).
    DevBuf<bf16> Ash0(size_t(sh.size) * K), Ash1(size_t(sh.size) * K), Gfull0(size_t(M) * K), Gfull1(size_t(M) * K),
        Gref(baselines ? size_t(M) * K : 0);
    bf16 *Ash[2] = {Ash0.p, Ash1.p}, *Gfull[2] = {Gfull0.p, Gfull1.p};
    for (int i = 0; i < 2; ++i) {
      gref::fill_uniform(Ash[i], size_t(sh.size) * K, seed_of(i, r, kA), 1.f, x.st);
      for (int q = 0; q < W; ++q) {
        const tp::Range sq = tp::shard(M, W, q);
        gref::fill_uniform(Gfull[i] + size_t(sq.begin) * K, size_t(sq.size) * K, seed_of(i, q, kA), 1.f, x.st);
      }
    }
    tp::AgGemm op(x.c);
    auto ref = [&] {
      const int i = last_b = nb++ & 1;
      WEAVE_NCCL_CHECK(ncclAllGather(Ash[i], Gref.p, size_t(sh.size) * K, ncclBfloat16, x.nccl->get(), x.st));
      x.blas.run(Gref.p, B[i], Cb.p, M, N, K, x.bl, false, x.st);
    };
    tp::LaunchInfo li{};
    auto fused_fn = [&] {
      const int i = last_f = nf++ & 1;
      li = op.run(Ash[i], G, B[i], Cf.p, M, N, K, o, x.st);
    };
    auto alone_fn = [&] {
      const int i = last_a = na++ & 1;
      gemm::gemm(Gfull[i], B[i], Ca.p, M, N, K, x.bl, {}, x.st);
    };
    auto poison_f = [&] {
      weave::check::poison(G, size_t(M) * K, x.st);
      weave::check::poison(Cf.p, nc, x.st);
    };
    auto poison_b = [&] { weave::check::poison(Cb.p, nc, x.st); };
    auto poison_a = [&] { weave::check::poison(Ca.p, nc, x.st); };
    poison_f();
    if (baselines) poison_b(), poison_a();
    measure(fused_fn, ref, alone_fn, li);
    check_ag(G, Gfull, check::gemm_bound(),
             [&](int i) { x.ref.run(Gfull[i], B[i], M, N, K, x.bl, ref_r.p, ref_s.p, false, x.st); },
             {&last_f, poison_f, fused_fn, {}}, {&last_b, poison_b, ref, {}}, {&last_a, poison_a, alone_fn, {}});
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    if (fused.variant == tp::to_int(tp::AgVariant::Adaptive)) {
      const tp::AdaptiveStats a = op.adaptive_stats(M, N, K);
      // The communication tasks of ag_gemm's split: this rank's push units per call (v0/v1's: its
      // shard's row tiles x P slices of a bf16 row), so early_reductions is the share of them
      // handed out while tiles were still unclaimed.
      const long long units = tp::ag_units(tp::make_layout(M, N, W, tp::default_group_m(K)), r,
                                           tp::ag_slices(static_cast<long long>(K) * sizeof(bf16)));
      fused.early_reductions = a.launches && units ? double(a.early_reductions) / double(a.launches * units) : 0;
      fused.peak_comm_blocks = static_cast<long long>(a.peak_comm_blocks);
    }
    x.c.barrier();
    x.c.free(G);
  } else {
    const bool rs = kernel == "gemm_rs";
    const tp::Range sh = tp::shard(M, W, r);
    // NCCL's reduce-scatter hands out equal blocks of M / W rows (the S of this benchmark are
    // multiples of W, where they are weave's shards).
    const int nccl_rows = M / W;
    DevBuf<bf16> A0(size_t(M) * K), A1(size_t(M) * K), a_q(size_t(M) * K), b_q(size_t(K) * N),
        rsout(baselines && rs ? size_t(nccl_rows) * N : 0);
    bf16* A[2] = {A0.p, A1.p};
    for (int i = 0; i < 2; ++i) gref::fill_uniform(A[i], size_t(M) * K, seed_of(i, r, kA), 1.f, x.st);
    const size_t out_n = rs ? tp::GemmRS::out_elems(M, N, W) : nc;
    bf16* out = static_cast<bf16*>(x.c.alloc(out_n * sizeof(bf16)));
    tp::GemmRS rsop(x.c);
    tp::GemmAR arop(x.c);
    tp::LaunchInfo li{};
    auto fused_fn = [&] {
      const int i = last_f = nf++ & 1;
      if (rs) li = rsop.run(A[i], B[i], out, M, N, K, o, x.st);
      else li = arop.run(A[i], B[i], out, M, N, K, o, x.st);
    };
    // Unfused: the local GEMM, then NCCL (reduce-scatter of equal row blocks, or all-reduce).
    auto ref = [&] {
      const int i = last_b = nb++ & 1;
      x.blas.run(A[i], B[i], Cb.p, M, N, K, x.bl, false, x.st);
      if (rs) WEAVE_NCCL_CHECK(ncclReduceScatter(Cb.p, rsout.p, size_t(nccl_rows) * N, ncclBfloat16, ncclSum, x.nccl->get(), x.st));
      else WEAVE_NCCL_CHECK(ncclAllReduce(Cb.p, Cb.p, nc, ncclBfloat16, ncclSum, x.nccl->get(), x.st));
    };
    auto alone_fn = [&] {
      const int i = last_a = na++ & 1;
      gemm::gemm(A[i], B[i], Ca.p, M, N, K, x.bl, {}, x.st);
    };
    auto poison_f = [&] { weave::check::poison(out, out_n, x.st); };
    auto poison_b = [&] {
      weave::check::poison(Cb.p, nc, x.st);
      if (rs) weave::check::poison(rsout.p, size_t(nccl_rows) * N, x.st);
    };
    auto poison_a = [&] { weave::check::poison(Ca.p, nc, x.st); };
    poison_f();
    if (baselines) poison_b(), poison_a();
    measure(fused_fn, ref, alone_fn, li);
    const check::Bound sum_bound = check::partial_sum_bound(W);
    auto cmp_rows = [&](const bf16* C, int row0, int rows, check::Bound b) {
      return check::compare({C, N}, {ref_r.p + size_t(row0) * N, N}, {ref_s.p + size_t(row0) * N, N}, rows, N, b, 128,
                            128, x.st);
    };
    auto sum_reference = [&](int i) {
      for (int q = 0; q < W; ++q) {  // sum over ranks of A_q * B_q: one product over the full K
        const bf16 *aq = A[i], *bq = B[i];
        if (q != r) {
          gref::fill_uniform(a_q.p, size_t(M) * K, seed_of(i, q, kA), 1.f, x.st);
          gref::fill_uniform(b_q.p, size_t(K) * N, seed_of(i, q, kB), 1.f, x.st);
          aq = a_q.p, bq = b_q.p;
        }
        x.ref.run(aq, bq, M, N, K, x.bl, ref_r.p, ref_s.p, q > 0, x.st);
      }
      check::sqrt_inplace(ref_s.p, nc, x.st);
    };
    std::vector<Recheck> impls{{&last_f, poison_f, fused_fn, [&] {
                                  settle_check(x, fused, rs ? cmp_rows(out, sh.begin, sh.size, sum_bound)
                                                            : cmp_rows(out, 0, M, sum_bound));
                                }}};
    if (baselines)
      impls.push_back({&last_b, poison_b, ref, [&] {
                         settle_check(x, base, rs ? cmp_rows(rsout.p, r * nccl_rows, nccl_rows, sum_bound)
                                                  : cmp_rows(Cb.p, 0, M, sum_bound));
                       }});
    recheck(x, impls, sum_reference);
    if (baselines)  // GEMM alone: this rank's local product only
      check_alone([&](int i) { x.ref.run(A[i], B[i], M, N, K, x.bl, ref_r.p, ref_s.p, false, x.st); }, poison_a,
                  alone_fn, check::gemm_bound());
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    if (fused.variant == (rs ? tp::to_int(tp::RsVariant::Adaptive) : tp::to_int(tp::ArVariant::Adaptive))) {
      const tp::AdaptiveStats a = rs ? rsop.adaptive_stats(M, N, K) : arop.adaptive_stats(M, N, K);
      // The reductions this rank runs per call: the tiles it owns (gemm_ar: every W-th; gemm_rs:
      // those of its row shard).
      const long long owned = rs ? tp::make_layout(M, N, W, tp::default_group_m(K)).owner_tiles(r)
                                 : tp::ar_owned_tiles(tp::make_ar_layout(M, N, W, tp::default_group_m(K)), r);
      fused.early_reductions = a.launches && owned ? double(a.early_reductions) / double(a.launches * owned) : 0;
      fused.peak_comm_blocks = static_cast<long long>(a.peak_comm_blocks);
    }
    x.c.barrier();
    x.c.free(out);
  }
  if (baselines) {
    emit(x, alone);
    emit(x, base);
  }
  // Sweep rows: "sweep": 1 for a fixed num_comm_sms / variant, 0 for the tuner's own pick (as the
  // default rows, which have no "sweep" key: bench/plot.py draws it as the tuner's line).
  const bool tuned = fixed_comm < 0 && variant < 0;
  emit(x, fused, x.sweep ? "sweep" : nullptr, tuned ? 0 : 1);
  if (print && x.rank == 0) {
    auto tf = [&](double us) { return 2.0 * M * N * K / (us * 1e-6) / 1e12; };
    auto verdict = [](const Row& w) {
      char b[48];
      std::snprintf(b, sizeof b, "%s %.3g", w.correct ? "ok" : "WRONG", w.worst);
      return std::string(b);
    };
    if (baselines)
      std::printf("| %s | %d | %dx%dx%d | %.1f / %.0f | %.1f / %.0f | %.1f / %.0f | %d (v%d %s) | %.3f | %.3f | "
                  "%s / %s / %s |\n",
                  kernel.c_str(), S, M, N, K, alone.us, tf(alone.us), base.us, tf(base.us), fused.us, tf(fused.us),
                  fused.ncomm, fused.variant, weave::tp::variant_name(kernel, fused.variant),
                  fused.us > 0 ? alone.us / fused.us : 0, fused.us > 0 ? base.us / fused.us : 0,
                  verdict(alone).c_str(), verdict(base).c_str(), verdict(fused).c_str());
    else
      std::printf("| %s | %d | %dx%dx%d | %d (%s%s) | %d | %.1f | %.0f | %s |\n", kernel.c_str(), S, M, N, K,
                  fused.variant, weave::tp::variant_name(kernel, fused.variant), tuned ? "; the tuner's pick" : "",
                  fused.ncomm, fused.us, tf(fused.us), verdict(fused).c_str());
    std::fflush(stdout);
  }
  fused.alone_us = alone.us;
  return fused;
}

int run(const bench::Args& a) {
  const auto sizes = a.numbers("sizes", "2048,4096,8192,16384,32768");
  auto kernels = a.names("kernels", "ag_gemm,gemm_rs,gemm_ar");
  const int fixed = static_cast<int>(a.get_int("num-comm-sms", -1));
  const int variant = static_cast<int>(a.get_int("variant", -1));
  const std::string dtype = a.get("dtype", "bf16");
  if (dtype != "bf16" && dtype != "fp8") {
    std::fprintf(stderr, "weave-bench tp: --dtype takes bf16 or fp8, got %s\n", dtype.c_str());
    return 2;
  }
  const bool fp8 = dtype == "fp8";
  bool skipped_ar = false;  // fp8: gemm_ar left out of the default kernel list (noted below)
  if (fp8) {
    std::vector<std::string> k8;
    for (const auto& k : kernels) {
      if (k == "ag_gemm" || k == "gemm_rs") k8.push_back(k);
      else if (k == "gemm_ar" && !a.has("kernels")) skipped_ar = true;
      else {
        std::fprintf(stderr, "weave-bench tp: --dtype fp8 runs ag_gemm and gemm_rs only (%s has no fp8 form)\n",
                     k.c_str());
        return 2;
      }
    }
    kernels = k8;
    const bool shard_gemms = variant == tp::to_int(tp::RsVariant::ShardGemms);
    if ((shard_gemms || variant == tp::to_int(tp::RsVariant::Adaptive)) && !a.has("only-extra") &&
        std::find(kernels.begin(), kernels.end(), "gemm_rs") != kernels.end()) {
      std::fprintf(stderr, "weave-bench tp: gemm_rs has no variant %d with fp8 inputs (%s); leave gemm_rs out or pick "
                           "another --variant\n", variant,
                   shard_gemms ? "the fp8 GEMM has no accumulating epilogue" : "the adaptive split is bf16 only");
      return 2;
    }
    if (variant == tp::to_int(tp::AgVariant::Adaptive) && !a.has("only-extra") &&
        std::find(kernels.begin(), kernels.end(), "ag_gemm") != kernels.end()) {
      std::fprintf(stderr, "weave-bench tp: ag_gemm has no variant %d with fp8 inputs (the adaptive split is bf16 "
                           "only); leave ag_gemm out or pick another --variant\n", variant);
      return 2;
    }
    if (a.has("b-layout") && a.get("b-layout") != "nk") {
      std::fprintf(stderr, "weave-bench tp: --dtype fp8 takes B as N x K only (--b-layout nk), got %s\n",
                   a.get("b-layout").c_str());
      return 2;
    }
  }
  // --variant restricts every listed kernel (the library refuses a number that is not one of its
  // variants, every rank together; refused here before the communicator is set up).
  if (variant >= 0 && !a.has("only-extra"))
    for (const auto& k : kernels)
      if (std::string(tp::variant_name(k, variant)) == "?") {
        std::fprintf(stderr, "weave-bench tp: %s has no variant %d (tp_common/variants.hpp); leave it out of "
                             "--kernels or pick another --variant\n", k.c_str(), variant);
        return 2;
      }
  long long maxS = 0;
  for (long long s : sizes) maxS = s > maxS ? s : maxS;
  if (a.has("table3") || a.has("sweep")) maxS = maxS > 16384 ? maxS : 16384;
  runtime::CommOptions co;
  co.heap_bytes = 3 * size_t(maxS) * maxS * 2 + (size_t(256) << 20);  // + gemm_rs v2's M x N scratch
  runtime::Communicator c(co);
  const std::string shared = bench::shared_gpu(c);  // every rank alike
  if (!shared.empty() && a.has("table3")) {
    if (c.rank() == 0)
      std::fprintf(stderr, "weave-bench tp: %s (--share-gpus): --table3 times GEMM alone beside the fused call, which "
                           "ranks taking turns on one GPU cannot; run it with a GPU per rank\n", shared.c_str());
    return 2;
  }
  std::unique_ptr<bench::NcclComm> nccl;  // every rank alike: the arguments and the GPUs decide
  if (shared.empty() && (!a.has("only-extra") || a.has("table3"))) nccl = std::make_unique<bench::NcclComm>(c);
  gref::CublasLt blas;
  bench::JsonSink json(a);
  cudaStream_t st;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  check::GemmRef ref;
  Ctx x{c, nccl.get(), blas, json, st, c.world(), c.rank(), ref};
  x.host_us = a.has("host-us");
  x.shared = !shared.empty();
  const std::string layout = a.get("b-layout", "kn");
  if (layout != "kn" && layout != "nk") {
    std::fprintf(stderr, "weave-bench tp: --b-layout takes kn (B K x N) or nk (B N x K), got %s\n", layout.c_str());
    return 2;
  }
  x.bl = layout == "nk" ? gemm::BLayout::NK : gemm::BLayout::KN;
  std::unique_ptr<check::Fp8GemmRef> fref;
  std::unique_ptr<gemm_fp8::ref::Lt> lt;
  if (fp8) {
    x.fp8 = true;
    x.bl = gemm::BLayout::NK;
    fref = std::make_unique<check::Fp8GemmRef>();
    lt = std::make_unique<gemm_fp8::ref::Lt>(size_t(64) << 20);  // as weave-bench gemm_fp8's cuBLASLt rows
    x.fref = fref.get(), x.lt = lt.get();
  }
  {  // rank 0's seed on every rank (only rank 0 draws and prints one)
    const uint64_t mine = x.rank == 0 ? check::test_seed() : 0;
    std::vector<uint64_t> all(x.W);
    c.bootstrap().all_gather(&mine, all.data(), sizeof mine);
    x.seed = all[0];
  }
  if (x.rank == 0 && fp8) {
    std::printf("weave-bench tp --dtype fp8: e4m3 A and B (B N x K), per-tensor scales, bf16 out; world %d, %s, %d "
                "SMs; times in us (slowest rank) / TFLOP/s of the local GEMM\n",
                x.W, c.props().name, c.sm_count());
    if (skipped_ar) std::printf("(gemm_ar left out: it has no fp8 form)\n");
    if (!x.shared) std::printf("| kernel | S | local MxNxK | fp8 GEMM alone | cuBLASLt fp8+NCCL | weave fused | comm SMs | fused/alone | fused/cuBLASLt+NCCL | check (alone / cuBLASLt+NCCL / fused: worst error / bound) |\n|---|---|---|---|---|---|---|---|---|---|\n");
  } else if (x.rank == 0) {
    std::printf("weave-bench tp: world %d, %s, %d SMs; times in us (slowest rank) / TFLOP/s of the local GEMM\n", x.W,
                c.props().name, c.sm_count());
    if (!x.shared) std::printf("| kernel | S | local MxNxK | GEMM alone | cuBLAS+NCCL | weave fused | comm SMs | fused/alone | fused/cuBLAS+NCCL | check (alone / cuBLAS+NCCL / fused: worst error / bound) |\n|---|---|---|---|---|---|---|---|---|---|\n");
  }
  if (!a.has("only-extra")) {
    if (x.shared && x.rank == 0)
      std::printf("NOTE: %s: weave's fused rows only (no cuBLAS+NCCL or GEMM-alone rows: NCCL needs one GPU per "
                  "rank), checked; their times mean nothing (the ranks time-slice)\n| kernel | S | local MxNxK | "
                  "variant | comm SMs | us | TFLOP/s | check |\n|---|---|---|---|---|---|---|---|\n",
                  shared.c_str());
    for (const auto& k : kernels)
      for (long long S : sizes) run_one(x, k, static_cast<int>(S), fixed, true, !x.shared, 0, variant);
  }
  if (a.has("sweep")) {
    x.sweep = true;
    auto counts = a.numbers("sweep", "");
    if (counts.empty()) counts = {0, 4, 8, 16, 32, 64};  // bare --sweep
    const auto ss = a.numbers("sweep-sizes", "4096,16384");
    bool has_zero = false, has_split = false;  // the adaptive split runs at 0, the fixed splits at the others
    for (long long n : counts) (n == 0 ? has_zero : has_split) = true;
    if (x.rank == 0) std::printf("\nnum_comm_sms sweep\n| kernel | S | local MxNxK | variant | comm SMs | us | TFLOP/s | check |\n|---|---|---|---|---|---|---|---|\n");
    // Issue 22's comparison, per kernel (those of an explicit --kernels, else all three) and size:
    // the fixed splits at each count > 0 (ag_gemm's communicator-block pushes v0 and v1, gemm_ar's
    // and gemm_rs's inter-SM reductions v0 and v2), the variants without communicator SMs at 0
    // (ag_gemm's aux-warp pushes 2..6, copy engine 7, 8, all_gather 9; gemm_ar's intra-SM 1) and
    // the adaptive split (ag_gemm 10, gemm_ar 2, gemm_rs 6; bf16 only), then one call of the tuner's
    // own pick, and the adaptive-vs-fixed row. Every rank makes the same calls: the list depends on
    // the arguments only, never on a time or a verdict.
    for (const char* k : {"ag_gemm", "gemm_ar", "gemm_rs"}) {
      const std::string kern = k;
      const bool ag = kern == "ag_gemm", rs = kern == "gemm_rs";
      if (a.has("kernels") && std::find(kernels.begin(), kernels.end(), kern) == kernels.end()) continue;
      if (fp8 && !ag) {
        if (x.rank == 0) std::printf("(%s left out of the sweep: %s)\n", k, rs ? "its adaptive split is bf16 only" : "it has no fp8 form");
        continue;
      }
      const int adaptive_variant = ag ? tp::to_int(tp::AgVariant::Adaptive)
                                   : rs ? tp::to_int(tp::RsVariant::Adaptive)
                                        : tp::to_int(tp::ArVariant::Adaptive);
      // The fixed splits' variants (at each count > 0), and those at 0 (the adaptive split last).
      const int split0 = ag ? tp::to_int(tp::AgVariant::CommTmaPush)
                         : rs ? tp::to_int(tp::RsVariant::InterSm)
                              : tp::to_int(tp::ArVariant::InterSm);
      const int split1 = ag ? tp::to_int(tp::AgVariant::CommRegisterPush) : split0;
      const int zero0 = ag ? tp::to_int(tp::AgVariant::AuxTmaPush) : rs ? adaptive_variant : tp::to_int(tp::ArVariant::IntraSm);
      const int zero1 = ag && fp8 ? tp::to_int(tp::AgVariant::AllGatherGemm) : adaptive_variant;
      // The adaptive-vs-fixed row (and the tuned call it reads): bf16, with 0 and another count.
      const bool compare = !fp8 && has_zero && has_split;
      if (ag && fp8 && x.rank == 0)
        std::printf("(ag_gemm fp8: no adaptive split (bf16 only), no tuned call, no adaptive-vs-fixed row)\n");
      for (long long S : ss) {
        double best_fixed = 0;  // the best fixed split's time, count and variant, and the adaptive split's row
        int best_n = 0, best_v = -1;
        Row adaptive;
        for (long long n : counts) {
          if (n == 0) {
            for (int v = zero0; v <= zero1; ++v) {
              const Row r = run_one(x, k, static_cast<int>(S), 0, true, false, 0, v);
              if (v == adaptive_variant) adaptive = r;
            }
          } else {
            for (int v = split0; v <= split1; ++v) {
              const Row r = run_one(x, k, static_cast<int>(S), static_cast<int>(n), true, false, 0, v);
              if (best_fixed == 0 || r.us < best_fixed) best_fixed = r.us, best_n = static_cast<int>(n), best_v = v;
            }
          }
        }
        if (!compare) continue;
        // The tuner's own pick for the shape ("sweep": 0): its search or cached choice over the
        // kernel's candidates, which offer the adaptive split only when it is named.
        const Row tuned = run_one(x, k, static_cast<int>(S), -1, true, false, 0, -1);
        if (x.rank == 0) {
          std::printf("| %s | %lld | adaptive split / best fixed split (v%d, %d comm SMs) %.3f, / the tuner's pick (v%d, "
                      "%d comm SMs, %.1f us) %.3f; %s while tiles were left %.2f, at most %lld blocks | | | %.3f | | |\n",
                      k, S, best_v, best_n, adaptive.us / best_fixed, tuned.variant, tuned.ncomm, tuned.us,
                      adaptive.us / tuned.us, ag ? "push units" : "reductions", adaptive.early_reductions,
                      adaptive.peak_comm_blocks, adaptive.us / best_fixed);
          std::fflush(stdout);
          bench::JsonLine j;
          j.add("kernel", kern).add("impl", "adaptive-vs-fixed").add("S", S).add("world", x.W)
              .add("adaptive_us", adaptive.us).add("best_fixed_us", best_fixed).add("best_fixed_comm_sms", best_n)
              .add("best_fixed_variant", best_v).add("ratio", adaptive.us / best_fixed)
              .add("tuned_us", tuned.us).add("tuned_variant", tuned.variant).add("tuned_comm_sms", tuned.ncomm)
              .add("ratio_tuned", adaptive.us / tuned.us).add("early_reductions", adaptive.early_reductions)
              .add("peak_comm_blocks", adaptive.peak_comm_blocks);
          if (x.shared) j.add("shared_gpu", true);
          json.write(j);
        }
      }
    }
  }
  x.sweep = false;
  if (a.has("table3")) {
    const double Bw = 370e9;  // usable NVLink bandwidth per direction (shared/HARDWARE.md)
    if (x.rank == 0)
      std::printf("\nTable 3: GEMM+RS%s, M = N = 16384, world %d\n| K_local | GEMM alone us | fused us | non-overlapped (fused-alone)/fused | R TFLOP/s | predicted K >= s*R/(2B) |\n|---|---|---|---|---|---|\n", fp8 ? " (fp8)" : "", x.W);
    for (int K : {512, 1024, 2048, 4096, 8192}) {
      Row r = run_one(x, "gemm_rs", 16384, -1, false, true, K);
      const double alone = r.alone_us, R = 2.0 * 16384.0 * 16384.0 * K / (alone * 1e-6);
      const double frac = (r.us - alone) / r.us, thr = 2.0 * R / (2.0 * Bw);
      if (x.rank == 0) {
        std::printf("| %d | %.1f | %.1f | %.3f | %.0f | %.0f |\n", K, alone, r.us, frac, R / 1e12, thr);
        std::fflush(stdout);
        bench::JsonLine j;
        j.add("kernel", "gemm_rs").add("impl", "table3").add("M", 16384).add("N", 16384).add("K", K).add("world", x.W)
            .add("alone_us", alone).add("fused_us", r.us).add("non_overlapped", frac).add("k_threshold", thr);
        if (fp8) j.add("dtype", kFp8Dtype);
        json.write(j);
      }
    }
  }
  WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
  return bench::exit_status("tp", x.wrong, x.seed, x.rank == 0);
}

}  // namespace

WEAVE_BENCH(tp,
            "TP fused kernels (ag_gemm, gemm_rs, gemm_ar) vs GEMM alone and cuBLAS+NCCL, 2+ ranks (--sizes "
            "2048,...,32768 --kernels ag_gemm,gemm_rs,gemm_ar --num-comm-sms N --variant V --sweep 0,4,...,64 "
            "--sweep-sizes 4096,16384 --table3 --only-extra --host-us --b-layout kn|nk --dtype bf16|fp8; fp8: "
            "ag_gemm and gemm_rs on e4m3 inputs with per-tensor scales vs weave's fp8 GEMM alone and cuBLASLt "
            "fp8+NCCL)",
            run);
