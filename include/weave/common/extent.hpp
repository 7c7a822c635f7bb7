// Whether [p, p + bytes) lies inside one device allocation, for entry points that take raw
// pointers: their sizes follow from the shape, and a buffer shorter than that must be an error
// before the launch, not an out-of-bounds access inside it.
#pragma once
#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "weave/common/driver.hpp"
#include "weave/common/error.hpp"

namespace weave {

// Whether p is a multiple of `align` bytes (TMA base addresses and 16-byte vector accesses need 16).
inline bool is_aligned(const void* p, size_t align = 16) { return reinterpret_cast<uintptr_t>(p) % align == 0; }

// Throws weave::Error naming `who` and `name` when p is not device memory, or when the
// allocation holding p ends before p + bytes. The allocation is the one the driver knows
// (cudaMalloc's, a VMM mapping, a caching allocator's whole segment: a short tensor carved from a
// larger segment is caught only when it runs past the segment).
inline void check_extent(const char* who, const char* name, const void* p, size_t bytes) {
  if (bytes == 0) return;
  WEAVE_CHECK(p != nullptr, who, ": ", name, " is a null pointer");
  CUdeviceptr base = 0;
  size_t size = 0;
  const CUresult r = drv().memGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(p));
  WEAVE_CHECK(r == CUDA_SUCCESS, who, ": ", name, " (", p, ") is not in device memory this process can use (",
              driver_error_string(r), ")");
  const size_t off = reinterpret_cast<CUdeviceptr>(p) - base;
  WEAVE_CHECK(off + bytes <= size, who, ": ", name, " needs ", bytes, " bytes from ", p, " but its allocation ends ",
              size - off, " bytes after it");
}

}  // namespace weave
