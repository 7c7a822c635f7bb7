// The gathered attention kernel's launch on every SM of the current device, for K (a
// GatheredKernel, or an extension of it) with parameters G (GatheredGlobals, or an extension),
// after plan_gathered (gathered.hpp) filled the tile order.
#pragma once
#include <cuda_runtime.h>

#include "gathered_attention/gathered.hpp"
#include "gathered_attention/gathered_kernel.cuh"
#include "weave/common/error.hpp"
#include "weave/lcsc.cuh"

namespace weave::attention {

template <class K, class G>
void launch_gathered_kernel(const G& g, cudaStream_t stream) {
  static_assert(sizeof(G) <= 32764, "kernel parameters are limited to 32764 bytes");
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  const lcsc::DeviceInfo info = lcsc::device_info(dev);
  WEAVE_CHECK(K::kSmemBytes <= info.smem_optin, "attention: kernel needs ", K::kSmemBytes,
              " bytes of shared memory per block but the device allows ", info.smem_optin);
  for (int t = 0; t < g.n_push; ++t)
    WEAVE_CHECK(g.push[t].box_bytes <= K::kBoxMax, "attention: push box of ", g.push[t].box_bytes, " bytes");
  static bool attr_set[64] = {};
  if (dev >= 64 || !attr_set[dev]) {
    WEAVE_CUDA_CHECK(cudaFuncSetAttribute(gathered_attention_kernel<K, G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(K::kSmemBytes)));
    if (dev < 64) attr_set[dev] = true;
  }
  gathered_attention_kernel<K, G><<<static_cast<unsigned>(info.sm_count), K::kThreads, K::kSmemBytes, stream>>>(g);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace weave::attention
