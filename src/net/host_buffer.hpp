// Host memory of the network path (internal to src/net): mapped pinned memory (cudaHostAlloc,
// visible to kernels through cudaHostGetDevicePointer) for the GPU path, ordinary page-aligned
// memory otherwise, so that the CPU tests make no CUDA call. Zeroed. Used by the proxy (ring,
// flags, control block) and by NetPath (the bounce buffers).
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "weave/common/error.hpp"

namespace weave::net {

class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(size_t bytes, bool mapped) : bytes_((bytes + 4095) / 4096 * 4096), mapped_(mapped) {
    if (mapped_)
      WEAVE_CUDA_CHECK(cudaHostAlloc(&p_, bytes_, cudaHostAllocMapped | cudaHostAllocPortable));
    else
      p_ = std::aligned_alloc(4096, bytes_);
    if (!p_) throw Error(detail::concat("weave::net: cannot allocate ", bytes_, " bytes of host memory"));
    std::memset(p_, 0, bytes_);
  }
  ~HostBuffer() {
    if (p_ && mapped_) cudaFreeHost(p_);
    if (p_ && !mapped_) std::free(p_);
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    std::swap(mapped_, o.mapped_);
    return *this;
  }
  char* get() const { return static_cast<char*>(p_); }
  size_t bytes() const { return bytes_; }
  bool mapped() const { return mapped_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  bool mapped_ = false;
};

}  // namespace weave::net
