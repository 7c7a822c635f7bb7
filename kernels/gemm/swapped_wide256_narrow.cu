// The swapped 256 x w tiles of w = 96 to 120 (swapped_wide256.cu has the wider ones and the dispatch).
#include "gemm/swapped_wide.cuh"

namespace weave::gemm::detail {

template lcsc::Plan run_swapped256_width<96>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int,
                                             int, const Options&, int, cudaStream_t);
template lcsc::Plan run_swapped256_width<104>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int,
                                              int, const Options&, int, cudaStream_t);
template lcsc::Plan run_swapped256_width<112>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int,
                                              int, const Options&, int, cudaStream_t);
template lcsc::Plan run_swapped256_width<120>(const __nv_bfloat16*, const __nv_bfloat16*, __nv_bfloat16*, int, int,
                                              int, const Options&, int, cudaStream_t);

}  // namespace weave::gemm::detail
