// Host entry of the fused dispatch_gemm (dispatch_gemm.hpp): the GEMM's argument checks joined to
// the dispatch's agreement, and the kernel (DispatchGemmKernel) in place of the dispatch's push and
// duplication kernels.
#include <algorithm>

#include "gemm/gemm.hpp"
#include "moe/dispatch_gemm.hpp"
#include "moe/dispatch_gemm_kernel.cuh"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/lcsc.cuh"
#include "weave/runtime/call.hpp"

namespace weave::moe {

using bf16 = __nv_bfloat16;

std::string dispatch_gemm_problem(const MoeExchange& ex, const bf16* W, int N, const bf16* Y,
                                  const GroupedGemmOptions& opt) {
  return runtime::local_problem([&] {
    const ExchangeConfig& cf = ex.config();
    const int L = cf.experts / ex.communicator().world(), H = cf.hidden, R = cf.capacity;
    WEAVE_CHECK(opt.layout == gemm::BLayout::NK,
                "moe dispatch_gemm: W must be L x N x H (nn.Linear's out x in, BLayout::NK)");
    WEAVE_CHECK(opt.lcsc.num_comm_sms == 0, "moe dispatch_gemm: num_comm_sms must be 0 (the rows move through the "
                "compute blocks' idle warps), got ", opt.lcsc.num_comm_sms);
    validate_grouped(ex.expert_input(), W, Y, reinterpret_cast<const int*>(16), L, N, H, R);
    const size_t b = sizeof(bf16);
    check_extent("moe dispatch_gemm", "W", W, static_cast<size_t>(L) * N * H * b);
    check_extent("moe dispatch_gemm", "Y", Y, static_cast<size_t>(R) * N * b);
    if (opt.status) check_extent("moe dispatch_gemm", "status", opt.status, kStatusWords * sizeof(int));
  });
}

Dispatched dispatch_gemm(MoeExchange& ex, const bf16* x, const int* topk_idx, int T, const bf16* W, int N, bf16* Y,
                         cudaStream_t s, const GroupedGemmOptions& opt) {
  const ExchangeConfig& cf = ex.config();
  const int L = cf.experts / ex.communicator().world(), H = cf.hidden, R = cf.capacity;
  const lcsc::Config cfg = fused_grouped_config(opt, ex.min_sm_count());
  // From the shape alone, so that a rank whose arguments are refused still agrees on it (a
  // non-positive N, which the checks refuse, must not make the plan throw first, on this rank alone).
  const int blocks =
      lcsc::plan_for<DispatchGemmKernel>(max_work(R, L, gemm::ceil_div(std::max(N, 0), kGroupedBN)), cfg).compute_blocks;
  FusedDispatch f;
  f.op = "moe.dispatch_gemm";
  f.what = "N, compute blocks";
  f.values = {N, blocks};
  f.problem = dispatch_gemm_problem(ex, W, N, Y, opt);
  f.aux_warps = blocks * kAuxWarps;
  f.launch = [&](const detail::DispatchArgs& a, cudaStream_t st) {
    DispatchGemmGlobals g{};
    const int group_m = opt.group_m > 0 ? opt.group_m : gemm::default_group_m(gemm::Tile::M128N256, H);
    static_cast<GroupedGlobals&>(g) = grouped_globals(gemm::BLayout::NK, ex.expert_input(), W, Y, a.counts, L, N, H,
                                                      R, group_m, opt.status ? opt.status : device_status());
    g.x = a.x;
    g.plan = a.plan;
    g.slist = a.slist;
    g.order = a.order;
    g.offsets = a.offsets;
    g.failed = a.status + detail::kStatusFailed;
    for (int r = 0; r < a.g.world; ++r) {
      g.xrecv[r] = a.xrecv[r];
      g.meta[r] = a.meta[r];
    }
    g.sig = a.fsig;
    g.arrive_expected = a.arrive_expected;
    g.ready_expected = a.ready_expected;
    g.k = a.k;
    g.hidden = a.H;
    const lcsc::Plan p = lcsc::launch<DispatchGemmKernel>(g, cfg, st);
    WEAVE_CHECK(p.compute_blocks == blocks && p.comm_blocks == 0, "moe dispatch_gemm: launched ", p.compute_blocks,
                " compute blocks, planned ", blocks);
  };
  return ex.dispatch(x, topk_idx, T, s, f);
}

}  // namespace weave::moe
