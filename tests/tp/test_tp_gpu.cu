// The TP fused kernels on 2 ranks (weave-run -n 2) against cuBLAS + NCCL on random data: ragged
// shapes, poisoned outputs, every variant and several num_comm_sms, 200 back-to-back launches
// with changing inputs, and shapes that differ across ranks rejected before any launch.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../primitives/common.hpp"
#include "ag_gemm/ag_gemm.hpp"
#include "gemm/reference.cuh"
#include "gemm_ar/gemm_ar.hpp"
#include "gemm_rs/gemm_rs.hpp"
#include "../../bench/nccl_comm.hpp"

using weave::tp::bf16;
using weave::tp::shard;
namespace gref = weave::gemm::ref;

namespace {

// Tuner choices stay in memory during tests (no cache file is written).
const int kTunerOff = (setenv("WEAVE_TUNER_CACHE", "off", 1), 0);

constexpr double kTol = 1e-2;  // bf16 partial sums rounded in a different order than NCCL's

struct Dev {
  bf16* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { WEAVE_CUDA_CHECK(cudaMalloc(&p, (count ? count : 1) * sizeof(bf16))); }
  ~Dev() { cudaFree(p); }
};
struct Sym {
  bf16* p;
  explicit Sym(size_t count) : p(static_cast<bf16*>(wt::comm().alloc((count ? count : 1) * sizeof(bf16)))) {}
  ~Sym() { wt::comm().free(p); }
};

weave::bench::NcclComm& nccl() {
  static weave::bench::NcclComm n(wt::comm());
  return n;
}
gref::CublasLt& blas() {
  static gref::CublasLt b;
  return b;
}
uint64_t seed_for(uint64_t base, int what) {
  return base * 0x9E3779B97F4A7C15ull + uint64_t(wt::comm().rank() + 1) * 7919 + uint64_t(what) * 104729;
}

struct Shape {
  int M, N, K;
};
const Shape kShapes[] = {{3000, 1000, 1000}, {4096, 2048, 1024}, {1000, 264, 512}, {257, 8, 64}, {2048, 4096, 4096}};

void ref_all_reduce(bf16* p, size_t n) {
  WEAVE_NCCL_CHECK(ncclAllReduce(p, p, n, ncclBfloat16, ncclSum, nccl().get(), nullptr));
}

}  // namespace

TEST(TpGpu, GemmRsMatchesCublasNccl) {
  auto& c = wt::comm();
  const uint64_t seed = wt::job_seed();
  weave::tp::GemmRS rs(c);
  for (const Shape& s : kShapes) {
    const int W = c.world(), r = c.rank();
    Dev A(size_t(s.M) * s.K), B(size_t(s.K) * s.N), ref(size_t(s.M) * s.N);
    Sym out(weave::tp::GemmRS::out_elems(s.M, s.N, W));
    gref::fill_uniform(A.p, A.n, seed_for(seed, 1));
    gref::fill_uniform(B.p, B.n, seed_for(seed, 2));
    blas().run(A.p, B.p, ref.p, s.M, s.N, s.K, weave::gemm::BLayout::KN, false, nullptr);
    ref_all_reduce(ref.p, ref.n);
    const auto sh = shard(s.M, W, r);
    // (variant, num_comm_sms): tuner, owner first, zero first, inter-SM (8 and 1 communicator
    // SMs), one GEMM per owner, copy engine, the chain kernel, and back to owner first on the
    // same output
    for (auto [variant, ncomm] :
         {std::pair{-1, -1}, {0, -1}, {1, -1}, {2, 8}, {-1, 1}, {3, -1}, {4, -1}, {5, -1}, {0, -1}}) {
      weave::tp::Options o;
      o.variant = variant;
      o.num_comm_sms = ncomm;
      for (int rep = 0; rep < 3; ++rep) {  // repeated launches on a poisoned output
        gref::poison(out.p, weave::tp::GemmRS::out_elems(s.M, s.N, W));
        rs.run(A.p, B.p, out.p, s.M, s.N, s.K, o);
        wt::settle();
      }
      const double e = gref::rel_error(out.p, ref.p + size_t(sh.begin) * s.N, size_t(sh.size) * s.N);
      EXPECT_LT(e, kTol) << "gemm_rs " << s.M << "x" << s.N << "x" << s.K << " variant " << variant << " ncomm "
                         << ncomm << " rank " << r;
      wt::settle();
    }
  }
}

