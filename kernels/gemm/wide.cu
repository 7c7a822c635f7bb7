// The 128 x w tiles: one kernel per width, with and without bias (split-K only without).
#include "gemm/run.cuh"
#include "gemm/wide.hpp"

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
  return with_width(split.width, "gemm", [&](auto w) {
    return run_width<decltype(w)::value>(A, B, C, M, N, K, opt, group_m, stream, split);
  });
}

}  // namespace weave::gemm::detail
