// Host entry of the fused kernel (net_coll_fused_kernel.cuh): the launch alone; the caller checks
// the launch error.
#pragma once
#include <cuda_runtime.h>

namespace weave::net::coll {

struct FusedArgs;
void launch_fused(const FusedArgs& f, bool bf16, cudaStream_t stream);

}  // namespace weave::net::coll
