// Host side of AllGather + GEMM: validation, shape check, per-owner maps, signals, tuner.
#include "ag_gemm/ag_gemm.hpp"

#include <optional>

#include "ag_gemm/ag_gemm_kernel.cuh"
#include "ag_gemm/copy_engine.hpp"
#include "collectives/collectives.hpp"
#include "gemm/gemm.hpp"
#include "tp_common/signal_wait.cuh"
#include "weave/lcsc.cuh"
#include "weave/pdl.cuh"
#include "weave/runtime/tuner.hpp"

namespace weave::tp {

struct AgGemm::Impl {
  runtime::Communicator& c;
  runtime::ShapeSignals sig{"tp.ag_gemm"};
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
    return coll || c.heap_bytes() - c.heap_used() >= need;
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

LaunchInfo AgGemm::launch(const bf16* a_shard, bf16* a_gathered, const bf16* B, gemm::BLayout bl, bf16* C, int M,
                          int N, int K, int ncomm, AgVariant variant, cudaStream_t s) {
  Impl& m = *impl_;
  const bool cap = runtime::capturing(s);
  WEAVE_CHECK(!cap || capturable(variant), "ag_gemm: variant ", to_int(variant), " (", variant_name(variant),
              ") cannot be captured in a CUDA graph (", capture_rule(), ")");
  m.order.before(s, cap);
  const int W = m.c.world(), rank = m.c.rank();
  if (variant == AgVariant::AllGatherGemm) {
    // The own rows into place first (a_shard may be any device memory; the all_gather reads
    // symmetric buffers), then the all_gather in place and the GEMM on the gathered A.
    const Range mine = shard(M, W, rank);
    bf16* own = a_gathered + size_t(mine.begin) * K;
    const bool copy = a_shard != own;
    if (copy)
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(own, a_shard, size_t(mine.size) * K * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
    if (!m.coll) m.coll = std::make_unique<coll::Collectives>(m.c);
    coll::Shape full;
    full.ndim = 2, full.d[0] = M, full.d[1] = K;
    std::optional<PdlOff> off;  // no programmatic launch right behind the copy (pdl.cuh)
    if (copy) off.emplace();
    m.coll->all_gather(own, a_gathered, full, 0, DType::bf16, s);
    gemm::gemm(a_gathered, B, C, M, N, K, bl, {}, s);
    m.order.after(s, cap);
    return {0, m.c.sm_count(), false, to_int(variant)};
  }
  AgGlobals g{};
  g.L = make_layout(M, N, W, default_group_m(K));
  const runtime::PeerPtrs pp = m.c.peers(a_gathered, size_t(M) * K * sizeof(bf16));
  const Range mine = shard(M, W, rank);
  for (int q = 0; q < W; ++q) {
    const Range sq = shard(M, W, q);
    const bf16* src = q == rank ? a_shard : a_gathered + size_t(sq.begin) * K;
    g.asrc[q] = map_128x64(src, sq.size, K, K);
    g.cdst[q] = map_128x64(C + size_t(sq.begin) * N, sq.size, N, N);
    g.gdst[q] = static_cast<bf16*>(pp[q]) + size_t(mine.begin) * K;
  }
  g.shard = a_shard;
  g.copy_local = a_shard != a_gathered + size_t(mine.begin) * K;
  g.b = map_b(B, K, N, bl);
  g.M = M, g.N = N, g.K = K;
  g.tiles_m = g.L.row_tiles(), g.tiles_n = g.L.tiles_n, g.group_m = g.L.group_m, g.accumulate = 0;
  g.rank = rank;
  g.push = to_int(variant);
  const bool ce = variant == AgVariant::CopyEngine || variant == AgVariant::CopyEngineShardGemms;
  const bool comm = variant == AgVariant::CommTmaPush || variant == AgVariant::CommRegisterPush;
  g.slices = ce ? 1 : comm ? ag_slices(K) : ag_slices_aux(g.L, K);
  // One set per (shape, P): a launch sends P signals per row tile, and the expectation
  // round * P only holds on a set that every launch feeds with the same P. The copy engine's
  // ready counters are set, not added to, and its arrive set has one slot per rank: its own key
  // (P = 0 marks it; real P are >= 1).
  const std::vector<long long> key = {M, N, K, ce ? 0 : g.slices};
  const std::vector<int> counts = {ag_ready_count(g.L), ce ? W : 1};
  runtime::SignalSet& rd = m.sig.get(m.c, key, counts, 0, cap);
  runtime::SignalSet& ar = m.sig.get(m.c, key, counts, 1, cap);
  g.ready = rd.view();
  g.arrive = ar.view();
  g.ready_round = rd.next_round(s, cap);
  g.arrive_round = ar.next_round(s, cap);
  if (ce) {
    void* dst[kMaxWorld] = {};
    for (int q = 0; q < W; ++q) dst[q] = g.gdst[q];
    m.ce.push(g.L, rank, K, a_shard, dst, g.copy_local ? a_gathered + size_t(mine.begin) * K : nullptr, g.ready,
              g.arrive, g.ready_round, ag_ready_expected(g.slices), variant == AgVariant::CopyEngine, s);
  }
  if (variant == AgVariant::CopyEngineShardGemms) {
    // Own rows from the input, then peer q's rows in the order the peers push to this rank (peer
    // q at its phase (q - rank) mod W), each after its shard's last counter (written after all of
    // the shard's copies, so it covers the shard). All on `s`: running the peers' GEMMs on a
    // second stream, to fill the own GEMM's last wave, measured 2-6 % slower (perf-notes).
    gemm::gemm(a_shard, B, C + size_t(mine.begin) * N, mine.size, N, K, bl, {}, s);
    for (int p = 1; p < W; ++p) {
      const int q = (rank + p) % W;
      const Range sq = shard(M, W, q);
      signal_wait(s, g.ready, -1, 0, g.L.off[q] + g.L.tm[q] - 1, g.ready_round * ag_ready_expected(g.slices));
      gemm::gemm(a_gathered + size_t(sq.begin) * K, B, C + size_t(sq.begin) * N, sq.size, N, K, bl, {}, s);
    }
    m.ce.join(s);
    m.order.after(s, cap);
    return {0, m.c.sm_count(), false, to_int(variant)};
  }
  lcsc::Config cfg;
  cfg.num_comm_sms = ncomm;
  const lcsc::Plan p =
      bl == gemm::BLayout::NK ? lcsc::launch<AgKernelNK>(g, cfg, s) : lcsc::launch<AgKernel>(g, cfg, s);
  if (ce) m.ce.join(s);
  m.order.after(s, cap);
  return {ncomm, p.compute_blocks, false, to_int(variant)};
}

LaunchInfo AgGemm::run(const bf16* a_shard, bf16* a_gathered, const bf16* B, bf16* C, int M, int N, int K,
                       const Options& o, cudaStream_t s) {
  Impl& m = *impl_;
  check_tp_call(m.c, "ag_gemm", M, N, K, o, {{"a_shard", a_shard, bf16_bytes(shard(M, m.c.world(), m.c.rank()).size, K)},
                 {"a_gathered", a_gathered, bf16_bytes(M, K)},
                 {"B", B, bf16_bytes(K, N)},
                 {"C", C, bf16_bytes(M, N)}},
                kAgVariants - 1,
                "0 (TMA push by communicator SMs), 1 (register push by communicator SMs), 2 (TMA push by the compute "
                "blocks' idle producer warps), 3..6 (register push by those of every 2^(v-3)-th block), 7 (copy "
                "engine), 8 (copy engine, one GEMM per shard) or 9 (all_gather, then one GEMM)",
                s, [&] {
                  WEAVE_CHECK(o.variant != to_int(AgVariant::AllGatherGemm) || m.coll_fits(), "ag_gemm: variant 9 needs ",
                              "room in the symmetric heap for the all_gather's scratch; ",
                              m.c.heap_bytes() - m.c.heap_used(), " bytes are free");
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
                  const Range mine = shard(M, m.c.world(), m.c.rank());
                  const size_t row = size_t(K) * sizeof(bf16);
                  const bool own = a_shard == a_gathered + size_t(mine.begin) * K;
                  WEAVE_CHECK(own || !runtime::overlap(a_shard, mine.size * row, a_gathered, M * row),
                              "ag_gemm: a_shard overlaps a_gathered without being this rank's rows of it (rows ",
                              mine.begin, "..", mine.begin + mine.size - 1, ")");
                });
  if (o.num_comm_sms >= 0) {
    const AgVariant v = o.variant >= 0 ? static_cast<AgVariant>(o.variant)
                        : o.num_comm_sms == 0 ? AgVariant::AuxTmaPush
                                              : AgVariant::CommTmaPush;
    const bool comm = v == AgVariant::CommTmaPush || v == AgVariant::CommRegisterPush;
    WEAVE_CHECK(!comm == (o.num_comm_sms == 0), "ag_gemm: variant ", to_int(v), " (", variant_name(v),
                ") with num_comm_sms = ", o.num_comm_sms,
                " (variants 2..9 use no communicator SMs, variants 0 and 1 need >= 1)");
    return launch(a_shard, a_gathered, B, o.b, C, M, N, K, o.num_comm_sms, v, s);
  }
  // The copy-engine variants only for shards of at least one copy chunk: below it the copy engine
  // runs well under the link's rate and the stream-memory handshake (~7 us each way) weighs; at
  // S = 2048 (4 MiB shards) the tuner's short samples ranked variant 8 first (48.7 us) and it
  // measured 80 us in the benchmark's turns.
  const bool ce_worth = size_t(shard(M, m.c.world(), 0).size) * K * sizeof(bf16) >= CopyEngine::kChunkBytes;
  std::vector<runtime::TuneCandidate> cands;
  const auto allowed = [&](AgVariant v) { return o.variant < 0 || o.variant == to_int(v); };
  for (AgVariant v : {AgVariant::AuxTmaPush, AgVariant::AuxRegisterPush1, AgVariant::AuxRegisterPush2,
                      AgVariant::AuxRegisterPush4, AgVariant::AuxRegisterPush8})
    if (allowed(v)) cands.push_back({to_int(v), 0});
  for (AgVariant v : {AgVariant::CopyEngine, AgVariant::CopyEngineShardGemms})
    if (allowed(v) && m.ce_ok && (ce_worth || o.variant == to_int(v))) cands.push_back({to_int(v), 0});
  if (allowed(AgVariant::AllGatherGemm) && m.coll_fits()) cands.push_back({to_int(AgVariant::AllGatherGemm), 0});
  for (AgVariant v : {AgVariant::CommTmaPush, AgVariant::CommRegisterPush})
    if (allowed(v))
      for (int n : comm_sms_candidates(M, K, m.c.world(), m.c.sm_count())) cands.push_back({to_int(v), n});
  return tuned_launch(m.c, "ag_gemm", o, M, N, K, cands, s, [](int v) { return capturable(static_cast<AgVariant>(v)); },
                      m.capture_ready, [&](const runtime::TuneCandidate& t) {
    return launch(a_shard, a_gathered, B, o.b, C, M, N, K, t.num_comm_sms, static_cast<AgVariant>(t.variant), s);
  });
}

}  // namespace weave::tp
