// Device side of the MoE low-latency (decode) mode (host entry: low_latency.cu; layout:
// low_latency_schedule.hpp; design and reasons: README.md, "Low-latency mode").
//
// ll_dispatch (one launch): every block reads all T k ids of its rank (histogram, checks), then
// for its tokens t = b, b + B, ...: each slot's place among the rank's rows of its expert (a
// block-wide count), the k route codes to every rank, the token's row once to each remote rank
// holding one of its experts (its staging row there); block 0 sends the rank's header (T, its
// checks, its counts of each peer's experts) to every peer. One signal per block and peer. Then
// the block packs its own tokens' rows into this rank's receive buffer (they come first in every
// expert's region: no peer needed), waits until every peer's blocks have signalled, judges the W
// headers (the same verdict on every rank) and packs the peers' rows of its tokens from staging.
//
// ll_combine (one launch): every block pushes the expert outputs of the peers' tokens it packed to
// their home ranks' landing rows (t k + j), signals every peer once, waits for every peer's
// blocks, then sums its own tokens' k rows (local expert outputs read in place, remote ones from
// landing) with combine_sum.cuh's weighted_sum_vec: fp32 fma in slot order, bf16 out.
//
// Waits: a block waits only for the peers' blocks of the same kernel, which signal before they
// wait and never wait for this rank's grid; never for a block of its own grid (its own rows come
// from its own tokens). Each grid has at most one block per SM and two blocks fit on an SM
// (__launch_bounds__(512, 2): at most 64 registers), so all of a rank's blocks are resident once
// the kernel before it on the stream finished (PDL's dependents start only after all of them
// started), even beside another rank's grid on a GPU shared through MPS: the peers' signals always
// come.
#pragma once
#include <cuda_bf16.h>

#include <climits>

#include "moe/combine_sum.cuh"
#include "moe/low_latency_schedule.hpp"
#include "moe/row_copy.cuh"
#include "moe/swiglu_row.cuh"
#include "weave/memory_order.cuh"
#include "weave/pdl.cuh"
#include "weave/signal.cuh"
#include "weave/tile/warpgroup.cuh"

