// The swapped 128 x w tiles of w = 32, 64, 96 and 128, and the run-time width's dispatch.
#include "gemm/swapped_wide.cuh"
#include "gemm/wide.hpp"

namespace weave::gemm::detail {

WEAVE_SWAPPED_WIDTH(32);
WEAVE_SWAPPED_WIDTH(64);
WEAVE_SWAPPED_WIDTH(96);
WEAVE_SWAPPED_WIDTH(128);

int swapped_quad_clusters(const lcsc::Config& cfg) {
  return lcsc::plan_for<SwappedWide<96, 4>>(1LL << 40, cfg).compute_blocks / 4;
}

lcsc::Plan run_swapped_wide(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* C, int M, int N, int K,
                            BLayout wl, const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  return with_width<kSwappedWidths>(split.width, "gemm (swapped)", [&](auto w) {
    return run_swapped_width<decltype(w)::value>(X, W, C, M, N, K, wl, opt, group_m, stream, split);
  });
}

}  // namespace weave::gemm::detail
