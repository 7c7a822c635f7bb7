// The definitions of run_swapped_width and run_swapped256_width (swapped_wide.hpp), for the
// translation units that instantiate their widths.
#pragma once
#include "gemm/run.cuh"
#include "gemm/split_k.cuh"
#include "gemm/swapped_wide.hpp"

namespace weave::gemm::detail {

// Cluster = 2: two CTAs on adjacent weight panels share the token tile, each loading half of it
// and multicasting (gemm_kernel.cuh), for pitches off the 128-byte grid; Cluster = 4 (forward
// weights only) four CTAs, a quarter each. WL: the weights as the
// kernel's A, N x K (MK: a forward X W^T) or K x N (KM: an input gradient dY W).
template <int Width, int Cluster, ALayout WL = ALayout::MK>
using SwappedWide =
    GemmKernel<Width, BLayout::NK, swapped_wide_stages(Width), 1, Cluster, WL, __nv_bfloat16, false, 128, true>;

template <int Width, ALayout WL>
lcsc::Plan run_swapped_layout(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* C, int M, int N, int K,
                              const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  static_assert(lcsc::shared_bytes<SplitKKernel<SwappedWide<Width, 1, WL>>>() <= 232448, "227 KB");
  // The kernel's M is the weights' rows (N), its N the tokens (M).
  if constexpr (swapped_width_quads(Width) && WL == ALayout::MK) {
    if (split.cluster == 4) return run<SwappedWide<Width, 4, WL>>(W, X, C, N, M, K, opt, group_m, stream, split);
  } else {
    WEAVE_CHECK(split.cluster != 4, "gemm: the swapped 128 x ", Width,
                " tile runs in 4-CTA clusters only at a width that is a multiple of 32, weights as N x K");
  }
  if constexpr (swapped_width_clusters(Width)) {
    static_assert(lcsc::shared_bytes<SplitKKernel<SwappedWide<Width, 2, WL>>>() <= 232448, "227 KB");
    if (split.cluster == 2) return run<SwappedWide<Width, 2, WL>>(W, X, C, N, M, K, opt, group_m, stream, split);
  } else {
    WEAVE_CHECK(split.cluster != 2, "gemm: the swapped 128 x ", Width, " tile runs in single CTAs only");
  }
  return run<SwappedWide<Width, 1, WL>>(W, X, C, N, M, K, opt, group_m, stream, split);
}

template <int Width>
lcsc::Plan run_swapped_width(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* C, int M, int N, int K,
                             BLayout wl, const Options& opt, int group_m, cudaStream_t stream, const Launch& split) {
  if (wl == BLayout::KN)
    return run_swapped_layout<Width, ALayout::KM>(X, W, C, M, N, K, opt, group_m, stream, split);
  return run_swapped_layout<Width, ALayout::MK>(X, W, C, M, N, K, opt, group_m, stream, split);
}

template <int Width>
using SwappedWide256 =
    GemmKernel<Width, BLayout::NK, swapped256_stages(Width), 2, 1, ALayout::MK, __nv_bfloat16, false, 256, true>;

template <int Width>
lcsc::Plan run_swapped256_width(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* C, int M, int N,
                                int K, const Options& opt, int group_m, cudaStream_t stream) {
  static_assert(lcsc::shared_bytes<SwappedWide256<Width>>() <= 232448, "227 KB");
  return run<SwappedWide256<Width>>(W, X, C, N, M, K, opt, group_m, stream);
}

// One width's explicit instantiation, for the translation units that split the widths between them.
#define WEAVE_SWAPPED_WIDTH(W)                                                                             \
  template lcsc::Plan run_swapped_width<W>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int, \
                                           int, BLayout, const Options&, int, cudaStream_t, const Launch&)
#define WEAVE_SWAPPED256_WIDTH(W)                                                                          \
  template lcsc::Plan run_swapped256_width<W>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, \
                                              int, int, const Options&, int, cudaStream_t)

}  // namespace weave::gemm::detail
