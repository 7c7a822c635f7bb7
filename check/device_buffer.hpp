// An owned device array for tests and benchmarks: cudaMalloc'd, freed on scope exit.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "weave/common/error.hpp"

namespace weave::check {

template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    WEAVE_CUDA_CHECK(cudaMalloc(&p, (count ? count : 1) * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace weave::check
