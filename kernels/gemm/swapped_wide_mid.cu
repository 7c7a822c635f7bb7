// The swapped 128 x w tiles of w = 104, 112 and 120, between 96 and 128 (swapped_wide.cu,
// swapped_wide_large.cu and swapped_wide_odd.cu have the others).
#include "gemm/swapped_wide.cuh"

namespace weave::gemm::detail {

WEAVE_SWAPPED_WIDTH(104);
WEAVE_SWAPPED_WIDTH(112);
WEAVE_SWAPPED_WIDTH(120);

}  // namespace weave::gemm::detail
