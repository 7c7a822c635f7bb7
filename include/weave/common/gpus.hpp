// How many CUDA GPUs this process sees, telling "this machine has none" apart from "it has
// some and CUDA failed": only the first may turn a GPU test into a skip.
#pragma once
#include <cuda_runtime.h>
#include <sys/stat.h>

#include <string>

namespace weave {

struct GpuCount {
  int count = 0;      // visible devices; 0 on a machine without them
  bool error = false;  // the NVIDIA driver is loaded but CUDA could not count the devices
  std::string why;     // the CUDA error, when error
};

// A loaded NVIDIA kernel driver shows /proc/driver/nvidia/version (also inside containers that
// are given GPUs); without it, any CUDA failure to count devices means "no GPU here".
inline bool nvidia_driver_loaded() {
  struct stat st{};
  return ::stat("/proc/driver/nvidia/version", &st) == 0 || ::stat("/dev/nvidiactl", &st) == 0;
}

// The count from cudaGetDeviceCount's result `e` and `count`, and whether the driver is loaded
// (apart from count_gpus so that tests can inject any CUDA error on any machine).
inline GpuCount gpu_count_from(cudaError_t e, int count, bool driver_loaded) {
  GpuCount g;
  if (e == cudaSuccess) {
    g.count = count;
    return g;
  }
  const bool no_gpu_error = e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver;
  if (!no_gpu_error || driver_loaded) {
    g.error = true;
    g.why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
  }
  return g;
}

inline GpuCount count_gpus() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  return gpu_count_from(e, count, e != cudaSuccess && nvidia_driver_loaded());
}

}  // namespace weave
