// The swapped 128 x w tiles of w = 144, 176 and 208, the widths off the 32-token grid above 128
// (swapped_wide.cu, swapped_wide_mid.cu and swapped_wide_large.cu have the others).
#include "gemm/swapped_wide.cuh"

namespace weave::gemm::detail {

template lcsc::Plan run_swapped_width<144>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int, int,
                                           const Options&, int, cudaStream_t, const Launch&);
template lcsc::Plan run_swapped_width<176>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int, int,
                                           const Options&, int, cudaStream_t, const Launch&);
template lcsc::Plan run_swapped_width<208>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int, int,
                                           const Options&, int, cudaStream_t, const Launch&);

}  // namespace weave::gemm::detail
