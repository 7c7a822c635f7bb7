// GEMM + reduce-scatter with fp8 inputs: the fused kernel's instantiation (host side in gemm_rs.cu).
#include "gemm_rs/gemm_rs_kernel.cuh"

namespace weave::tp {

lcsc::Plan launch_rs_fp8(const RsGlobalsFp8& g, const lcsc::Config& cfg, cudaStream_t s) {
  return lcsc::launch<RsKernelFp8>(g, cfg, s);
}

}  // namespace weave::tp
