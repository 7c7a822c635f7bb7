// Whole-array copies between a device array and a host vector, for the GPU tests' host-side
// references and checks (synchronous).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "weave/common/error.hpp"

namespace weave::check {

template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

template <class T>
void to_device(T* d, const std::vector<T>& h) {
  WEAVE_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}

}  // namespace weave::check
