// The 128 x w tiles (Tile::M128Nw, w in kWideWidths): their launch, instantiated in wide.cu so that
// gemm.cu's translation unit does not grow by sixteen kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <utility>

#include "gemm/gemm.hpp"
#include "weave/common/error.hpp"

namespace weave::gemm::detail {

// Stages of a 128 x w tile: as many as fit beside the dense staging tile (128 x w bf16), at most
// 6: w = 96-112 get 6, 144-160 5, 176-208 4. A stage is (128 + w) rows of 128 bytes (64 bf16 or
// 128 fp8 of K), so the fp8 GEMM's 128 x w tiles take the same count.
constexpr int wide_stages(int w) {
  const int budget = 227 * 1024 - 2048;  // less the barriers and alignment slack
  const int stages = (budget - 128 * w * 2) / ((128 + w) * 128);
  return stages > 6 ? 6 : stages;
}

// f(std::integral_constant<int, w>{}) for the run-time width w, which must be one of Widths
// (kWideWidths, or kSwappedWidths; else a weave::Error naming `who` and the widths): how the bf16
// and fp8 GEMMs pick their 128 x w (or swapped 128 x w) instantiation.
template <const auto& Widths, class F, size_t... I>
auto with_width_at(int w, const char* who, F& f, std::index_sequence<I...>) {
  using R = decltype(f(std::integral_constant<int, Widths[0]>{}));
  R r{};
  const bool found = ((w == Widths[I] ? (r = f(std::integral_constant<int, Widths[I]>{}), true) : false) || ...);
  WEAVE_CHECK(found, who, ": no 128 x ", w, " tile (widths: ", widths_text(Widths, std::size(Widths)), ")");
  return r;
}
template <const auto& Widths = kWideWidths, class F>
auto with_width(int w, const char* who, F&& f) {
  return with_width_at<Widths>(w, who, f, std::make_index_sequence<std::size(Widths)>{});
}

// A M x K, B N x K, bf16 C; opt's bias (if any); split.splits > 1 (no bias) splits the last round.
lcsc::Plan run_wide(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K,
                    const Options& opt, int group_m, cudaStream_t stream, const Launch& split);

}  // namespace weave::gemm::detail
