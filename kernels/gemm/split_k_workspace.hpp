// The split-K workspace: fp32 partial slots and counters for one split launch.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace weave::gemm {

struct SplitKWorkspace {
  float* partials = nullptr;
  int* counters = nullptr;  // zero when a launch starts (each launch leaves its counters zero)
};

// Eager launches take the buffers cached per (device, stream): kernels on one stream run in order,
// so they can share them; kernels on two streams cannot, hence one per stream. A launch captured
// into a CUDA graph takes buffers that the graph owns (a CUDA user object returns them to a spare
// list once the graph and its executables are destroyed and their launches done), shared only
// with the other launches of that capture on that stream: graphs captured on one stream,
// replayed on different streams at once and beside eager launches there, share nothing. Two
// executables instantiated from one graph share its buffers: launch them in order.
SplitKWorkspace split_k_workspace(cudaStream_t stream, size_t partial_bytes, size_t counter_bytes);

}  // namespace weave::gemm
