// ag_gemm variants 7 and 8: the A shard travels by copy engine (tp_common/copy_engine.hpp)
// instead of by SMs. A side stream copies this rank's shard into each peer's gathered A and sets
// ready counters in the peer with stream memory writes, which fence the copies before them, so a
// reader that sees a counter reads the rows. v7's fused kernel waits per row tile: chunks of whole
// 128-row tiles of about kChunkBytes, each followed by its tiles' counters (per-tile copies with a
// fenced write each made every call ~100 us slower than GEMM alone at S = 4096). v8 waits once per
// shard: one copy per peer, then the shard's last counter.
//
// Buffer reuse across calls: before writing into a peer, the side stream announces "entered call
// k" and waits for every peer's (CopyEngine::enter): every peer's stream finished its previous
// call, whose kernels read the gathered buffer. The caller's stream waits for the side stream at
// the end, so the shard may be overwritten after the call. A peer that never calls leaves the
// side stream waiting without a timeout; the caller's wait for that peer's rows (v7's kernel,
// v8's one-thread wait) times out with the usual diagnostic.
#pragma once
#include "tp_common/copy_engine.hpp"
#include "tp_common/schedule.hpp"

namespace weave::tp {

class CopyEnginePush {
 public:
  // Row tiles per chunk for rows of `row_bytes`: about CopyEngine::kChunkBytes, at least one.
  static int tiles_per_chunk(size_t row_bytes) {
    const size_t tile = row_bytes * kBM;
    return tile >= CopyEngine::kChunkBytes ? 1 : static_cast<int>(CopyEngine::kChunkBytes / tile);
  }

  // Enqueues the pushes of call `round` (the round the kernel waits for: ready[off[rank] + i] on
  // every peer >= round * expected_per_round). `src`: this rank's rows (rows of row_bytes, contiguous);
  // gdst[d]: rank d's gathered A at this rank's first row, as mapped here; own_dst: this rank's
  // rows of its own gathered A, or null when the shard is already there. per_tile: every row
  // tile's counter is set (the fused kernel waits per tile), after chunks of about kChunkBytes;
  // otherwise (a waiter per shard) one copy per peer, the fastest size for the copy engine, and
  // only the shard's last tile's counter (each write fences the copies before it). Returns after
  // enqueueing; the caller launches the kernel on `s`, then calls join(s).
  void push(const Layout& L, int rank, size_t row_bytes, const void* src, void* const* gdst, void* own_dst,
            signals ready, signals arrive, unsigned long long round, unsigned long long expected_per_round,
            bool per_tile, cudaStream_t s) {
    const int W = L.W;
    const Range mine = shard(L.M, W, rank);
    ce_.after(s);
    ce_.enter(arrive, rank, W, round);
    const int tiles = L.tm[rank], per = per_tile ? tiles_per_chunk(row_bytes) : tiles;
    // Peer d meets this rank's rows at phase (rank - d) mod W of its schedule: push in that order.
    for (int phase = 1; phase < W; ++phase) {
      const int d = (rank - phase + W) % W;
      for (int i0 = 0; i0 < tiles; i0 += per) {
        const int i1 = i0 + per < tiles ? i0 + per : tiles;
        const long long r0 = static_cast<long long>(i0) * kBM;
        const long long r1 = static_cast<long long>(i1) * kBM < mine.size ? static_cast<long long>(i1) * kBM : mine.size;
        const size_t off = size_t(r0) * row_bytes;
        ce_.copy(static_cast<char*>(gdst[d]) + off, static_cast<const char*>(src) + off, size_t(r1 - r0) * row_bytes);
        for (int i = per_tile ? i0 : i1 - 1; i < i1; ++i) ce_.set(ready.ptr[d] + L.off[rank] + i, round * expected_per_round);
      }
    }
    if (own_dst) ce_.copy(own_dst, src, size_t(mine.size) * row_bytes);
  }

  void join(cudaStream_t s) { ce_.join(s); }

 private:
  CopyEngine ce_;
};

}  // namespace weave::tp
