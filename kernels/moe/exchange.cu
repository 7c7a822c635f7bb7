// Host entry of the non-fused MoE dispatch and combine: argument checks, cross-rank agreement,
// the exchange's buffers and signal sets, five launches per dispatch and three per combine.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moe/exchange.hpp"
#include "moe/exchange_kernels.cuh"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/runtime/call.hpp"

namespace weave::moe {

using detail::bf16;

namespace {


void check_config(const ExchangeConfig& c, int world) {
  WEAVE_CHECK(c.experts > 0 && c.experts % world == 0, "moe exchange: ", c.experts,
              " experts do not divide among ", world, " ranks");
  WEAVE_CHECK(c.experts <= kMaxExchangeExperts, "moe exchange: at most ", kMaxExchangeExperts, " experts, got ",
              c.experts);
  WEAVE_CHECK(c.hidden > 0 && c.hidden % 8 == 0, "moe exchange: hidden size ", c.hidden,
              " must be a positive multiple of 8 (rows move as 16-byte vectors)");
  WEAVE_CHECK(c.topk >= 1 && c.topk <= kMaxTopk, "moe exchange: top-k ", c.topk, " outside 1..", kMaxTopk);
  WEAVE_CHECK(c.max_tokens >= 0, "moe exchange: negative max_tokens ", c.max_tokens);
  WEAVE_CHECK(static_cast<long long>(c.max_tokens) * c.topk < INT_MAX, "moe exchange: max_tokens x top-k (",
              static_cast<long long>(c.max_tokens) * c.topk, ") must fit in int32");
  WEAVE_CHECK(c.capacity > 0, "moe exchange: capacity must be positive, got ", c.capacity);
}

}  // namespace

struct MoeExchange::Impl {
  runtime::Communicator& c;
  ExchangeConfig cfg;
  Geometry g;
  int blocks = 1;  // the smallest SM count of all ranks: every rank's push / combine grid
  runtime::SymmetricTensor<int> mat;
  runtime::SymmetricTensor<bf16> xrecv;
  runtime::SymmetricTensor<RowMeta> meta;
  std::optional<runtime::SymmetricTensor<bf16>> yout;
  runtime::SignalSet dsig, csig;
  // The fused dispatch's counters (dispatch_gemm_schedule.hpp): L arrivals, then L ready.
  runtime::SignalSet fsig;
  // Expected totals over the calls launched (device cells once a call was captured): dsig counter 1
  // (push blocks' signals, non-fused calls only), then fsig's arrivals and ready counts (fused calls
  // only; a call's aux warp count may differ from the last's), and the dispatch's round (dsig's
  // own round cell is left unused: one advance per call instead of two).
  enum Total { kPushed, kArrive, kReady, kRound, kTotals };
  runtime::RunningCounts totals;
  runtime::CallOrder order;
  // Local scratch, one allocation: hist, base, plan, counts, offsets, status, record, send order,
  // slist, the totals' cells.
  void* local = nullptr;
  int *hist = nullptr, *base = nullptr, *counts = nullptr, *offsets = nullptr, *status = nullptr, *send_order = nullptr;
  int2 *plan = nullptr, *slist = nullptr;
  Verdict* record = nullptr;
  int last_T = -1;  // the last dispatch's T (combine must match), -1 before the first
  unsigned long long calls = 0;  // dispatches launched

