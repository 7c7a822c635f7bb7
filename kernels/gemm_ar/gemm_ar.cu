// Host side of GEMM + all-reduce: validation, shape check, signals, tuner.
#include "gemm_ar/gemm_ar.hpp"
#include "gemm_ar/gemm_ar_kernel.cuh"
#include "weave/lcsc.cuh"
#include "weave/runtime/tuner.hpp"

namespace weave::tp {

struct GemmAR::Impl {
  runtime::Communicator& c;
  runtime::ShapeSignals sig{"tp.gemm_ar"};
  runtime::ShapeSignals sig_intra{"tp.gemm_ar_intra"};
  runtime::ShapeSignals sig_adaptive{"tp.gemm_ar_adaptive"};  // ready, done, the SM split's ledger
  runtime::CallOrder order;
  std::set<std::string> capture_ready;  // tuned_launch's (every variant is capturable: unused)
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

LaunchInfo GemmAR::launch(const bf16* A, const bf16* B, gemm::BLayout bl, bf16* out, int M, int N, int K, int ncomm,
                          ArVariant variant, cudaStream_t s) {
  Impl& m = *impl_;
  const bool cap = runtime::capturing(s);
  m.order.before(s, cap);
  const int W = m.c.world(), rank = m.c.rank();
  ArIntraGlobals g{};
  g.L = make_ar_layout(M, N, W, default_group_m(K));
  const runtime::PeerPtrs pp = m.c.peers(out, size_t(M) * N * sizeof(bf16));
  for (int q = 0; q < W; ++q) g.buf[q] = static_cast<bf16*>(pp[q]);
  g.a = map_128x64(A, M, K, K);
  g.b = map_b(B, K, N, bl);
  g.c = map_128x64(out, M, N, N);
  g.M = M, g.N = N, g.K = K;
  g.tiles_m = g.L.tiles_m, g.tiles_n = g.L.tiles_n, g.group_m = g.L.group_m, g.accumulate = 0;
  g.rank = rank;
  const bool adaptive = variant == ArVariant::Adaptive;
  runtime::ShapeSignals& sig = variant == ArVariant::IntraSm ? m.sig_intra : adaptive ? m.sig_adaptive : m.sig;
  std::vector<int> counts = {variant == ArVariant::IntraSm ? ar_intra_ready_count(g.L) : g.L.work(), 1};
  if (adaptive) counts.push_back(static_cast<int>(sizeof(sm_split::Ledger) / sizeof(unsigned long long)));
  runtime::SignalSet& rd = sig.get(m.c, {M, N, K}, counts, 0, cap);
  runtime::SignalSet& dn = sig.get(m.c, {M, N, K}, counts, 1, cap);
  g.ready = rd.view();
  g.done = dn.view();
  g.ready_round = rd.next_round(s, cap);
  g.done_round = dn.next_round(s, cap);
  lcsc::Config cfg;
  cfg.num_comm_sms = ncomm;
  lcsc::Plan p;
  if (variant == ArVariant::IntraSm) {
    for (int q = 0; q < W; ++q) g.out[q] = map_128x64(g.buf[q], M, N, N);
    p = bl == gemm::BLayout::NK ? lcsc::launch<ArIntraKernelNK>(g, cfg, s) : lcsc::launch<ArIntraKernel>(g, cfg, s);
  } else if (adaptive) {
    ArAdaptiveGlobals ga{};
    static_cast<ArGlobals&>(ga) = g;
    const AdaptivePriors pr = adaptive_priors(K, 2 * (W - 1));  // reads W - 1 peer tiles, writes W - 1
    ga.set_split(reinterpret_cast<sm_split::Ledger*>(sig.get(m.c, {M, N, K}, counts, 2, cap).view().ptr[rank]),
                 pr.compute, pr.comm);
    cfg.balance_waves = false;  // every SM: the blocks beyond the tiles' waves reduce
    p = bl == gemm::BLayout::NK ? lcsc::launch<ArAdaptiveKernelNK>(ga, cfg, s)
                                : lcsc::launch<ArAdaptiveKernel>(ga, cfg, s);
  } else {
    p = bl == gemm::BLayout::NK ? lcsc::launch<ArKernelNK>(g, cfg, s) : lcsc::launch<ArKernel>(g, cfg, s);
  }
  m.order.after(s, cap);
  return {ncomm, p.compute_blocks, false, to_int(variant)};
}

AdaptiveStats GemmAR::adaptive_stats(int M, int N, int K) const {
  const runtime::SignalSet* set = impl_->sig_adaptive.find({M, N, K}, 2);
  if (set == nullptr) return {};
  return read_adaptive_stats(set->view().ptr[impl_->c.rank()]);
}

LaunchInfo GemmAR::run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, const Options& o,
                       cudaStream_t s) {
  Impl& m = *impl_;
  check_tp_call(m.c, "gemm_ar", M, N, K, o, {{"A", A, bf16_bytes(M, K)}, {"B", B, bf16_bytes(K, N)}, {"out", out, bf16_bytes(M, N), true}}, kArVariants - 1,
                "0 (inter-SM, communicator SMs reduce), 1 (intra-SM, storers reduce-add) or 2 (adaptive split)", s, [] {});
  if (o.num_comm_sms >= 0) {
    const ArVariant v = o.variant >= 0 ? static_cast<ArVariant>(o.variant)
                        : o.num_comm_sms == 0 ? ArVariant::IntraSm
                                              : ArVariant::InterSm;
    WEAVE_CHECK((v == ArVariant::InterSm) == (o.num_comm_sms > 0), "gemm_ar: variant ", to_int(v), " (",
                variant_name(v), ") with num_comm_sms = ", o.num_comm_sms,
                " (the inter-SM variant 0 needs >= 1; the intra-SM variant 1 and the adaptive split 2 use 0)");
    return launch(A, B, o.b, out, M, N, K, o.num_comm_sms, v, s);
  }
  std::vector<runtime::TuneCandidate> cands;
  const auto allowed = [&](ArVariant v) { return o.variant < 0 || o.variant == to_int(v); };
  // The adaptive split only when asked for by name: not measured on two GPUs yet (README).
  if (o.variant == to_int(ArVariant::Adaptive)) cands.push_back({to_int(ArVariant::Adaptive), 0});
  if (allowed(ArVariant::IntraSm)) cands.push_back({to_int(ArVariant::IntraSm), 0});
  if (allowed(ArVariant::InterSm))
    for (int n : comm_sms_candidates(M, N, m.c.world(), m.c.sm_count()))
      cands.push_back({to_int(ArVariant::InterSm), n});
  return tuned_launch(m.c, "gemm_ar", o, M, N, K, cands, s, [](int v) { return capturable(static_cast<ArVariant>(v)); },
                      m.capture_ready, [&](const runtime::TuneCandidate& t) {
    return launch(A, B, o.b, out, M, N, K, t.num_comm_sms, static_cast<ArVariant>(t.variant), s);
  });
}

}  // namespace weave::tp
