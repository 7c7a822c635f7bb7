// The fp8 GEMM's 128 x w tiles: one kernel per width (plain and split-K) for e4m3 x e4m3 and for
// the gradients' e5m2 x e4m3.
#include "gemm/gemm.hpp"
#include "gemm/wide.hpp"
#include "gemm_fp8/run.cuh"
#include "gemm_fp8/wide_fp8.hpp"

namespace weave::gemm_fp8::detail {

namespace {

template <class TA, int W>
using Wide = GemmFp8Kernel<TA, tile::fp8e4m3, W, gemm::detail::wide_stages(W)>;

template <class TA, int W>
lcsc::Plan run_width(const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K, const float* sa,
                     const float* sb, const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  static_assert(lcsc::shared_bytes<Wide<TA, W>>() <= 232448, "227 KB");
  return run<Wide<TA, W>>(A, B, C, M, N, K, sa, sb, opt, group_m, stream, split);
}

}  // namespace

lcsc::Plan run_wide(Fp8 ta, const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K, const float* sa,
                    const float* sb, const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  return gemm::detail::with_width(split.width, "gemm_fp8", [&](auto w) {
    constexpr int W = decltype(w)::value;
    if (ta == Fp8::E5M2) return run_width<tile::fp8e5m2, W>(A, B, C, M, N, K, sa, sb, opt, group_m, stream, split);
    return run_width<tile::fp8e4m3, W>(A, B, C, M, N, K, sa, sb, opt, group_m, stream, split);
  });
}

}  // namespace weave::gemm_fp8::detail
