// The fp8 GEMM's swapped 128 x w tiles: one e4m3 x e4m3 kernel per width of gemm::kSwappedWidths
// (plain and split-K), with the bf16 GEMM's stage counts (a stage holds as many bytes).
#include "gemm/gemm.hpp"
#include "gemm/swapped_wide.hpp"
#include "gemm/wide.hpp"
#include "gemm_fp8/run.cuh"
#include "gemm_fp8/wide_fp8.hpp"

namespace weave::gemm_fp8::detail {

namespace {

template <int W>
using SwappedWide = GemmFp8Kernel<tile::fp8e4m3, tile::fp8e4m3, W, gemm::detail::swapped_wide_stages(W), 128, true>;

template <int W>
lcsc::Plan run_width(const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K, const float* sa,
                     const float* sb, const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  static_assert(lcsc::shared_bytes<gemm::SplitKKernel<SwappedWide<W>>>() <= 232448, "227 KB");
  // The kernel's A is the weights (its M = N), its B the tokens (its N = M).
  return run<SwappedWide<W>>(B, A, C, N, M, K, sb, sa, opt, group_m, stream, split);
}

}  // namespace

lcsc::Plan run_swapped_wide(const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K, const float* sa,
                            const float* sb, const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  return gemm::detail::with_width<gemm::kSwappedWidths>(split.width, "gemm_fp8 (swapped)", [&](auto w) {
    return run_width<decltype(w)::value>(A, B, C, M, N, K, sa, sb, opt, group_m, stream, split);
  });
}

}  // namespace weave::gemm_fp8::detail
