// Host side of GEMM + reduce-scatter: validation, the cross-rank shape check, maps, signals,
// the tuner (RsVariant, tp_common/variants.hpp: 0 OwnerFirst, 1 ZeroFirst, 2 InterSm,
// 3 ShardGemms (one GEMM per owner), 4 CopyEngine, 5 Chain (3's chain as one kernel)).
#include <utility>

#include "gemm/gemm.hpp"
#include "gemm_rs/gemm_rs.hpp"
#include "gemm_rs/gemm_rs_kernel.cuh"
#include "tp_common/copy_engine.hpp"
#include "tp_common/plain_gemm.hpp"
#include "tp_common/reduce_tile.cuh"
#include "tp_common/signal_wait.cuh"
#include "weave/runtime/tuner.hpp"

namespace weave::tp {

namespace {
// Variant 4's sum: out (rows x N) = sources in rank order (one of them `out` itself), rows split
// over the blocks.
struct SumArgs {
  __nv_bfloat16* src[kMaxWorld];
  __nv_bfloat16* dst[1];
  int nsrc, rows, rows_per_block, ncv;
  long long ld;
};
__global__ void __launch_bounds__(256) rs_sum_kernel(const __grid_constant__ SumArgs a) {
  const int r0 = blockIdx.x * a.rows_per_block;
  const int nr = a.rows - r0 < a.rows_per_block ? a.rows - r0 : a.rows_per_block;
  if (nr > 0) reduce_tile_rows<kMaxWorld, 2>(a.src, a.nsrc, r0 * a.ld, a.dst, 1, r0 * a.ld, nr, a.ncv, a.ld,
                                                threadIdx.x, blockDim.x);
}
}  // namespace


struct GemmRS::Impl {
  runtime::Communicator& c;
  runtime::ShapeSignals sig{"tp.gemm_rs"};
  std::set<std::string> capture_ready;  // tuned_launch's
  bf16* scratch = nullptr;  // v2: this rank's partials (M x N), symmetric
  size_t scratch_bytes = 0;
  runtime::CallOrder order;
  // v4: partials for the peers (local), the peers' partials for this rank (symmetric, one slot
  // per peer), the copy engine.
  bf16* send = nullptr;
  bf16* recv = nullptr;
  size_t recv_bytes = 0;  // `send` has the same size
  CopyEngine ce;
  const bool ce_ok;
  explicit Impl(runtime::Communicator& cc) : c(cc), ce_ok(CopyEngine::supported(cc.device())) {}
  ~Impl() {
    if (scratch || recv || send) cudaDeviceSynchronize();  // no launch or copy of ours still uses them
    if (scratch) c.free(scratch);
    if (recv) c.free(recv);
    if (send) cudaFree(send);
  }
  // v4's heap bytes for this shape: W - 1 slots of the largest shard.
  static size_t recv_need(int M, int N, int W) { return size_t(W - 1) * shard(M, W, 0).size * N * sizeof(bf16); }
  bool recv_fits(int M, int N) const {
    const size_t need = recv_need(M, N, c.world());
    return need <= recv_bytes || c.heap_fits(need);
  }
  // Collective (every rank takes v4 for the same shapes in the same order).
  void v4_buffers(int M, int N, cudaStream_t s) {
    const size_t need = recv_need(M, N, c.world());
    if (need > recv_bytes) {
      WEAVE_CUDA_CHECK(cudaDeviceSynchronize());  // the caller's and the copy engine's streams
      c.barrier();                                // no peer still copies into the old slots
      // Each pointer is cleared as it is freed, so that an allocation that throws leaves no
      // freed buffer behind for the next call (or the destructor) to use or free again.
      if (recv) c.free(std::exchange(recv, nullptr));
      recv_bytes = 0;
      if (send) WEAVE_CUDA_CHECK(cudaFree(std::exchange(send, nullptr)));
      recv = static_cast<bf16*>(c.alloc(need));
      WEAVE_CUDA_CHECK(cudaMalloc(&send, need));
      recv_bytes = need;
    }
  }
  // Collective (every rank picks v2 for the same shapes in the same order).
  bf16* scratch_for(size_t bytes, cudaStream_t s, bool capturing) {
    if (bytes > scratch_bytes) {
      if (capturing)
        throw runtime::NotPrepared(detail::concat("gemm_rs: variant 2's scratch must grow to ", bytes,
                                                  " bytes, which a CUDA graph capture cannot do; make one eager call of "
                                                  "this shape first"));
      if (scratch) {  // forgotten as it is freed (an allocation that throws leaves no freed buffer)
        WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
        c.free(std::exchange(scratch, nullptr));
      }
      scratch_bytes = 0;
      scratch = static_cast<bf16*>(c.alloc(bytes));
      scratch_bytes = bytes;
    }
    return scratch;
  }
};

GemmRS::GemmRS(runtime::Communicator& c) : impl_(std::make_unique<Impl>(c)) {}
GemmRS::~GemmRS() = default;

LaunchInfo GemmRS::launch(const Inputs& in, bf16* out, int M, int N, int K, RsVariant variant, int ncomm,
                          cudaStream_t s) {
  Impl& m = *impl_;
  const bool cap = runtime::capturing(s);
  WEAVE_CHECK(!cap || capturable(variant), "gemm_rs: variant ", to_int(variant), " (", variant_name(variant),
              ") cannot be captured in a CUDA graph (", capture_rule(), ")");
  m.order.before(s, cap);
  const int W = m.c.world(), rank = m.c.rank();
  if (variant == RsVariant::CopyEngine) {
    launch_copy_engine(in, out, M, N, K, s);
    m.order.after(s, cap);
    return {0, m.c.sm_count(), false, to_int(variant)};
  }
  if (variant == RsVariant::ShardGemms) {
    launch_shard_gemms(in, out, M, N, K, s);
    m.order.after(s, cap);
    return {0, m.c.sm_count(), false, to_int(variant)};
  }
  const Layout L = make_layout(M, N, W, default_group_m(K));
  const runtime::PeerPtrs pp = m.c.peers(out, out_elems(M, N, W) * sizeof(bf16));
  const bool adaptive = variant == RsVariant::Adaptive;
  bf16* scr = variant == RsVariant::InterSm || adaptive ? m.scratch_for(size_t(M) * N * sizeof(bf16), s, cap) : nullptr;
  // One set per (shape, variant): each launch's expectations are round * per_round of its variant;
  // the adaptive split's ledger is a fourth.
  std::vector<int> counts = {rs_ready_count(L), W, 1};
  if (adaptive) counts.push_back(static_cast<int>(sizeof(sm_split::Ledger) / sizeof(unsigned long long)));
  runtime::ShapeSignals& sg = m.sig;
  runtime::SignalSet& rd = sg.get(m.c, {M, N, K, to_int(variant)}, counts, 0, cap);
  runtime::SignalSet& zr = sg.get(m.c, {M, N, K, to_int(variant)}, counts, 1, cap);
  runtime::SignalSet& dn = sg.get(m.c, {M, N, K, to_int(variant)}, counts, 2, cap);
  const Round ready_round = rd.next_round(s, cap), zeroed_round = zr.next_round(s, cap),
              done_round = dn.next_round(s, cap);
  // The globals both input types share (the GEMM's part differs: fp8 adds the scales).
  auto fill = [&](auto& g) {
    g.L = L;
    g.a = in.fp8 ? map_fp8(in.a, M, K, kBM) : map_128x64(static_cast<const bf16*>(in.a), M, K, K);
    g.b = in.fp8 ? map_fp8(in.b, N, K, kBN) : map_b(static_cast<const bf16*>(in.b), K, N, in.bl);
    for (int q = 0; q < W; ++q) g.out[q] = map_128x64(static_cast<const bf16*>(pp[q]), shard(M, W, q).size, N, N);
    g.M = M, g.N = N, g.K = K;
    g.tiles_m = L.row_tiles(), g.tiles_n = L.tiles_n, g.group_m = L.group_m, g.accumulate = 0;
    g.rank = rank;
    g.variant = to_int(adaptive ? RsVariant::InterSm : variant);  // v6 runs v2's tile order and stores
    g.own = out;
    g.own_elems = static_cast<long long>(shard(M, W, rank).size) * N;
    if (scr) {
      const runtime::PeerPtrs sp = m.c.peers(scr, size_t(M) * N * sizeof(bf16));
      for (int q = 0; q < W; ++q) {
        const Range sq = shard(M, W, q);
        g.scr[q] = static_cast<bf16*>(sp[q]);
        g.sc[q] = map_128x64(scr + size_t(sq.begin) * N, sq.size, N, N);
      }
    }
    g.ready = rd.view();
    g.zeroed = zr.view();
    g.done = dn.view();
    g.ready_round = ready_round;
    g.zeroed_round = zeroed_round;
    g.done_round = done_round;
  };
  lcsc::Config cfg;
  cfg.num_comm_sms = variant == RsVariant::InterSm ? ncomm : 0;
  lcsc::Plan p;
  if (in.fp8) {
    RsGlobalsFp8 g{};
    fill(g);
    g.scale_a = in.scale_a, g.scale_b = in.scale_b;
    g.kblocks = gemm_fp8::k_blocks(K);
    p = launch_rs_fp8(g, cfg, s);
  } else if (adaptive) {
    RsAdaptiveGlobals g{};
    fill(g);
    const AdaptivePriors pr = adaptive_priors(K, W - 1);  // reads W - 1 peer partials, writes its own
    g.set_split(reinterpret_cast<sm_split::Ledger*>(sg.get(m.c, {M, N, K, to_int(variant)}, counts, 3, cap).view().ptr[rank]),
                pr.compute, pr.comm);
    cfg.balance_waves = false;  // every SM: the blocks beyond the tiles' waves reduce
    p = in.bl == gemm::BLayout::NK ? lcsc::launch<RsAdaptiveKernelNK>(g, cfg, s)
                                   : lcsc::launch<RsAdaptiveKernel>(g, cfg, s);
  } else {
    RsGlobals g{};
    fill(g);
    p = in.bl == gemm::BLayout::NK ? lcsc::launch<RsKernelNK>(g, cfg, s) : lcsc::launch<RsKernel>(g, cfg, s);
  }
  m.order.after(s, cap);
  return {cfg.num_comm_sms, p.compute_blocks, false, to_int(variant)};
}

// Variant 3: plain GEMMs chained across ranks, no fused kernel. Step t = 1..W-1: rank r computes
// the rows of owner q = r - t (mod W) into q's output, stored at t = 1 and added at t >= 2 (the
// GEMM's C += A * B), then tells rank r + 1, whose next step targets the same owner; last, its
// own rows, added to what the W - 1 peers left in its output. Before its first step, rank r waits
// until owner r - 1 entered this call (so that call's output is free to overwrite); the chain
// carries that to the later steps. At W = 2: one GEMM into the peer, one signal each way, one GEMM
// with C += A * B.
void GemmRS::launch_shard_gemms(const Inputs& in, bf16* out, int M, int N, int K, cudaStream_t s) {
  Impl& m = *impl_;
  const int W = m.c.world(), rank = m.c.rank(), next = (rank + 1) % W;
  const runtime::PeerPtrs pp = m.c.peers(out, out_elems(M, N, W) * sizeof(bf16));
  runtime::SignalSet& st = m.sig.get(m.c, {M, N, K, to_int(RsVariant::ShardGemms)}, {2}, 0);  // 0: entered, 1: steps done
  const unsigned long long round = st.next_round();
  const signals sv = st.view();
  auto step = [&](int dst, int index_dst, int index_wait, unsigned long long expected) {
    signal_wait(s, sv, dst, index_dst, index_wait, expected);
  };
  if (W > 1) step(next, 0, 0, round);
  for (int t = 1; t <= W - 1; ++t) {
    const int q = rs_chain_owner(rank, t, W);
    const Range sq = shard(M, W, q);
    if (t >= 2) step(-1, 0, 1, rs_chain_expected(round, t, W));
    plain_gemm(in, in.a_row(sq.begin, K), static_cast<bf16*>(pp[q]), sq.size, N, K, s, t >= 2);
    step(next, 1, 1, t == W - 1 ? rs_chain_expected(round, W, W) : 0);
  }
  const Range mine = shard(M, W, rank);
  plain_gemm(in, in.a_row(mine.begin, K), out, mine.size, N, K, s, W > 1);
}

// Variant 4: the peers' rows as plain local GEMMs into `send` (slot of owner q), each copied by
// the copy engine into q's `recv` slot for this rank, then a stream write of q's ready[this
// rank]; the own rows as a plain GEMM into `out` while the copies run; then, once every peer's
// partial is here (one-thread waits with timeout diagnostics), `out` = the sum of the W partials
// in rank order. Before its first copy the side stream tells every peer this rank entered the
// call and waits for theirs (each peer's previous call, whose sum read its recv slots, is over).
// Slots: rank p's partial for owner q sits in q's recv slot (p - q - 1) mod W.
void GemmRS::launch_copy_engine(const Inputs& in, bf16* out, int M, int N, int K, cudaStream_t s) {
  Impl& m = *impl_;
  const int W = m.c.world(), rank = m.c.rank();
  if (W == 1) {  // nothing to move or sum
    plain_gemm(in, in.a, out, M, N, K, s);
    return;
  }
  m.v4_buffers(M, N, s);
  const size_t slot = size_t(shard(M, W, 0).size) * N;
  const runtime::PeerPtrs pr = m.c.peers(m.recv, m.recv_bytes);
  runtime::SignalSet& st = m.sig.get(m.c, {M, N, K, to_int(RsVariant::CopyEngine)}, {W, W}, 0);  // entered, ready; by sender
  runtime::SignalSet& rd = m.sig.get(m.c, {M, N, K, to_int(RsVariant::CopyEngine)}, {W, W}, 1);
  const unsigned long long round = st.next_round();
  rd.next_round();
  const signals sv = st.view(), rv = rd.view();
  m.ce.after(s);
  m.ce.enter(sv, rank, W, round);
  for (int t = 1; t < W; ++t) {
    const int q = (rank + t) % W;
    const Range sq = shard(M, W, q);
    bf16* part = m.send + size_t(t - 1) * slot;
    plain_gemm(in, in.a_row(sq.begin, K), part, sq.size, N, K, s);
    m.ce.after(s);
    m.ce.copy(static_cast<bf16*>(pr[q]) + size_t((rank - q - 1 + W) % W) * slot, part,
              size_t(sq.size) * N * sizeof(bf16));
    m.ce.set(rv.ptr[q] + rank, round);
  }
  const Range mine = shard(M, W, rank);
  plain_gemm(in, in.a_row(mine.begin, K), out, mine.size, N, K, s);
  SumArgs a{};
  for (int p = 0; p < W; ++p) {
    if (p != rank) signal_wait(s, rv, -1, 0, p, round);
    a.src[p] = p == rank ? out : m.recv + size_t((p - rank - 1 + W) % W) * slot;
  }
  a.dst[0] = out;
  a.nsrc = W;
  a.rows = mine.size;
  a.rows_per_block = 16;
  a.ncv = N / 8;
  a.ld = N;
  rs_sum_kernel<<<(mine.size + a.rows_per_block - 1) / a.rows_per_block, 256, 0, s>>>(a);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  m.ce.join(s);  // the next call's GEMMs rewrite `send`: the copies out of it come first
}

LaunchInfo GemmRS::run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, const Options& o,
                       cudaStream_t s) {
  Inputs in;
  in.a = A, in.b = B, in.bl = o.b;
  return run_inputs(in, out, M, N, K, o, s);
}

