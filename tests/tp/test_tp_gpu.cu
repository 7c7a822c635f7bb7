// The TP fused kernels on 2 ranks (weave-run -n 2) against a float32 reference that every rank
// computes on its own, without NCCL: every rank's inputs derive from the job seed
// (WEAVE_TEST_SEED replays a run), so each rank regenerates all of them and forms the full-K
// (or gathered) product with cuBLASLt (check/gemm_ref.hpp). Outputs are compared element by
// element and reported per 128 x 128 tile (check/tile_check.hpp); a wrong tile on any rank fails
// the case on every rank. Every repetition and configuration gets fresh inputs and a freshly
// poisoned output, so neither a previous call's scratch nor an unwritten element can pass.
// Cases: ragged shapes, every variant and several num_comm_sms, 200 back-to-back launches each
// checked on the device, one object on two streams, shapes that differ across ranks rejected
// before any launch, and calls captured in a CUDA graph and replayed with fresh inputs.
//
// Why the bounds catch a tile that misses one K step (64 of the full K) or one rank's part: with
// A, B uniform in [-1, 1), s = sqrt(sum_k a^2 b^2) ~ sqrt(K_full)/3, and a missing sum of n
// products has standard deviation s * sqrt(n / K_full). |r| is of the order of s.
// - ag_gemm (one bf16 rounding, check::gemm_bound: 2^-8 |r| + 2^-10 s ~ 0.005 s): one K step
//   of K <= 4096 is >= s/8, 25 bounds at one standard deviation; a missing (stale or poisoned)
//   row shard is a different sum altogether. The gathered A is compared exactly.
// - gemm_rs / gemm_ar (W bf16 partials, check::partial_sum_bound(W): 2^-7 |r| + W/64 s): one
//   rank's part is s/sqrt(W), 22 bounds at W = 2 and 2.8 at W = 8; one K step of the largest
//   full K here (W * 4096) is s/(8 sqrt(W)): 2.2 bounds at W = 2, and at W = 8 0.35 bound per
//   standard deviation, which a 128 x 128 tile of 16384 elements still exceeds (more than 40
//   elements past 3 standard deviations); at the smaller K of the other shapes the margin is
//   larger.
//
// fp8 (e4m3) inputs with per-tensor scales (the Fp8* tests): the reference decodes the operands
// and applies the scales in a plain kernel, then multiplies in float32 (check/gemm_fp8_ref.hpp);
// s = sqrt(sum_k (sa a)^2 (sb b)^2) of the scaled operands. A spans the whole e4m3 range with
// scale_a in [2^-8, 2^-7], B is in [-1, 1) (a few subnormal codes) with scale_b in [2, 4]: a
// kernel that drops a scale is 2 to 256 times off, one that applies one scale twice >= 256 times.
// The fp8 tensor core accumulates with 13 mantissa bits, truncating: each of the T = K / 32
// instructions loses below 2^-13 of the running sum (derived in check/gemm_fp8_ref.hpp).
// - ag_gemm (one per-tensor fp8 GEMM, one bf16 rounding, check::fp8_tensor_core_bound(K):
//   2^-8 |r| + 2^-10 s + 2^-14 T |r| + 2^-12 T s): ~0.01 s at K = 528 and ~0.045 s at K = 4096,
//   against 0.17 s per standard deviation for one missing 128-K block (at K = 528 its last
//   block holds 16 of K). The gathered A is compared byte for byte.
// - gemm_rs: each rank's partial carries its own tensor-core loss, 2^-14 T |r_q| + 2^-12 T s_q,
//   besides partial_sum_bound's bf16 roundings. Over the ranks sum s_q <= sqrt(W) s, and
//   sum |r_q| is |r| where the partials drift alike and below ~4 s_q each (a tile's tail of a
//   random-sign sum) where they do not, so fp8_partial_sum_bound adds 2^-14 T |r| +
//   2^-11 T sqrt(W) s: ~0.05 s at K = 528 and ~0.135 s at K = 4096 (W = 2). The ranks' scale
//   products differ by at most 4x, so the smaller rank's part is >= s / sqrt(17) = 0.24 s (1.8
//   bounds per standard deviation at K = 4096); a scale read in place of the other is >= 256x off.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../primitives/common.hpp"
#include "ag_gemm/ag_gemm.hpp"
#include "check/gemm_fp8_ref.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "check/gemm_baseline.cuh"
#include "gemm_ar/gemm_ar.hpp"
#include "gemm_rs/gemm_rs.hpp"

using weave::tp::bf16;
using weave::tp::shard;
namespace gref = weave::gemm::ref;
namespace check = weave::check;
constexpr auto kKN = weave::gemm::BLayout::KN;

namespace {

// Tuner choices stay in memory during tests (no cache file is written).
const int kTunerOff = (setenv("WEAVE_TUNER_CACHE", "off", 1), 0);

template <class T>
struct DevT {
  T* p = nullptr;
  size_t n = 0;
  explicit DevT(size_t count) : n(count) { WEAVE_CUDA_CHECK(cudaMalloc(&p, (count ? count : 1) * sizeof(T))); }
  ~DevT() { cudaFree(p); }
  DevT(const DevT&) = delete;
  DevT& operator=(const DevT&) = delete;
};
using Dev = DevT<bf16>;
using DevF = DevT<float>;
template <class T>
struct SymT {
  T* p;
  explicit SymT(size_t count) : p(static_cast<T*>(wt::comm().alloc((count ? count : 1) * sizeof(T)))) {}
  ~SymT() { wt::comm().free(p); }
  SymT(const SymT&) = delete;
  SymT& operator=(const SymT&) = delete;
};
using Sym = SymT<bf16>;

using check::gemm_ref;

// Input `what` of rank q in the call seeded `call`: every rank computes the same value, so any
// rank can regenerate any rank's inputs.
enum What : int { kA = 1, kB = 2, kScaleA = 3, kScaleB = 4 };  // scales: fp8 inputs
uint64_t input_seed(uint64_t call, int q, What what) { return check::derive(call, uint64_t(q), uint64_t(what)); }

// Fresh call seeds, identical on every rank (the ranks draw them in the same order).
struct Calls {
  uint64_t base = wt::job_seed();
  uint64_t n = 0;
  uint64_t next() { return check::derive(base, 0xCA11, n++); }
};

struct Shape {
  int M, N, K;
};
const Shape kShapes[] = {{3000, 1000, 1000}, {4096, 2048, 1024}, {1000, 264, 512}, {257, 8, 64}, {2048, 4096, 4096}};

// The float32 reference of one M x N output and its per-element scale, with scratch for one
// rank's regenerated inputs.
struct Ref {
  Dev a, b;
  DevF r, s;
  Ref(size_t na, size_t nb, size_t nc) : a(na), b(nb), r(nc), s(nc) {}
};

// gemm_rs / gemm_ar: r = sum over ranks q of A_q * B_q (A_q: M x K, B_q: K x N, regenerated),
// the same sum as one product over the full K.
// B regenerated as bl says: the same values as K x N (KN) or as N x K (NK), one fill either way.
void partial_sum_ref(uint64_t call, int M, int N, int K, Ref& x, cudaStream_t st = nullptr,
                     weave::gemm::BLayout bl = kKN) {
  const int W = wt::comm().world();
  for (int q = 0; q < W; ++q) {
    gref::fill_uniform(x.a.p, size_t(M) * K, input_seed(call, q, kA), 1.f, st);
    gref::fill_uniform(x.b.p, size_t(K) * N, input_seed(call, q, kB), 1.f, st);
    gemm_ref().run(x.a.p, x.b.p, M, N, K, bl, x.r.p, x.s.p, q > 0, st);
  }
  check::sqrt_inplace(x.s.p, size_t(M) * N, st);
}

// ag_gemm: x.a = the gathered A (every rank's row shard regenerated), r = x.a * B (B is this
// rank's own, local operand).
void gathered_ref(uint64_t call, int M, int N, int K, const bf16* B, Ref& x, cudaStream_t st = nullptr,
                  weave::gemm::BLayout bl = kKN) {
  const int W = wt::comm().world();
  for (int q = 0; q < W; ++q) {
    const auto sq = shard(M, W, q);
    gref::fill_uniform(x.a.p + size_t(sq.begin) * K, size_t(sq.size) * K, input_seed(call, q, kA), 1.f, st);
  }
  gemm_ref().run(x.a.p, B, M, N, K, bl, x.r.p, x.s.p, false, st);
  check::sqrt_inplace(x.s.p, size_t(M) * N, st);
}

// This rank's inputs for `call`: what the references above regenerate for it.
void fill_inputs(uint64_t call, bf16* A, size_t na, bf16* B, size_t nb, cudaStream_t st = nullptr) {
  const int r = wt::comm().rank();
  if (A) gref::fill_uniform(A, na, input_seed(call, r, kA), 1.f, st);
  if (B) gref::fill_uniform(B, nb, input_seed(call, r, kB), 1.f, st);
}

struct RankResult {
  double worst, ok;
};

// Every rank's verdict, gathered: a wrong output on any rank fails the case on every rank. Rank 0
// prints the worst ratio over ranks for every case (the bounds are calibrated from these lines).
void expect_all_ranks(bool ok, double worst, const std::string& what, const std::string& detail) {
  auto& c = wt::comm();
  const RankResult mine{worst, ok ? 1.0 : 0.0};
  std::vector<RankResult> all(c.world());
  c.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  bool all_ok = true;
  double w = 0;
  int wr = 0;
  std::string bad;
  for (int q = 0; q < c.world(); ++q) {
    all_ok = all_ok && all[q].ok != 0;
    if (all[q].ok == 0) bad += " " + std::to_string(q);
    if (!(all[q].worst <= w)) w = all[q].worst, wr = q;
  }
  if (c.rank() == 0) std::printf("check %s: worst %.4g (rank %d)%s\n", what.c_str(), w, wr, all_ok ? "" : "  WRONG");
  EXPECT_TRUE(ok) << what << " on rank " << c.rank() << ": " << detail;
  EXPECT_TRUE(all_ok) << what << ": wrong on rank(s)" << bad;
}
void expect_all_ranks(const check::Report& rep, const std::string& what) {
  expect_all_ranks(rep.ok, rep.worst, what, rep.str());
}

// out (rows x N, ld N) against rows [row0, row0 + rows) of the reference.
check::Report compare_rows(const bf16* out, const Ref& x, int row0, int rows, int N, check::Bound b) {
  return check::compare({out, N}, {x.r.p + size_t(row0) * N, N}, {x.s.p + size_t(row0) * N, N}, rows, N, b);
}

// The gathered A, exactly (a copy: any differing bit is wrong).
check::Report compare_gathered(const bf16* G, const Ref& x, int M, int K) {
  DevF g(size_t(M) * K);
  check::to_float(g.p, x.a.p, g.n);
  return check::compare({G, K}, {g.p, K}, {nullptr, 0}, M, K, check::Bound{});
}

std::string shape_name(const char* kernel, int M, int N, int K) {
  return std::string(kernel) + " " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
}

// A case's label: kernel and shape, the variant and communicator SMs asked for, and what ran.
std::string case_name(const char* kernel, const Shape& s, int variant, int ncomm, const weave::tp::LaunchInfo& li) {
  return shape_name(kernel, s.M, s.N, s.K) + " variant " + std::to_string(variant) + " ncomm " + std::to_string(ncomm) +
         " (ran v" + std::to_string(li.variant) + ", " + std::to_string(li.num_comm_sms) + ")";
}

}  // namespace