  Impl(runtime::Communicator& comm, const ExchangeConfig& conf)
      : c(comm),
        cfg(conf),
        g{comm.world(), conf.experts},
        mat(comm, 2 * static_cast<size_t>(comm.world()) * row_ints(conf.experts)),
        xrecv(comm, static_cast<size_t>(conf.capacity) * conf.hidden),
        meta(comm, static_cast<size_t>(conf.capacity)),
        dsig(comm.signals("moe.dispatch", 2)),
        csig(comm.signals("moe.combine", 2)),
        fsig(comm.signals("moe.dispatch_gemm", 2 * (conf.experts / comm.world()))) {  // check_config: E % W == 0
    if (cfg.output_buffer) yout.emplace(comm, static_cast<size_t>(cfg.capacity) * cfg.hidden);
    std::vector<int> sms(c.world());
    const int mine = c.sm_count();
    c.bootstrap().all_gather(&mine, sms.data(), sizeof mine);
    blocks = *std::min_element(sms.begin(), sms.end());

    const int E = cfg.experts, L = g.local_experts();
    const size_t chunks = std::max(num_chunks(static_cast<long long>(cfg.max_tokens) * cfg.topk), 1);
    auto round16 = [](size_t b) { return (b + 15) / 16 * 16; };
    const size_t b_hist = round16(chunks * E * sizeof(int)), b_base = round16(E * sizeof(int)),
                 b_plan = round16(std::max<size_t>(static_cast<size_t>(cfg.max_tokens) * cfg.topk, 1) * sizeof(int2)),
                 b_counts = round16(L * sizeof(int)), b_offsets = round16((L + 1) * sizeof(int)),
                 b_status = round16(detail::kStatusWords * sizeof(int)), b_record = round16(sizeof(Verdict)),
                 b_order = round16((E + 1) * sizeof(int)), b_totals = round16(kTotals * sizeof(unsigned long long));
    WEAVE_CUDA_CHECK(cudaMalloc(&local, b_hist + b_base + b_plan + b_counts + b_offsets + b_status + b_record + b_order +
                                            b_plan + b_totals));
    char* p = static_cast<char*>(local);
    hist = reinterpret_cast<int*>(p), p += b_hist;
    base = reinterpret_cast<int*>(p), p += b_base;
    plan = reinterpret_cast<int2*>(p), p += b_plan;
    counts = reinterpret_cast<int*>(p), p += b_counts;
    offsets = reinterpret_cast<int*>(p), p += b_offsets;
    status = reinterpret_cast<int*>(p), p += b_status;
    record = reinterpret_cast<Verdict*>(p), p += b_record;
    send_order = reinterpret_cast<int*>(p), p += b_order;
    slist = reinterpret_cast<int2*>(p), p += b_plan;
    totals = runtime::RunningCounts(reinterpret_cast<unsigned long long*>(p), kTotals);
    const int st[detail::kStatusWords] = {0, 0, INT_MAX, 0};
    const Verdict none{};
    WEAVE_CUDA_CHECK(cudaMemset(local, 0, b_hist + b_base + b_plan + b_counts + b_offsets));
    WEAVE_CUDA_CHECK(cudaMemset(p, 0, b_totals));
    WEAVE_CUDA_CHECK(cudaMemcpy(status, st, sizeof st, cudaMemcpyHostToDevice));
    WEAVE_CUDA_CHECK(cudaMemcpy(record, &none, sizeof none, cudaMemcpyHostToDevice));
  }
  ~Impl() {
    // A call may still run here or on a peer (writing into this rank's buffers, or waiting for
    // its signals): the signal sets' destructors quiesce every rank; the local scratch waits.
    cudaDeviceSynchronize();
    cudaFree(local);
  }
};

MoeExchange::MoeExchange(runtime::Communicator& comm, const ExchangeConfig& cfg) {
  comm.check_same("moe exchange config (E, H, k, max_tokens, capacity, output_buffer)",
                  {cfg.experts, cfg.hidden, cfg.topk, cfg.max_tokens, cfg.capacity, cfg.output_buffer ? 1 : 0});
  check_config(cfg, comm.world());  // the same config everywhere: every rank throws alike
  impl_ = std::make_unique<Impl>(comm, cfg);
}

MoeExchange::~MoeExchange() = default;

bf16* MoeExchange::expert_input() const { return impl_->xrecv.data(); }
bf16* MoeExchange::expert_output() const { return impl_->yout ? impl_->yout->data() : nullptr; }
const ExchangeConfig& MoeExchange::config() const { return impl_->cfg; }
unsigned long long MoeExchange::dispatches() const { return impl_->calls; }
runtime::Communicator& MoeExchange::communicator() const { return impl_->c; }
int MoeExchange::min_sm_count() const { return impl_->blocks; }

Dispatched MoeExchange::dispatch(const bf16* x, const int* topk_idx, int T, cudaStream_t s) {
  return dispatch(x, topk_idx, T, s, FusedDispatch{});
}

Dispatched MoeExchange::dispatch(const bf16* x, const int* topk_idx, int T, cudaStream_t s,
                                 const FusedDispatch& fused) {
  Impl& m = *impl_;
  const bool fuse = static_cast<bool>(fused.launch);
  const ExchangeConfig& cf = m.cfg;
  const std::string problem = runtime::local_problem([&] {
    WEAVE_CHECK(T >= 0 && T <= cf.max_tokens, "moe dispatch: T = ", T, " tokens outside 0..max_tokens (",
                cf.max_tokens, ")");
    if (T == 0) return;
    WEAVE_CHECK(is_aligned(x), "moe dispatch: x (", static_cast<const void*>(x), ") must be 16-byte aligned");
    m.c.check_buffer("moe dispatch", "x", x, static_cast<size_t>(T) * cf.hidden * sizeof(bf16));
    m.c.check_buffer("moe dispatch", "topk_idx", topk_idx, static_cast<size_t>(T) * cf.topk * sizeof(int));
  });
  // A fused call is its own operator: its name, values and problem (a FusedDispatch{} has none).
  std::vector<long long> values{cf.experts, cf.hidden, cf.topk, cf.max_tokens, cf.capacity};
  values.insert(values.end(), fused.values.begin(), fused.values.end());
  m.c.agree_call(fuse ? fused.op : "moe.dispatch",
                 "E, H, k, max_tokens, capacity" + (fuse ? ", " + fused.what : std::string()), values,
                 problem.empty() ? fused.problem : problem, s);
  const bool cap = runtime::capturing(s);
  m.order.before(s, cap);
  detail::DispatchArgs a{};
  a.x = x;
  a.idx = topk_idx;
  a.T = T, a.k = cf.topk, a.H = cf.hidden, a.capacity = cf.capacity;
  a.g = m.g;
  a.hist = m.hist, a.base = m.base, a.plan = m.plan, a.counts = m.counts, a.offsets = m.offsets;
  a.status = m.status, a.record = m.record;
  const runtime::PeerPtrs pm = m.c.peers(m.mat.data(), m.mat.bytes());
  const runtime::PeerPtrs px = m.c.peers(m.xrecv.data(), m.xrecv.bytes());
  const runtime::PeerPtrs pr = m.c.peers(m.meta.data(), m.meta.bytes());
  for (int r = 0; r < m.c.world(); ++r) {
    a.mat[r] = static_cast<int*>(pm[r]);
    a.xrecv[r] = static_cast<bf16*>(px[r]);
    a.meta[r] = static_cast<RowMeta*>(pr[r]);
  }
  a.sig = m.dsig.view();
  // Taken only by a launched call (a rejected one leaves no gap), on the device once some call was
  // captured (runtime::RunningCounts).
  const unsigned long long pushes = fuse ? 0 : static_cast<unsigned long long>(m.c.world()) * m.blocks;
  const runtime::RunningCounts::Counts tot = m.totals.advance(
      {pushes, fuse ? arrivals_per_call(m.c.world(), fused.aux_warps) : 0, fuse ? ready_per_call(fused.aux_warps) : 0,
       1},
      s, cap);
  a.round = tot[Impl::kRound];
  a.pushed_expected = tot[Impl::kPushed];
  const int walk_blocks =
      std::max(1, (num_chunks(static_cast<long long>(T) * cf.topk) + detail::kWalkWarps - 1) / detail::kWalkWarps);
  launch_pdl(detail::route_walk<false>, walk_blocks, detail::kWalkWarps * 32, s, a);
  if (fuse) {
    a.order = m.send_order;
    a.slist = m.slist;
    a.fsig = m.fsig.view();
    a.arrive_expected = tot[Impl::kArrive];
    a.ready_expected = tot[Impl::kReady];
  }
  launch_pdl(detail::exchange_counts, 1, detail::kCountThreads, s, a);
  launch_pdl(detail::route_walk<true>, walk_blocks, detail::kWalkWarps * 32, s, a);
  if (fuse) {
    fused.launch(a, s);
  } else {
    launch_pdl(detail::push_rows, m.blocks, detail::kPushThreads, s, a);
    launch_pdl(detail::dup_rows, m.blocks, detail::kPushThreads, s, a);
  }
  m.order.after(s, cap);
  m.last_T = T;
  ++m.calls;
  Dispatched d;
  d.rows = m.xrecv.data();
  d.counts = m.counts;
  d.offsets = m.offsets;
  d.meta = m.meta.data();
  d.capacity = cf.capacity;
  d.local_experts = m.g.local_experts();
  d.failed = m.status + detail::kStatusFailed;
  d.tokens = T;
  d.call = m.calls;
  return d;
}

void MoeExchange::combine(const bf16* y, const float* topk_weights, bf16* out, int T, cudaStream_t s) {
  Impl& m = *impl_;
  const ExchangeConfig& cf = m.cfg;
  runtime::PeerPtrs py{};
  const std::string problem = runtime::local_problem([&] {
    WEAVE_CHECK(m.last_T >= 0, "moe combine: no dispatch on this exchange yet");
    WEAVE_CHECK(T == m.last_T, "moe combine: T = ", T, " but the last dispatch had ", m.last_T, " tokens");
    WEAVE_CHECK(is_aligned(y), "moe combine: y (", static_cast<const void*>(y), ") must be 16-byte aligned");
    try {
      py = m.c.peers(y, static_cast<size_t>(cf.capacity) * cf.hidden * sizeof(bf16));
    } catch (const Error& e) {
      throw Error(std::string(e.what()) +
                  " (moe combine: y must be in the symmetric heap or registered, capacity x H bf16; "
                  "expert_output() is one)");
    }
    if (T == 0) return;
    WEAVE_CHECK(is_aligned(out), "moe combine: out (", static_cast<const void*>(out), ") must be 16-byte aligned");
    m.c.check_buffer("moe combine", "topk_weights", topk_weights, static_cast<size_t>(T) * cf.topk * sizeof(float));
    m.c.check_buffer("moe combine", "out", out, static_cast<size_t>(T) * cf.hidden * sizeof(bf16));
  });
  m.c.agree_call("moe.combine", "E, H, k, max_tokens, capacity",
                 {cf.experts, cf.hidden, cf.topk, cf.max_tokens, cf.capacity}, problem, s, {y});
  const bool cap = runtime::capturing(s);
  m.order.before(s, cap);
  detail::CombineArgs a{};
  for (int r = 0; r < m.c.world(); ++r) a.y[r] = static_cast<const bf16*>(py[r]);
  a.w = topk_weights;
  a.plan = m.plan;
  a.out = out;
  a.status = m.status;
  a.T = T, a.k = cf.topk, a.H = cf.hidden;
  a.sig = m.csig.view();
  a.round = m.csig.next_round(s, cap);
  a.blocks = m.blocks;
  launch_pdl(detail::combine_arrive, 1, 32, s, a);
  launch_pdl(detail::combine_rows, m.blocks, detail::kPushThreads, s, a);
  launch_pdl(detail::combine_done, 1, 32, s, a);
  m.order.after(s, cap);
}

void MoeExchange::check(cudaStream_t s) {
  Impl& m = *impl_;
  WEAVE_CHECK(!runtime::capturing(s), "moe check: the stream is capturing a CUDA graph; check() waits for the GPU, "
              "call it outside the capture (after a replay)");
  m.c.sync(s);
  Verdict v;
  WEAVE_CUDA_CHECK(cudaMemcpyAsync(&v, m.record, sizeof v, cudaMemcpyDeviceToHost, s));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
  if (v.ok()) return;
  const Verdict none{};
  WEAVE_CUDA_CHECK(cudaMemcpyAsync(m.record, &none, sizeof none, cudaMemcpyHostToDevice, s));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
  throw Error(v.message());
}

}  // namespace weave::moe
