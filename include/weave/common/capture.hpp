// Whether a stream is capturing a CUDA graph: what every enqueue that allocates, counts on the host
// or picks per-stream scratch asks first.
#pragma once
#include <cuda_runtime.h>

#include "weave/common/error.hpp"

namespace weave {

// Invalidated captures count as capturing: their enqueues fail like the capture's others.
inline bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  WEAVE_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  return st != cudaStreamCaptureStatusNone;
}

}  // namespace weave
