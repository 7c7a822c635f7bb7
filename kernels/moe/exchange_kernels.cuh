// Device side of the non-fused MoE dispatch and combine (host entry: exchange.cu; schedule and
// reasons: README.md). Every kernel waits only for signals of kernels that precede it on the
// peers' streams, never for another block of its own grid: nothing assumes co-scheduling (ranks
// sharing one GPU time-slice their kernels).
//
// dispatch: route_walk<false> (per-chunk expert histograms) -> exchange_counts (one block: the
// count exchange, the verdict, this rank's counts / offsets and send bases) -> route_walk<true>
// (every (token, slot)'s destination row) -> push_rows (each token's row once per destination
// rank, with the rows' metadata, then one signal per block and rank) -> dup_rows (waits for every
// peer's blocks, copies primary rows into the other slots' rows).
// combine: combine_arrive (this rank's expert outputs are ready) -> combine_rows (pull the k rows
// of each token, fp32 weighted sum in slot order) -> combine_done (every peer finished reading
// this rank's rows).
#pragma once
#include <cuda_bf16.h>

#include <climits>

#include "moe/combine_sum.cuh"
#include "moe/dispatch_gemm_schedule.hpp"
#include "moe/exchange_args.hpp"
#include "moe/row_copy.cuh"
#include "moe/exchange_plan.hpp"
#include "weave/pdl.cuh"
#include "weave/signal.cuh"
#include "weave/tile/warpgroup.cuh"

namespace weave::moe::detail {

constexpr int kWalkWarps = 4;
constexpr int kPushThreads = 512;
constexpr int kCountThreads = 1024;
constexpr int kCopyUnroll = 4;

// One warp per chunk of kChunkEntries (token * k + slot) entries, walked 32 at a time in order:
// lanes with the same expert find each other (match), so each entry's cursor is the chunk's
// running count of its expert plus the same-expert lanes before it. Place = false: the chunk's
// histogram (and the first out-of-range entry); Place = true: every entry's destination row from
// the prefix the count exchange left in hist. walk_chunk (exchange_plan.hpp) is the host form.
template <bool Place>
__global__ void __launch_bounds__(kWalkWarps * 32) route_walk(const __grid_constant__ DispatchArgs a) {
  __shared__ int cursor[kWalkWarps][kMaxExchangeExperts];
  pdl_enter();
  if (Place && a.status[kStatusFailed]) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, E = a.g.experts;
  const long long n = static_cast<long long>(a.T) * a.k;
  const int c = blockIdx.x * kWalkWarps + warp;
  if (c >= num_chunks(n)) return;
  int* cur = cursor[warp];
  for (int e = lane; e < E; e += 32) cur[e] = Place ? a.hist[static_cast<long long>(c) * E + e] : 0;
  __syncwarp();
  const long long begin = static_cast<long long>(c) * kChunkEntries;
  const long long end = begin + kChunkEntries < n ? begin + kChunkEntries : n;
  // The chunk's ids all requested before the walk: one memory round trip, not one per step.
  constexpr int kSteps = kChunkEntries / 32;
  int ids[kSteps];
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    const long long i = begin + u * 32 + lane;
    ids[u] = i < end ? a.idx[i] : 0;
  }
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    if (begin + u * 32 >= end) break;
    const long long i = begin + u * 32 + lane;
    int e = -1;
    if (i < end) {
      e = ids[u];
      if (!valid_expert(e, a.g)) {
        if (!Place) atomicMin(&a.status[kStatusBadSlot], static_cast<int>(i));
        e = -1;
      }
    }
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int before = __popc(same & tile::lanemask_lt());
    const int pos = e >= 0 ? cur[e] + before : -1;
    __syncwarp();
    if (e >= 0 && before == 0) cur[e] += __popc(same);
    __syncwarp();
    if (Place && i < end) {
      a.plan[i] = e >= 0 ? make_int2(a.g.rank_of(e), a.base[e] + pos) : make_int2(-1, -1);
      if (a.slist && e >= 0) {
        const long long t = i / a.k;
        const int j = static_cast<int>(i - t * a.k);
        a.slist[a.order[send_position(a.sig.rank, e, a.g)] + pos] =
            make_int2(static_cast<int>(i), primary_slot(a.idx + t * a.k, a.k, a.g, j));
      }
    }
  }
  if (!Place)
    for (int e = lane; e < E; e += 32) a.hist[static_cast<long long>(c) * E + e] = cur[e];
}

