// ag_gemm variant 7: the A shard travels by copy engine instead of by SMs. Every SM computes;
// side streams copy this rank's shard into each peer's gathered A one 128-row tile at a time
// (cudaMemcpyAsync) and after each tile set that tile's ready counter in the peer with a stream
// memory write, which the GEMM's loader waits for exactly as for the SM pushes. The stream write
// fences the copy before it, so a loader that sees the counter reads the rows. Tiles go round
// robin over kStreams streams: one copy of a 1-2 MB tile reaches only 100-160 GB/s (per-copy
// latency, shared/HARDWARE.md), several in flight approach the link's ~390.
//
// Buffer reuse across calls: before writing into a peer, the side stream sets this rank's
// "entered call k" slot in every peer and waits until every peer set its slot here, i.e. every
// peer's stream finished its previous call (whose kernel read the gathered buffer). The caller's
// stream waits for the side stream at the end, so the shard may be overwritten after the call.
// A peer that never calls leaves the side stream waiting without a timeout; the kernel's own
// wait for that peer's rows times out with the usual diagnostic.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <vector>

#include "tp_common/schedule.hpp"
#include "weave/common/driver.hpp"
#include "weave/common/error.hpp"
#include "weave/signal_types.hpp"

namespace weave::tp {

class CopyEnginePush {
 public:
  CopyEnginePush() = default;
  static constexpr int kStreams = 4;

  ~CopyEnginePush() {
    for (int k = 0; k < kStreams; ++k) {
      if (side_[k]) cudaStreamDestroy(side_[k]);
      if (out_[k]) cudaEventDestroy(out_[k]);
    }
    if (in_) cudaEventDestroy(in_);
    if (entered_) cudaEventDestroy(entered_);
  }
  CopyEnginePush(const CopyEnginePush&) = delete;
  CopyEnginePush& operator=(const CopyEnginePush&) = delete;

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

  // Enqueues the pushes of call `round` (the round the kernel waits for: ready[off[rank] + i] on
  // every peer >= round * expected_per_round). `src`: this rank's rows (rows x K, contiguous);
  // gdst[d]: rank d's gathered A at this rank's first row, as mapped here; own_dst: this rank's
  // rows of its own gathered A, or null when the shard is already there. Returns after
  // enqueueing; the caller launches the kernel on `s`, then calls join(s).
  void push(const Layout& L, int rank, int K, const void* src, void* const* gdst, void* own_dst, signals ready,
            signals arrive, unsigned long long round, unsigned long long expected_per_round, cudaStream_t s) {
    ensure();
    const int W = L.W;
    const size_t row_bytes = size_t(K) * 2;
    const Range mine = shard(L.M, W, rank);
    WEAVE_CUDA_CHECK(cudaEventRecord(in_, s));
    WEAVE_CUDA_CHECK(cudaStreamWaitEvent(side_[0], in_, 0));
    for (int d = 0; d < W; ++d)
      if (d != rank) write(side_[0], arrive.ptr[d] + rank, round);
    for (int d = 0; d < W; ++d)
      if (d != rank)
        WEAVE_CU_CHECK(drv().streamWaitValue64(side_[0], reinterpret_cast<CUdeviceptr>(arrive.ptr[rank] + d), round,
                                               CU_STREAM_WAIT_VALUE_GEQ));
    WEAVE_CUDA_CHECK(cudaEventRecord(entered_, side_[0]));
    for (int k = 1; k < kStreams; ++k) WEAVE_CUDA_CHECK(cudaStreamWaitEvent(side_[k], entered_, 0));
    int next = 0;
    // Peer d meets this rank's rows at phase (rank - d) mod W of its schedule: push in that order.
    for (int phase = 1; phase < W; ++phase) {
      const int d = (rank - phase + W) % W;
      for (int i = 0; i < L.tm[rank]; ++i) {
        const long long r0 = static_cast<long long>(i) * kBM;
        const long long rows = mine.size - r0 < kBM ? mine.size - r0 : kBM;
        const size_t off = size_t(r0) * row_bytes;
        cudaStream_t st = side_[next++ % kStreams];
        WEAVE_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(gdst[d]) + off, static_cast<const char*>(src) + off,
                                         size_t(rows) * row_bytes, cudaMemcpyDeviceToDevice, st));
        write(st, ready.ptr[d] + L.off[rank] + i, round * expected_per_round);
      }
    }
    if (own_dst)
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(own_dst, src, size_t(mine.size) * row_bytes, cudaMemcpyDeviceToDevice,
                                       side_[next % kStreams]));
    for (int k = 0; k < kStreams; ++k) WEAVE_CUDA_CHECK(cudaEventRecord(out_[k], side_[k]));
  }

  void join(cudaStream_t s) {
    for (int k = 0; k < kStreams; ++k) WEAVE_CUDA_CHECK(cudaStreamWaitEvent(s, out_[k], 0));
  }

 private:
  void ensure() {
    if (side_[0]) return;
    int lo = 0, hi = 0;
    WEAVE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    // Highest priority: the copies are few and short, and the kernel waits for them.
    for (int k = 0; k < kStreams; ++k) {
      WEAVE_CUDA_CHECK(cudaStreamCreateWithPriority(&side_[k], cudaStreamNonBlocking, hi));
      WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&out_[k], cudaEventDisableTiming));
    }
    WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&in_, cudaEventDisableTiming));
    WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&entered_, cudaEventDisableTiming));
  }

  static void write(cudaStream_t st, unsigned long long* addr, unsigned long long value) {
    WEAVE_CU_CHECK(drv().streamWriteValue64(st, reinterpret_cast<CUdeviceptr>(addr), value,
                                            CU_STREAM_WRITE_VALUE_DEFAULT));
  }

  cudaStream_t side_[kStreams] = {};
  cudaEvent_t out_[kStreams] = {};
  cudaEvent_t in_ = nullptr, entered_ = nullptr;
};

}  // namespace weave::tp
