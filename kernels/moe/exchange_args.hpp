// The kernel parameters of the MoE dispatch and combine (exchange_kernels.cuh) and the rank's
// status words: plain data, shared with the fused dispatch_gemm's host side (dispatch_gemm.cu),
// which hands the dispatch's parameters to its own kernel.
#pragma once
#include <cuda_bf16.h>
#include <vector_types.h>

#include "moe/exchange_plan.hpp"
#include "weave/config.hpp"
#include "weave/signal_types.hpp"

namespace weave::moe::detail {

using bf16 = __nv_bfloat16;

// Status words of the rank's last dispatch (local device memory).
enum StatusWord : int {
  kStatusFailed = 0,   // the call's verdict was not ok (every rank has the same)
  kStatusRows = 1,     // rows this rank received (rank_rows)
  kStatusBadSlot = 2,  // route_walk's atomicMin of out-of-range entries, INT_MAX = none
  kStatusWords = 4,
};

struct DispatchArgs {
  const bf16* x;
  const int* idx;
  int T, k, H, capacity;
  Geometry g;
  int* hist;         // max chunks x E: per-chunk histograms, then their prefixes over chunks
  int* base;         // E: first row of block (local_of(e), this rank) on rank_of(e)
  int2* plan;        // T x k: {rank, row} of each (token, slot): what combine reads back
  int* counts;       // L
  int* offsets;      // L + 1
  int* status;       // kStatusWords
  Verdict* record;   // the first failed call's verdict since the host last looked
  int* mat[kMaxWorld];         // count rows of every rank: 2 parities x W x row_ints(E)
  bf16* xrecv[kMaxWorld];      // grouped buffers, capacity x H
  RowMeta* meta[kMaxWorld];    // capacity
  signals sig;                 // 0: count rows (W per call), 1: pushed (W x push_blocks per non-fused call)
  Round round;
  // Counter 1's running total after this call's pushes: fused calls (dispatch_gemm) push through
  // their own counters and add nothing to it.
  Round pushed_expected;
  // The fused dispatch_gemm only (null otherwise): route_walk<true> also lists this rank's
  // (token, slot) entries in send order (dispatch_gemm_schedule.hpp), from exchange_counts' order.
  int* order;   // E + 1: send_offsets of this rank's counts (zeros after a failed verdict)
  int2* slist;  // T x k: {token * k + slot, the token's primary slot on that rank}, in send order
  // Its aux warps' counters (signal set of the fused call: L arrivals, L ready) and this call's
  // running totals of them.
  signals fsig;
  Round arrive_expected, ready_expected;
};

struct CombineArgs {
  const bf16* y[kMaxWorld];
  const float* w;
  const int2* plan;
  bf16* out;
  const int* status;
  int T, k, H;
  signals sig;  // 0: outputs ready (W per call), 1: done reading (W x blocks per call)
  Round round;
  int blocks;
};

}  // namespace weave::moe::detail
