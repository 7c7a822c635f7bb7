// AllGather + GEMM with fp8 inputs: the fused kernel's instantiation (host side in ag_gemm.cu).
#include "ag_gemm/ag_gemm_kernel.cuh"

namespace weave::tp {

lcsc::Plan launch_ag_fp8(const AgGlobalsFp8& g, const lcsc::Config& cfg, cudaStream_t s) {
  return lcsc::launch<AgKernelFp8>(g, cfg, s);
}

}  // namespace weave::tp