// One block. Chunk prefixes and this rank's row of counts, broadcast into every rank's matrix
// (parity round & 1: a fast peer's next call writes the other half, and it cannot be two calls
// ahead, since each call waits for every rank's row), then the whole matrix read back and judged.
__global__ void __launch_bounds__(kCountThreads) exchange_counts(const __grid_constant__ DispatchArgs a) {
  __shared__ int cnt[kMaxWorld * kMaxExchangeExperts];
  __shared__ int bad_slot[kMaxWorld], bad_value[kMaxWorld];
  __shared__ int failed;
  pdl_enter();
  const int E = a.g.experts, W = a.g.world, me = a.sig.rank, RI = row_ints(E);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int chunks = num_chunks(static_cast<long long>(a.T) * a.k);
  const long long mine = (static_cast<long long>(a.round & 1) * W + me) * RI;
  for (int e = tid; e < E; e += nt) {
    const int total = chunk_prefix(a.hist, chunks, E, e);
    for (int d = 0; d < W; ++d) a.mat[d][mine + e] = total;
  }
  if (tid == 0) {
    int bs = a.status[kStatusBadSlot], bv = 0;
    if (bs != INT_MAX) bv = a.idx[bs];
    else bs = -1;
    a.status[kStatusBadSlot] = INT_MAX;  // the next call's route_walk starts from none
    for (int d = 0; d < W; ++d) {
      a.mat[d][mine + E + kRowBadSlot] = bs;
      a.mat[d][mine + E + kRowBadValue] = bv;
      a.mat[d][mine + E + kRowTokens] = a.T;
    }
  }
  __syncthreads();
  if (tid == 0) {
    signal_all(a.sig, 0);
    wait(a.sig, 0, a.round * static_cast<unsigned long long>(W));
  }
  __syncthreads();
  const int* m = a.mat[me] + static_cast<long long>(a.round & 1) * W * RI;
  for (int i = tid; i < W * E; i += nt) cnt[i] = __ldcg(m + (i / E) * RI + i % E);
  if (tid < W) {
    bad_slot[tid] = __ldcg(m + tid * RI + E + kRowBadSlot);
    bad_value[tid] = __ldcg(m + tid * RI + E + kRowBadValue);
  }
  __syncthreads();
  if (tid == 0) {
    const Verdict v = judge(cnt, bad_slot, bad_value, a.g, a.k, a.capacity);
    failed = v.ok() ? 0 : 1;
    a.status[kStatusFailed] = failed;
    a.status[kStatusRows] = failed ? 0 : rank_rows(cnt, a.g, me);
    if (!v.ok() && a.record->kind == kVerdictOk) *a.record = v;
  }
  __syncthreads();
  const int L = a.g.local_experts();
  for (int l = tid; l <= L; l += nt) {
    a.offsets[l] = failed ? 0 : expert_begin(cnt, a.g, me, l);
    if (l < L) a.counts[l] = failed ? 0 : expert_rows(cnt, a.g, a.g.expert(me, l));
  }
  if (!failed)
    for (int e = tid; e < E; e += nt) a.base[e] = block_begin(cnt, a.g, a.g.rank_of(e), a.g.local_of(e), me);
  if (a.order) {
    if (failed)
      for (int p = tid; p <= E; p += nt) a.order[p] = 0;
    else if (tid == 0)
      send_offsets(cnt + me * E, a.g, me, a.order);  // E steps on shared memory, fused calls only
  }
}

