// Host side of AllGather + GEMM: validation, shape check, per-owner maps, signals, tuner.
#include "ag_gemm/ag_gemm.hpp"

#include "ag_gemm/ag_gemm_kernel.cuh"
#include "ag_gemm/copy_engine.hpp"
#include "collectives/collectives.hpp"
#include "gemm/gemm.hpp"
#include "tp_common/plain_gemm.hpp"
#include "tp_common/signal_wait.cuh"
#include "weave/lcsc.cuh"
#include "weave/runtime/device_copy.hpp"
#include "weave/runtime/tuner.hpp"

namespace weave::tp {

struct AgGemm::Impl {
  runtime::Communicator& c;
  runtime::ShapeSignals sig{"tp.ag_gemm"};
  runtime::ShapeSignals sig_adaptive{"tp.ag_gemm_adaptive"};  // v10: the SM split's ledger, per shape
  CopyEnginePush ce;
  runtime::CallOrder order;
  std::set<std::string> capture_ready;  // tuned_launch's
  const bool ce_ok;
  // v9's all_gather, made by the first v9 call (every rank takes v9 for the same shapes in the
  // same order), so that objects which never take it hold none of its heap.
  std::unique_ptr<coll::Collectives> coll;
  explicit Impl(runtime::Communicator& cc) : c(cc), ce_ok(CopyEngine::supported(cc.device())) {}
  // Heap a Collectives object takes at construction, and a margin for its signal sets.
  bool coll_fits() const {
    const size_t need = coll::Collectives::scratch_bytes(c.world()) + (size_t(1) << 20);
    return coll || c.heap_fits(need);
  }
};

AgGemm::AgGemm(runtime::Communicator& c) : impl_(std::make_unique<Impl>(c)) {}
AgGemm::~AgGemm() = default;

std::vector<int> AgGemm::comm_sms_candidates(int M, int K, int W, int sm_count) {
  (void)K;
  const int row_tiles = (shard(M, W, 0).size + kBM - 1) / kBM;  // more blocks than row tiles idle
  std::vector<int> v;
  for (int n : {2, 4, 8, 12, 16, 24, 32})
    if (n <= row_tiles && n < sm_count / 2) v.push_back(n);
  if (v.empty()) v.push_back(1);
  return v;
}

LaunchInfo AgGemm::launch(const Inputs& in, void* a_gathered, bf16* C, int M, int N, int K, int ncomm,
                          AgVariant variant, cudaStream_t s) {
  Impl& m = *impl_;
  const bool cap = runtime::capturing(s);
  WEAVE_CHECK(!cap || capturable(variant), "ag_gemm: variant ", to_int(variant), " (", variant_name(variant),
              ") cannot be captured in a CUDA graph (", capture_rule(), ")");
  m.order.before(s, cap);
  const int W = m.c.world(), rank = m.c.rank();
  const size_t row = size_t(K) * in.elem();  // bytes of one row of A
  char* const gathered = static_cast<char*>(a_gathered);
  const Range mine = shard(M, W, rank);
  char* const own = gathered + size_t(mine.begin) * row;  // this rank's rows of its gathered A
  if (variant == AgVariant::AllGatherGemm) {
    // The own rows into place first (a_shard may be any device memory; the all_gather reads
    // symmetric buffers), then the all_gather in place and the GEMM on the gathered A. fp8 rows
    // are gathered as bf16 pairs (K % 16 == 0: whole pairs, the same bytes).
    const bool copy = in.a != own;
    if (copy) runtime::device_copy(own, in.a, size_t(mine.size) * row, s);
    if (!m.coll) m.coll = std::make_unique<coll::Collectives>(m.c);
    coll::Shape full;
    full.ndim = 2, full.d[0] = M, full.d[1] = static_cast<long long>(row / sizeof(bf16));
    m.coll->all_gather(own, a_gathered, full, 0, DType::bf16, s);
    plain_gemm(in, a_gathered, C, M, N, K, s);
    m.order.after(s, cap);
    return {0, m.c.sm_count(), false, to_int(variant)};
  }
  const runtime::PeerPtrs pp = m.c.peers(a_gathered, size_t(M) * row);
  const bool ce = variant == AgVariant::CopyEngine || variant == AgVariant::CopyEngineShardGemms;
  const bool adaptive = variant == AgVariant::Adaptive;
  WEAVE_CHECK(!adaptive || !in.fp8, "ag_gemm: variant 10 (the adaptive split) is built for bf16 inputs only");
  // v10 pushes v0/v1's units (and shares their counter sets: the same P per row tile).
  const bool comm = variant == AgVariant::CommTmaPush || variant == AgVariant::CommRegisterPush || adaptive;
  // The globals both input types share (the GEMM's part differs: fp8 adds the scales).
  const Layout L = make_layout(M, N, W, default_group_m(K));
  const int slices = ce ? 1 : comm ? ag_slices(static_cast<long long>(row)) : ag_slices_aux(L, static_cast<long long>(row));
  // One set per (shape, input type, P): a launch sends P signals per row tile, and the
  // expectation round * P only holds on a set that every launch feeds with the same P. The copy
  // engine's ready counters are set, not added to, and its arrive set has one slot per rank: its
  // own key (P = 0 marks it; real P are >= 1).
  const std::vector<long long> key = {M, N, K, ce ? 0 : slices, in.fp8 ? 1 : 0};
  const std::vector<int> counts = {ag_ready_count(L), ce ? W : 1};
  runtime::SignalSet& rd = m.sig.get(m.c, key, counts, 0, cap);
  runtime::SignalSet& ar = m.sig.get(m.c, key, counts, 1, cap);
  // v10's ledger (its own set per shape: v0/v1's calls may have made the counter sets alone), found
  // or made before any round is taken: under capture a missing one throws NotPrepared, and a round
  // taken before that would stay in the graph with no launch feeding it.
  sm_split::Ledger* const ledger =
      adaptive ? reinterpret_cast<sm_split::Ledger*>(
                     m.sig_adaptive
                         .get(m.c, {M, N, K}, {static_cast<int>(sizeof(sm_split::Ledger) / sizeof(unsigned long long))},
                              0, cap)
                         .view()
                         .ptr[rank])
               : nullptr;
  const Round ready_round = rd.next_round(s, cap), arrive_round = ar.next_round(s, cap);
  auto fill = [&](auto& g) {
    g.L = L;
    for (int q = 0; q < W; ++q) {
      const Range sq = shard(M, W, q);
      const void* src = q == rank ? in.a : gathered + size_t(sq.begin) * row;
      g.asrc[q] = in.fp8 ? map_fp8(src, sq.size, K, kBM) : map_128x64(static_cast<const bf16*>(src), sq.size, K, K);
      g.cdst[q] = map_128x64(C + size_t(sq.begin) * N, sq.size, N, N);
      g.gdst[q] = static_cast<char*>(pp[q]) + size_t(mine.begin) * row;
    }
    g.shard = in.a;
    g.copy_local = in.a != own;
    g.b = in.fp8 ? map_fp8(in.b, N, K, kBN) : map_b(static_cast<const bf16*>(in.b), K, N, in.bl);
    g.M = M, g.N = N, g.K = K;
    g.tiles_m = L.row_tiles(), g.tiles_n = L.tiles_n, g.group_m = L.group_m, g.accumulate = 0;
    g.rank = rank;
    g.push = to_int(variant);
    g.slices = slices;
    g.ready = rd.view();
    g.arrive = ar.view();
    g.ready_round = ready_round;
    g.arrive_round = arrive_round;
  };
  if (ce) {
    void* dst[kMaxWorld] = {};
    for (int q = 0; q < W; ++q) dst[q] = static_cast<char*>(pp[q]) + size_t(mine.begin) * row;
    m.ce.push(L, rank, row, in.a, dst, in.a != own ? own : nullptr, rd.view(), ar.view(), ready_round,
              ag_ready_expected(slices), variant == AgVariant::CopyEngine, s);
  }
  if (variant == AgVariant::CopyEngineShardGemms) {
    // Own rows from the input, then peer q's rows in the order the peers push to this rank (peer
    // q at its phase (q - rank) mod W), each after its shard's last counter (written after all of
    // the shard's copies, so it covers the shard). All on `s`: running the peers' GEMMs on a
    // second stream, to fill the own GEMM's last wave, measured 2-6 % slower (perf-notes).
    plain_gemm(in, in.a, C + size_t(mine.begin) * N, mine.size, N, K, s);
    for (int p = 1; p < W; ++p) {
      const int q = (rank + p) % W;
      const Range sq = shard(M, W, q);
      signal_wait(s, rd.view(), -1, 0, L.off[q] + L.tm[q] - 1, ready_round * ag_ready_expected(slices));
      plain_gemm(in, gathered + size_t(sq.begin) * row, C + size_t(sq.begin) * N, sq.size, N, K, s);
    }
    m.ce.join(s);
    m.order.after(s, cap);
    return {0, m.c.sm_count(), false, to_int(variant)};
  }
  lcsc::Config cfg;
  cfg.num_comm_sms = ncomm;
  lcsc::Plan p;
  if (in.fp8) {
    AgGlobalsFp8 g{};
    fill(g);
    g.scale_a = in.scale_a, g.scale_b = in.scale_b;
    g.kblocks = gemm_fp8::k_blocks(K);
    p = launch_ag_fp8(g, cfg, s);
  } else if (adaptive) {
    AgAdaptiveGlobals g{};
    fill(g);
    const long long unit = (static_cast<long long>(kBM) * static_cast<long long>(row) + slices - 1) / slices;
    const AdaptivePriors pr = ag_adaptive_priors(K, unit, W - 1 + (in.a != own ? 1 : 0));
    g.set_split(ledger, pr.compute, pr.comm);
    cfg.balance_waves = false;  // every SM: the blocks beyond the tiles' waves push
    p = in.bl == gemm::BLayout::NK ? lcsc::launch<AgAdaptiveKernelNK>(g, cfg, s)
                                   : lcsc::launch<AgAdaptiveKernel>(g, cfg, s);
  } else {
    AgGlobals g{};
    fill(g);
    p = in.bl == gemm::BLayout::NK ? lcsc::launch<AgKernelNK>(g, cfg, s) : lcsc::launch<AgKernel>(g, cfg, s);
  }
  if (ce) m.ce.join(s);
  m.order.after(s, cap);
  return {ncomm, p.compute_blocks, false, to_int(variant)};
}

AdaptiveStats AgGemm::adaptive_stats(int M, int N, int K) const {
  const runtime::SignalSet* set = impl_->sig_adaptive.find({M, N, K}, 0);
  if (set == nullptr) return {};
  return read_adaptive_stats(set->view().ptr[impl_->c.rank()]);
}

LaunchInfo AgGemm::run(const bf16* a_shard, bf16* a_gathered, const bf16* B, bf16* C, int M, int N, int K,
                       const Options& o, cudaStream_t s) {
  Inputs in;
  in.a = a_shard, in.b = B, in.bl = o.b;
  return run_inputs(in, a_gathered, C, M, N, K, o, s);
}

LaunchInfo AgGemm::run(const __nv_fp8_e4m3* a_shard, __nv_fp8_e4m3* a_gathered, const __nv_fp8_e4m3* B,
                       const float* scale_a, const float* scale_b, bf16* C, int M, int N, int K, const Options& o,
                       cudaStream_t s) {
  Inputs in;
  in.a = a_shard, in.b = B, in.bl = gemm::BLayout::NK;
  in.scale_a = scale_a, in.scale_b = scale_b, in.fp8 = true;
  Options on = o;
  on.b = gemm::BLayout::NK;
  return run_inputs(in, a_gathered, C, M, N, K, on, s);
}

LaunchInfo AgGemm::run_inputs(const Inputs& in, void* a_gathered, bf16* C, int M, int N, int K, const Options& o,
                              cudaStream_t s) {
  Impl& m = *impl_;
  const Range mine = shard(M, m.c.world(), m.c.rank());
  const size_t row = size_t(K) * in.elem();
  const auto ops = {Operand{"a_shard", in.a, in.bytes(mine.size, K)},
                    Operand{"a_gathered", a_gathered, in.bytes(M, K), true}, Operand{"B", in.b, in.bytes(K, N)},
                    Operand{"C", C, bf16_bytes(M, N)}};
  check_tp_call(m.c, "ag_gemm", M, N, K, o, ops, kAgVariants - 1,
                "0 (TMA push by communicator SMs), 1 (register push by communicator SMs), 2 (TMA push by the compute "
                "blocks' idle producer warps), 3..6 (register push by those of every 2^(v-3)-th block), 7 (copy "
                "engine), 8 (copy engine, one GEMM per shard), 9 (all_gather, then one GEMM) or 10 (adaptive "
                "split, bf16)",
                s, [&] {
                  if (in.fp8) check_scales("ag_gemm", in, m.c);
                  WEAVE_CHECK(!in.fp8 || o.variant != to_int(AgVariant::Adaptive),
                              "ag_gemm: variant 10 (the adaptive split) is built for bf16 inputs only (use 0..9)");
                  WEAVE_CHECK(o.variant != to_int(AgVariant::AllGatherGemm) || m.coll_fits(), "ag_gemm: variant 9 needs ",
                              "room in the symmetric heap for the all_gather's scratch (one free range); ",
                              m.c.heap_bytes() - m.c.heap_used(), " bytes are free in all");
                  WEAVE_CHECK((o.variant != to_int(AgVariant::CopyEngine) &&
                               o.variant != to_int(AgVariant::CopyEngineShardGemms)) ||
                                  m.ce_ok,
                              "ag_gemm: variant ", o.variant,
                              " (copy engine) needs 64-bit stream memory operations, which this device or driver "
                              "does not offer (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)");
                  WEAVE_CHECK(M >= m.c.world(), "ag_gemm: M = ", M, " gives some rank no rows (world ", m.c.world(),
                              ")");
                  // In place means exactly this rank's rows of a_gathered: elsewhere in it, peers'
                  // pushes would overwrite the input.
                  const bool own = in.a == static_cast<const char*>(a_gathered) + size_t(mine.begin) * row;
                  WEAVE_CHECK(own || !runtime::overlap(in.a, mine.size * row, a_gathered, M * row),
                              "ag_gemm: a_shard overlaps a_gathered without being this rank's rows of it (rows ",
                              mine.begin, "..", mine.begin + mine.size - 1, ")");
                },
                in.fp8);
  if (o.num_comm_sms >= 0) {
    const AgVariant v = o.variant >= 0 ? static_cast<AgVariant>(o.variant)
                        : o.num_comm_sms == 0 ? AgVariant::AuxTmaPush
                                              : AgVariant::CommTmaPush;
    const bool comm = v == AgVariant::CommTmaPush || v == AgVariant::CommRegisterPush;
    WEAVE_CHECK(!comm == (o.num_comm_sms == 0), "ag_gemm: variant ", to_int(v), " (", variant_name(v),
                ") with num_comm_sms = ", o.num_comm_sms,
                " (variants 2..10 use no communicator SMs, variants 0 and 1 need >= 1)");
    return launch(in, a_gathered, C, M, N, K, o.num_comm_sms, v, s);
  }
  // The copy-engine variants only for shards of at least one copy chunk: below it the copy engine
  // runs well under the link's rate and the stream-memory handshake (~7 us each way) weighs; at
  // S = 2048 (4 MiB shards) the tuner's short samples ranked variant 8 first (48.7 us) and it
  // measured 80 us in the benchmark's turns.
  const bool ce_worth = size_t(shard(M, m.c.world(), 0).size) * row >= CopyEngine::kChunkBytes;
  std::vector<runtime::TuneCandidate> cands;
  const auto allowed = [&](AgVariant v) { return o.variant < 0 || o.variant == to_int(v); };
  // The adaptive split only when asked for by name: not measured on two GPUs yet (README).
  if (o.variant == to_int(AgVariant::Adaptive)) cands.push_back({to_int(AgVariant::Adaptive), 0});
  for (AgVariant v : {AgVariant::AuxTmaPush, AgVariant::AuxRegisterPush1, AgVariant::AuxRegisterPush2,
                      AgVariant::AuxRegisterPush4, AgVariant::AuxRegisterPush8})
    if (allowed(v)) cands.push_back({to_int(v), 0});
  for (AgVariant v : {AgVariant::CopyEngine, AgVariant::CopyEngineShardGemms})
    if (allowed(v) && m.ce_ok && (ce_worth || o.variant == to_int(v))) cands.push_back({to_int(v), 0});
  if (allowed(AgVariant::AllGatherGemm) && m.coll_fits()) cands.push_back({to_int(AgVariant::AllGatherGemm), 0});
  for (AgVariant v : {AgVariant::CommTmaPush, AgVariant::CommRegisterPush})
    if (allowed(v))
      for (int n : comm_sms_candidates(M, K, m.c.world(), m.c.sm_count())) cands.push_back({to_int(v), n});
  return tuned_launch(
      m.c, "ag_gemm", o, M, N, K, cands, s, [](int v) { return capturable(static_cast<AgVariant>(v)); },
      m.capture_ready,
      [&](const runtime::TuneCandidate& t) {
        return launch(in, a_gathered, C, M, N, K, t.num_comm_sms, static_cast<AgVariant>(t.variant), s);
      },
      in.fp8);
}

}  // namespace weave::tp
