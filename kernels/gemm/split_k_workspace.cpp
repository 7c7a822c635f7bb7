// The split-K workspace cache (split_k_launch.cuh): one per (device, stream), grown on demand.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "gemm/split_k_workspace.hpp"
#include "weave/common/error.hpp"

namespace weave::gemm {

namespace {
struct Buffers {
  void* partials = nullptr;
  void* counters = nullptr;
  size_t partial_bytes = 0, counter_bytes = 0;
  bool captured = false;  // a CUDA graph captured kernels that use these: never freed
};
}  // namespace

bool split_k_workspace(cudaStream_t stream, size_t partial_bytes, size_t counter_bytes, SplitKWorkspace& out) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, Buffers> cache;  // kept for the process's life
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  Buffers& b = cache[{dev, stream}];
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  WEAVE_CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
  if (b.partial_bytes < partial_bytes || b.counter_bytes < counter_bytes) {
    if (cap != cudaStreamCaptureStatusNone) return false;
    // Stream-ordered: the old buffers are freed after the kernels already queued on this stream,
    // unless a graph captured kernels that use them (its replays would write freed memory): those
    // stay allocated for the process's life.
    if (b.partials && !b.captured) WEAVE_CUDA_CHECK(cudaFreeAsync(b.partials, stream));
    if (b.counters && !b.captured) WEAVE_CUDA_CHECK(cudaFreeAsync(b.counters, stream));
    b = Buffers{};
    const size_t pb = partial_bytes > 0 ? partial_bytes : 16, cb = counter_bytes > 0 ? counter_bytes : 16;
    WEAVE_CUDA_CHECK(cudaMallocAsync(&b.partials, pb, stream));
    WEAVE_CUDA_CHECK(cudaMallocAsync(&b.counters, cb, stream));
    WEAVE_CUDA_CHECK(cudaMemsetAsync(b.counters, 0, cb, stream));  // the kernels keep them zero
    b.partial_bytes = pb;
    b.counter_bytes = cb;
  }
  if (cap != cudaStreamCaptureStatusNone) b.captured = true;
  out.partials = static_cast<float*>(b.partials);
  out.counters = static_cast<int*>(b.counters);
  return true;
}

}  // namespace weave::gemm