namespace weave::moe::ll {

using bf16 = __nv_bfloat16;

// This rank's state after its last dispatch (local device memory), read by the combine.
enum LlStateWord : int {
  kLlStateFailed = 0,  // the call's verdict was not ok (the same on every rank)
  kLlStateTokens = 4,  // then W ints: T of every source rank
  kLlStateInts = kLlStateTokens + kMaxWorld,
};

struct LlArgs {
  const bf16* x;        // T x H, this rank's tokens (dispatch)
  const int* idx;       // T x k (dispatch)
  const float* w;       // T x k (combine)
  const bf16* y;        // L x S x H, this rank's expert outputs in the receive layout (combine)
  bf16* out;            // T x H (combine)
  int T, k, H, max_tokens, row_stride;
  Geometry g;
  bf16* stage[kMaxWorld];    // every rank's staging rows: W x max_tokens x H (source s's token t at s max_tokens + t)
  int* route[kMaxWorld];     // every rank's route codes: W x max_tokens x k
  int* head[kMaxWorld];      // every rank's headers: W x ll_header_ints(L)
  bf16* landing[kMaxWorld];  // every rank's landing rows: max_tokens x k x H
  bf16* recv;                // this rank's receive buffer: L x S x H
  LlRowMeta* meta;           // L x S
  int* counts;               // L
  int* src_counts;           // L x W
  int* src_offsets;          // L x W
  int* state;                // kLlStateInts
  LlVerdict* record;         // the first failed call since the host last looked
  signals sig;               // counter 0: the kernel's blocks of every peer ((W - 1) B per call)
  Round round;               // the set's round (read after pdl_enter: a device cell once captured)
  unsigned long long per_round;  // (W - 1) B
};

// The block's stores, released to every peer (signal_all's release pattern, without this rank).
__device__ __forceinline__ void signal_peers(const signals& s, int index) {
  fence_acq_rel_sys();
  for (int r = 0; r < s.world; ++r)
    if (r != s.rank) red_add_relaxed_sys(s.ptr[r] + index, 1);
}

constexpr int kUnroll = 4;

// The most tokens any peer (rank != me) had in the call: the bound of the loops over the peers'
// tokens this block handles.
__device__ __forceinline__ int most_peer_tokens(const int* Ts, int W, int me) {
  int m = 0;
  for (int s = 0; s < W; ++s)
    if (s != me && Ts[s] > m) m = Ts[s];
  return m;
}

// n rows copied one to one (src[q] -> dst[q]), the n nv vectors spread over the block.
__device__ __forceinline__ void copy_rows(const int4* const* src, int4* const* dst, int n, int nv) {
  const int total = n * nv;
#pragma unroll 1
  for (int f0 = threadIdx.x; f0 < total; f0 += kLlThreads * kUnroll) {
    int4 val[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int f = f0 + u * kLlThreads;
      if (f < total) val[u] = __ldcg(src[f / nv] + f % nv);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int f = f0 + u * kLlThreads;
      if (f < total) dst[f / nv][f % nv] = val[u];
    }
  }
}

struct DispatchShared {
  int hist[kLlMaxExperts];  // this rank's rows per expert
  int cnt[kLlMaxExperts];   // L x W: rows of each local expert from each source
  int off[kLlMaxExperts];   // L x W: ll_offsets
  int tok[kLlMaxTopk];      // the current token's ids
  int within[kLlMaxTopk];   // their places
  int4* dst[kLlMaxTopk];    // the rows the current row goes to
  int ndst;
  int bad, over;            // this rank's first out-of-range entry, first overfull expert (INT_MAX: none)
  int check[kMaxWorld][4];  // every source's LlSourceCheck: bad_slot, bad_value, over_expert, over_rows
  int Ts[kMaxWorld];
  int failed;
};

// Packs token t of source s (its row at src) into this rank's receive buffer: its route codes for
// this rank give the rows (sh.off must hold source s's offsets); the rows' metadata beside them.
template <bool FromL2>
__device__ __forceinline__ void pack_token(const LlArgs& a, DispatchShared& sh, int s, int t, const int4* src) {
  const int tid = threadIdx.x, k = a.k, me = a.sig.rank, W = a.g.world;
  if (tid < 32) {
    int code = kLlNoSlot;
    if (tid < k) code = __ldcg(a.route[me] + (static_cast<long long>(s) * a.max_tokens + t) * k + tid);
    const unsigned has = __ballot_sync(0xffffffffu, code != kLlNoSlot);
    if (code != kLlNoSlot) {
      const int row = ll_packed_row(code, sh.off, W, s, a.row_stride);
      sh.dst[__popc(has & tile::lanemask_lt())] = reinterpret_cast<int4*>(a.recv + static_cast<long long>(row) * a.H);
      a.meta[row] = LlRowMeta{s, t, tid, a.g.expert(me, ll_code_local(code))};
    }
    if (tid == 0) sh.ndst = __popc(has);
  }
  __syncthreads();
  if (sh.ndst) fanout_row<kUnroll, FromL2>(src, sh.dst, sh.ndst, a.H / 8, threadIdx.x, kLlThreads);
  __syncthreads();
}

__global__ void __launch_bounds__(kLlThreads, 2) ll_dispatch(const __grid_constant__ LlArgs a) {
  __shared__ DispatchShared sh;
  pdl_enter();
  const int tid = threadIdx.x, lane = tid % 32, k = a.k, me = a.sig.rank, B = gridDim.x;
  const int E = a.g.experts, W = a.g.world, L = a.g.local_experts(), n = a.T * k, nv = a.H / 8;

  // 1. All of this rank's ids (kLlPerThread per thread, in registers for the places below): the
  //    histogram and the checks, the same in every block.
  for (int e = tid; e < E; e += kLlThreads) sh.hist[e] = 0;
  if (tid == 0) sh.bad = INT_MAX, sh.over = INT_MAX;
  __syncthreads();
  int ids[kLlPerThread];
#pragma unroll
  for (int u = 0; u < kLlPerThread; ++u) {
    const int i = tid + u * kLlThreads;
    ids[u] = i < n ? __ldg(a.idx + i) : -1;
  }
#pragma unroll
  for (int u = 0; u < kLlPerThread; ++u) {
    const int i = tid + u * kLlThreads;
    if (i >= n) continue;
    if (valid_expert(ids[u], a.g)) atomicAdd(&sh.hist[ids[u]], 1);
    else atomicMin(&sh.bad, i);
  }
  __syncthreads();
  for (int e = tid; e < E; e += kLlThreads)
    if (sh.hist[e] > a.max_tokens) atomicMin(&sh.over, e);
  __syncthreads();
  const bool mine_ok = sh.bad == INT_MAX && sh.over == INT_MAX;

  // 2. This block's tokens: each slot's place among this rank's rows of its expert, the route codes
  //    to every rank (this one too: its own rows are packed from them), the row once to each remote
  //    rank holding one of the token's experts (none when this rank's ids fail the call).
  for (int t = blockIdx.x; t < a.T; t += B) {
    if (tid < k) {
      sh.tok[tid] = __ldg(a.idx + static_cast<long long>(t) * k + tid);
      sh.within[tid] = 0;
    }
    __syncthreads();
    for (int j = 0; j < k; ++j) {
      const int e = sh.tok[j], limit = t * k + j;
      int c = 0;
#pragma unroll
      for (int u = 0; u < kLlPerThread; ++u) c += (tid + u * kLlThreads < limit && ids[u] == e) ? 1 : 0;
      c = __reduce_add_sync(0xffffffffu, c);
      if (lane == 0 && c) atomicAdd(&sh.within[j], c);
    }
    __syncthreads();
    for (int q = tid; q < W * k; q += kLlThreads) {
      const int d = q / k, j = q % k;
      a.route[d][(static_cast<long long>(me) * a.max_tokens + t) * k + j] = ll_route_code(sh.tok[j], sh.within[j], a.g, d);
    }
    const unsigned remote = mine_ok ? ll_dest_mask(sh.tok, k, a.g) & ~(1u << me) : 0u;
    if (remote) {
      if (tid == 0) {
        int q = 0;
        for (int d = 0; d < W; ++d)
          if (remote >> d & 1u)
            sh.dst[q++] = reinterpret_cast<int4*>(a.stage[d] + (static_cast<long long>(me) * a.max_tokens + t) * a.H);
        sh.ndst = q;
      }
      __syncthreads();
      fanout_row<kUnroll, false>(reinterpret_cast<const int4*>(a.x + static_cast<long long>(t) * a.H), sh.dst, sh.ndst, nv,
                                 threadIdx.x, kLlThreads);
    }
    __syncthreads();  // tok, within and dst are the next token's
  }

  // 3. Block 0: this rank's header to every peer.
  const int HI = ll_header_ints(L);
  if (blockIdx.x == 0) {
    for (int q = tid; q < W * HI; q += kLlThreads) {
      const int d = q / HI, f = q % HI;
      if (d == me) continue;
      int v = 0;
      if (f == kLlHdrTokens) v = a.T;
      else if (f == kLlHdrBadSlot) v = sh.bad == INT_MAX ? -1 : sh.bad;
      else if (f == kLlHdrBadValue) v = sh.bad == INT_MAX ? 0 : __ldg(a.idx + sh.bad);
      else if (f == kLlHdrOverExpert) v = sh.over == INT_MAX ? -1 : sh.over;
      else if (f == kLlHdrOverRows) v = sh.over == INT_MAX ? 0 : sh.hist[sh.over];
      else if (f >= kLlHdrCounts && f < kLlHdrCounts + L) v = sh.hist[a.g.expert(d, f - kLlHdrCounts)];
      a.head[d][me * HI + f] = v;
    }
  }
  __syncthreads();
  if (tid == 0 && W > 1) signal_peers(a.sig, 0);

  // 4. This rank's own rows, before any peer's: they come first in every expert's region.
  for (int l = tid; l < L; l += kLlThreads) sh.off[l * W + me] = 0;
  __syncthreads();
  if (mine_ok)
    for (int t = blockIdx.x; t < a.T; t += B)
      pack_token<false>(a, sh, me, t, reinterpret_cast<const int4*>(a.x + static_cast<long long>(t) * a.H));

  // 5. Every peer's blocks have sent their rows, codes and headers.
  if (tid == 0 && W > 1) wait(a.sig, 0, a.round * a.per_round);
  __syncthreads();
  const int* head = a.head[me];
  for (int q = tid; q < L * W; q += kLlThreads) {
    const int l = q / W, s = q % W;
    sh.cnt[q] = s == me ? sh.hist[a.g.expert(me, l)] : __ldcg(head + s * HI + kLlHdrCounts + l);
  }
  if (tid < W) {
    int* c = sh.check[tid];
    if (tid == me) {
      c[0] = sh.bad == INT_MAX ? -1 : sh.bad;
      c[1] = sh.bad == INT_MAX ? 0 : __ldg(a.idx + sh.bad);
      c[2] = sh.over == INT_MAX ? -1 : sh.over;
      c[3] = sh.over == INT_MAX ? 0 : sh.hist[sh.over];
      sh.Ts[tid] = a.T;
    } else {
      const int* h = head + tid * HI;
      c[0] = __ldcg(h + kLlHdrBadSlot);
      c[1] = __ldcg(h + kLlHdrBadValue);
      c[2] = __ldcg(h + kLlHdrOverExpert);
      c[3] = __ldcg(h + kLlHdrOverRows);
      sh.Ts[tid] = __ldcg(h + kLlHdrTokens);
    }
  }
  __syncthreads();
  if (tid == 0) {
    const LlVerdict v = ll_judge_by(
        [&](int s) {
          LlSourceCheck c;
          c.bad_slot = sh.check[s][0], c.bad_value = sh.check[s][1];
          c.over_expert = sh.check[s][2], c.over_rows = sh.check[s][3];
          return c;
        },
        W, k, a.max_tokens);
    sh.failed = v.ok() ? 0 : 1;
    if (blockIdx.x == 0) {
      a.state[kLlStateFailed] = sh.failed;
      for (int s = 0; s < W; ++s) a.state[kLlStateTokens + s] = sh.failed ? 0 : sh.Ts[s];
      if (!v.ok() && a.record->kind == kLlOk) *a.record = v;
    }
  }
  __syncthreads();
  const bool failed = sh.failed != 0;
  // The offsets (the same in every block; the own column stays 0).
  for (int l = tid; l < L; l += kLlThreads) {
    int run = 0;
    for (int q = 0; q < W; ++q) {
      const int s = ll_source_at(q, me, W);
      sh.off[l * W + s] = run;
      run += sh.cnt[l * W + s];
    }
    if (blockIdx.x == 0) a.counts[l] = failed ? 0 : run;
  }
  __syncthreads();
  if (blockIdx.x == 0)
    for (int q = tid; q < L * W; q += kLlThreads) {
      a.src_counts[q] = failed ? 0 : sh.cnt[q];
      a.src_offsets[q] = failed ? 0 : sh.off[q];
    }
  if (failed) return;  // block-uniform

  // 6. The peers' rows of this block's tokens, from staging.
  const int maxT = most_peer_tokens(sh.Ts, W, me);
  for (int t = blockIdx.x; t < maxT; t += B)
    for (int q = 1; q < W; ++q) {
      const int s = ll_source_at(q, me, W);
      if (t < sh.Ts[s])
        pack_token<true>(a, sh, s, t,
                         reinterpret_cast<const int4*>(a.stage[me] + (static_cast<long long>(s) * a.max_tokens + t) * a.H));
    }
}

struct CombineShared {
  int off[kLlMaxExperts];  // L x W
  int Ts[kMaxWorld];
  int failed;
  const int4* src[kLlMaxTopk];
  int4* dst[kLlMaxTopk];
  float wt[kLlMaxTopk];
  int n;
};

__global__ void __launch_bounds__(kLlThreads, 2) ll_combine(const __grid_constant__ LlArgs a) {
  __shared__ CombineShared sh;
  pdl_enter();
  const int tid = threadIdx.x, k = a.k, me = a.sig.rank, B = gridDim.x;
  const int W = a.g.world, L = a.g.local_experts(), nv = a.H / 8;
  for (int q = tid; q < L * W; q += kLlThreads) sh.off[q] = a.src_offsets[q];
  if (tid < W) sh.Ts[tid] = a.state[kLlStateTokens + tid];
  if (tid == 0) sh.failed = a.state[kLlStateFailed];
  __syncthreads();
  const bool failed = sh.failed != 0;

  // 1. The expert outputs of the peers' tokens this block packed, to their home ranks' landing rows.
  if (!failed) {
    const int maxT = most_peer_tokens(sh.Ts, W, me);
    for (int t = blockIdx.x; t < maxT; t += B)
      for (int q = 1; q < W; ++q) {
        const int s = ll_source_at(q, me, W);
        if (t >= sh.Ts[s]) continue;
        if (tid < 32) {
          int code = kLlNoSlot;
          if (tid < k) code = __ldcg(a.route[me] + (static_cast<long long>(s) * a.max_tokens + t) * k + tid);
          const unsigned has = __ballot_sync(0xffffffffu, code != kLlNoSlot);
          if (code != kLlNoSlot) {
            const int p = __popc(has & tile::lanemask_lt());
            const int row = ll_packed_row(code, sh.off, W, s, a.row_stride);
            sh.src[p] = reinterpret_cast<const int4*>(a.y + static_cast<long long>(row) * a.H);
            sh.dst[p] = reinterpret_cast<int4*>(a.landing[s] + ll_landing_row(t, tid, k) * a.H);
          }
          if (tid == 0) sh.n = __popc(has);
        }
        __syncthreads();
        if (sh.n) copy_rows(sh.src, sh.dst, sh.n, nv);
        __syncthreads();
      }
  }
  __syncthreads();
  if (tid == 0 && W > 1) {
    signal_peers(a.sig, 0);
    wait(a.sig, 0, a.round * a.per_round);
  }
  __syncthreads();

  // 2. This rank's tokens: out[t] = bf16(sum_j w[t, j] y[t, j]), fp32 fma in slot order; NaN after a
  //    failed dispatch.
  const bf16* land = a.landing[me];
  for (int t = blockIdx.x; t < a.T; t += B) {
    if (tid < k && !failed) {
      const long long i = static_cast<long long>(t) * k + tid;
      const int code = a.route[me][static_cast<long long>(me) * a.max_tokens * k + i];
      bool local = false;
      const long long row = ll_home_row(code, sh.off, W, me, a.row_stride, t, tid, k, &local);
      sh.src[tid] = reinterpret_cast<const int4*>((local ? a.y : land) + row * a.H);
      sh.wt[tid] = __ldg(a.w + i);
    }
    __syncthreads();
    int4* o = reinterpret_cast<int4*>(a.out + static_cast<long long>(t) * a.H);
    for (int v = tid; v < nv; v += kLlThreads) o[v] = failed ? detail::nan_vec() : detail::weighted_sum_vec(sh.src, sh.wt, k, v);
    __syncthreads();
  }
}

// SwiGLU on the fixed-stride layout (swiglu_row.cuh, the packed pass's math): rows
// [l S, l S + counts[l]) of each expert, one warp per row.

constexpr int kSwigluThreads = 256;

__global__ void __launch_bounds__(kSwigluThreads) ll_swiglu(const uint4* __restrict__ G, uint4* __restrict__ Hout,
                                                            const int* __restrict__ counts, int L, int S, int F8) {
  const int lane = threadIdx.x % 32, warps = gridDim.x * (kSwigluThreads / 32);
  const long long rows = static_cast<long long>(L) * S;
  for (long long r = blockIdx.x * (kSwigluThreads / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const int l = static_cast<int>(r / S);
    const int c = __ldg(counts + l);
    if (r - static_cast<long long>(l) * S >= (c < 0 ? 0 : c)) continue;
    swiglu_row(G + r * 2 * F8, Hout + r * F8, F8, lane);
  }
}

}  // namespace weave::moe::ll
