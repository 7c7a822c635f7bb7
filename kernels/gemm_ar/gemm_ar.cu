// Host side of GEMM + all-reduce: validation, shape check, signals, tuner.
#include "gemm_ar/gemm_ar.hpp"
#include "gemm_ar/gemm_ar_kernel.cuh"
#include "weave/lcsc.cuh"
#include "weave/runtime/tuner.hpp"

namespace weave::tp {

struct GemmAR::Impl {
  runtime::Communicator& c;
  ShapeSignals sig{"tp.gemm_ar"};
  explicit Impl(runtime::Communicator& cc) : c(cc) {}
};

GemmAR::GemmAR(runtime::Communicator& c) : impl_(std::make_unique<Impl>(c)) {}
GemmAR::~GemmAR() = default;

std::vector<int> GemmAR::comm_sms_candidates(int M, int N, int W, int sm_count) {
  const int owned = (make_ar_layout(M, N, W, 8).work() + W - 1) / W;
  std::vector<int> v;
  for (int n : {4, 8, 16, 24, 32, 48})
    if (n <= owned && n < sm_count / 2) v.push_back(n);
  if (v.empty()) v.push_back(1);
  return v;
}

LaunchInfo GemmAR::launch(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, int ncomm, cudaStream_t s) {
  Impl& m = *impl_;
  const int W = m.c.world(), rank = m.c.rank();
  ArGlobals g{};
  g.L = make_ar_layout(M, N, W, default_group_m(K));
  const runtime::PeerPtrs pp = m.c.peers(out, size_t(M) * N * sizeof(bf16));
  for (int q = 0; q < W; ++q) g.buf[q] = static_cast<bf16*>(pp[q]);
  g.a = map_128x64(A, M, K, K);
  g.b = map_b_kn(B, K, N);
  g.c = map_128x64(out, M, N, N);
  g.M = M, g.N = N, g.K = K;
  g.tiles_m = g.L.tiles_m, g.tiles_n = g.L.tiles_n, g.group_m = g.L.group_m, g.accumulate = 0;
  g.rank = rank;
  const std::vector<int> counts = {g.L.work(), 1};
  runtime::SignalSet& rd = m.sig.get(m.c, {M, N, K}, counts, 0);
  runtime::SignalSet& dn = m.sig.get(m.c, {M, N, K}, counts, 1);
  g.ready = rd.view();
  g.done = dn.view();
  g.ready_round = rd.next_round();
  g.done_round = dn.next_round();
  lcsc::Config cfg;
  cfg.num_comm_sms = ncomm;
  const lcsc::Plan p = lcsc::launch<ArKernel>(g, cfg, s);
  return {ncomm, p.compute_blocks, false};
}

LaunchInfo GemmAR::run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, const Options& o,
                       cudaStream_t s) {
  Impl& m = *impl_;
  validate("gemm_ar", M, N, K);
  WEAVE_CHECK(A && B && out, "gemm_ar: null pointer");
  m.c.check_same("gemm_ar shape (M, N, K)", {M, N, K});  // every call: a shared-page compare
  if (o.num_comm_sms >= 0) {
    WEAVE_CHECK(o.num_comm_sms >= 1, "gemm_ar: the inter-SM kernel needs num_comm_sms >= 1 (got ", o.num_comm_sms,
                ")");
    return launch(A, B, out, M, N, K, o.num_comm_sms, s);
  }
  std::vector<runtime::TuneCandidate> cands;
  for (int n : comm_sms_candidates(M, N, m.c.world(), m.c.sm_count())) cands.push_back({0, n});
  const std::string key = runtime::tune_key("gemm_ar", {M, N, K}, m.c.world(), device_key(m.c));
  const runtime::TuneResult r = runtime::Tuner::global().choose(&m.c, key, cands, [&](const runtime::TuneCandidate& t) {
    return time_launches(s, [&] { launch(A, B, out, M, N, K, t.num_comm_sms, s); });
  });
  LaunchInfo li = launch(A, B, out, M, N, K, r.choice.num_comm_sms, s);
  li.tuned = true;
  return li;
}

}  // namespace weave::tp
