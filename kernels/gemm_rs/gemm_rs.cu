// Host side of GEMM + reduce-scatter: validation, the cross-rank shape check, maps, signals,
// the tuner (variant 0 owner first, 1 zero first).
#include "gemm_rs/gemm_rs.hpp"
#include "gemm_rs/gemm_rs_kernel.cuh"
#include "weave/runtime/tuner.hpp"

namespace weave::tp {

struct GemmRS::Impl {
  runtime::Communicator& c;
  ShapeSignals sig{"tp.gemm_rs"};
  explicit Impl(runtime::Communicator& cc) : c(cc) {}
};

GemmRS::GemmRS(runtime::Communicator& c) : impl_(std::make_unique<Impl>(c)) {}
GemmRS::~GemmRS() = default;

LaunchInfo GemmRS::launch(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, int variant, cudaStream_t s) {
  Impl& m = *impl_;
  const int W = m.c.world(), rank = m.c.rank();
  RsGlobals g{};
  // Variant 1 runs W owners' tiles side by side: group_m / W rows of each keeps the A panels
  // resident in L2 at the single-owner footprint.
  const int gm = default_group_m(K);
  g.L = make_layout(M, N, W, variant == 1 ? (gm / W > 1 ? gm / W : 1) : gm);
  const runtime::PeerPtrs pp = m.c.peers(out, out_elems(M, N, W) * sizeof(bf16));
  g.a = map_128x64(A, M, K, K);
  g.b = map_b_kn(B, K, N);
  for (int q = 0; q < W; ++q) g.out[q] = map_128x64(static_cast<const bf16*>(pp[q]), shard(M, W, q).size, N, N);
  g.M = M, g.N = N, g.K = K;
  g.tiles_m = g.L.row_tiles(), g.tiles_n = g.L.tiles_n, g.group_m = g.L.group_m, g.accumulate = 0;
  g.rank = rank;
  g.variant = variant;
  g.own = out;
  g.own_elems = static_cast<long long>(shard(M, W, rank).size) * N;
  // One set per (shape, variant): each launch's expectations are round * per_round of its variant.
  const std::vector<int> counts = {rs_ready_count(g.L), W, 1};
  ShapeSignals& sg = m.sig;
  runtime::SignalSet& rd = sg.get(m.c, {M, N, K, variant}, counts, 0);
  runtime::SignalSet& zr = sg.get(m.c, {M, N, K, variant}, counts, 1);
  runtime::SignalSet& dn = sg.get(m.c, {M, N, K, variant}, counts, 2);
  g.ready = rd.view();
  g.zeroed = zr.view();
  g.done = dn.view();
  g.ready_round = rd.next_round();
  g.zeroed_round = zr.next_round();
  g.done_round = dn.next_round();
  lcsc::Config cfg;
  cfg.num_comm_sms = 0;
  const lcsc::Plan p = aux::launch<RsKernel>(g, cfg, s);
  return {0, p.compute_blocks, false, variant};
}

LaunchInfo GemmRS::run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, const Options& o,
                       cudaStream_t s) {
  Impl& m = *impl_;
  validate("gemm_rs", M, N, K);
  WEAVE_CHECK(A && B && out, "gemm_rs: null pointer");
  WEAVE_CHECK(o.num_comm_sms <= 0, "gemm_rs: the intra-SM kernel uses no communicator SMs (num_comm_sms = ",
              o.num_comm_sms, ")");
  WEAVE_CHECK(o.variant >= -1 && o.variant <= 1, "gemm_rs: variant ", o.variant,
              " is not 0 (owner first) or 1 (zero first)");
  WEAVE_CHECK(reinterpret_cast<uintptr_t>(out) % 16 == 0, "gemm_rs: out must be 16-byte aligned");
  m.c.check_same("gemm_rs shape (M, N, K)", {M, N, K});  // every call: a shared-page compare
  if (o.variant >= 0) return launch(A, B, out, M, N, K, o.variant, s);
  const std::vector<runtime::TuneCandidate> cands = {{0, 0}, {1, 0}};
  const std::string key = runtime::tune_key("gemm_rs", {M, N, K}, m.c.world(), device_key(m.c));
  const runtime::TuneResult r = runtime::Tuner::global().choose(&m.c, key, cands, [&](const runtime::TuneCandidate& t) {
    return time_launches(s, [&] { launch(A, B, out, M, N, K, t.variant, s); });
  });
  LaunchInfo li = launch(A, B, out, M, N, K, r.choice.variant, s);
  li.tuned = true;
  return li;
}

}  // namespace weave::tp
