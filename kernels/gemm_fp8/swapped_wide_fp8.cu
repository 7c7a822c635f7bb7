// The fp8 GEMM's swapped 128 x w tiles: one kernel per width of gemm::kSwappedWidths (plain and
// split-K) for e4m3 tokens and for the gradients' e5m2 ones (e4m3 weights), with the bf16 GEMM's
// stage counts (a stage holds as many bytes).
#include "gemm/gemm.hpp"
#include "gemm/swapped_wide.hpp"
#include "gemm/wide.hpp"
#include "gemm_fp8/run.cuh"
#include "gemm_fp8/wide_fp8.hpp"

namespace weave::gemm_fp8::detail {

namespace {

// TX: the tokens' type, the kernel's B.
template <class TX, int W>
using SwappedWide = GemmFp8Kernel<tile::fp8e4m3, TX, W, gemm::detail::swapped_wide_stages(W), 128, true>;

template <class TX, int W>
lcsc::Plan run_width(const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K, const float* sa,
                     const float* sb, const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  static_assert(lcsc::shared_bytes<gemm::SplitKKernel<SwappedWide<TX, W>>>() <= 232448, "227 KB");
  // The kernel's A is the weights (its M = N), its B the tokens (its N = M).
  return run<SwappedWide<TX, W>>(B, A, C, N, M, K, sb, sa, opt, group_m, stream, split);
}

}  // namespace

lcsc::Plan run_swapped_wide(Fp8 ta, const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K,
                            const float* sa, const float* sb, const Options& opt, int group_m, cudaStream_t stream,
                            const Launch& split) {
  return gemm::detail::with_width<gemm::kSwappedWidths>(split.width, "gemm_fp8 (swapped)", [&](auto w) {
    constexpr int W = decltype(w)::value;
    if (ta == Fp8::E5M2) return run_width<tile::fp8e5m2, W>(A, B, C, M, N, K, sa, sb, opt, group_m, stream, split);
    return run_width<tile::fp8e4m3, W>(A, B, C, M, N, K, sa, sb, opt, group_m, stream, split);
  });
}

}  // namespace weave::gemm_fp8::detail