TEST(TpGpu, AgGemmMatchesCublasNccl) {
  auto& c = wt::comm();
  const uint64_t seed = wt::job_seed();
  weave::tp::AgGemm ag(c);
  for (const Shape& s : kShapes) {
    for (int cfg = 0; cfg < 15; ++cfg) {  // tuner, then (variant, num_comm_sms) fixed; 7..14: variants 2..9
      int ncomm = cfg == 0 ? -1 : std::array<int, 3>{1, 4, 16}[(cfg - 1) % 3], variant = cfg == 0 ? -1 : (cfg - 1) / 3;
      if (cfg >= 7) ncomm = 0, variant = cfg - 5;
      for (int in_place = 0; in_place < 2; ++in_place) {
        const int W = c.world(), r = c.rank();
        const auto sh = shard(s.M, W, r);
        Dev Ash(size_t(sh.size) * s.K), B(size_t(s.K) * s.N), C(size_t(s.M) * s.N), refg(size_t(s.M) * s.K),
            refc(size_t(s.M) * s.N);
        Sym G(size_t(s.M) * s.K);
        gref::poison(G.p, size_t(s.M) * s.K);
        gref::fill_uniform(Ash.p, Ash.n, seed_for(seed, 3));
        gref::fill_uniform(B.p, B.n, seed_for(seed, 4));
        bf16* src = Ash.p;
        if (in_place) {
          src = G.p + size_t(sh.begin) * s.K;
          WEAVE_CUDA_CHECK(cudaMemcpy(src, Ash.p, Ash.n * sizeof(bf16), cudaMemcpyDeviceToDevice));
        }
        wt::settle();
        gref::poison(C.p, C.n);
        weave::tp::Options o;
        o.num_comm_sms = ncomm;
        o.variant = variant;
        const auto li = ag.run(src, G.p, B.p, C.p, s.M, s.N, s.K, o);
        wt::settle();
        WEAVE_NCCL_CHECK(ncclGroupStart());
        for (int q = 0; q < W; ++q) {
          const auto sq = shard(s.M, W, q);
          WEAVE_NCCL_CHECK(ncclBroadcast(Ash.p, refg.p + size_t(sq.begin) * s.K, size_t(sq.size) * s.K, ncclBfloat16,
                                            q, nccl().get(), nullptr));
        }
        WEAVE_NCCL_CHECK(ncclGroupEnd());
        blas().run(refg.p, B.p, refc.p, s.M, s.N, s.K, weave::gemm::BLayout::KN, false, nullptr);
        const double eg = gref::rel_error(G.p, refg.p, refg.n), ec = gref::rel_error(C.p, refc.p, refc.n);
        EXPECT_EQ(eg, 0.0) << "gathered A " << s.M << "x" << s.K << " ncomm " << ncomm << " in_place " << in_place;
        EXPECT_LT(ec, kTol) << "ag_gemm " << s.M << "x" << s.N << "x" << s.K << " ncomm " << ncomm << " (ran "
                            << li.num_comm_sms << ", variant " << li.variant << ") in_place " << in_place;
        wt::settle();
      }
    }
  }
}

TEST(TpGpu, GemmArMatchesCublasNccl) {
  auto& c = wt::comm();
  const uint64_t seed = wt::job_seed();
  weave::tp::GemmAR ar(c);
  for (const Shape& s : kShapes) {
    for (int ncomm : {-1, 0, 1, 8, 33}) {  // 0: the intra-SM variant
      Dev A(size_t(s.M) * s.K), B(size_t(s.K) * s.N), ref(size_t(s.M) * s.N);
      Sym out(size_t(s.M) * s.N);
      gref::fill_uniform(A.p, A.n, seed_for(seed, 5));
      gref::fill_uniform(B.p, B.n, seed_for(seed, 6));
      gref::poison(out.p, ref.n);
      wt::settle();
      weave::tp::Options o;
      o.num_comm_sms = ncomm;
      ar.run(A.p, B.p, out.p, s.M, s.N, s.K, o);
      wt::settle();
      blas().run(A.p, B.p, ref.p, s.M, s.N, s.K, weave::gemm::BLayout::KN, false, nullptr);
      ref_all_reduce(ref.p, ref.n);
      const double e = gref::rel_error(out.p, ref.p, ref.n);
      EXPECT_LT(e, kTol) << "gemm_ar " << s.M << "x" << s.N << "x" << s.K << " ncomm " << ncomm;
      wt::settle();
    }
  }
}