LaunchInfo GemmRS::run(const __nv_fp8_e4m3* A, const __nv_fp8_e4m3* B, const float* scale_a, const float* scale_b,
                       bf16* out, int M, int N, int K, const Options& o, cudaStream_t s) {
  Inputs in;
  in.a = A, in.b = B, in.bl = gemm::BLayout::NK;
  in.scale_a = scale_a, in.scale_b = scale_b, in.fp8 = true;
  Options on = o;
  on.b = gemm::BLayout::NK;
  return run_inputs(in, out, M, N, K, on, s);
}

AdaptiveStats GemmRS::adaptive_stats(int M, int N, int K) const {
  const runtime::SignalSet* set = impl_->sig.find({M, N, K, to_int(RsVariant::Adaptive)}, 3);
  if (set == nullptr) return {};
  return read_adaptive_stats(set->view().ptr[impl_->c.rank()]);
}

LaunchInfo GemmRS::run_inputs(const Inputs& in, bf16* out, int M, int N, int K, const Options& o, cudaStream_t s) {
  Impl& m = *impl_;
  const auto ops = {Operand{"A", in.a, in.bytes(M, K)}, Operand{"B", in.b, in.bytes(K, N)},
                    Operand{"out", out, out_elems(M, N, m.c.world()) * sizeof(bf16), true}};
  check_tp_call(m.c, "gemm_rs", M, N, K, o, ops, kRsVariants - 1,
                "0 (owner first), 1 (zero first), 2 (inter-SM), 3 (one GEMM per owner), 4 (copy engine), 5 "
                "(chained owners, one kernel) or 6 (adaptive split, bf16)",
                s, [&] {
                  if (in.fp8) check_scales("gemm_rs", in, m.c);
                  WEAVE_CHECK(!in.fp8 || o.variant != to_int(RsVariant::ShardGemms),
                              "gemm_rs: variant 3 (one GEMM per owner) is not offered for fp8 inputs: its GEMMs "
                              "accumulate into the owner's output, which the fp8 GEMM cannot (use 0, 1, 2, 4 or 5)");
                  WEAVE_CHECK(!in.fp8 || o.variant != to_int(RsVariant::Adaptive),
                              "gemm_rs: variant 6 (the adaptive split) is built for bf16 inputs only (use 0, 1, 2, 4 "
                              "or 5)");
                  WEAVE_CHECK(M >= m.c.world(), "gemm_rs: M = ", M, " gives some rank no rows (world ", m.c.world(),
                              ")");
                  WEAVE_CHECK(o.variant != to_int(RsVariant::CopyEngine) || m.recv_fits(M, N),
                              "gemm_rs: variant 4 (copy engine) needs ",
                              Impl::recv_need(M, N, m.c.world()), " bytes of the symmetric heap (one free range) for "
                              "the peers' partials; ", m.c.heap_bytes() - m.c.heap_used(), " are free in all");
                  WEAVE_CHECK(o.variant != to_int(RsVariant::CopyEngine) || m.ce_ok,
                              "gemm_rs: variant 4 needs 64-bit stream memory operations");
                },
                in.fp8);
  if (o.variant >= 0 || o.num_comm_sms >= 0) {
    const RsVariant v = o.variant >= 0 ? static_cast<RsVariant>(o.variant)
                        : o.num_comm_sms > 0 ? RsVariant::InterSm
                                             : RsVariant::OwnerFirst;
    const int n = o.num_comm_sms < 0 ? (v == RsVariant::InterSm ? 8 : 0) : o.num_comm_sms;
    WEAVE_CHECK((v == RsVariant::InterSm) == (n > 0), "gemm_rs: variant ", to_int(v), " (", variant_name(v),
                ") with num_comm_sms = ", n,
                " (the inter-SM variant 2 needs >= 1, variants 0, 1, 3, 4, 5 and 6 use none)");
    return launch(in, out, M, N, K, v, n, s);
  }
  std::vector<runtime::TuneCandidate> cands;
  for (RsVariant v : {RsVariant::OwnerFirst, RsVariant::ZeroFirst, RsVariant::ShardGemms, RsVariant::Chain})
    if (!in.fp8 || v != RsVariant::ShardGemms) cands.push_back({to_int(v), 0});
  // The copy engine only for partials of at least one of its chunks (as ag_gemm: below, it runs
  // well under the link's rate; at S = 2048, 4 MiB partials, variant 4 measured 81.7 us against
  // 41.5-48.6 for variants 3 and 0).
  const bool ce_worth = size_t(shard(M, m.c.world(), 0).size) * N * sizeof(bf16) >= CopyEngine::kChunkBytes;
  if (ce_worth && m.recv_fits(M, N) && m.ce_ok) cands.push_back({to_int(RsVariant::CopyEngine), 0});
  const int row_tiles = (shard(M, m.c.world(), 0).size + kBM - 1) / kBM;
  for (int n : {4, 8, 16, 32})
    if (n <= row_tiles * ((N + kBN - 1) / kBN) && n < m.c.sm_count() / 2) cands.push_back({to_int(RsVariant::InterSm), n});
  return tuned_launch(
      m.c, "gemm_rs", o, M, N, K, cands, s, [](int v) { return capturable(static_cast<RsVariant>(v)); },
      m.capture_ready,
      [&](const runtime::TuneCandidate& t) {
        return launch(in, out, M, N, K, static_cast<RsVariant>(t.variant), t.num_comm_sms, s);
      },
      in.fp8);
}

}  // namespace weave::tp
