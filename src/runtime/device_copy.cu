// device_copy (device_copy.hpp): a grid-stride copy as copy_split.hpp splits it.
#include "weave/common/error.hpp"
#include "weave/pdl.cuh"
#include "weave/runtime/copy_split.hpp"
#include "weave/runtime/device_copy.hpp"

namespace weave::runtime {

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 4;          // enough loads in flight to run at the memory's rate
constexpr size_t kVectorsPerThread = 4;  // a short copy starts fewer blocks

__global__ void copy_kernel(char* __restrict__ dst, const char* __restrict__ src, size_t bytes) {
  pdl_enter();
  copy_part<uint4>(dst, src, bytes, blockIdx.x * size_t(blockDim.x) + threadIdx.x, size_t(gridDim.x) * blockDim.x);
}

int sm_count() {
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms > 0 ? sms : 1;
}

}  // namespace

void device_copy(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (!bytes) return;
  const int sms = sm_count();  // the current device's (two cached attribute reads, well under 1 µs)
  const size_t units = bytes / 16 + 1, per_block = size_t(kThreads) * kVectorsPerThread;
  const size_t want = (units + per_block - 1) / per_block, most = size_t(sms) * kBlocksPerSm;
  const unsigned blocks = static_cast<unsigned>(want < most ? want : most);
  launch_pdl(copy_kernel, dim3(blocks), dim3(kThreads), s, static_cast<char*>(dst), static_cast<const char*>(src),
             bytes);
}

}  // namespace weave::runtime
