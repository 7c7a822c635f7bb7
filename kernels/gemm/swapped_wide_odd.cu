// The swapped 128 x w tiles of w = 144, 176 and 208, the widths off the 32-token grid above 128
// (swapped_wide.cu, swapped_wide_mid.cu and swapped_wide_large.cu have the others).
#include "gemm/swapped_wide.cuh"

namespace weave::gemm::detail {

WEAVE_SWAPPED_WIDTH(144);
WEAVE_SWAPPED_WIDTH(176);
WEAVE_SWAPPED_WIDTH(208);

}  // namespace weave::gemm::detail
