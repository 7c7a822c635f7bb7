// Host side of GEMM + reduce-scatter: validation, the cross-rank shape check, maps, signals.
#include "gemm_rs/gemm_rs.hpp"
#include "gemm_rs/gemm_rs_kernel.cuh"
#include "weave/lcsc.cuh"

namespace weave::tp {

struct GemmRS::Impl {
  runtime::Communicator& c;
  ShapeSignals sig{"tp.gemm_rs"};
  explicit Impl(runtime::Communicator& cc) : c(cc) {}
};

GemmRS::GemmRS(runtime::Communicator& c) : impl_(std::make_unique<Impl>(c)) {}
GemmRS::~GemmRS() = default;

LaunchInfo GemmRS::run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, const Options& o,
                       cudaStream_t s) {
  Impl& m = *impl_;
  validate("gemm_rs", M, N, K);
  WEAVE_CHECK(A && B && out, "gemm_rs: null pointer");
  WEAVE_CHECK(o.num_comm_sms <= 0, "gemm_rs: the intra-SM kernel uses no communicator SMs (num_comm_sms = ",
              o.num_comm_sms, ")");
  m.c.check_same("gemm_rs shape (M, N, K)", {M, N, K});  // every call: a shared-page compare
  const int W = m.c.world(), rank = m.c.rank();
  RsGlobals g{};
  g.L = make_layout(M, N, W, default_group_m(K));
  const runtime::PeerPtrs pp = m.c.peers(out, out_elems(M, N, W) * sizeof(bf16));
  g.a = map_128x64(A, M, K, K);
  g.b = map_b_kn(B, K, N);
  for (int q = 0; q < W; ++q) g.out[q] = map_128x64(static_cast<const bf16*>(pp[q]), shard(M, W, q).size, N, N);
  g.M = M, g.N = N, g.K = K;
  g.tiles_m = g.L.row_tiles(), g.tiles_n = g.L.tiles_n, g.group_m = g.L.group_m, g.accumulate = 0;
  g.rank = rank;
  const std::vector<int> counts = {rs_ready_count(g.L), 1};
  runtime::SignalSet& rd = m.sig.get(m.c, {M, N, K}, counts, 0);
  runtime::SignalSet& dn = m.sig.get(m.c, {M, N, K}, counts, 1);
  g.ready = rd.view();
  g.done = dn.view();
  g.ready_round = rd.next_round();
  g.done_round = dn.next_round();
  lcsc::Config cfg;
  cfg.num_comm_sms = 0;
  const lcsc::Plan p = lcsc::launch<RsKernel>(g, cfg, s);
  return {0, p.compute_blocks, false};
}

}  // namespace weave::tp
