// Host side of GEMM + reduce-scatter: validation, the cross-rank shape check, maps, signals,
// the tuner (variant 0 owner first, 1 zero first, 2 inter-SM, 3 one GEMM per owner).
#include "gemm/gemm.hpp"
#include "gemm_rs/gemm_rs.hpp"
#include "gemm_rs/gemm_rs_kernel.cuh"
#include "tp_common/signal_wait.cuh"
#include "weave/runtime/tuner.hpp"

namespace weave::tp {


struct GemmRS::Impl {
  runtime::Communicator& c;
  ShapeSignals sig{"tp.gemm_rs"};
  bf16* scratch = nullptr;  // v2: this rank's partials (M x N), symmetric
  size_t scratch_bytes = 0;
  attention::CallOrder order;
  explicit Impl(runtime::Communicator& cc) : c(cc) {}
  ~Impl() {
    if (!scratch) return;
    cudaDeviceSynchronize();  // no launch of ours still writes it (peers' reads ended with our calls)
    c.free(scratch);
  }
  // Collective (every rank picks v2 for the same shapes in the same order).
  bf16* scratch_for(size_t bytes, cudaStream_t s) {
    if (bytes > scratch_bytes) {
      if (scratch) {
        WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
        c.free(scratch);
      }
      scratch = static_cast<bf16*>(c.alloc(bytes));
      scratch_bytes = bytes;
    }
    return scratch;
  }
};

GemmRS::GemmRS(runtime::Communicator& c) : impl_(std::make_unique<Impl>(c)) {}
GemmRS::~GemmRS() = default;

LaunchInfo GemmRS::launch(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, int variant, int ncomm,
                          cudaStream_t s) {
  Impl& m = *impl_;
  m.order.before(s);
  const int W = m.c.world(), rank = m.c.rank();
  if (variant == kRsShardGemms) {
    launch_shard_gemms(A, B, out, M, N, K, s);
    m.order.after(s);
    return {0, m.c.sm_count(), false, variant};
  }
  RsGlobals g{};
  g.L = make_layout(M, N, W, default_group_m(K));
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
  if (variant == 2) {
    bf16* scr = m.scratch_for(size_t(M) * N * sizeof(bf16), s);
    const runtime::PeerPtrs sp = m.c.peers(scr, size_t(M) * N * sizeof(bf16));
    for (int q = 0; q < W; ++q) {
      const Range sq = shard(M, W, q);
      g.scr[q] = static_cast<bf16*>(sp[q]);
      g.sc[q] = map_128x64(scr + size_t(sq.begin) * N, sq.size, N, N);
    }
  }
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
  cfg.num_comm_sms = variant == 2 ? ncomm : 0;
  const lcsc::Plan p = aux::launch<RsKernel>(g, cfg, s);
  m.order.after(s);
  return {cfg.num_comm_sms, p.compute_blocks, false, variant};
}

// Variant 3: plain GEMMs chained across ranks, no fused kernel. Step t = 1..W-1: rank r computes
// the rows of owner q = r - t (mod W) into q's output, stored at t = 1 and added at t >= 2 (the
// GEMM's C += A * B), then tells rank r + 1, whose next step targets the same owner; last, its
// own rows, added to what the W - 1 peers left in its output. Before its first step, rank r waits
// until owner r - 1 entered this call (so that call's output is free to overwrite); the chain
// carries that to the later steps. At W = 2: one GEMM into the peer, one signal each way, one GEMM
// with C += A * B.
void GemmRS::launch_shard_gemms(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, cudaStream_t s) {
  Impl& m = *impl_;
  const int W = m.c.world(), rank = m.c.rank(), next = (rank + 1) % W;
  const runtime::PeerPtrs pp = m.c.peers(out, out_elems(M, N, W) * sizeof(bf16));
  runtime::SignalSet& st = m.sig.get(m.c, {M, N, K, kRsShardGemms}, {2}, 0);  // 0: entered, 1: steps done
  const unsigned long long round = st.next_round();
  const signals sv = st.view();
  auto step = [&](int dst, int index_dst, int index_wait, unsigned long long expected) {
    signal_wait(s, sv, dst, index_dst, index_wait, expected);
  };
  gemm::Options add;
  add.accumulate = true;
  if (W > 1) step(next, 0, 0, round);
  for (int t = 1; t <= W - 1; ++t) {
    const int q = rs_chain_owner(rank, t, W);
    const Range sq = shard(M, W, q);
    if (t >= 2) step(-1, 0, 1, rs_chain_expected(round, t, W));
    gemm::gemm(A + size_t(sq.begin) * K, B, static_cast<bf16*>(pp[q]), sq.size, N, K, gemm::BLayout::KN,
               t == 1 ? gemm::Options{} : add, s);
    step(next, 1, 1, t == W - 1 ? rs_chain_expected(round, W, W) : 0);
  }
  const Range mine = shard(M, W, rank);
  gemm::gemm(A + size_t(mine.begin) * K, B, out, mine.size, N, K, gemm::BLayout::KN, W > 1 ? add : gemm::Options{}, s);
}

LaunchInfo GemmRS::run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, const Options& o,
                       cudaStream_t s) {
  Impl& m = *impl_;
  check_tp_call(m.c, "gemm_rs", M, N, K, o, {{"A", A}, {"B", B}, {"out", out}}, kRsShardGemms,
                "0 (owner first), 1 (zero first), 2 (inter-SM) or 3 (one GEMM per owner)", s, [&] {
                  WEAVE_CHECK(M >= m.c.world(), "gemm_rs: M = ", M, " gives some rank no rows (world ", m.c.world(),
                              ")");
                });
  if (o.variant >= 0 || o.num_comm_sms >= 0) {
    const int v = o.variant >= 0 ? o.variant : o.num_comm_sms > 0 ? 2 : 0;
    const int n = o.num_comm_sms < 0 ? (v == 2 ? 8 : 0) : o.num_comm_sms;
    WEAVE_CHECK((v == 2) == (n > 0), "gemm_rs: variant ", v, " with num_comm_sms = ", n,
                " (the inter-SM variant 2 needs >= 1, variants 0, 1 and 3 use none)");
    return launch(A, B, out, M, N, K, v, n, s);
  }
  std::vector<runtime::TuneCandidate> cands = {{0, 0}, {1, 0}, {kRsShardGemms, 0}};
  const int row_tiles = (shard(M, m.c.world(), 0).size + kBM - 1) / kBM;
  for (int n : {4, 8, 16, 32})
    if (n <= row_tiles * ((N + kBN - 1) / kBN) && n < m.c.sm_count() / 2) cands.push_back({2, n});
  return tuned_launch(m.c, "gemm_rs", o, M, N, K, cands, s, [&](const runtime::TuneCandidate& t) {
    return launch(A, B, out, M, N, K, t.variant, t.num_comm_sms, s);
  });
}

}  // namespace weave::tp
