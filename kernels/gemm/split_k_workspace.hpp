// The split-K workspace: fp32 partial slots and zeroed counters, cached per (device, stream).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace weave::gemm {

// Kernels on one stream run in order, so they can share one workspace; kernels on two streams
// cannot, hence one per stream. Returns false where it may not allocate (the stream is being
// captured into a CUDA graph and what exists is too small: a graph must not capture an allocation
// of its own); the caller then runs without split-K. Buffers a capture used are never freed (a
// later growth allocates beside them): the graph's replays still write them.
struct SplitKWorkspace {
  float* partials = nullptr;
  int* counters = nullptr;
};
bool split_k_workspace(cudaStream_t stream, size_t partial_bytes, size_t counter_bytes, SplitKWorkspace& out);

}  // namespace weave::gemm
