// Host entry of the MoE low-latency mode (low_latency.hpp): argument checks and cross-rank
// agreement, the symmetric buffers and signal sets, one launch per dispatch and one per combine.
#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "moe/low_latency.hpp"
#include "moe/low_latency_kernels.cuh"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/runtime/call.hpp"

namespace weave::moe {

using ll::bf16;

namespace {

void check_config(const LowLatencyConfig& c, int world) {
  WEAVE_CHECK(world >= 1 && world <= kMaxWorld, "moe low-latency: world ", world, " outside 1..", kMaxWorld);
  WEAVE_CHECK(c.experts > 0 && c.experts % world == 0, "moe low-latency: ", c.experts, " experts do not divide among ",
              world, " ranks");
  WEAVE_CHECK(c.experts <= kLlMaxExperts, "moe low-latency: at most ", kLlMaxExperts, " experts, got ", c.experts);
  WEAVE_CHECK(c.hidden > 0 && c.hidden % 8 == 0, "moe low-latency: hidden size ", c.hidden,
              " must be a positive multiple of 8 (rows move as 16-byte vectors)");
  WEAVE_CHECK(c.topk >= 1 && c.topk <= kLlMaxTopk, "moe low-latency: top-k ", c.topk, " outside 1..", kLlMaxTopk);
  WEAVE_CHECK(c.max_tokens >= 1 && c.max_tokens <= kLlMaxTokens, "moe low-latency: max_tokens = ", c.max_tokens,
              " outside 1..", kLlMaxTokens,
              " (the low-latency mode is for decode batches; larger ones use MoeExchange, exchange.hpp)");
}

}  // namespace

struct MoeLowLatency::Impl {
  runtime::Communicator& c;
  LowLatencyConfig cfg;
  Geometry g;
  int stride = 0, blocks = 1;
  runtime::SymmetricTensor<bf16> stage, landing;
  runtime::SymmetricTensor<int> route, head;
  runtime::SignalSet dsig, csig;
  runtime::CallOrder order;
  // Local: the receive buffer, its metadata, and the small arrays (counts, src counts and offsets,
  // state, record) in one allocation.
  bf16* recv = nullptr;
  LlRowMeta* meta = nullptr;
  void* local = nullptr;
  int *counts = nullptr, *src_counts = nullptr, *src_offsets = nullptr, *state = nullptr;
  LlVerdict* record = nullptr;
  bool pending = false;  // a dispatch waits for its combine
  int last_T = -1;
  unsigned long long calls = 0;

  Impl(runtime::Communicator& comm, const LowLatencyConfig& conf)
      : c(comm),
        cfg(conf),
        g{comm.world(), conf.experts},
        stride(ll_row_stride(comm.world(), conf.max_tokens)),
        stage(comm, static_cast<size_t>(comm.world()) * conf.max_tokens * conf.hidden),
        landing(comm, static_cast<size_t>(conf.max_tokens) * conf.topk * conf.hidden),
        route(comm, static_cast<size_t>(comm.world()) * conf.max_tokens * conf.topk),
        head(comm, static_cast<size_t>(comm.world()) * ll_header_ints(conf.experts / comm.world())),
        dsig(comm.signals("moe.ll.dispatch", 1)),
        csig(comm.signals("moe.ll.combine", 1)) {
    std::vector<int> sms(c.world());
    const int mine = c.sm_count();
    c.bootstrap().all_gather(&mine, sms.data(), sizeof mine);
    blocks = ll_blocks(*std::min_element(sms.begin(), sms.end()), cfg.max_tokens);
    const int L = g.local_experts(), W = g.world;
    const size_t rows = static_cast<size_t>(L) * stride;
    WEAVE_CUDA_CHECK(cudaMalloc(&recv, rows * cfg.hidden * sizeof(bf16)));
    WEAVE_CUDA_CHECK(cudaMalloc(&meta, rows * sizeof(LlRowMeta)));
    auto round16 = [](size_t b) { return (b + 15) / 16 * 16; };
    const size_t b_counts = round16(L * sizeof(int)), b_lw = round16(static_cast<size_t>(L) * W * sizeof(int)),
                 b_state = round16(ll::kLlStateInts * sizeof(int)), b_record = round16(sizeof(LlVerdict));
    WEAVE_CUDA_CHECK(cudaMalloc(&local, b_counts + 2 * b_lw + b_state + b_record));
    char* p = static_cast<char*>(local);
    counts = reinterpret_cast<int*>(p), p += b_counts;
    src_counts = reinterpret_cast<int*>(p), p += b_lw;
    src_offsets = reinterpret_cast<int*>(p), p += b_lw;
    state = reinterpret_cast<int*>(p), p += b_state;
    record = reinterpret_cast<LlVerdict*>(p);
    WEAVE_CUDA_CHECK(cudaMemset(local, 0, b_counts + 2 * b_lw + b_state));
    const LlVerdict none{};
    WEAVE_CUDA_CHECK(cudaMemcpy(record, &none, sizeof none, cudaMemcpyHostToDevice));
    base = make_base();
  }
  ~Impl() {
    // A call may still run here or on a peer: the signal sets' destructors quiesce every rank
    // (they go before the symmetric buffers: members are destroyed in reverse order); the local
    // memory waits for this device.
    cudaDeviceSynchronize();
    cudaFree(recv);
    cudaFree(meta);
    cudaFree(local);
  }

