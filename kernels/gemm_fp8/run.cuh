// The launch of one fp8 GEMM kernel instantiation: tensor maps, globals, split-K when asked.
// Included by the fp8 GEMM's translation units (gemm_fp8.cu, wide_fp8.cu), which instantiate it.
#pragma once
#include "gemm/split_k_launch.cuh"
#include "gemm_fp8/gemm_fp8.hpp"
#include "gemm_fp8/gemm_fp8_kernel.cuh"
#include "weave/lcsc.cuh"
#include "weave/tile/tma.hpp"

namespace weave::gemm_fp8::detail {

template <class Kern>
lcsc::Plan run(const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K, const float* sa, const float* sb,
               const Options& opt, int group_m, cudaStream_t stream, Launch split = {}) {
  using tile::Swizzle;
  constexpr CUtensorMapDataType u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;  // TMA has no fp8 type; bytes are exact
  Fp8Globals g{};
  g.a = tile::encode(tile::tma_2d(u8, 1, A, M, K, K, Kern::BM, Kern::BK, Swizzle::B128));
  g.b = tile::encode(tile::tma_2d(u8, 1, B, N, K, K, Kern::kBRowsPerCta, Kern::BK, Swizzle::B128));
  if constexpr (Kern::kTransOut)  // C is N x M here (the caller swapped the operands): BN rows of 64 columns
    g.c = tile::encode(tile::tma_2d(static_cast<const __nv_bfloat16*>(C), N, M, M, Kern::BN, 64, Swizzle::B128));
  else
    g.c = tile::encode(tile::tma_2d(static_cast<const __nv_bfloat16*>(C), M, N, N, Kern::BM, Kern::kOutBlockCols,
                                    Kern::kOutSwizzle));
  g.scale_a = sa;
  g.scale_b = sb;
  g.M = M;
  g.N = N;
  g.K = K;
  g.tiles_m = gemm::ceil_div(M, Kern::BM);
  g.tiles_n = gemm::ceil_div(N, Kern::BN);
  g.group_m = group_m;
  g.kblocks = k_blocks(K);
  g.accumulate = 0;
  // The per-tensor 128x256, 128 x w, swapped 128 x w and 64x128 tiles split, and the block-scaled ones.
  if constexpr (Kern::BN == 256 || Kern::kDenseOut || Kern::kTransOut || Kern::BM == 64 || Kern::kBlockScales)
    if (split.splits > 1) return gemm::launch_split_k<Kern>(g, C, split.workers, split.splits, opt.lcsc, stream);
  return lcsc::launch<Kern>(g, opt.lcsc, stream);
}

}  // namespace weave::gemm_fp8::detail
