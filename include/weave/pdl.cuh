// Programmatic dependent launch (PDL): a kernel launched with launch_pdl may be scheduled while
// the kernel before it on the stream is still running; pdl_enter() holds every thread until that
// kernel has completed and its writes are visible, then lets the next PDL kernel be scheduled.
// What it saves is the launch latency between back-to-back short kernels (block scheduling and
// kernel setup overlap the previous kernel's tail): the whole fixed cost of a small collective is
// a few microseconds, and about one of them is that gap (docs/perf-notes.md, session 5).
//
// Rule for a kernel launched with launch_pdl: pdl_enter() before its first global memory access;
// without it nothing guarantees that the kernel before it has finished (its own exit still holds
// the kernel after it). A kernel launched plainly needs no call: it waits for its predecessor and
// holds its successor. $WEAVE_PDL=0 launches without the attribute (A/B measurements, escape hatch).
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "weave/common/error.hpp"
#include "weave/memory_order.cuh"

namespace weave {

__device__ __forceinline__ void pdl_enter() {
  griddep_wait();
  griddep_launch_dependents();
}

// While one lives, launches from its thread go without the attribute. For a kernel right behind a
// cudaMemcpyAsync on the stream: there a programmatic launch holds the host until the copy has run
// (ag_gemm v9's own-rows copy then its all_gather: 139 µs of host time per call with PDL, 23
// without; perf-notes 22). weave's own device-to-device copies are kernels for that reason
// (runtime/device_copy.hpp).
class PdlOff {
 public:
  PdlOff() { ++depth(); }
  ~PdlOff() { --depth(); }
  PdlOff(const PdlOff&) = delete;
  PdlOff& operator=(const PdlOff&) = delete;
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
};

// $WEAVE_PDL through the host runtime's environment reader (src/runtime/env.cpp), so that every
// variable weave reads is in its one table; programs that launch with launch_pdl link weave_runtime.
bool pdl_allowed_by_env();

inline bool pdl_enabled() { return pdl_allowed_by_env() && PdlOff::depth() == 0; }

// kernel<<<grid, block, 0, s>>>(args...) with programmatic stream serialization allowed, then the
// launch error check.
template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  WEAVE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace weave
