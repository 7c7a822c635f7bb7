// A VMM range for tests and benchmarks, made as the symmetric heap makes its memory (cuMemCreate
// with a POSIX-fd handle, mapped into a reserved range, read-write on the current device), freed on
// scope exit: what copies into and out of the heap see, without a communicator.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "weave/common/driver.hpp"
#include "weave/common/error.hpp"

namespace weave::check {

struct VmmBuffer {
  CUdeviceptr va = 0;
  size_t size = 0;  // `bytes` rounded up to the allocation granularity
  CUmemGenericAllocationHandle h{};
  explicit VmmBuffer(size_t bytes) {
    int dev = 0;
    WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
    WEAVE_CUDA_CHECK(cudaFree(nullptr));  // the device's primary context
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    WEAVE_CU_CHECK(drv().memGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    size = (bytes + gran - 1) / gran * gran;
    WEAVE_CU_CHECK(drv().memCreate(&h, size, &prop, 0));
    WEAVE_CU_CHECK(drv().memAddressReserve(&va, size, 0, 0, 0));
    WEAVE_CU_CHECK(drv().memMap(va, size, 0, h, 0));
    CUmemAccessDesc acc{};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    WEAVE_CU_CHECK(drv().memSetAccess(va, size, &acc, 1));
  }
  ~VmmBuffer() {
    drv().memUnmap(va, size);
    drv().memAddressFree(va, size);
    drv().memRelease(h);
  }
  VmmBuffer(const VmmBuffer&) = delete;
  VmmBuffer& operator=(const VmmBuffer&) = delete;
  char* p() const { return reinterpret_cast<char*>(va); }
};

}  // namespace weave::check
