// The cross-rank agreement of operator calls (Communicator::agree_call), on 2+ ranks with the TP
// kernels, whose checked values (M, N, K, options) can be equal for different operators:
// - a plan's first call is checked with every rank: different operators with equal shapes, and a
//   short buffer on one rank, are rejected on every rank before any launch, and everything is
//   usable afterwards;
// - later calls of agreed plans do not wait for the peers (no host rendezvous per call); a rank
//   that finds a difference or a problem of its own then stops the peers' launched kernels
//   (abort words), so every rank gets an error within seconds, long before the wait timeout
//   (set to 300 s for these tests), and nothing hangs. Each such case kills the CUDA context of
//   every rank, so it is disabled here and runs alone (its own CTest entry, tests/tp/CMakeLists.txt);
// - with debug (CommOptions::debug, WEAVE_DEBUG=1) every call is checked together: a problem
//   after agreed calls is rejected on every rank and the communicator stays usable.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>

#include "../primitives/common.hpp"
#include "ag_gemm/ag_gemm.hpp"
#include "gemm_ar/gemm_ar.hpp"

using weave::tp::bf16;

namespace {

const int kTunerOff = (setenv("WEAVE_TUNER_CACHE", "off", 1), 0);
// Each test has its own M, so that no test's plans were agreed by an earlier one.
constexpr int N = 512, K = 256;

struct Dev {
  bf16* p = nullptr;
  explicit Dev(size_t n) { WEAVE_CUDA_CHECK(cudaMalloc(&p, n * sizeof(bf16))); }
  ~Dev() { cudaFree(p); }
};

// The operands of both kernels at M x N x K on communicator c: ag_gemm's gathered A and gemm_ar's
// output in the heap, the rest ordinary device memory.
struct Operands {
  weave::runtime::Communicator& c;
  const int M;
  Dev a{size_t(M) * K}, b{size_t(K) * N}, out{size_t(M) * N};
  bf16* gathered;
  bf16* reduced;
  Operands(weave::runtime::Communicator& cc, int m)
      : c(cc),
        M(m),
        gathered(static_cast<bf16*>(cc.alloc(size_t(M) * K * sizeof(bf16)))),
        reduced(static_cast<bf16*>(cc.alloc(size_t(M) * N * sizeof(bf16)))) {
    WEAVE_CUDA_CHECK(cudaMemset(a.p, 0, size_t(M) * K * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMemset(b.p, 0, size_t(K) * N * sizeof(bf16)));
  }
  const bf16* shard() const { return gathered + size_t(weave::tp::shard(M, c.world(), c.rank()).begin) * K; }
};

weave::tp::Options fixed() {
  weave::tp::Options o;
  o.num_comm_sms = 4;
  o.variant = 0;
  return o;
}

// Both kernels at one shape with fixed options: checked values that are equal, operators that
// are not.
struct Both {
  Operands x;
  weave::tp::AgGemm ag;
  weave::tp::GemmAR ar;
  Both(weave::runtime::Communicator& c, int M) : x(c, M), ag(c), ar(c) {}
  void run_ag() { ag.run(x.shard(), x.gathered, x.b.p, x.out.p, x.M, N, K, fixed()); }
  void run_ar() { ar.run(x.a.p, x.b.p, x.reduced, x.M, N, K, fixed()); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const weave::Error& e) {
    return e.what();
  }
  return {};
}

bool mentions(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

TEST(CallAgreement, DifferentOperatorsWithEqualShapesRejectedEverywhere) {
  auto& c = wt::comm();
  Both k(c, 512);
  const std::string e = error_of([&] { c.rank() == 0 ? k.run_ag() : k.run_ar(); });
  EXPECT_TRUE(mentions(e, "different operators")) << "rank " << c.rank() << ": '" << e << "'";
  EXPECT_TRUE(mentions(e, "ag_gemm") && mentions(e, "gemm_ar")) << e;
  // Nothing was launched anywhere: the same calls on every rank now run.
  k.run_ar();
  k.run_ag();
  wt::settle();
}

TEST(CallAgreement, ShortBufferRejectedEverywhere) {
  auto& c = wt::comm();
  const int M = 520;
  Both k(c, M);
  Operands& x = k.x;
  weave::tp::GemmAR& ar = k.ar;
  const auto o = fixed();
  Dev short_a(size_t(M) * K - 8);  // one row short by 8 elements, on rank 1 only
  const std::string e = error_of([&] { ar.run(c.rank() == 1 ? short_a.p : x.a.p, x.b.p, x.reduced, M, N, K, o); });
  if (c.rank() == 1) EXPECT_TRUE(mentions(e, "A needs")) << e;
  else EXPECT_TRUE(mentions(e, "rank 1 rejected its arguments")) << e;
  // And a short symmetric output: the heap allocation is checked the same way.
  bf16* small = static_cast<bf16*>(c.alloc(size_t(M - 1) * N * sizeof(bf16)));
  const std::string e2 = error_of([&] { ar.run(x.a.p, x.b.p, small, M, N, K, o); });
  EXPECT_TRUE(mentions(e2, "out needs")) << e2;
  c.free(small);
  ar.run(x.a.p, x.b.p, x.reduced, M, N, K, o);
  wt::settle();
}

TEST(CallAgreement, DebugModeRejectsAProblemAfterAgreedCalls) {
  weave::runtime::CommOptions co;
  co.heap_bytes = size_t(64) << 20;
  co.debug = 1;
  weave::runtime::Communicator c(co);
  const int M = 528;
  Both k(c, M);
  Operands& x = k.x;
  weave::tp::GemmAR& ar = k.ar;
  const auto o = fixed();
  for (int i = 0; i < 3; ++i) ar.run(x.a.p, x.b.p, x.reduced, M, N, K, o);
  const std::string e = error_of([&] { ar.run(c.rank() == 1 ? x.a.p + 1 : x.a.p, x.b.p, x.reduced, M, N, K, o); });
  if (c.rank() == 1) EXPECT_TRUE(mentions(e, "16-byte aligned")) << e;
  else EXPECT_TRUE(mentions(e, "rank 1 rejected its arguments")) << e;
  ar.run(x.a.p, x.b.p, x.reduced, M, N, K, o);
  c.sync();
  c.barrier();
}

// The error a rank gets from a call and the sync after it, and how long that took.
struct Outcome {
  std::string error;
  double seconds;
};
Outcome outcome(const std::function<void()>& call) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of([&] {
    call();
    wt::comm().sync();
  });
  return {e, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

// Alone in its process: ends with every rank's context stopped.
TEST(CallAgreementAbort, DISABLED_DifferentOperatorsAfterAgreedPlans) {
  auto& c = wt::comm();
  Both k(c, 536);
  k.run_ag();
  k.run_ar();
  wt::settle();
  const Outcome r = outcome([&] { c.rank() == 0 ? k.run_ag() : k.run_ar(); });
  EXPECT_TRUE(mentions(r.error, "ag_gemm") && mentions(r.error, "gemm_ar")) << "rank " << c.rank() << ": '" << r.error
                                                                            << "'";
  EXPECT_LT(r.seconds, 60.0) << "stopped by the wait timeout, not by the abort: " << r.error;
}

// Alone in its process: ends with rank 0's context stopped.
TEST(CallAgreementAbort, DISABLED_OwnProblemAfterAgreedPlan) {
  auto& c = wt::comm();
  const int M = 544;
  Both k(c, M);
  Operands& x = k.x;
  weave::tp::GemmAR& ar = k.ar;
  const auto o = fixed();
  ar.run(x.a.p, x.b.p, x.reduced, M, N, K, o);
  wt::settle();
  const Outcome r = outcome([&] { ar.run(c.rank() == 1 ? x.a.p + 1 : x.a.p, x.b.p, x.reduced, M, N, K, o); });
  EXPECT_TRUE(mentions(r.error, "16-byte aligned")) << "rank " << c.rank() << ": '" << r.error << "'";
  if (c.rank() != 1) EXPECT_TRUE(mentions(r.error, "rank 1 rejected")) << r.error;
  EXPECT_LT(r.seconds, 60.0) << "stopped by the wait timeout, not by the abort: " << r.error;
}

}  // namespace
