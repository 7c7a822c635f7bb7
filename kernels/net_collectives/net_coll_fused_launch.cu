// The fused kernel's instantiations, in a translation unit of their own: beside the G = 1 kernel
// they changed the compiler's inlining of the shared device code there (28 bytes of spills in its
// fp32 form, ptxas -v), alone neither spills.
#include <cuda_bf16.h>

#include "net_collectives/net_coll_fused_launch.hpp"
#include "net_collectives/net_coll_fused_kernel.cuh"

namespace weave::net::coll {

void launch_fused(const FusedArgs& f, bool bf16, cudaStream_t stream) {
  const dim3 grid(f.roles.grid()), block(256);
  if (bf16)
    net_coll_fused_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(f);
  else
    net_coll_fused_kernel<float><<<grid, block, 0, stream>>>(f);
}

}  // namespace weave::net::coll