TEST(TpGpu, GemmRsMatchesReference) {
  auto& c = wt::comm();
  Calls calls;
  weave::tp::GemmRS rs(c);
  const int W = c.world(), r = c.rank();
  for (const Shape& s : kShapes) {
    Dev A(size_t(s.M) * s.K), B(size_t(s.K) * s.N);
    Ref ref(A.n, B.n, size_t(s.M) * s.N);
    const size_t out_n = weave::tp::GemmRS::out_elems(s.M, s.N, W);
    Sym out(out_n);
    const auto sh = shard(s.M, W, r);
    // (variant, num_comm_sms): tuner, owner first, zero first, inter-SM (8 and 1 communicator
    // SMs), one GEMM per owner, copy engine, the chain kernel, the adaptive split, and back to
    // owner first on the same output
    for (auto [variant, ncomm] :
         {std::pair{-1, -1}, {0, -1}, {1, -1}, {2, 8}, {-1, 1}, {3, -1}, {4, -1}, {5, -1}, {6, -1}, {0, -1}}) {
      weave::tp::Options o;
      o.variant = variant;
      o.num_comm_sms = ncomm;
      for (int rep = 0; rep < 3; ++rep) {  // repeated launches, each on new inputs and a poisoned output
        const uint64_t call = calls.next();
        fill_inputs(call, A.p, A.n, B.p, B.n);
        partial_sum_ref(call, s.M, s.N, s.K, ref);
        weave::check::poison(out.p, out_n);
        wt::settle();  // no peer writes into `out` before it is poisoned here
        const auto li = rs.run(A.p, B.p, out.p, s.M, s.N, s.K, o);
        wt::settle();
        expect_all_ranks(compare_rows(out.p, ref, sh.begin, sh.size, s.N, check::partial_sum_bound(W)),
                         case_name("gemm_rs", s, variant, ncomm, li) + " rep " + std::to_string(rep));
      }
    }
  }
  // The adaptive split (v6) reduced while tiles were still unclaimed on the largest shape.
  const weave::tp::AdaptiveStats st = rs.adaptive_stats(2048, 4096, 4096);
  EXPECT_EQ(st.launches, 3u);
  // Ranks taking turns on one GPU may run a peer's whole grid before this rank's: whether a
  // reduction starts early is then up to the time-slicing, not the policy.
  if (!wt::gpus_shared(c))
    EXPECT_GT(st.early_reductions, 0u) << "rank " << c.rank() << ": every reduction waited for the last tile";
}

TEST(TpGpu, AgGemmMatchesReference) {
  auto& c = wt::comm();
  Calls calls;
  weave::tp::AgGemm ag(c);
  const int W = c.world(), r = c.rank();
  for (const Shape& s : kShapes) {
    const auto sh = shard(s.M, W, r);
    Dev Ash(size_t(sh.size) * s.K), B(size_t(s.K) * s.N), C(size_t(s.M) * s.N);
    Ref ref(size_t(s.M) * s.K, 0, C.n);
    // tuner, then (variant, num_comm_sms) fixed; 7..15: variants 2..10 (10: the adaptive split)
    for (int cfg = 0; cfg < 16; ++cfg) {
      int ncomm = cfg == 0 ? -1 : std::array<int, 3>{1, 4, 16}[(cfg - 1) % 3], variant = cfg == 0 ? -1 : (cfg - 1) / 3;
      if (cfg >= 7) ncomm = 0, variant = cfg - 5;
      for (int in_place = 0; in_place < 2; ++in_place) {
        const uint64_t call = calls.next();
        Sym G(size_t(s.M) * s.K);
        weave::check::poison(G.p, size_t(s.M) * s.K);
        fill_inputs(call, Ash.p, Ash.n, B.p, B.n);
        gathered_ref(call, s.M, s.N, s.K, B.p, ref);
        bf16* src = Ash.p;
        if (in_place) {
          src = G.p + size_t(sh.begin) * s.K;
          WEAVE_CUDA_CHECK(cudaMemcpy(src, Ash.p, Ash.n * sizeof(bf16), cudaMemcpyDeviceToDevice));
        }
        weave::check::poison(C.p, C.n);
        wt::settle();
        weave::tp::Options o;
        o.num_comm_sms = ncomm;
        o.variant = variant;
        const auto li = ag.run(src, G.p, B.p, C.p, s.M, s.N, s.K, o);
        wt::settle();
        const std::string what = case_name("ag_gemm", s, variant, ncomm, li) + " in_place " + std::to_string(in_place);
        expect_all_ranks(compare_gathered(G.p, ref, s.M, s.K), what + ", gathered A");
        expect_all_ranks(compare_rows(C.p, ref, 0, s.M, s.N, check::gemm_bound()), what);
        wt::settle();
      }
    }
  }
  // The adaptive split (v10) ran both calls of the largest shape and pushed while tiles were still
  // unclaimed (ranks taking turns on one GPU: up to the time-slicing, as for gemm_rs v6).
  const weave::tp::AdaptiveStats st = ag.adaptive_stats(2048, 4096, 4096);
  EXPECT_EQ(st.launches, 2u);
  if (!wt::gpus_shared(c)) {
    EXPECT_GT(st.early_reductions, 0u) << "rank " << c.rank() << ": every push waited for the last tile's claim";
    EXPECT_GE(st.peak_comm_blocks, 1u);
  }
}

