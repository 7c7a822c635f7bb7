// device_copy, device_copy_2d (device_copy.hpp): grid-stride copies of rows, each split as
// copy_split.hpp splits it.
#include "weave/common/error.hpp"
#include "weave/lcsc.cuh"  // device_info
#include "weave/pdl.cuh"
#include "weave/runtime/copy_split.hpp"
#include "weave/runtime/device_copy.hpp"

namespace weave::runtime {

namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 4;          // enough loads in flight to run at the memory's rate
constexpr size_t kVectorsPerThread = 4;  // a short copy starts fewer blocks
constexpr size_t kMaxGridY = 65535;      // CUDA's limit on gridDim.y

// Block row y of the grid copies rows y, y + gridDim.y, ...; its blocks share each row.
__global__ void copy_kernel(char* __restrict__ dst, size_t dpitch, const char* __restrict__ src, size_t spitch,
                            size_t width, size_t rows) {
  pdl_enter();
  const size_t t = blockIdx.x * size_t(blockDim.x) + threadIdx.x, stride = size_t(gridDim.x) * blockDim.x;
  for (size_t r = blockIdx.y; r < rows; r += gridDim.y)
    copy_part<uint4>(dst + r * dpitch, src + r * spitch, width, t, stride);
}

}  // namespace

void device_copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows,
                    cudaStream_t s) {
  if (!width || !rows) return;
  WEAVE_CHECK(rows == 1 || (width <= dpitch && width <= spitch), "device_copy_2d: rows of ", width,
              " bytes at pitches ", dpitch, " (dst) and ", spitch, " (src): a row may not be wider than a pitch");
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  const int sm_count = lcsc::device_info(dev).sm_count;  // read once per device
  const size_t sms = static_cast<size_t>(sm_count > 0 ? sm_count : 1);
  const size_t most = sms * kBlocksPerSm, per_block = size_t(kThreads) * kVectorsPerThread;
  const size_t y = rows < most ? rows : (most < kMaxGridY ? most : kMaxGridY);
  const size_t want = (width / 16 + 1 + per_block - 1) / per_block, x_most = most / y > 0 ? most / y : 1;
  const size_t x = want < x_most ? want : x_most;
  launch_pdl(copy_kernel, dim3(static_cast<unsigned>(x), static_cast<unsigned>(y)), dim3(kThreads), s,
             static_cast<char*>(dst), dpitch, static_cast<const char*>(src), spitch, width, rows);
}

void device_copy(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  device_copy_2d(dst, bytes, src, bytes, bytes, 1, s);
}

}  // namespace weave::runtime
