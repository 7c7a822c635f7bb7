// The 128 x w tiles: one kernel per width, with and without bias (split-K only without).
#include "gemm/run.cuh"
#include "gemm/wide.hpp"
#include "weave/common/error.hpp"

namespace weave::gemm::detail {

namespace {

using bf16 = __nv_bfloat16;

template <int W, bool Bias>
using Wide = GemmKernel<W, BLayout::NK, wide_stages(W), 1, 1, ALayout::MK, bf16, Bias>;

template <int W>
lcsc::Plan run_width(const bf16* A, const bf16* B, bf16* C, int M, int N, int K, const Options& opt, int group_m,
                     cudaStream_t stream, const Launch& split) {
  static_assert(lcsc::shared_bytes<Wide<W, true>>() <= 232448, "227 KB");
  if (opt.bias_type != BiasType::None) return run<Wide<W, true>>(A, B, C, M, N, K, opt, group_m, stream);
  return run<Wide<W, false>>(A, B, C, M, N, K, opt, group_m, stream, split);
}

}  // namespace

lcsc::Plan run_wide(const bf16* A, const bf16* B, bf16* C, int M, int N, int K, const Options& opt, int group_m,
                    cudaStream_t stream, const Launch& split) {
  switch (split.width) {
    case 96: return run_width<96>(A, B, C, M, N, K, opt, group_m, stream, split);
    case 112: return run_width<112>(A, B, C, M, N, K, opt, group_m, stream, split);
    case 144: return run_width<144>(A, B, C, M, N, K, opt, group_m, stream, split);
    case 160: return run_width<160>(A, B, C, M, N, K, opt, group_m, stream, split);
    case 176: return run_width<176>(A, B, C, M, N, K, opt, group_m, stream, split);
    case 208: return run_width<208>(A, B, C, M, N, K, opt, group_m, stream, split);
    default: WEAVE_CHECK(false, "gemm: no 128 x ", split.width, " tile (widths: ", wide_widths_text(), ")");
  }
  return {};
}

}  // namespace weave::gemm::detail