TEST(TpGpu, GemmArMatchesReference) {
  auto& c = wt::comm();
  Calls calls;
  weave::tp::GemmAR ar(c);
  const int W = c.world();
  for (const Shape& s : kShapes) {
    Dev A(size_t(s.M) * s.K), B(size_t(s.K) * s.N);
    Ref ref(A.n, B.n, size_t(s.M) * s.N);
    Sym out(size_t(s.M) * s.N);
    // (num_comm_sms, variant): the tuner, intra-SM, inter-SM with 1, 8 and 33 communicator SMs,
    // the adaptive split.
    const std::pair<int, int> runs[] = {{-1, -1}, {0, -1}, {1, -1}, {8, -1}, {33, -1}, {0, 2}};
    for (const auto& [ncomm, variant] : runs) {
      for (int rep = 0; rep < 2; ++rep) {
        const uint64_t call = calls.next();
        fill_inputs(call, A.p, A.n, B.p, B.n);
        partial_sum_ref(call, s.M, s.N, s.K, ref);
        weave::check::poison(out.p, ref.r.n);
        wt::settle();
        weave::tp::Options o;
        o.num_comm_sms = ncomm;
        o.variant = variant;
        const auto li = ar.run(A.p, B.p, out.p, s.M, s.N, s.K, o);
        wt::settle();
        if (variant >= 0) EXPECT_EQ(li.variant, variant) << shape_name("gemm_ar", s.M, s.N, s.K);
        expect_all_ranks(compare_rows(out.p, ref, 0, s.M, s.N, check::partial_sum_bound(W)),
                         shape_name("gemm_ar", s.M, s.N, s.K) + " ncomm " + std::to_string(ncomm) + " variant " +
                             std::to_string(variant) + " (ran v" + std::to_string(li.variant) + ", " +
                             std::to_string(li.num_comm_sms) + ") rep " + std::to_string(rep));
      }
    }
  }
  // The adaptive split reduced while tiles were still unclaimed on the largest shape (a policy that
  // waited for the last tile would pass the output checks above): its ledger's statistics.
  const weave::tp::AdaptiveStats st = ar.adaptive_stats(2048, 4096, 4096);
  EXPECT_EQ(st.launches, 2u);
  // As in GemmRsMatchesReference; the peak is recorded only while tiles are unclaimed, so it is
  // up to the time-slicing too.
  if (!wt::gpus_shared(c)) {
    EXPECT_GT(st.early_reductions, 0u) << "rank " << c.rank() << ": every reduction waited for the last tile";
    EXPECT_GE(st.peak_comm_blocks, 1u);
  }
}

// B given as N x K (an nn.Linear weight: Options::b = NK), read in place by every family and
// every variant kind (fused kernels, plain-GEMM variants, copy engine), on ragged shapes.
TEST(TpGpu, NkWeightsMatchReference) {
  auto& c = wt::comm();
  Calls calls;
  weave::tp::GemmRS rs(c);
  weave::tp::AgGemm ag(c);
  weave::tp::GemmAR ar(c);
  const int W = c.world(), r = c.rank();
  constexpr auto kNK = weave::gemm::BLayout::NK;
  for (const Shape& s : {Shape{3000, 1000, 1000}, Shape{1000, 264, 512}, Shape{257, 8, 64}}) {
    const auto sh = shard(s.M, W, r);
    Dev A(size_t(s.M) * s.K), Ash(size_t(sh.size) * s.K), B(size_t(s.K) * s.N), C(size_t(s.M) * s.N);
    Ref ref(A.n, B.n, C.n);
    const size_t rs_n = weave::tp::GemmRS::out_elems(s.M, s.N, W);
    Sym rs_out(rs_n), ar_out(C.n), G(size_t(s.M) * s.K);
    auto name = [&](const char* k, int v, int n, const weave::tp::LaunchInfo& li) {
      return shape_name(k, s.M, s.N, s.K) + " NK variant " + std::to_string(v) + " ncomm " + std::to_string(n) +
             " (ran v" + std::to_string(li.variant) + ", " + std::to_string(li.num_comm_sms) + ")";
    };
    for (auto [v, n] : {std::pair{-1, -1}, {0, -1}, {1, -1}, {2, 8}, {3, -1}, {4, -1}, {5, -1}}) {
      weave::tp::Options o;
      o.variant = v, o.num_comm_sms = n, o.b = kNK;
      const uint64_t call = calls.next();
      fill_inputs(call, A.p, A.n, B.p, B.n);
      partial_sum_ref(call, s.M, s.N, s.K, ref, nullptr, kNK);
      weave::check::poison(rs_out.p, rs_n);
      wt::settle();
      const auto li = rs.run(A.p, B.p, rs_out.p, s.M, s.N, s.K, o);
      wt::settle();
      expect_all_ranks(compare_rows(rs_out.p, ref, sh.begin, sh.size, s.N, check::partial_sum_bound(W)),
                       name("gemm_rs", v, n, li));
    }
    for (auto [v, n] : {std::pair{-1, -1}, {0, 4}, {1, 4}, {2, 0}, {3, 0}, {7, 0}, {8, 0}, {9, 0}, {10, 0}}) {
      weave::tp::Options o;
      o.variant = v, o.num_comm_sms = n, o.b = kNK;
      const uint64_t call = calls.next();
      weave::check::poison(G.p, size_t(s.M) * s.K);
      fill_inputs(call, Ash.p, Ash.n, B.p, B.n);
      gathered_ref(call, s.M, s.N, s.K, B.p, ref, nullptr, kNK);
      weave::check::poison(C.p, C.n);
      wt::settle();
      const auto li = ag.run(Ash.p, G.p, B.p, C.p, s.M, s.N, s.K, o);
      wt::settle();
      expect_all_ranks(compare_gathered(G.p, ref, s.M, s.K), name("ag_gemm", v, n, li) + ", gathered A");
      expect_all_ranks(compare_rows(C.p, ref, 0, s.M, s.N, check::gemm_bound()), name("ag_gemm", v, n, li));
      wt::settle();
    }
    for (int n : {-1, 0, 8}) {
      weave::tp::Options o;
      o.num_comm_sms = n, o.b = kNK;
      const uint64_t call = calls.next();
      fill_inputs(call, A.p, A.n, B.p, B.n);
      partial_sum_ref(call, s.M, s.N, s.K, ref, nullptr, kNK);
      weave::check::poison(ar_out.p, C.n);
      wt::settle();
      const auto li = ar.run(A.p, B.p, ar_out.p, s.M, s.N, s.K, o);
      wt::settle();
      expect_all_ranks(compare_rows(ar_out.p, ref, 0, s.M, s.N, check::partial_sum_bound(W)), name("gemm_ar", -1, n, li));
    }
  }
}