// 200 launches of each kernel back to back, inputs refilled between launches on the stream, each
// result checked against cuBLAS + NCCL on the device (errors summed; one host check at the end).
TEST(TpGpu, TwoHundredLaunchesChangingInputs) {
  auto& c = wt::comm();
  const uint64_t seed = wt::job_seed();
  const int M = 1000, N = 512, K = 256, W = c.world(), r = c.rank();
  const auto sh = shard(M, W, r);
  Dev A(size_t(M) * K), B(size_t(K) * N), ref(size_t(M) * N), Ash(size_t(sh.size) * K), refg(size_t(M) * K);
  Sym out(size_t(M) * N), G(size_t(M) * K);
  double* sums = nullptr;
  WEAVE_CUDA_CHECK(cudaMalloc(&sums, 3 * 3 * sizeof(double)));
  WEAVE_CUDA_CHECK(cudaMemset(sums, 0, 9 * sizeof(double)));
  weave::tp::GemmRS rs(c);
  weave::tp::AgGemm ag(c);
  weave::tp::GemmAR ar(c);
  weave::tp::Options o4;
  o4.num_comm_sms = 4;
  for (int it = 0; it < 200; ++it) {
    gref::fill_uniform(A.p, A.n, seed_for(seed, 100 + it));
    gref::fill_uniform(B.p, B.n, seed_for(seed, 1000 + it));
    gref::fill_uniform(Ash.p, Ash.n, seed_for(seed, 5000 + it));
    // gemm_rs
    weave::tp::Options ors;
    ors.variant = it % 6;  // every variant, alternating on the same output (2: 8 communicator SMs)
    rs.run(A.p, B.p, out.p, M, N, K, ors);
    blas().run(A.p, B.p, ref.p, M, N, K, weave::gemm::BLayout::KN, false, nullptr);
    ref_all_reduce(ref.p, ref.n);
    gref::error_kernel<<<64, 256>>>(out.p, ref.p + size_t(sh.begin) * N, size_t(sh.size) * N, sums);
    // ag_gemm (C into `ref`'s twin: reuse out as C is fine, it is only local here)
    weave::tp::Options oa = o4;
    oa.variant = it % 10;  // every variant (2..9: no communicator SM; 7 and 8 the copy engine, 9 all_gather)
    if (oa.variant >= 2) oa.num_comm_sms = 0;
    ag.run(Ash.p, G.p, B.p, out.p, M, N, K, oa);
    WEAVE_NCCL_CHECK(ncclGroupStart());
    for (int q = 0; q < W; ++q) {
      const auto sq = shard(M, W, q);
      WEAVE_NCCL_CHECK(ncclBroadcast(Ash.p, refg.p + size_t(sq.begin) * K, size_t(sq.size) * K, ncclBfloat16, q,
                                        nccl().get(), nullptr));
    }
    WEAVE_NCCL_CHECK(ncclGroupEnd());
    blas().run(refg.p, B.p, ref.p, M, N, K, weave::gemm::BLayout::KN, false, nullptr);
    gref::error_kernel<<<64, 256>>>(out.p, ref.p, ref.n, sums + 3);
    // gemm_ar
    weave::tp::Options or_ = o4;
    if (it % 2) or_.num_comm_sms = 0;  // both variants (odd: intra-SM)
    ar.run(A.p, B.p, out.p, M, N, K, or_);
    blas().run(A.p, B.p, ref.p, M, N, K, weave::gemm::BLayout::KN, false, nullptr);
    ref_all_reduce(ref.p, ref.n);
    gref::error_kernel<<<64, 256>>>(out.p, ref.p, ref.n, sums + 6);
  }
  wt::settle();
  double h[9];
  WEAVE_CUDA_CHECK(cudaMemcpy(h, sums, sizeof h, cudaMemcpyDeviceToHost));
  cudaFree(sums);
  const char* names[3] = {"gemm_rs", "ag_gemm", "gemm_ar"};
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(h[3 * k + 2], 0.0) << names[k] << ": non-finite outputs (unwritten elements)";
    EXPECT_LT(std::sqrt(h[3 * k] / h[3 * k + 1]), kTol) << names[k] << " over 200 launches";
  }
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
      EXPECT_NE(m.find("differs across ranks"), std::string::npos) << m;
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

