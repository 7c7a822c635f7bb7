// The swapped 256 x w tiles (Tile::SwappedW256): 256 weight rows per tile, each consumer two m64
// accumulators over the same token operand, the transposed output staged in two parts.
#include "gemm/run.cuh"
#include "gemm/swapped_wide.hpp"
#include "gemm/wide.hpp"

namespace weave::gemm::detail {

namespace {

template <int Width>
using SwappedWide256 = GemmKernel<Width, BLayout::NK, swapped256_stages(Width), 2, 1, ALayout::MK, __nv_bfloat16,
                                  false, 256, true>;

}  // namespace

lcsc::Plan run_swapped_wide256(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* C, int M, int N, int K,
                               const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  return with_width<kSwapped256Widths>(split.width, "gemm (swapped 256)", [&](auto w) {
    using Kern = SwappedWide256<decltype(w)::value>;
    static_assert(lcsc::shared_bytes<Kern>() <= 232448, "227 KB");
    // The kernel's M is the weights' rows (N), its N the tokens (M).
    return run<Kern>(W, X, C, N, M, K, opt, group_m, stream);
  });
}

}  // namespace weave::gemm::detail