namespace {

// One launch's check, accumulated on the device: the largest |x - r| / bound and how many
// elements exceed their bound. A non-negative double orders like its bits as an unsigned
// integer (+inf included), so atomicMax on the bits is a max on the ratio.
struct LaunchCheck {
  unsigned long long worst_bits;
  unsigned long long over;
};

__global__ void check_launch_kernel(const bf16* x, const float* r, const float* s, size_t n, check::Bound b,
                                    LaunchCheck* out) {
  double worst = 0;
  unsigned long long over = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const double q = check::element_ratio(__bfloat162float(x[i]), r[i], s ? s[i] : 0.0, b.rel, b.scale, b.abs);
    worst = fmax(worst, q);
    over += !(q <= 1.0);
  }
  for (int o = 16; o > 0; o >>= 1) {
    worst = fmax(worst, __shfl_xor_sync(0xffffffff, worst, o));
    over += __shfl_xor_sync(0xffffffff, over, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicMax(&out->worst_bits, static_cast<unsigned long long>(__double_as_longlong(worst)));
    atomicAdd(&out->over, over);
  }
}

void check_on_device(const bf16* x, const float* r, const float* s, size_t n, check::Bound b, LaunchCheck* out) {
  check_launch_kernel<<<64, 256>>>(x, r, s, n, b, out);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

// After the last launch: the result slots (launch it's check k at it * names.size() + k) read
// back, and per check the worst ratio and the wrong launches (with their variants), on every rank.
void expect_launches(const LaunchCheck* slots, int launches, const std::vector<std::string>& names,
                     const std::vector<int>& variant) {
  const size_t n = names.size();
  wt::settle();
  std::vector<LaunchCheck> h(size_t(launches) * n);
  WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), slots, h.size() * sizeof(LaunchCheck), cudaMemcpyDeviceToHost));
  for (size_t k = 0; k < n; ++k) {
    double worst = 0;
    int bad = 0;
    std::string first_bad;
    for (int it = 0; it < launches; ++it) {
      const LaunchCheck& x = h[size_t(it) * n + k];
      double q = 0;
      std::memcpy(&q, &x.worst_bits, sizeof q);
      worst = std::max(worst, q);
      if (x.over > 0 && bad++ < 8)
        first_bad += " launch " + std::to_string(it) + " (variant " + std::to_string(variant[size_t(it) * n + k]) +
                     ": " + std::to_string(x.over) + " elements over, worst " + std::to_string(q) + ")";
    }
    expect_all_ranks(bad == 0, worst, names[k] + " over " + std::to_string(launches) + " launches",
                     std::to_string(bad) + " wrong launches:" + first_bad);
  }
}

}  // namespace

// 200 launches of each kernel back to back on one stream, every variant in turn, inputs new for
// every launch. The reference, the poisoning of the next output and the check of each launch
// are enqueued on the same stream between the launches (no host synchronisation), each launch
// into its own result slot; the slots are read once at the end. The kernels order their peer
// writes after the peer entered the same call, so a check enqueued after a call reads that call's
// output and nothing else.
TEST(TpGpu, TwoHundredLaunchesChangingInputs) {
  auto& c = wt::comm();
  Calls calls;
  constexpr int kLaunches = 200, kSlots = 4;  // gemm_rs, ag_gemm, its gathered A, gemm_ar
  const int M = 1000, N = 512, K = 256, W = c.world(), r = c.rank();
  const auto sh = shard(M, W, r);
  Dev A(size_t(M) * K), B(size_t(K) * N), Ash(size_t(sh.size) * K);
  Ref ref(size_t(M) * K, size_t(K) * N, size_t(M) * N);
  DevF gathered_f(size_t(M) * K);
  Sym out(size_t(M) * N), G(size_t(M) * K);
  DevT<LaunchCheck> res(size_t(kLaunches) * kSlots);
  WEAVE_CUDA_CHECK(cudaMemset(res.p, 0, res.n * sizeof(LaunchCheck)));
  weave::tp::GemmRS rs(c);
  weave::tp::AgGemm ag(c);
  weave::tp::GemmAR ar(c);
  weave::tp::Options o4;
  o4.num_comm_sms = 4;
  partial_sum_ref(calls.next(), M, N, K, ref);  // sizes the reference's scratch before the loop
  wt::settle();
  std::vector<int> variant(size_t(kLaunches) * kSlots);
  for (int it = 0; it < kLaunches; ++it) {
    LaunchCheck* slot = res.p + size_t(it) * kSlots;
    // gemm_rs
    uint64_t call = calls.next();
    weave::tp::Options ors;
    ors.variant = it % weave::tp::kRsVariants;  // every variant, alternating on the same output (2: 8 comm SMs)
    variant[size_t(it) * kSlots + 0] = ors.variant;
    fill_inputs(call, A.p, A.n, B.p, B.n);
    partial_sum_ref(call, M, N, K, ref);
    weave::check::poison(out.p, size_t(M) * N);
    rs.run(A.p, B.p, out.p, M, N, K, ors);
    check_on_device(out.p, ref.r.p + size_t(sh.begin) * N, ref.s.p + size_t(sh.begin) * N, size_t(sh.size) * N,
                    check::partial_sum_bound(W), slot + 0);
    // ag_gemm, its C in the same buffer
    call = calls.next();
    weave::tp::Options oa = o4;
    oa.variant = it % weave::tp::kAgVariants;  // every variant (2..10: no communicator SM; 7 and 8 the copy
                                                // engine, 9 all_gather, 10 the adaptive split)
    if (oa.variant >= 2) oa.num_comm_sms = 0;
    variant[size_t(it) * kSlots + 1] = variant[size_t(it) * kSlots + 2] = oa.variant;
    fill_inputs(call, Ash.p, Ash.n, B.p, B.n);
    gathered_ref(call, M, N, K, B.p, ref);
    check::to_float(gathered_f.p, ref.a.p, gathered_f.n);
    weave::check::poison(out.p, size_t(M) * N);
    weave::check::poison(G.p, size_t(M) * K);
    ag.run(Ash.p, G.p, B.p, out.p, M, N, K, oa);
    check_on_device(out.p, ref.r.p, ref.s.p, size_t(M) * N, check::gemm_bound(), slot + 1);
    check_on_device(G.p, gathered_f.p, nullptr, size_t(M) * K, check::Bound{}, slot + 2);
    // gemm_ar
    call = calls.next();
    weave::tp::Options or_ = o4;
    or_.variant = it % 3;  // every variant: inter-SM (4 communicator SMs), intra-SM, adaptive split
    if (or_.variant > 0) or_.num_comm_sms = 0;
    variant[size_t(it) * kSlots + 3] = or_.variant;
    fill_inputs(call, A.p, A.n, B.p, B.n);
    partial_sum_ref(call, M, N, K, ref);
    weave::check::poison(out.p, size_t(M) * N);
    ar.run(A.p, B.p, out.p, M, N, K, or_);
    check_on_device(out.p, ref.r.p, ref.s.p, size_t(M) * N, check::partial_sum_bound(W), slot + 3);
  }
  expect_launches(res.p, kLaunches, {"gemm_rs", "ag_gemm", "ag_gemm gathered A", "gemm_ar"}, variant);
}

TEST(TpGpu, MismatchedShapesAcrossRanksRejected) {
  auto& c = wt::comm();
  const int M = 512, K = 256, N = c.rank() == 0 ? 512 : 520;
  Dev A(size_t(M) * K), B(size_t(K) * 520);
  Sym out(size_t(M) * 520);
  auto expect_reject = [&](const std::function<void()>& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << ": no error for shapes that differ across ranks";
    } catch (const weave::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("ranks call different operators or arguments"), std::string::npos) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
    }
  };
  weave::tp::GemmRS rs(c);
  weave::tp::AgGemm ag(c);
  weave::tp::GemmAR ar(c);
  weave::tp::Options o;
  o.num_comm_sms = 4;
  expect_reject([&] { rs.run(A.p, B.p, out.p, M, N, K); }, "gemm_rs");
  expect_reject([&] { ag.run(A.p, out.p, B.p, A.p, M, N, K, o); }, "ag_gemm");
  expect_reject([&] { ar.run(A.p, B.p, out.p, M, N, K, o); }, "gemm_ar");
  wt::settle();
}

// A buffer peers write (ag_gemm's a_gathered, gemm_rs's and gemm_ar's out) outside the symmetric
// heap on one rank only: that rank's own check finds it, and every rank refuses the call before
// launching (it was found after the agreement, on that rank alone, its peers launched and waited).
TEST(TpGpu, NonSymmetricBufferOnOneRankRejectedEverywhere) {
  auto& c = wt::comm();
  const int M = 512, K = 256, N = 512, last = c.world() - 1;
  Dev A(size_t(M) * K), B(size_t(K) * N), plain(size_t(M) * N), C(size_t(M) * N);
  Sym sym(size_t(M) * N), G(size_t(M) * K);
  bf16* out = c.rank() == last ? plain.p : sym.p;
  const auto sh = shard(M, c.world(), c.rank());
  auto expect_reject = [&](const std::function<void()>& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << ": no error on rank " << c.rank();
    } catch (const weave::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(c.rank() == last ? "symmetric heap" : "rejected its arguments"), std::string::npos)
          << what << ", rank " << c.rank() << ": " << m;
    }
  };
  weave::tp::GemmRS rs(c);
  weave::tp::AgGemm ag(c);
  weave::tp::GemmAR ar(c);
  weave::tp::Options o;
  o.num_comm_sms = 4;
  expect_reject([&] { rs.run(A.p, B.p, out, M, N, K, o); }, "gemm_rs");
  expect_reject([&] { ar.run(A.p, B.p, out, M, N, K, o); }, "gemm_ar");
  bf16* gathered = c.rank() == last ? reinterpret_cast<bf16*>(plain.p) : G.p;
  expect_reject([&] { ag.run(gathered + size_t(sh.begin) * K, gathered, B.p, C.p, M, N, K, o); }, "ag_gemm");
  wt::settle();
}

