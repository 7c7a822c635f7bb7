// The swapped 256 x w tiles (Tile::SwappedW256) of w = 128 to 176, and the run-time width's dispatch:
// 256 weight rows per tile, each consumer two m64 accumulators over the same token operand, the
// transposed output staged in two parts.
#include "gemm/swapped_wide.cuh"
#include "gemm/wide.hpp"

namespace weave::gemm::detail {

WEAVE_SWAPPED256_WIDTH(128);
WEAVE_SWAPPED256_WIDTH(144);
WEAVE_SWAPPED256_WIDTH(160);
WEAVE_SWAPPED256_WIDTH(176);

lcsc::Plan run_swapped_wide256(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* C, int M, int N, int K,
                               const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  return with_width<kSwapped256Widths>(split.width, "gemm (swapped 256)", [&](auto w) {
    return run_swapped256_width<decltype(w)::value>(X, W, C, M, N, K, opt, group_m, stream);
  });
}

}  // namespace weave::gemm::detail