// A call on a stream that is capturing a CUDA graph is rejected on every rank before anything
// is enqueued (a replay would reuse the call's signal rounds), for every TP kernel.
TEST(TpGpu, GraphCaptureRejected) {
  auto& c = wt::comm();
  const int M = 512, K = 256, N = 512;
  Dev A(size_t(M) * K), B(size_t(K) * N), C(size_t(M) * N);
  Sym G(size_t(M) * K), out(size_t(M) * N);
  weave::tp::GemmRS rs(c);
  weave::tp::AgGemm ag(c);
  weave::tp::GemmAR ar(c);
  weave::tp::Options o;
  o.num_comm_sms = 4;
  o.variant = 0;
  cudaStream_t st;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const auto sh = shard(M, c.world(), c.rank());
  wt::expect_capture_rejected(st, "gemm_rs", [&] { rs.run(A.p, B.p, out.p, M, N, K, o, st); });
  wt::expect_capture_rejected(st, "ag_gemm", [&] { ag.run(G.p + size_t(sh.begin) * K, G.p, B.p, C.p, M, N, K, o, st); });
  wt::expect_capture_rejected(st, "gemm_ar", [&] { ar.run(A.p, B.p, out.p, M, N, K, o, st); });
  // The objects still work afterwards (nothing was enqueued, no round was taken).
  gref::fill_uniform(A.p, A.n, 7);
  gref::fill_uniform(B.p, B.n, 8);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  ar.run(A.p, B.p, out.p, M, N, K, o, st);
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
  wt::settle();
}