// CUDA graphs: a shape's first call cannot be captured (it creates the shape's signal sets, which
// synchronizes) and neither can a copy-engine variant; both are rejected on every rank with
// nothing enqueued. After an eager call, the three kernels captured in one graph and replayed
// with fresh inputs in the same buffers give every replay's own product: the captured launches
// read their rounds from the device (SignalSet::next_round), so a replay waits for its round and
// not the captured one. Eager calls after the replays agree with them too.
TEST(TpGpu, GraphCaptureAndReplay) {
  auto& c = wt::comm();
  const int W = c.world();
  Calls calls;
  const int M = 520, K = 264, N = 392;
  Dev A(size_t(M) * K), B(size_t(K) * N), C(size_t(M) * N);
  Ref ref(A.n, B.n, C.n);
  Sym G(size_t(M) * K), rs_out(size_t(M) * N), ar_out(size_t(M) * N), ar2_out(size_t(M) * N);
  Dev C2(size_t(M) * N);
  weave::tp::GemmRS rs(c);
  weave::tp::AgGemm ag(c);
  weave::tp::GemmAR ar(c);
  weave::tp::Options oag, oag2, ors, oar, oar2;
  oag.num_comm_sms = 0, oag.variant = weave::tp::to_int(weave::tp::AgVariant::AuxTmaPush);
  oag2.num_comm_sms = 0, oag2.variant = weave::tp::to_int(weave::tp::AgVariant::Adaptive);
  ors.num_comm_sms = 0, ors.variant = weave::tp::to_int(weave::tp::RsVariant::OwnerFirst);
  oar.num_comm_sms = 0, oar.variant = weave::tp::to_int(weave::tp::ArVariant::IntraSm);
  oar2.num_comm_sms = 0, oar2.variant = weave::tp::to_int(weave::tp::ArVariant::Adaptive);
  cudaStream_t st;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const auto sh = shard(M, W, c.rank());
  bf16* a_shard = G.p + size_t(sh.begin) * K;
  auto enqueue = [&] {
    ag.run(a_shard, G.p, B.p, C.p, M, N, K, oag, st);
    ag.run(a_shard, G.p, B.p, C2.p, M, N, K, oag2, st);  // the adaptive split, its ledger zeroed by each launch
    rs.run(A.p, B.p, rs_out.p, M, N, K, ors, st);
    ar.run(A.p, B.p, ar_out.p, M, N, K, oar, st);
    ar.run(A.p, B.p, ar2_out.p, M, N, K, oar2, st);  // its ledger zeroes itself: replays find it zero
  };
  auto rejected = [&](const char* what, const char* needle, const std::function<void()>& call) {
    const auto [msg, nodes] = wt::under_capture(st, call);
    EXPECT_NE(msg.find(needle), std::string::npos) << what << ": " << msg;
    EXPECT_EQ(nodes, 0u) << what << ": something was enqueued into the graph";
  };
  rejected("first call of the shape", "outside a CUDA graph capture", [&] { enqueue(); });
  weave::tp::Options ce;
  ce.num_comm_sms = 0, ce.variant = weave::tp::to_int(weave::tp::AgVariant::CopyEngine);
  rejected("ag_gemm copy engine", "cannot be captured", [&] { ag.run(a_shard, G.p, B.p, C.p, M, N, K, ce, st); });
  // Fresh inputs for a call: this rank's shard of A into the gathered buffer and its own A, B.
  auto inputs = [&](uint64_t call) {
    fill_inputs(call, nullptr, 0, B.p, B.n, st);
    fill_inputs(call, A.p, A.n, nullptr, 0, st);
    gref::fill_uniform(a_shard, size_t(sh.size) * K, input_seed(call, c.rank(), kA), 1.f, st);
    for (bf16* o : {C.p, C2.p, rs_out.p, ar_out.p, ar2_out.p}) check::poison(o, size_t(M) * N, st);
  };
  auto verify = [&](uint64_t call, const std::string& what) {
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    gathered_ref(call, M, N, K, B.p, ref);
    expect_all_ranks(compare_rows(C.p, ref, 0, M, N, check::gemm_bound()), "ag_gemm " + what);
    expect_all_ranks(compare_rows(C2.p, ref, 0, M, N, check::gemm_bound()), "ag_gemm adaptive " + what);
    partial_sum_ref(call, M, N, K, ref);
    expect_all_ranks(compare_rows(rs_out.p, ref, sh.begin, sh.size, N, check::partial_sum_bound(W)), "gemm_rs " + what);
    expect_all_ranks(compare_rows(ar_out.p, ref, 0, M, N, check::partial_sum_bound(W)), "gemm_ar " + what);
    expect_all_ranks(compare_rows(ar2_out.p, ref, 0, M, N, check::partial_sum_bound(W)), "gemm_ar adaptive " + what);
  };
  uint64_t call = calls.next();
  inputs(call);
  enqueue();  // eager: the shapes' signal sets
  verify(call, "eager");
  wt::settle();
  const wt::Graph graph(st, enqueue, cudaStreamCaptureModeRelaxed);
  for (int rep = 0; rep < 40; ++rep) {
    call = calls.next();
    inputs(call);
    graph.launch(st);
    verify(call, "replay " + std::to_string(rep));
  }
  call = calls.next();
  inputs(call);
  enqueue();
  verify(call, "eager after the replays");
  WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
  wt::settle();
}

