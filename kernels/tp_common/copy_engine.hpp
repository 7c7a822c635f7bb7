// A side stream for the copy engine and the stream-memory operations around it, shared by the
// TP variants that move data without SMs (ag_gemm v7/v8, gemm_rs v4). The host enqueues; nothing
// here waits on the host.
//
// Measured on 2 x H200 (weave-bench primitives): a copy into a peer's heap reaches 204 GB/s in
// 1 MiB pieces, 268 in 2 MiB, 348 in 8 MiB and 393 in 128 MiB, the same on 1 or 4 streams; a
// stream write into a peer answered by a stream wait crosses in ~7 us.
//
// Waits on the side stream (enter) have no timeout: the caller's stream always ends with a
// one-thread wait with weave's diagnostics (tp_common/signal_wait.cuh) or a kernel wait for what
// the side stream delivers, so a peer that never calls is reported there.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include "weave/common/driver.hpp"
#include "weave/common/error.hpp"
#include "weave/signal_types.hpp"

namespace weave::tp {

class CopyEngine {
 public:
  // Below about this many bytes per copy the copy engine runs well under the link's rate.
  static constexpr size_t kChunkBytes = size_t(8) << 20;

  CopyEngine() = default;
  ~CopyEngine() {
    if (side_) cudaStreamDestroy(side_);
    if (mark_) cudaEventDestroy(mark_);
  }
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // 64-bit stream memory operations (cuStreamWaitValue64 / cuStreamWriteValue64) on `device`.
  static bool supported(int device) {
    try {
      int v = 0;
      CUdevice d;
      if (drv().deviceGet(&d, device) != CUDA_SUCCESS) return false;
      if (drv().deviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, d) != CUDA_SUCCESS) return false;
      return v != 0;
    } catch (const Error&) {
      return false;
    }
  }

  // The side stream's next work starts after everything enqueued on `s` so far.
  void after(cudaStream_t s) {
    ensure();
    WEAVE_CUDA_CHECK(cudaEventRecord(mark_, s));
    WEAVE_CUDA_CHECK(cudaStreamWaitEvent(side_, mark_, 0));
  }
  // "Entered call `round`": sets this rank's slot of `arrive` in every peer, then waits until
  // every peer set its slot here, i.e. every peer's stream finished its previous call (whose
  // kernels read the buffers this call's copies overwrite).
  void enter(const signals& arrive, int rank, int world, unsigned long long round) {
    ensure();
    for (int d = 0; d < world; ++d)
      if (d != rank) set(arrive.ptr[d] + rank, round);
    for (int d = 0; d < world; ++d)
      if (d != rank)
        WEAVE_CU_CHECK(drv().streamWaitValue64(side_, reinterpret_cast<CUdeviceptr>(arrive.ptr[rank] + d), round,
                                               CU_STREAM_WAIT_VALUE_GEQ));
  }
  void copy(void* dst, const void* src, size_t bytes) {
    ensure();
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, side_));
  }
  // Sets a counter (local or a peer's) after the side stream's copies before it (the default
  // flag fences them), so a reader that sees the value reads the bytes.
  void set(unsigned long long* addr, unsigned long long value) {
    ensure();
    WEAVE_CU_CHECK(drv().streamWriteValue64(side_, reinterpret_cast<CUdeviceptr>(addr), value,
                                            CU_STREAM_WRITE_VALUE_DEFAULT));
  }
  // `s` waits for everything enqueued on the side stream so far.
  void join(cudaStream_t s) {
    ensure();
    WEAVE_CUDA_CHECK(cudaEventRecord(mark_, side_));
    WEAVE_CUDA_CHECK(cudaStreamWaitEvent(s, mark_, 0));
  }

 private:
  void ensure() {
    if (side_) return;
    int lo = 0, hi = 0;
    WEAVE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    // Highest priority: the copies are few and kernels wait for them.
    WEAVE_CUDA_CHECK(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, hi));
    WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&mark_, cudaEventDisableTiming));
  }

  cudaStream_t side_ = nullptr;
  cudaEvent_t mark_ = nullptr;  // a wait takes the recording current when it is enqueued: one serves all
};

}  // namespace weave::tp
