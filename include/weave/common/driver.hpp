// CUDA driver entry points, resolved through the runtime so that nothing links libcuda:
// binaries start (and CPU tests run) on machines with no GPU driver at all.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <type_traits>
#include <string>
#include "weave/common/error.hpp"

namespace weave {

struct Driver {
  decltype(&::cuGetErrorString) getErrorString = nullptr;
  decltype(&::cuInit) init = nullptr;
  decltype(&::cuDeviceGet) deviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) deviceGetAttribute = nullptr;
  decltype(&::cuCtxGetCurrent) ctxGetCurrent = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) devicePrimaryCtxRetain = nullptr;
  decltype(&::cuMemCreate) memCreate = nullptr;
  decltype(&::cuMemRelease) memRelease = nullptr;
  decltype(&::cuMemExportToShareableHandle) memExportToShareableHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) memImportFromShareableHandle = nullptr;
  decltype(&::cuMemAddressReserve) memAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) memAddressFree = nullptr;
  decltype(&::cuMemMap) memMap = nullptr;
  decltype(&::cuMemUnmap) memUnmap = nullptr;
  decltype(&::cuMemSetAccess) memSetAccess = nullptr;
  decltype(&::cuMemGetAllocationGranularity) memGetAllocationGranularity = nullptr;
  decltype(&::cuMemGetAddressRange) memGetAddressRange = nullptr;
  decltype(&::cuPointerGetAttribute) pointerGetAttribute = nullptr;
  decltype(&::cuTensorMapEncodeTiled) tensorMapEncodeTiled = nullptr;
  decltype(&::cuStreamWaitValue64) streamWaitValue64 = nullptr;
  decltype(&::cuStreamWriteValue64) streamWriteValue64 = nullptr;
};

namespace detail {
inline Driver load_driver() {
  Driver d;
  auto load = [](const char* name, auto& fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || p == nullptr)
      throw Error(concat("weave: CUDA driver entry point ", name, " unavailable: ", cudaGetErrorString(e),
                         " (is an NVIDIA driver installed?)"));
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
    load("cuGetErrorString", d.getErrorString);
    load("cuInit", d.init);
    load("cuDeviceGet", d.deviceGet);
    load("cuDeviceGetAttribute", d.deviceGetAttribute);
    load("cuCtxGetCurrent", d.ctxGetCurrent);
    load("cuDevicePrimaryCtxRetain", d.devicePrimaryCtxRetain);
    load("cuMemCreate", d.memCreate);
    load("cuMemRelease", d.memRelease);
    load("cuMemExportToShareableHandle", d.memExportToShareableHandle);
    load("cuMemImportFromShareableHandle", d.memImportFromShareableHandle);
    load("cuMemAddressReserve", d.memAddressReserve);
    load("cuMemAddressFree", d.memAddressFree);
    load("cuMemMap", d.memMap);
    load("cuMemUnmap", d.memUnmap);
    load("cuMemSetAccess", d.memSetAccess);
    load("cuMemGetAllocationGranularity", d.memGetAllocationGranularity);
    load("cuMemGetAddressRange", d.memGetAddressRange);
    load("cuPointerGetAttribute", d.pointerGetAttribute);
    load("cuTensorMapEncodeTiled", d.tensorMapEncodeTiled);
    load("cuStreamWaitValue64", d.streamWaitValue64);
    load("cuStreamWriteValue64", d.streamWriteValue64);
  return d;
}
}  // namespace detail

// Throws weave::Error when there is no driver.
inline const Driver& drv() {
  static const Driver d = detail::load_driver();
  return d;
}

inline const char* driver_error_string(CUresult r) {
  const char* s = nullptr;
  try {
    if (drv().getErrorString(r, &s) == CUDA_SUCCESS && s) return s;
  } catch (const Error&) {
  }
  return "unknown CUresult";
}

}  // namespace weave
