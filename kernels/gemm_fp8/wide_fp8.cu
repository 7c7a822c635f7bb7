// The fp8 GEMM's 128 x w tiles: one e4m3 x e4m3 kernel per width (plain and split-K).
#include "gemm/gemm.hpp"
#include "gemm/wide.hpp"
#include "gemm_fp8/run.cuh"
#include "gemm_fp8/wide_fp8.hpp"

namespace weave::gemm_fp8::detail {

namespace {

template <int W>
using Wide = GemmFp8Kernel<tile::fp8e4m3, tile::fp8e4m3, W, gemm::detail::wide_stages(W)>;

template <int W>
lcsc::Plan run_width(const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K, const float* sa,
                     const float* sb, const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  static_assert(lcsc::shared_bytes<Wide<W>>() <= 232448, "227 KB");
  return run<Wide<W>>(A, B, C, M, N, K, sa, sb, opt, group_m, stream, split);
}

}  // namespace

lcsc::Plan run_wide(const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K, const float* sa,
                    const float* sb, const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  return gemm::detail::with_width(split.width, "gemm_fp8", [&](auto w) {
    return run_width<decltype(w)::value>(A, B, C, M, N, K, sa, sb, opt, group_m, stream, split);
  });
}

}  // namespace weave::gemm_fp8::detail
