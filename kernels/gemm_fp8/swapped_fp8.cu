// Instantiations of the swapped decode kernel for fp8: the three operand type pairs x the
// configurations swapped::config() picks, bf16 output.
#include "gemm/swapped_launch.cuh"
#include "gemm_fp8/swapped_fp8.hpp"

namespace weave::gemm_fp8 {

lcsc::Plan launch_swapped(Fp8 ta, Fp8 tb, const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K,
                          const float* scale_a, const float* scale_b, int sm_count, cudaStream_t stream) {
  using namespace gemm::swapped;
  Params p{A, B, C, nullptr, 0, 0, M, N, K, scale_a, scale_b};
  // The kernel's A operand is the weight (the GEMM's B), its B operand the tokens (the GEMM's A).
  const bool we5 = tb == Fp8::E5M2, xe5 = ta == Fp8::E5M2;
  if (we5) return launch_config<Fp8Op<true, false>, __nv_bfloat16>(p, sm_count, stream);
  if (xe5) return launch_config<Fp8Op<false, true>, __nv_bfloat16>(p, sm_count, stream);
  return launch_config<Fp8Op<false, false>, __nv_bfloat16>(p, sm_count, stream);
}

}  // namespace weave::gemm_fp8
