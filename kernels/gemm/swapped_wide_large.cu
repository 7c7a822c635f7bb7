// The swapped 128 x w tiles of w = 160 and 192 (swapped_wide.cu, swapped_wide_mid.cu and swapped_wide_odd.cu
// have the others).
#include "gemm/swapped_wide.cuh"

namespace weave::gemm::detail {

WEAVE_SWAPPED_WIDTH(160);
WEAVE_SWAPPED_WIDTH(192);

}  // namespace weave::gemm::detail