// One object called alternately on two streams with no synchronisation between the calls: each
// call must wait for the object's previous one (its gathered buffer / counters serve one call at
// a time), so every call's output matches its own reference. Without the ordering the second
// stream's kernel overwrites the gathered A (or the counters) under the first's. Every call has
// its own inputs and its own poisoned output, for every variant.
TEST(TpGpu, OneObjectOnTwoStreams) {
  auto& c = wt::comm();
  Calls seeds;
  const int M = 1000, N = 264, K = 512, W = c.world(), r = c.rank(), calls = 6;
  const auto sh = shard(M, W, r);
  weave::tp::AgGemm ag(c);
  weave::tp::GemmAR ar(c);
  weave::tp::GemmRS rs(c);
  Sym G(size_t(M) * K);
  Ref ref(size_t(M) * K, size_t(K) * N, size_t(M) * N);
  std::vector<std::unique_ptr<Dev>> ash, as, bs, cs;
  std::vector<std::unique_ptr<Sym>> outs;
  for (int i = 0; i < calls; ++i) {
    ash.push_back(std::make_unique<Dev>(size_t(sh.size) * K));
    as.push_back(std::make_unique<Dev>(size_t(M) * K));
    bs.push_back(std::make_unique<Dev>(size_t(K) * N));
    cs.push_back(std::make_unique<Dev>(size_t(M) * N));
    outs.push_back(std::make_unique<Sym>(size_t(M) * N));
  }
  cudaStream_t st[2];
  for (auto& x : st) WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  std::vector<uint64_t> call(calls);
  auto fresh = [&](bool ag_inputs) {  // new inputs for every call, every output poisoned
    for (int i = 0; i < calls; ++i) {
      call[i] = seeds.next();
      fill_inputs(call[i], ag_inputs ? ash[i]->p : as[i]->p, ag_inputs ? ash[i]->n : as[i]->n, bs[i]->p, bs[i]->n);
      weave::check::poison(cs[i]->p, cs[i]->n);
      weave::check::poison(outs[i]->p, size_t(M) * N);
    }
    weave::check::poison(G.p, size_t(M) * K);
    wt::settle();
  };
  auto finish = [&] {
    for (auto& x : st) WEAVE_CUDA_CHECK(cudaStreamSynchronize(x));
    wt::settle();
  };
  for (int v : {0, 2, 7, 8, 9, 10}) {  // communicator push, aux-warp push, copy engine, copy engine + GEMM
                                        // per shard, all_gather + GEMM, the adaptive split
    weave::tp::Options o;
    o.variant = v;
    o.num_comm_sms = v == 0 ? 4 : 0;
    fresh(true);
    for (int i = 0; i < calls; ++i) ag.run(ash[i]->p, G.p, bs[i]->p, cs[i]->p, M, N, K, o, st[i % 2]);
    finish();
    for (int i = 0; i < calls; ++i) {
      gathered_ref(call[i], M, N, K, bs[i]->p, ref);
      const std::string what =
          "ag_gemm v" + std::to_string(v) + " call " + std::to_string(i) + " (stream " + std::to_string(i % 2) + ")";
      expect_all_ranks(compare_rows(cs[i]->p, ref, 0, M, N, check::gemm_bound()), what);
      if (i == calls - 1) expect_all_ranks(compare_gathered(G.p, ref, M, K), what + ", gathered A");  // the last call's
    }
  }
  for (int v : {1, 2}) {  // intra-SM; the adaptive split (one ledger per shape: the calls share it)
    weave::tp::Options o;
    o.num_comm_sms = 0;
    o.variant = v;
    fresh(false);
    for (int i = 0; i < calls; ++i) ar.run(as[i]->p, bs[i]->p, outs[i]->p, M, N, K, o, st[i % 2]);
    finish();
    for (int i = 0; i < calls; ++i) {
      partial_sum_ref(call[i], M, N, K, ref);
      expect_all_ranks(compare_rows(outs[i]->p, ref, 0, M, N, check::partial_sum_bound(W)),
                       "gemm_ar v" + std::to_string(v) + " call " + std::to_string(i) + " (stream " +
                           std::to_string(i % 2) + ")");
    }
  }
  // gemm_rs, owner first, one GEMM per owner, the copy engine (whose steps signal across ranks
  // from the streams) and the chain kernel.
  for (weave::tp::RsVariant rv : {weave::tp::RsVariant::OwnerFirst, weave::tp::RsVariant::ShardGemms,
                                   weave::tp::RsVariant::CopyEngine, weave::tp::RsVariant::Chain,
                                   weave::tp::RsVariant::Adaptive}) {
    const int v = weave::tp::to_int(rv);
    weave::tp::Options o;
    o.variant = v;
    fresh(false);
    for (int i = 0; i < calls; ++i) rs.run(as[i]->p, bs[i]->p, outs[i]->p, M, N, K, o, st[i % 2]);
    finish();
    for (int i = 0; i < calls; ++i) {
      partial_sum_ref(call[i], M, N, K, ref);
      expect_all_ranks(compare_rows(outs[i]->p, ref, sh.begin, sh.size, N, check::partial_sum_bound(W)),
                       "gemm_rs v" + std::to_string(v) + " call " + std::to_string(i) + " (stream " +
                           std::to_string(i % 2) + ")");
    }
  }
  for (auto& x : st) WEAVE_CUDA_CHECK(cudaStreamDestroy(x));
  wt::settle();
}

// ---- fp8 (e4m3) inputs with per-tensor scales ----------------------------------------------------

namespace {

using fp8 = __nv_fp8_e4m3;

// Ragged in M (not a multiple of 128, nor of W = 2), N (a multiple of 8, not of 256) and K (a
// multiple of 16, not of 128), one large shape, and one tiny (K below one 128-K block).
const Shape kFp8Shapes[] = {{999, 776, 528}, {2304, 2048, 4096}, {257, 8, 64}};

using check::fp8_gemm_ref;

// Rank q's fp8 inputs of `call` (null pointers are skipped), what the references regenerate: A
// uniform over the whole e4m3 range, B in [-1, 1), scale_a log-uniform in [2^-8, 2^-7], scale_b
// in [2, 4] (the file's header says why).
void fp8_fill(uint64_t call, int q, fp8* A, size_t na, fp8* B, size_t nb, float* sa, float* sb,
              cudaStream_t st = nullptr) {
  if (A) check::fill_fp8_uniform(A, false, na, input_seed(call, q, kA), 448.f, st);
  if (B) check::fill_fp8_uniform(B, false, nb, input_seed(call, q, kB), 1.f, st);
  if (sa) check::fill_log_uniform(sa, 1, input_seed(call, q, kScaleA), 1.f / 256, 1.f / 128, st);
  if (sb) check::fill_log_uniform(sb, 1, input_seed(call, q, kScaleB), 2.f, 4.f, st);
}
// ag_gemm's scale_a is one scale of the whole gathered A: rank 0's, on every rank.
constexpr int kSharedScaleRank = 0;

// 0xFF bytes: the e4m3 NaN code, so an fp8 element never written is a wrong byte.
void poison_fp8(fp8* p, size_t n, cudaStream_t st = nullptr) { WEAVE_CUDA_CHECK(cudaMemsetAsync(p, 0xFF, n, st)); }

// The reference (Ref's r and s; its bf16 a, b unused) and scratch for one rank's regenerated fp8
// inputs: a8 (gemm_rs: one rank's A; ag_gemm: the gathered A), b8, their scales, and one rank's
// partial (rq, sq).
struct Fp8Ref : Ref {
  DevT<fp8> a8, b8;
  DevF sa, sb, rq, sq;
  Fp8Ref(size_t na, size_t nb, size_t nc) : Ref(0, 0, nc), a8(na), b8(nb), sa(1), sb(1), rq(nc), sq(nc) {}
};

// gemm_rs: r = sum over ranks q of sa_q sb_q A_q B_q^T, every rank's partial with its own scales;
// s^2 the sum of the partials' s^2 (the same as one product over the full K).
void fp8_partial_sum_ref(uint64_t call, int M, int N, int K, Fp8Ref& x, cudaStream_t st = nullptr) {
  const int W = wt::comm().world();
  const size_t n = size_t(M) * N;
  for (int q = 0; q < W; ++q) {
    fp8_fill(call, q, x.a8.p, size_t(M) * K, x.b8.p, size_t(N) * K, x.sa.p, x.sb.p, st);
    fp8_gemm_ref().run(x.a8.p, false, x.b8.p, false, M, N, K, x.sa.p, x.sb.p, q ? x.rq.p : x.r.p, q ? x.sq.p : x.s.p, st);
    if (q) {
      check::add_f32(x.r.p, x.rq.p, n, st);
      check::add_f32(x.s.p, x.sq.p, n, st);
    }
  }
  check::sqrt_inplace(x.s.p, n, st);
}

// ag_gemm: x.a8 = the gathered A (every rank's row shard regenerated), r = sa sb x.a8 B^T with
// this rank's own B and the scales it passed.
void fp8_gathered_ref(uint64_t call, int M, int N, int K, const fp8* B, const float* sa, const float* sb, Fp8Ref& x,
                      cudaStream_t st = nullptr) {
  const int W = wt::comm().world();
  for (int q = 0; q < W; ++q) {
    const auto sq = shard(M, W, q);
    fp8_fill(call, q, x.a8.p + size_t(sq.begin) * K, size_t(sq.size) * K, nullptr, 0, nullptr, nullptr, st);
  }
  fp8_gemm_ref().run(x.a8.p, false, B, false, M, N, K, sa, sb, x.r.p, x.s.p, st);
  check::sqrt_inplace(x.s.p, size_t(M) * N, st);
}

// gemm_rs with fp8 inputs (header): partial_sum_bound plus every rank's tensor-core loss.
check::Bound fp8_partial_sum_bound(int W, int K) {
  const double T = K / 32.0;
  check::Bound b = check::partial_sum_bound(W);
  b.rel += std::ldexp(T, -14);
  b.scale += std::sqrt(double(W)) * std::ldexp(T, -11);
  return b;
}

// Bytes of x and y that differ, counted into out->over; out->worst becomes +inf when any does
// (as Bound{} gives for a copy).
__global__ void compare_bytes_kernel(const uint8_t* x, const uint8_t* y, size_t n, LaunchCheck* out) {
  unsigned long long over = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    over += x[i] != y[i];
  for (int o = 16; o > 0; o >>= 1) over += __shfl_xor_sync(0xffffffff, over, o);
  if ((threadIdx.x & 31) == 0 && over) {
    atomicAdd(&out->over, over);
    atomicMax(&out->worst_bits, static_cast<unsigned long long>(__double_as_longlong(INFINITY)));
  }
}
void compare_bytes_on_device(const fp8* x, const fp8* y, size_t n, LaunchCheck* out) {
  compare_bytes_kernel<<<64, 256>>>(reinterpret_cast<const uint8_t*>(x), reinterpret_cast<const uint8_t*>(y), n, out);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

// The gathered fp8 A against its regeneration, byte for byte, per rank's row shard (so that a
// stale or missing shard names its rank); checked on every rank.
void expect_gathered_fp8(const fp8* G, const Fp8Ref& x, int M, int K, const std::string& what) {
  const int W = wt::comm().world();
  DevT<LaunchCheck> res(W);
  WEAVE_CUDA_CHECK(cudaMemset(res.p, 0, W * sizeof(LaunchCheck)));
  for (int q = 0; q < W; ++q) {
    const auto sq = shard(M, W, q);
    compare_bytes_on_device(G + size_t(sq.begin) * K, x.a8.p + size_t(sq.begin) * K, size_t(sq.size) * K, res.p + q);
  }
  std::vector<LaunchCheck> h(W);
  WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), res.p, W * sizeof(LaunchCheck), cudaMemcpyDeviceToHost));
  unsigned long long bad = 0;
  std::string detail;
  for (int q = 0; q < W; ++q) {
    bad += h[q].over;
    if (h[q].over) {
      const auto sq = shard(M, W, q);
      detail += " rows of rank " + std::to_string(q) + " (" + std::to_string(sq.begin) + ".." +
                std::to_string(sq.begin + sq.size - 1) + "): " + std::to_string(h[q].over) + " bytes differ;";
    }
  }
  expect_all_ranks(bad == 0, bad ? INFINITY : 0.0, what + ", gathered A (bytes)", detail);
}

}  // namespace

