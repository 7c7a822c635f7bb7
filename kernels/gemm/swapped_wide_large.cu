// The swapped 128 x w tiles of w = 160 and 192 (swapped_wide.cu, swapped_wide_mid.cu and swapped_wide_odd.cu
// have the others).
#include "gemm/swapped_wide.cuh"

namespace weave::gemm::detail {

template lcsc::Plan run_swapped_width<160>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int, int,
                                           const Options&, int, cudaStream_t, const Launch&);
template lcsc::Plan run_swapped_width<192>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int, int,
                                           const Options&, int, cudaStream_t, const Launch&);

}  // namespace weave::gemm::detail
