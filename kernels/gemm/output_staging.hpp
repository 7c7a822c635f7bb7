// How a GEMM tile stages its output for the TMA store (gemm_kernel.cuh, gemm_fp8_kernel.cuh): in
// 128-byte column blocks with the 128B swizzle, or, for a tile width off the 64-column grid (the
// 128 x w tiles), as one dense block of the whole width without the swizzle.
#pragma once
#include "weave/tile/swizzle.hpp"

namespace weave::gemm {

template <int BN, int ElemBytes>
struct OutputStaging {
  static constexpr bool kDense = BN % 64 != 0;
  static constexpr int kBlockCols = kDense ? BN : 128 / ElemBytes;  // the store box's inner extent
  static constexpr tile::Swizzle kSwizzle = kDense ? tile::Swizzle::None : tile::Swizzle::B128;
};

}  // namespace weave::gemm
