// The bf16 swapped decode kernel's instantiations: the configurations swapped::config() picks x
// bf16 / fp32 output (small kernels: the set compiles in seconds).
#include "gemm/swapped.hpp"
#include "gemm/swapped_launch.cuh"

namespace weave::gemm::swapped {

lcsc::Plan launch(const Params& p, bool c_f32, int sm_count, cudaStream_t stream) {
  return c_f32 ? launch_config<Bf16Op, float>(p, sm_count, stream)
               : launch_config<Bf16Op, __nv_bfloat16>(p, sm_count, stream);
}

}  // namespace weave::gemm::swapped
