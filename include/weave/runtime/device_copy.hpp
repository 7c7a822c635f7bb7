// Device-to-device copies on a stream as a kernel, not cudaMemcpyAsync: every weave call's first
// kernel is a programmatic launch (pdl.cuh), and such a launch right behind a memcpy on the stream
// holds the host until the copy has run, so a memcpy between two calls (a staging buffer filled or
// emptied) made each call wait for the GPU (docs/perf-notes.md, 2026-12-08).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace weave::runtime {

// `bytes` from src to dst (device memory of the current device, or peer memory it maps; the ranges
// must not overlap), ordered on `s` like any kernel; a programmatic launch itself (it waits for
// the kernel before it). Capturable in a CUDA graph. Accesses of 16 bytes where dst and src share
// their offset within 16 bytes, else of the widest grain they share (copy_split.hpp).
void device_copy(void* dst, const void* src, size_t bytes, cudaStream_t s);

// `rows` rows of `width` bytes, row i from src + i * spitch to dst + i * dpitch (cudaMemcpy2DAsync's
// arguments, with no limit on the pitches; a row wider than a pitch is an error), as device_copy
// copies one.
void device_copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
                    cudaStream_t s);

}  // namespace weave::runtime
