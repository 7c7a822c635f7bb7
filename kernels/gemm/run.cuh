// The launch of one GEMM kernel instantiation: its tensor maps, its globals, and split-K when
// asked. Included by the GEMM's translation units (gemm.cu, wide.cu), which instantiate it.
#pragma once
#include "gemm/gemm.hpp"
#include "gemm/gemm_kernel.cuh"
#include "gemm/split_k_launch.cuh"
#include "weave/common/extent.hpp"
#include "weave/lcsc.cuh"
#include "weave/tile/tma.hpp"

namespace weave::gemm::detail {

// Split-K is instantiated for the 128x256 tiles (plain and clustered), the 128x192, 128x128, 128 x w
// and 64x128 tiles, with the default epilogue only, and for the swapped 128 x w tiles with the
// weights either way round: those are the tiles the planner splits (kernels/gemm/plan.hpp).
template <class Kern>
constexpr bool kSplittable = ((Kern::BN == 256 && Kern::kStages == 3) || Kern::BN == 192 || Kern::BN == 128 ||
                              Kern::kDenseOut || Kern::kTransOut) &&
                             Kern::kOutputParts == 1 && Kern::kPlainEpilogue &&
                             (Kern::kALayout == ALayout::MK || Kern::kTransOut);

template <class Kern, class OutT>
lcsc::Plan run(const __nv_bfloat16* A, const __nv_bfloat16* B, OutT* C, int M, int N, int K, const Options& opt, int group_m,
               cudaStream_t stream, Launch split = {}) {
  using tile::Swizzle;
  typename Kern::Globals g{};
  if constexpr (Kern::kALayout == ALayout::KM)
    g.a = tile::encode(tile::tma_2d(A, K, M, M, 64, 64, Swizzle::B128));  // one 64 x 64 box per consumer
  else
    g.a = tile::encode(tile::tma_2d(A, M, K, K, Kern::BM, 64, Swizzle::B128));
  if constexpr (Kern::kBLayout == BLayout::NK)
    g.b = tile::encode(tile::tma_2d(B, N, K, K, Kern::kBRowsPerCta, 64, Swizzle::B128));
  else
    g.b = tile::encode(tile::tma_2d(B, K, N, N, 64, 64, Swizzle::B128));
  if constexpr (Kern::kTransOut)  // C is N x M here (the caller swapped the operands): BN rows of 64 columns
    g.c = tile::encode(tile::tma_2d(static_cast<const OutT*>(C), N, M, M, Kern::BN, 64, Swizzle::B128));
  else
    g.c = tile::encode(
        tile::tma_2d(static_cast<const OutT*>(C), M, N, N, Kern::BM, Kern::kOutBlockCols, Kern::kOutSwizzle));
  if constexpr (!Kern::kPlainEpilogue) {
    g.bias = opt.bias_type == BiasType::None ? nullptr : opt.bias;
    g.bias_f32 = opt.bias_type == BiasType::F32 ? 1 : 0;
  }
  g.M = M;
  g.N = N;
  g.K = K;
  g.tiles_m = ceil_div(M, Kern::BM);
  g.tiles_n = ceil_div(N, Kern::BN);
  g.group_m = group_m;
  g.accumulate = opt.accumulate ? 1 : 0;
  if constexpr (kSplittable<Kern>)
    if (split.splits > 1)
      return launch_split_k<Kern>(g, static_cast<const OutT*>(C), split.workers, split.splits, opt.lcsc, stream);
  return lcsc::launch<Kern>(g, opt.lcsc, stream);
}

}  // namespace weave::gemm::detail