// One object called alternately on two streams with no synchronisation between the calls: each
// call must wait for the object's previous one (its gathered buffer / counters serve one call at
// a time), so every call's output matches its own reference. Without the ordering the second
// stream's kernel overwrites the gathered A (or the counters) under the first's.
TEST(TpGpu, OneObjectOnTwoStreams) {
  auto& c = wt::comm();
  const uint64_t seed = wt::job_seed();
  const int M = 1000, N = 264, K = 512, W = c.world(), r = c.rank(), calls = 6;
  const auto sh = shard(M, W, r);
  weave::tp::AgGemm ag(c);
  weave::tp::GemmAR ar(c);
  Sym G(size_t(M) * K), out0(size_t(M) * N), out1(size_t(M) * N);
  Dev B(size_t(K) * N), refg(size_t(M) * K), refc(size_t(M) * N);
  std::vector<std::unique_ptr<Dev>> ash, cs;
  for (int i = 0; i < calls; ++i) {
    ash.push_back(std::make_unique<Dev>(size_t(sh.size) * K));
    cs.push_back(std::make_unique<Dev>(size_t(M) * N));
    gref::fill_uniform(ash[i]->p, ash[i]->n, seed_for(seed, 300 + i));
    gref::poison(cs[i]->p, cs[i]->n);
  }
  gref::fill_uniform(B.p, B.n, seed_for(seed, 299));
  cudaStream_t st[2];
  for (auto& x : st) WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  wt::settle();
  for (int v : {0, 2, 7, 8, 9}) {  // communicator push, aux-warp push, copy engine, copy engine + GEMM per
                                    // shard, all_gather + GEMM
    weave::tp::Options o;
    o.variant = v;
    o.num_comm_sms = v == 0 ? 4 : 0;
    for (int i = 0; i < calls; ++i) ag.run(ash[i]->p, G.p, B.p, cs[i]->p, M, N, K, o, st[i % 2]);
    for (auto& x : st) WEAVE_CUDA_CHECK(cudaStreamSynchronize(x));
    wt::settle();
    for (int i = 0; i < calls; ++i) {
      WEAVE_NCCL_CHECK(ncclGroupStart());
      for (int q = 0; q < W; ++q) {
        const auto sq = shard(M, W, q);
        WEAVE_NCCL_CHECK(ncclBroadcast(ash[i]->p, refg.p + size_t(sq.begin) * K, size_t(sq.size) * K, ncclBfloat16, q,
                                       nccl().get(), nullptr));
      }
      WEAVE_NCCL_CHECK(ncclGroupEnd());
      blas().run(refg.p, B.p, refc.p, M, N, K, weave::gemm::BLayout::KN, false, nullptr);
      EXPECT_LT(gref::rel_error(cs[i]->p, refc.p, refc.n), kTol) << "ag_gemm v" << v << " call " << i;
      gref::poison(cs[i]->p, cs[i]->n);
    }
    wt::settle();
  }
  // gemm_ar: the same, alternating two inputs and two outputs.
  Dev A0(size_t(M) * K), A1(size_t(M) * K), ref0(size_t(M) * N), ref1(size_t(M) * N);
  gref::fill_uniform(A0.p, A0.n, seed_for(seed, 400));
  gref::fill_uniform(A1.p, A1.n, seed_for(seed, 401));
  gref::poison(out0.p, size_t(M) * N);
  gref::poison(out1.p, size_t(M) * N);
  wt::settle();
  weave::tp::Options o;
  o.num_comm_sms = 0;
  for (int i = 0; i < calls; ++i) ar.run(i % 2 ? A1.p : A0.p, B.p, i % 2 ? out1.p : out0.p, M, N, K, o, st[i % 2]);
  for (auto& x : st) WEAVE_CUDA_CHECK(cudaStreamSynchronize(x));
  wt::settle();
  blas().run(A0.p, B.p, ref0.p, M, N, K, weave::gemm::BLayout::KN, false, nullptr);
  blas().run(A1.p, B.p, ref1.p, M, N, K, weave::gemm::BLayout::KN, false, nullptr);
  ref_all_reduce(ref0.p, ref0.n);
  ref_all_reduce(ref1.p, ref1.n);
  EXPECT_LT(gref::rel_error(out0.p, ref0.p, ref0.n), kTol) << "gemm_ar, stream 0";
  EXPECT_LT(gref::rel_error(out1.p, ref1.p, ref1.n), kTol) << "gemm_ar, stream 1";
  // gemm_rs, owner first, one GEMM per owner, the copy engine (whose steps signal across ranks
  // from the streams) and the chain kernel: the same alternation, each output its own reference's rows.
  weave::tp::GemmRS rs(c);
  for (int v : {0, weave::tp::kRsShardGemms, weave::tp::kRsCopyEngine, weave::tp::kRsChain}) {
    gref::poison(out0.p, size_t(M) * N);
    gref::poison(out1.p, size_t(M) * N);
    wt::settle();
    weave::tp::Options orv;
    orv.variant = v;
    for (int i = 0; i < calls; ++i) rs.run(i % 2 ? A1.p : A0.p, B.p, i % 2 ? out1.p : out0.p, M, N, K, orv, st[i % 2]);
    for (auto& x : st) WEAVE_CUDA_CHECK(cudaStreamSynchronize(x));
    wt::settle();
    EXPECT_LT(gref::rel_error(out0.p, ref0.p + size_t(sh.begin) * N, size_t(sh.size) * N), kTol)
        << "gemm_rs v" << v << ", stream 0";
    EXPECT_LT(gref::rel_error(out1.p, ref1.p + size_t(sh.begin) * N, size_t(sh.size) * N), kTol)
        << "gemm_rs v" << v << ", stream 1";
  }
  for (auto& x : st) WEAVE_CUDA_CHECK(cudaStreamDestroy(x));
  wt::settle();
}