  ll::LlArgs base{};  // what every launch shares (peer pointers, local arrays), made once

  ll::LlArgs make_base() const {
    ll::LlArgs a{};
    a.k = cfg.topk, a.H = cfg.hidden, a.max_tokens = cfg.max_tokens, a.row_stride = stride;
    a.g = g;
    const runtime::PeerPtrs ps = c.peers(stage.data(), stage.bytes());
    const runtime::PeerPtrs pr = c.peers(route.data(), route.bytes());
    const runtime::PeerPtrs ph = c.peers(head.data(), head.bytes());
    const runtime::PeerPtrs pl = c.peers(landing.data(), landing.bytes());
    for (int r = 0; r < c.world(); ++r) {
      a.stage[r] = static_cast<bf16*>(ps[r]);
      a.route[r] = static_cast<int*>(pr[r]);
      a.head[r] = static_cast<int*>(ph[r]);
      a.landing[r] = static_cast<bf16*>(pl[r]);
    }
    a.recv = recv, a.meta = meta, a.counts = counts, a.src_counts = src_counts, a.src_offsets = src_offsets;
    a.state = state, a.record = record;
    return a;
  }
  // What each kernel waits for per round: every peer's blocks, once per call.
  unsigned long long per_round() const {
    return static_cast<unsigned long long>(g.world - 1) * static_cast<unsigned long long>(blocks);
  }
};

MoeLowLatency::MoeLowLatency(runtime::Communicator& comm, const LowLatencyConfig& cfg) {
  comm.check_same("moe low-latency config (E, H, k, max_tokens)", {cfg.experts, cfg.hidden, cfg.topk, cfg.max_tokens});
  check_config(cfg, comm.world());  // the same config everywhere: every rank throws alike
  impl_ = std::make_unique<Impl>(comm, cfg);
}

MoeLowLatency::~MoeLowLatency() = default;

const LowLatencyConfig& MoeLowLatency::config() const { return impl_->cfg; }
int MoeLowLatency::row_stride() const { return impl_->stride; }
int MoeLowLatency::local_experts() const { return impl_->g.local_experts(); }
int MoeLowLatency::blocks() const { return impl_->blocks; }
bf16* MoeLowLatency::receive_buffer() const { return impl_->recv; }
unsigned long long MoeLowLatency::dispatches() const { return impl_->calls; }
runtime::Communicator& MoeLowLatency::communicator() const { return impl_->c; }

LowLatencyDispatched MoeLowLatency::dispatch(const bf16* x, const int* topk_idx, int T, cudaStream_t s) {
  Impl& m = *impl_;
  const LowLatencyConfig& cf = m.cfg;
  const std::string problem = runtime::local_problem([&] {
    WEAVE_CHECK(!m.pending, "moe low-latency dispatch: dispatch ", m.calls,
                " has not been combined yet; dispatch and combine alternate (the combine tells every rank that the "
                "call's buffers are free)");
    WEAVE_CHECK(T >= 0 && T <= cf.max_tokens, "moe low-latency dispatch: T = ", T,
                " tokens outside 0..max_tokens (", cf.max_tokens, ")");
    if (T == 0) return;
    WEAVE_CHECK(is_aligned(x), "moe low-latency dispatch: x (", static_cast<const void*>(x),
                ") must be 16-byte aligned");
    WEAVE_CHECK(is_aligned(topk_idx, 4), "moe low-latency dispatch: topk_idx (", static_cast<const void*>(topk_idx),
                ") must be 4-byte aligned");
    m.c.check_buffer("moe low-latency dispatch", "x", x, static_cast<size_t>(T) * cf.hidden * sizeof(bf16));
    m.c.check_buffer("moe low-latency dispatch", "topk_idx", topk_idx, static_cast<size_t>(T) * cf.topk * sizeof(int));
  });
  m.c.agree_call("moe.ll.dispatch", "E, H, k, max_tokens", {cf.experts, cf.hidden, cf.topk, cf.max_tokens}, problem,
                 s);
  const bool cap = runtime::capturing(s);
  m.order.before(s, cap);
  ll::LlArgs a = m.base;
  a.x = x, a.idx = topk_idx, a.T = T;
  a.sig = m.dsig.view();
  a.round = m.dsig.next_round(s, cap);  // taken only by a launched call (a rejected one leaves no gap)
  a.per_round = m.per_round();
  launch_pdl(ll::ll_dispatch, m.blocks, kLlThreads, s, a);
  m.order.after(s, cap);
  m.pending = true;
  m.last_T = T;
  ++m.calls;
  LowLatencyDispatched d;
  d.rows = m.recv;
  d.counts = m.counts;
  d.src_counts = m.src_counts;
  d.src_offsets = m.src_offsets;
  d.meta = m.meta;
  d.row_stride = m.stride;
  d.local_experts = m.g.local_experts();
  d.world = m.g.world;
  d.hidden = cf.hidden;
  d.tokens = T;
  d.failed = m.state + ll::kLlStateFailed;
  d.call = m.calls;
  return d;
}

void MoeLowLatency::combine(const bf16* y, const float* topk_weights, bf16* out, int T, cudaStream_t s) {
  Impl& m = *impl_;
  const LowLatencyConfig& cf = m.cfg;
  const std::string problem = runtime::local_problem([&] {
    WEAVE_CHECK(m.pending, "moe low-latency combine: no dispatch to combine (every dispatch is combined once)");
    WEAVE_CHECK(T == m.last_T, "moe low-latency combine: T = ", T, " but the dispatch had ", m.last_T, " tokens");
    // y is read for the peers' tokens too, whatever this rank's T.
    WEAVE_CHECK(is_aligned(y), "moe low-latency combine: y (", static_cast<const void*>(y),
                ") must be 16-byte aligned");
    m.c.check_buffer("moe low-latency combine", "y (L x row_stride x H)", y,
                     static_cast<size_t>(m.g.local_experts()) * m.stride * cf.hidden * sizeof(bf16));
    if (T == 0) return;
    WEAVE_CHECK(is_aligned(out), "moe low-latency combine: out (", static_cast<const void*>(out),
                ") must be 16-byte aligned");
    WEAVE_CHECK(is_aligned(topk_weights, 4), "moe low-latency combine: topk_weights (",
                static_cast<const void*>(topk_weights), ") must be 4-byte aligned");
    m.c.check_buffer("moe low-latency combine", "topk_weights", topk_weights,
                     static_cast<size_t>(T) * cf.topk * sizeof(float));
    m.c.check_buffer("moe low-latency combine", "out", out, static_cast<size_t>(T) * cf.hidden * sizeof(bf16));
  });
  m.c.agree_call("moe.ll.combine", "E, H, k, max_tokens", {cf.experts, cf.hidden, cf.topk, cf.max_tokens}, problem,
                 s);
  const bool cap = runtime::capturing(s);
  m.order.before(s, cap);
  ll::LlArgs a = m.base;
  a.y = y, a.w = topk_weights, a.out = out, a.T = T;
  a.sig = m.csig.view();
  a.round = m.csig.next_round(s, cap);
  a.per_round = m.per_round();
  launch_pdl(ll::ll_combine, m.blocks, kLlThreads, s, a);
  m.order.after(s, cap);
  m.pending = false;
}

void MoeLowLatency::check(cudaStream_t s) {
  Impl& m = *impl_;
  WEAVE_CHECK(!runtime::capturing(s), "moe low-latency check: the stream is capturing a CUDA graph; check() waits for "
              "the GPU, call it outside the capture (after a replay)");
  m.c.sync(s);
  LlVerdict v;
  WEAVE_CUDA_CHECK(cudaMemcpyAsync(&v, m.record, sizeof v, cudaMemcpyDeviceToHost, s));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
  if (v.ok()) return;
  const LlVerdict none{};
  WEAVE_CUDA_CHECK(cudaMemcpyAsync(m.record, &none, sizeof none, cudaMemcpyHostToDevice, s));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
  throw Error(v.message());
}

void swiglu_strided(const bf16* G, bf16* Hout, const int* counts, int L, int row_stride, int F, cudaStream_t stream) {
  WEAVE_CHECK(F > 0 && F % 8 == 0, "moe swiglu_strided: F = ", F, " must be a positive multiple of 8 (16-byte vectors)");
  WEAVE_CHECK(L >= 1 && row_stride >= 1, "moe swiglu_strided: L = ", L, " experts of row_stride ", row_stride,
              ", want both >= 1");
  WEAVE_CHECK(is_aligned(G) && is_aligned(Hout), "moe swiglu_strided: G (", static_cast<const void*>(G), ") and H (",
              static_cast<const void*>(Hout), ") must be 16-byte aligned");
  WEAVE_CHECK(counts != nullptr && is_aligned(counts, 4), "moe swiglu_strided: counts must be 4-byte aligned device memory");
  const long long rows = static_cast<long long>(L) * row_stride;
  check_extent("moe swiglu_strided", "G", G, size_t(rows) * 2 * F * sizeof(bf16));
  check_extent("moe swiglu_strided", "Hout", Hout, size_t(rows) * F * sizeof(bf16));
  check_extent("moe swiglu_strided", "counts", counts, size_t(L) * sizeof(int));
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  constexpr int kWarps = ll::kSwigluThreads / 32;
  const int grid = static_cast<int>(std::max<long long>(1, std::min<long long>((rows + kWarps - 1) / kWarps, 8LL * sms)));
  ll::ll_swiglu<<<grid, ll::kSwigluThreads, 0, stream>>>(reinterpret_cast<const uint4*>(G),
                                                         reinterpret_cast<uint4*>(Hout), counts, L, row_stride, F / 8);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace weave::moe
