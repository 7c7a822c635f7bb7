// The swapped 256 x w tiles of w = 96 to 120 (swapped_wide256.cu has the wider ones and the dispatch).
#include "gemm/swapped_wide.cuh"

namespace weave::gemm::detail {

WEAVE_SWAPPED256_WIDTH(96);
WEAVE_SWAPPED256_WIDTH(104);
WEAVE_SWAPPED256_WIDTH(112);
WEAVE_SWAPPED256_WIDTH(120);

}  // namespace weave::gemm::detail