// fp8 AllGather + GEMM: every variant (the communicator-SM pushes with 1 and 8 SMs), a_shard
// apart and in place, each case on fresh inputs and scales, C and the gathered A poisoned.
TEST(TpGpu, Fp8AgGemmMatchesReference) {
  auto& c = wt::comm();
  Calls calls;
  weave::tp::AgGemm ag(c);
  const int W = c.world(), r = c.rank();
  for (const Shape& s : kFp8Shapes) {
    const auto sh = shard(s.M, W, r);
    const size_t na = size_t(s.M) * s.K;
    DevT<fp8> Ash(size_t(sh.size) * s.K), B(size_t(s.N) * s.K);
    DevF sa(1), sb(1);
    Dev C(size_t(s.M) * s.N);
    SymT<fp8> G(na);
    Fp8Ref ref(na, 0, C.n);
    // (variant, num_comm_sms): the tuner, TMA and register push by 1 and 8 communicator SMs, then
    // 2..9 (no communicator SM; 7 and 8 the copy engine, 9 all_gather then one GEMM)
    for (auto [variant, ncomm] : {std::pair{-1, -1}, {0, 1}, {0, 8}, {1, 1}, {1, 8}, {2, 0}, {3, 0}, {4, 0}, {5, 0},
                                  {6, 0}, {7, 0}, {8, 0}, {9, 0}}) {
      for (int in_place = 0; in_place < 2; ++in_place) {
        const uint64_t call = calls.next();
        poison_fp8(G.p, na);
        fp8_fill(call, r, Ash.p, Ash.n, B.p, B.n, nullptr, sb.p);
        fp8_fill(call, kSharedScaleRank, nullptr, 0, nullptr, 0, sa.p, nullptr);
        fp8_gathered_ref(call, s.M, s.N, s.K, B.p, sa.p, sb.p, ref);
        const fp8* src = Ash.p;
        if (in_place) {
          fp8* own = G.p + size_t(sh.begin) * s.K;
          WEAVE_CUDA_CHECK(cudaMemcpy(own, Ash.p, Ash.n, cudaMemcpyDeviceToDevice));
          src = own;
        }
        weave::check::poison(C.p, C.n);
        wt::settle();
        weave::tp::Options o;
        o.num_comm_sms = ncomm;
        o.variant = variant;
        const auto li = ag.run(src, G.p, B.p, sa.p, sb.p, C.p, s.M, s.N, s.K, o);
        wt::settle();
        const std::string what =
            case_name("ag_gemm fp8", s, variant, ncomm, li) + " in_place " + std::to_string(in_place);
        expect_gathered_fp8(G.p, ref, s.M, s.K, what);
        expect_all_ranks(compare_rows(C.p, ref, 0, s.M, s.N, check::fp8_tensor_core_bound(s.K)), what);
        wt::settle();
      }
    }
  }
}

// fp8 GEMM + reduce-scatter: every variant fp8 offers (3 is not), each rank's partial with its
// own scales, fresh inputs and a poisoned output for every repetition.
TEST(TpGpu, Fp8GemmRsMatchesReference) {
  auto& c = wt::comm();
  Calls calls;
  weave::tp::GemmRS rs(c);
  const int W = c.world(), r = c.rank();
  for (const Shape& s : kFp8Shapes) {
    DevT<fp8> A(size_t(s.M) * s.K), B(size_t(s.N) * s.K);
    DevF sa(1), sb(1);
    Fp8Ref ref(A.n, B.n, size_t(s.M) * s.N);
    const size_t out_n = weave::tp::GemmRS::out_elems(s.M, s.N, W);
    Sym out(out_n);
    const auto sh = shard(s.M, W, r);
    const check::Bound bound = fp8_partial_sum_bound(W, s.K);
    // (variant, num_comm_sms): tuner, owner first, zero first, inter-SM (8 and 1 communicator
    // SMs), copy engine, the chain kernel, and back to owner first on the same output
    for (auto [variant, ncomm] : {std::pair{-1, -1}, {0, -1}, {1, -1}, {2, 8}, {-1, 1}, {4, -1}, {5, -1}, {0, -1}}) {
      weave::tp::Options o;
      o.variant = variant;
      o.num_comm_sms = ncomm;
      for (int rep = 0; rep < 2; ++rep) {
        const uint64_t call = calls.next();
        fp8_fill(call, r, A.p, A.n, B.p, B.n, sa.p, sb.p);
        fp8_partial_sum_ref(call, s.M, s.N, s.K, ref);
        weave::check::poison(out.p, out_n);
        wt::settle();
        const auto li = rs.run(A.p, B.p, sa.p, sb.p, out.p, s.M, s.N, s.K, o);
        wt::settle();
        expect_all_ranks(compare_rows(out.p, ref, sh.begin, sh.size, s.N, bound),
                         case_name("gemm_rs fp8", s, variant, ncomm, li) + " rep " + std::to_string(rep));
      }
    }
  }
}

