// ag_gemm variant 7: the A shard travels by copy engine instead of by SMs. Every SM computes;
// a side stream copies this rank's shard into each peer's gathered A in chunks of whole 128-row
// tiles (cudaMemcpyAsync) and after each chunk sets its tiles' ready counters in the peer with
// stream memory writes, which the GEMM's loader waits for exactly as for the SM pushes. Each
// write fences the copies before it (the default flag), so a loader that sees a counter reads
// the rows.
//
// Chunks of about kChunkBytes: measured on 2 x H200 (weave-bench primitives), a copy into a
// peer's heap reaches 204 GB/s in 1 MiB pieces, 268 in 2 MiB, 348 in 8 MiB and 393 in 128 MiB,
// the same on 1 or 4 streams, and a stream write + wait crosses in ~7 us; per-tile copies with a
// fenced write each made every call ~100 us slower than GEMM alone at S = 4096. The kernel
// starts on its own rows, so the first peer rows are needed only after 1/W of the GEMM.
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

#include "tp_common/schedule.hpp"
#include "weave/common/driver.hpp"
#include "weave/common/error.hpp"
#include "weave/signal_types.hpp"

namespace weave::tp {

class CopyEnginePush {
 public:
  static constexpr size_t kChunkBytes = size_t(8) << 20;

  CopyEnginePush() = default;
  ~CopyEnginePush() {
    if (side_) cudaStreamDestroy(side_);
    if (in_) cudaEventDestroy(in_);
    if (out_) cudaEventDestroy(out_);
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

  // Row tiles per chunk for rows of `row_bytes`: about kChunkBytes, at least one.
  static int tiles_per_chunk(size_t row_bytes) {
    const size_t tile = row_bytes * kBM;
    return tile >= kChunkBytes ? 1 : static_cast<int>(kChunkBytes / tile);
  }

  // Enqueues the pushes of call `round` (the round the kernel waits for: ready[off[rank] + i] on
  // every peer >= round * expected_per_round). `src`: this rank's rows (rows x K, contiguous);
  // gdst[d]: rank d's gathered A at this rank's first row, as mapped here; own_dst: this rank's
  // rows of its own gathered A, or null when the shard is already there. per_tile: every row
  // tile's counter is set (the fused kernel waits per tile), after chunks of about kChunkBytes;
  // otherwise (a waiter per shard) one copy per peer, the fastest size for the copy engine, and
  // only the shard's last tile's counter (each write fences the copies before it). Returns after
  // enqueueing; the caller launches the kernel on `s`, then calls join(s).
  void push(const Layout& L, int rank, int K, const void* src, void* const* gdst, void* own_dst, signals ready,
            signals arrive, unsigned long long round, unsigned long long expected_per_round, bool per_tile,
            cudaStream_t s) {
    ensure();
    const int W = L.W;
    const size_t row_bytes = size_t(K) * 2;
    const Range mine = shard(L.M, W, rank);
    WEAVE_CUDA_CHECK(cudaEventRecord(in_, s));
    WEAVE_CUDA_CHECK(cudaStreamWaitEvent(side_, in_, 0));
    for (int d = 0; d < W; ++d)
      if (d != rank) write(arrive.ptr[d] + rank, round);
    for (int d = 0; d < W; ++d)
      if (d != rank)
        WEAVE_CU_CHECK(drv().streamWaitValue64(side_, reinterpret_cast<CUdeviceptr>(arrive.ptr[rank] + d), round,
                                               CU_STREAM_WAIT_VALUE_GEQ));
    const int tiles = L.tm[rank], per = per_tile ? tiles_per_chunk(row_bytes) : tiles;
    // Peer d meets this rank's rows at phase (rank - d) mod W of its schedule: push in that order.
    for (int phase = 1; phase < W; ++phase) {
      const int d = (rank - phase + W) % W;
      for (int i0 = 0; i0 < tiles; i0 += per) {
        const int i1 = i0 + per < tiles ? i0 + per : tiles;
        const long long r0 = static_cast<long long>(i0) * kBM;
        const long long r1 = static_cast<long long>(i1) * kBM < mine.size ? static_cast<long long>(i1) * kBM : mine.size;
        const size_t off = size_t(r0) * row_bytes;
        WEAVE_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(gdst[d]) + off, static_cast<const char*>(src) + off,
                                         size_t(r1 - r0) * row_bytes, cudaMemcpyDeviceToDevice, side_));
        for (int i = per_tile ? i0 : i1 - 1; i < i1; ++i) write(ready.ptr[d] + L.off[rank] + i, round * expected_per_round);
      }
    }
    if (own_dst)
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(own_dst, src, size_t(mine.size) * row_bytes, cudaMemcpyDeviceToDevice, side_));
    WEAVE_CUDA_CHECK(cudaEventRecord(out_, side_));
  }

  void join(cudaStream_t s) { WEAVE_CUDA_CHECK(cudaStreamWaitEvent(s, out_, 0)); }

 private:
  void ensure() {
    if (side_) return;
    int lo = 0, hi = 0;
    WEAVE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    // Highest priority: the copies are few and the kernel waits for them.
    WEAVE_CUDA_CHECK(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, hi));
    WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&in_, cudaEventDisableTiming));
    WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&out_, cudaEventDisableTiming));
  }

  void write(unsigned long long* addr, unsigned long long value) {
    WEAVE_CU_CHECK(drv().streamWriteValue64(side_, reinterpret_cast<CUdeviceptr>(addr), value,
                                            CU_STREAM_WRITE_VALUE_DEFAULT));
  }

  cudaStream_t side_ = nullptr;
  cudaEvent_t in_ = nullptr, out_ = nullptr;
};

}  // namespace weave::tp
