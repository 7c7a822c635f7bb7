// Host entry of the fused gemm_combine (gemm_combine.hpp): argument checks agreed across ranks,
// the landing buffer and signal set, the GEMM launch (GemmCombineKernel) and the final sum.
#include <algorithm>

#include "gemm/gemm.hpp"
#include "moe/gemm_combine.hpp"
#include "moe/gemm_combine_kernel.cuh"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/lcsc.cuh"
#include "weave/pdl.cuh"
#include "weave/runtime/call.hpp"

namespace weave::moe {

using bf16 = __nv_bfloat16;

struct MoeGemmCombine::Impl {
  MoeExchange& ex;
  runtime::Communicator& c;
  runtime::SymmetricTensor<bf16> landing;
  runtime::SignalSet sig;
  runtime::CallOrder order;
  unsigned long long last_call = 0;  // the dispatch the last run consumed (one run per dispatch)
  // Signals this rank's counter has received over all launched calls: W x compute blocks per call.
  // A running total rather than round x per_round, since a caller's max_compute_blocks may change
  // the count from one call to the next (every rank agrees on each call's, agree_call); a device
  // cell once a call was captured.
  runtime::RunningCounts landed{1};

  static size_t landing_elems(const ExchangeConfig& cf) {
    return std::max<size_t>(static_cast<size_t>(cf.max_tokens) * cf.topk * cf.hidden, 8);
  }
  explicit Impl(MoeExchange& e)
      : ex(e),
        c(e.communicator()),
        landing(c, landing_elems(e.config())),
        sig(c.signals("moe.gemm_combine", 1)) {}
};

MoeGemmCombine::MoeGemmCombine(MoeExchange& ex) : impl_(std::make_unique<Impl>(ex)) {
  device_status();  // the GEMM's status words, made here rather than in a graph capture
}
MoeGemmCombine::~MoeGemmCombine() = default;

bf16* MoeGemmCombine::landing() const { return impl_->landing.data(); }
MoeExchange& MoeGemmCombine::exchange() const { return impl_->ex; }

std::string MoeGemmCombine::problem(const Dispatched* d, const bf16* h, const bf16* W_down, int F,
                                    const float* topk_weights, const bf16* out, int T,
                                    const GroupedGemmOptions& opt) const {
  const Impl& m = *impl_;
  return runtime::local_problem([&] {
    const ExchangeConfig& cf = m.ex.config();
    const int L = cf.experts / m.c.world(), H = cf.hidden, R = cf.capacity, k = cf.topk;
    WEAVE_CHECK(opt.layout == gemm::BLayout::NK,
                "moe gemm_combine: W_down must be L x H x F (nn.Linear's out x in, BLayout::NK)");
    WEAVE_CHECK(opt.lcsc.num_comm_sms == 0, "moe gemm_combine: num_comm_sms must be 0 (the rows leave through the "
                "compute blocks' idle warps), got ", opt.lcsc.num_comm_sms);
    WEAVE_CHECK(T >= 0 && T <= cf.max_tokens, "moe gemm_combine: T = ", T, " tokens outside 0..max_tokens (",
                cf.max_tokens, ")");
    if (d) {
      WEAVE_CHECK(d->rows == m.ex.expert_input() && d->call >= 1 && d->call <= m.ex.dispatches(),
                  "moe gemm_combine: the Dispatched is not from this combine's exchange");
      WEAVE_CHECK(d->call == m.ex.dispatches(), "moe gemm_combine: the Dispatched is from dispatch ", d->call,
                  " but the exchange's latest is ", m.ex.dispatches(), " (its rows and metadata are overwritten)");
      WEAVE_CHECK(d->call != m.last_call, "moe gemm_combine: dispatch ", d->call,
                  " was already combined (one gemm_combine per dispatch: peers write the landing buffers "
                  "only after the next dispatch's count exchange)");
      WEAVE_CHECK(d->tokens == T, "moe gemm_combine: T = ", T, " but the dispatch had ", d->tokens, " tokens");
    }
    // The GEMM's own checks (N = H, K = F); its counts come from the dispatch (E = L ints).
    validate_grouped(h, W_down, m.landing.data(), reinterpret_cast<const int*>(16), L, H, F, R);
    const size_t b = sizeof(bf16);
    check_extent("moe gemm_combine", "h", h, static_cast<size_t>(R) * F * b);
    check_extent("moe gemm_combine", "W_down", W_down, static_cast<size_t>(L) * H * F * b);
    if (opt.status) check_extent("moe gemm_combine", "status", opt.status, kStatusWords * sizeof(int));
    if (T == 0) return;
    WEAVE_CHECK(is_aligned(out), "moe gemm_combine: out (", static_cast<const void*>(out),
                ") must be 16-byte aligned");
    m.c.check_buffer("moe gemm_combine", "topk_weights", topk_weights, static_cast<size_t>(T) * k * sizeof(float));
    m.c.check_buffer("moe gemm_combine", "out", out, static_cast<size_t>(T) * H * b);
  });
}

void MoeGemmCombine::run(const Dispatched& d, const bf16* h, const bf16* W_down, int F, const float* topk_weights,
                         bf16* out, int T, cudaStream_t s, const GroupedGemmOptions& opt) {
  Impl& m = *impl_;
  const ExchangeConfig& cf = m.ex.config();
  const int W = m.c.world(), L = cf.experts / W, H = cf.hidden, R = cf.capacity, k = cf.topk;
  // At most the smallest SM count of all ranks: every rank launches the same number of compute blocks
  // (what the final sum's expected count assumes).
  const lcsc::Config cfg = fused_grouped_config(opt, m.ex.min_sm_count());
  CombineGlobals g{};
  // From the shape alone (the grid sized for the most tiles the capacity allows), so that a rank
  // whose arguments are refused still agrees on it and its peers hear the refusal itself.
  const int blocks = lcsc::plan_for<GemmCombineKernel>(max_work(R, L, gemm::ceil_div(H, kGroupedBN)), cfg).compute_blocks;
  std::string prob = problem(&d, h, W_down, F, topk_weights, out, T, opt);
  if (prob.empty()) {
    prob = runtime::local_problem([&] {
      const int group_m = opt.group_m > 0 ? opt.group_m : gemm::default_group_m(gemm::Tile::M128N256, F);
      static_cast<GroupedGlobals&>(g) =
          grouped_globals(gemm::BLayout::NK, h, W_down, nullptr, d.counts, L, H, F, R, group_m,
                          opt.status ? opt.status : device_status());
      const runtime::PeerPtrs pl = m.c.peers(m.landing.data(), m.landing.bytes());
      for (int r = 0; r < W; ++r) g.landing[r] = static_cast<bf16*>(pl[r]);
      g.meta = d.meta;
      g.landed = m.sig.view();
      g.topk = k;
      g.max_tokens = cf.max_tokens;
    });
  }
  // The compute block count is part of the plan: every rank's final sum counts W x blocks signals.
  m.c.agree_call("moe.gemm_combine", "E, H, k, F, capacity, max_tokens, compute blocks",
                 {cf.experts, H, k, F, R, cf.max_tokens, blocks}, prob, s);
  const bool cap = runtime::capturing(s);
  m.order.before(s, cap);
  const Round expected = m.landed.advance({landed_per_round(W, blocks)}, s, cap)[0];
  const lcsc::Plan p = lcsc::launch<GemmCombineKernel>(g, cfg, s);
  WEAVE_CHECK(p.compute_blocks == blocks && p.comm_blocks == 0, "moe gemm_combine: launched ", p.compute_blocks,
              " compute blocks, planned ", blocks);
  SumArgs a{};
  a.landing = m.landing.data();
  a.w = topk_weights;
  a.out = out;
  a.failed = d.failed;
  a.T = T, a.k = k, a.H = H;
  a.landed = m.sig.view();
  a.expected = expected;
  // One warp per token, up to four blocks of 512 threads per SM (a full SM: the sum is bound by
  // the loads in flight); at least one block, so that the call ends (in stream order) only once
  // every peer's pushes into this rank are complete, whatever T is.
  const int warps = kSumThreads / 32;
  const int sum_blocks = std::max(1, std::min(4 * m.c.sm_count(), (T + warps - 1) / warps));
  launch_pdl(sum_landed, sum_blocks, kSumThreads, s, a);
  m.order.after(s, cap);
  m.last_call = d.call;
}

}  // namespace weave::moe