// 50 fp8 launches of each kernel back to back on one stream, every variant in turn, inputs and
// scales new for every launch, each launch checked on the device into its own slot as in
// TwoHundredLaunchesChangingInputs (no host synchronisation until the end).
TEST(TpGpu, Fp8FiftyLaunchesChangingInputs) {
  auto& c = wt::comm();
  Calls calls;
  constexpr int kLaunches = 50, kSlots = 3;  // gemm_rs, ag_gemm, its gathered A
  const int M = 999, N = 520, K = 272, W = c.world(), r = c.rank();
  const auto sh = shard(M, W, r);
  DevT<fp8> A(size_t(M) * K), B(size_t(N) * K), Ash(size_t(sh.size) * K);
  DevF sa(1), sb(1);
  Fp8Ref ref(A.n, B.n, size_t(M) * N);
  Sym out(size_t(M) * N);
  SymT<fp8> G(size_t(M) * K);
  DevT<LaunchCheck> res(size_t(kLaunches) * kSlots);
  WEAVE_CUDA_CHECK(cudaMemset(res.p, 0, res.n * sizeof(LaunchCheck)));
  weave::tp::GemmRS rs(c);
  weave::tp::AgGemm ag(c);
  fp8_partial_sum_ref(calls.next(), M, N, K, ref);  // sizes the reference's scratch before the loop
  wt::settle();
  constexpr int kFp8RsVariants[] = {0, 1, 2, 4, 5};  // every variant fp8 offers (2: 8 communicator SMs)
  std::vector<int> variant(size_t(kLaunches) * kSlots);
  for (int it = 0; it < kLaunches; ++it) {
    LaunchCheck* slot = res.p + size_t(it) * kSlots;
    // gemm_rs
    uint64_t call = calls.next();
    weave::tp::Options ors;
    ors.variant = kFp8RsVariants[it % 5];
    variant[size_t(it) * kSlots + 0] = ors.variant;
    fp8_fill(call, r, A.p, A.n, B.p, B.n, sa.p, sb.p);
    fp8_partial_sum_ref(call, M, N, K, ref);
    weave::check::poison(out.p, size_t(M) * N);
    rs.run(A.p, B.p, sa.p, sb.p, out.p, M, N, K, ors);
    check_on_device(out.p, ref.r.p + size_t(sh.begin) * N, ref.s.p + size_t(sh.begin) * N, size_t(sh.size) * N,
                    fp8_partial_sum_bound(W, K), slot + 0);
    // ag_gemm, its C in the same buffer
    call = calls.next();
    weave::tp::Options oa;
    oa.variant = it % 10;  // every variant fp8 offers, 0..9 (0, 1: 4 communicator SMs; 10 is bf16 only)
    oa.num_comm_sms = oa.variant < 2 ? 4 : 0;
    variant[size_t(it) * kSlots + 1] = variant[size_t(it) * kSlots + 2] = oa.variant;
    fp8_fill(call, r, Ash.p, Ash.n, B.p, B.n, nullptr, sb.p);
    fp8_fill(call, kSharedScaleRank, nullptr, 0, nullptr, 0, sa.p, nullptr);
    fp8_gathered_ref(call, M, N, K, B.p, sa.p, sb.p, ref);
    weave::check::poison(out.p, size_t(M) * N);
    poison_fp8(G.p, size_t(M) * K);
    ag.run(Ash.p, G.p, B.p, sa.p, sb.p, out.p, M, N, K, oa);
    check_on_device(out.p, ref.r.p, ref.s.p, size_t(M) * N, check::fp8_tensor_core_bound(K), slot + 1);
    compare_bytes_on_device(G.p, ref.a8.p, size_t(M) * K, slot + 2);
  }
  expect_launches(res.p, kLaunches, {"gemm_rs fp8", "ag_gemm fp8", "ag_gemm fp8 gathered A (bytes)"}, variant);
}

// fp8 arguments every rank rejects with weave::Error before anything is launched: K not a
// multiple of 16 (520: enough for bf16), a null scale_a (on every rank, then on rank 1 only: rank
// 0 rejects the call because rank 1 did), gemm_rs variant 3, ag_gemm variant 10 (the adaptive
// split, bf16 only), and ranks that call the same shape
// with different input types. Each case on a shape no other call in this process used, so that
// it is the plan's first call, which every rank checks together. Calls afterwards still work.
TEST(TpGpu, Fp8BadArgumentsRejected) {
  auto& c = wt::comm();
  Calls calls;
  const int W = c.world(), r = c.rank();
  const int M = 384, N = 392, Kmax = 528;
  DevT<fp8> A(size_t(M) * Kmax), B(size_t(N) * Kmax), Ash(size_t(shard(M, W, r).size) * Kmax);
  Dev A16(size_t(M) * Kmax), B16(size_t(Kmax) * N), C(size_t(M) * N);
  DevF sa(1), sb(1);
  Sym out(size_t(M) * N);
  SymT<fp8> G(size_t(M) * Kmax);
  const float one = 1.f;
  for (float* p : {sa.p, sb.p}) WEAVE_CUDA_CHECK(cudaMemcpy(p, &one, sizeof one, cudaMemcpyHostToDevice));
  weave::tp::GemmRS rs(c);
  weave::tp::AgGemm ag(c);
  auto expect_reject = [&](const std::string& what, const std::string& needle, const std::function<void()>& call) {
    std::string msg;
    try {
      call();
    } catch (const weave::Error& e) {
      msg = e.what();
    }
    const bool ok = !msg.empty() && msg.find(needle) != std::string::npos;
    expect_all_ranks(ok, 0, "rejected: " + what,
                     msg.empty() ? "no weave::Error" : "the error does not say \"" + needle + "\": " + msg);
  };
  weave::tp::Options o;
  o.num_comm_sms = 0;
  const std::string k16 = "K = 520 is not a multiple of 16";
  expect_reject("gemm_rs K % 16", k16, [&] { rs.run(A.p, B.p, sa.p, sb.p, out.p, M, N, 520, o); });
  expect_reject("ag_gemm K % 16", k16, [&] { ag.run(Ash.p, G.p, B.p, sa.p, sb.p, C.p, M, N, 520, o); });
  const std::string null_sa = "scale_a is a null pointer";
  expect_reject("gemm_rs null scale_a", null_sa, [&] { rs.run(A.p, B.p, nullptr, sb.p, out.p, M, N, 400, o); });
  expect_reject("ag_gemm null scale_a", null_sa, [&] { ag.run(Ash.p, G.p, B.p, nullptr, sb.p, C.p, M, N, 400, o); });
  expect_reject("ag_gemm null scale_a on rank 1", r == 1 ? null_sa : "rank 1 rejected its arguments",
                [&] { ag.run(Ash.p, G.p, B.p, r == 1 ? nullptr : sa.p, sb.p, C.p, M, N, 416, o); });
  weave::tp::Options o3;
  o3.variant = 3;
  expect_reject("gemm_rs fp8 variant 3", "variant 3 (one GEMM per owner) is not offered for fp8",
                [&] { rs.run(A.p, B.p, sa.p, sb.p, out.p, M, N, 400, o3); });
  weave::tp::Options o10;
  o10.num_comm_sms = 0, o10.variant = weave::tp::to_int(weave::tp::AgVariant::Adaptive);
  expect_reject("ag_gemm fp8 variant 10", "variant 10 (the adaptive split) is built for bf16 inputs only",
                [&] { ag.run(Ash.p, G.p, B.p, sa.p, sb.p, C.p, M, N, 464, o10); });
  expect_reject("gemm_rs bf16 on rank 0, fp8 on the others", "ranks call different operators or arguments", [&] {
    if (r == 0) rs.run(A16.p, B16.p, out.p, M, N, 432, o);
    else rs.run(A.p, B.p, sa.p, sb.p, out.p, M, N, 432, o);
  });
  // Nothing was launched and everything is usable: valid fp8 calls of the rejected shapes agree
  // with the reference.
  wt::settle();
  {
    const int K = 400;
    Fp8Ref ref(size_t(M) * K, size_t(N) * K, size_t(M) * N);
    const auto sh = shard(M, W, r);
    uint64_t call = calls.next();
    fp8_fill(call, r, A.p, size_t(M) * K, B.p, size_t(N) * K, sa.p, sb.p);
    fp8_partial_sum_ref(call, M, N, K, ref);
    weave::check::poison(out.p, weave::tp::GemmRS::out_elems(M, N, W));
    wt::settle();
    rs.run(A.p, B.p, sa.p, sb.p, out.p, M, N, K, o);
    wt::settle();
    expect_all_ranks(compare_rows(out.p, ref, sh.begin, sh.size, N, fp8_partial_sum_bound(W, K)),
                     shape_name("gemm_rs fp8", M, N, K) + " after the rejections");
    call = calls.next();
    poison_fp8(G.p, size_t(M) * K);
    fp8_fill(call, r, Ash.p, size_t(sh.size) * K, B.p, size_t(N) * K, nullptr, sb.p);
    fp8_fill(call, kSharedScaleRank, nullptr, 0, nullptr, 0, sa.p, nullptr);
    fp8_gathered_ref(call, M, N, K, B.p, sa.p, sb.p, ref);
    weave::check::poison(C.p, C.n);
    wt::settle();
    ag.run(Ash.p, G.p, B.p, sa.p, sb.p, C.p, M, N, K, o);
    wt::settle();
    const std::string what = shape_name("ag_gemm fp8", M, N, K) + " after the rejections";
    expect_gathered_fp8(G.p, ref, M, K, what);
    expect_all_ranks(compare_rows(C.p, ref, 0, M, N, check::fp8_tensor_core_bound(K)), what);
  }
  wt::settle();
}