// One warp per token: the metadata of each of its k rows goes to the row's rank, and its data
// once to each rank (into the row of its primary slot there), read once for all of them.
__global__ void __launch_bounds__(kPushThreads) push_rows(const __grid_constant__ DispatchArgs a) {
  pdl_enter();
  const int lane = threadIdx.x % 32, me = a.sig.rank;
  if (!a.status[kStatusFailed]) {
    const int warps = gridDim.x * (blockDim.x / 32), nv = a.H / 8, k = a.k;
    for (int t = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; t < a.T; t += warps) {
      int d = -1, row = -1;
      if (lane < k) {
        const int2 p = a.plan[static_cast<long long>(t) * k + lane];
        d = p.x, row = p.y;
      }
      const int prim = lane < k ? primary_slot(a.idx + static_cast<long long>(t) * k, k, a.g, lane) : lane;
      const int prow = __shfl_sync(0xffffffffu, row, prim);
      if (lane < k)
        *reinterpret_cast<int4*>(a.meta[d] + row) = make_int4(me, t, prow, lane);
      unsigned prims = __ballot_sync(0xffffffffu, lane < k && prim == lane);
      const int nd = __popc(prims);
      int4* dst[kMaxWorld];
#pragma unroll
      for (int q = 0; q < kMaxWorld; ++q) {
        const int j = prims ? __ffs(prims) - 1 : 0;
        prims &= prims - 1;
        const int dj = __shfl_sync(0xffffffffu, d, j), rj = __shfl_sync(0xffffffffu, row, j);
        dst[q] = q < nd ? reinterpret_cast<int4*>(a.xrecv[dj < 0 ? 0 : dj] + static_cast<long long>(rj) * a.H)
                        : nullptr;
      }
      const int4* src = reinterpret_cast<const int4*>(a.x + static_cast<long long>(t) * a.H);
      for (int v0 = lane; v0 < nv; v0 += 32 * kCopyUnroll) {
        int4 val[kCopyUnroll];
#pragma unroll
        for (int u = 0; u < kCopyUnroll; ++u)
          if (v0 + 32 * u < nv) val[u] = __ldg(src + v0 + 32 * u);
#pragma unroll
        for (int q = 0; q < kMaxWorld; ++q) {
          if (q >= nd) break;
#pragma unroll
          for (int u = 0; u < kCopyUnroll; ++u)
            if (v0 + 32 * u < nv) dst[q][v0 + 32 * u] = val[u];
        }
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) signal_all(a.sig, 1);  // the block's stores, released to every rank
}

// After every rank's push blocks: each non-primary row gets its primary row's data (local HBM).
__global__ void __launch_bounds__(kPushThreads) dup_rows(const __grid_constant__ DispatchArgs a) {
  pdl_enter();
  if (threadIdx.x == 0)
    wait(a.sig, 1, a.pushed_expected);
  __syncthreads();
  if (a.status[kStatusFailed]) return;
  const int me = a.sig.rank, lane = threadIdx.x % 32, R = a.status[kStatusRows], nv = a.H / 8;
  const int warps = gridDim.x * (blockDim.x / 32);
  bf16* buf = a.xrecv[me];
  for (int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < R; r += warps) {
    const int4 m = __ldcg(reinterpret_cast<const int4*>(a.meta[me] + r));
    if (m.z == r) continue;
    copy_row<kCopyUnroll, true>(reinterpret_cast<const int4*>(buf + static_cast<long long>(m.z) * a.H),
                                reinterpret_cast<int4*>(buf + static_cast<long long>(r) * a.H), nv, lane, 32);
  }
}

__global__ void combine_arrive(const __grid_constant__ CombineArgs a) {
  pdl_enter();
  if (threadIdx.x == 0) signal_all(a.sig, 0);  // the previous kernels' writes to y are complete
}

// One warp per home token: its k rows (on their experts' ranks) read 16 bytes per lane at a time
// and summed by weighted_sum_vec (combine_sum.cuh, shared with the fused gemm_combine): fp32 fma in
// slot order, so the result does not depend on the grid. A failed dispatch leaves nothing to read:
// the output is NaN.
__global__ void __launch_bounds__(kPushThreads) combine_rows(const __grid_constant__ CombineArgs a) {
  __shared__ const int4* src[kPushThreads / 32][kMaxTopk];
  __shared__ float wt[kPushThreads / 32][kMaxTopk];
  pdl_enter();
  if (threadIdx.x == 0) wait(a.sig, 0, a.round * static_cast<unsigned long long>(a.sig.world));
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, k = a.k, nv = a.H / 8;
  const bool failed = a.status[kStatusFailed] != 0;
  const int warps = gridDim.x * (blockDim.x / 32);
  for (int t = blockIdx.x * (blockDim.x / 32) + warp; t < a.T; t += warps) {
    if (!failed && lane < k) {
      const long long i = static_cast<long long>(t) * k + lane;
      const int2 p = a.plan[i];
      src[warp][lane] = reinterpret_cast<const int4*>(a.y[p.x] + static_cast<long long>(p.y) * a.H);
      wt[warp][lane] = a.w[i];
    }
    __syncwarp();
    int4* out = reinterpret_cast<int4*>(a.out + static_cast<long long>(t) * a.H);
    for (int v = lane; v < nv; v += 32) {
      if (failed) {
        out[v] = nan_vec();
        continue;
      }
      out[v] = weighted_sum_vec(src[warp], wt[warp], k, v);
    }
    __syncwarp();
  }
  __syncthreads();
  if (threadIdx.x == 0) signal_all(a.sig, 1);  // this block read what it needed from every rank
}

__global__ void combine_done(const __grid_constant__ CombineArgs a) {
  pdl_enter();
  if (threadIdx.x == 0)
    wait(a.sig, 1, a.round * static_cast<unsigned long long>(a.sig.world) * static_cast<unsigned long long>(a.blocks));
}

}  // namespace weave::moe::detail
