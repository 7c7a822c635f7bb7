// The MoE low-latency (decode) mode of issue 21: dispatch and combine for small batches (at most
// 256 tokens per rank and call) in one kernel each, with no count exchange before the rows move.
// Every (token, slot) row lands in its expert's region of a fixed-stride receive buffer on the
// expert's rank (L x S rows, S = W x max_tokens: expert l's rows at [l S, l S + count[l]), packed),
// which the grouped GEMM reads with GroupedGemmOptions::row_stride = S; the expert outputs, in the
// same layout, go back to their tokens' home ranks and are summed there (fp32, slot order). Every
// call is collective; nothing synchronizes with the host. Design, schedule and reasons:
// README.md next to this file, "Low-latency mode"; the layout: low_latency_schedule.hpp.
//
//   #include "moe/low_latency.hpp"   // link weave_moe_low_latency
//   weave::moe::MoeLowLatency ll(comm, {E, H, k, max_tokens});           // collective, once
//   const auto d = ll.dispatch(x, topk_idx, T, s);                         // T <= max_tokens
//   GroupedGemmOptions o;  o.row_stride = d.row_stride;
//   grouped_gemm(d.rows, W_up, G, d.counts, L, 2F, H, L * d.row_stride, s, o);
//   swiglu_strided(G, Hb, d.counts, L, d.row_stride, F, s);
//   grouped_gemm(Hb, W_down, Y, d.counts, L, H, F, L * d.row_stride, s, o);
//   ll.combine(Y, topk_weights, out, T, s);
//   ll.check(s);                                                           // later, off the hot path
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "moe/low_latency_schedule.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::moe {

struct LowLatencyConfig {
  int experts = 0;     // E, a multiple of the world size, at most kLlMaxExperts (1024)
  int hidden = 0;      // H, a multiple of 8 (rows move as 16-byte vectors)
  int topk = 0;        // k, 1..kLlMaxTopk (16)
  int max_tokens = 0;  // the most tokens any rank passes to one call, 1..kLlMaxTokens (256)
};

// What a dispatch produced on this rank: device memory owned by the MoeLowLatency, valid until
// its next dispatch (the counts, offsets and metadata; `rows` until the next dispatch too).
struct LowLatencyDispatched {
  __nv_bfloat16* rows = nullptr;     // L x row_stride x H: local expert l's rows at [l S, l S + counts[l])
  const int* counts = nullptr;       // L: rows per local expert (zero after a failed call): the grouped GEMM's counts
  const int* src_counts = nullptr;   // L x W: rows of local expert l from source rank s ([l * W + s])
  const int* src_offsets = nullptr;  // L x W: where they start inside the expert's region (own rank first)
  const LlRowMeta* meta = nullptr;   // L x row_stride: source rank, token, slot and expert of each row
  int row_stride = 0;                // S = W x max_tokens
  int local_experts = 0, world = 0, hidden = 0;
  int tokens = 0;                    // this rank's T of the call
  const int* failed = nullptr;       // device int: nonzero when the call failed (every rank alike)
  unsigned long long call = 0;       // 1, 2, ...
};

class MoeLowLatency {
 public:
  // Collective (every rank, the same config, checked): the symmetric buffers (staging rows,
  // route codes, headers, landing rows: about (W + k) x max_tokens x H x 2 bytes), this rank's
  // receive buffer (L x W x max_tokens x H x 2 bytes, plain device memory) and two signal sets.
  MoeLowLatency(runtime::Communicator& comm, const LowLatencyConfig& cfg);
  ~MoeLowLatency();
  MoeLowLatency(const MoeLowLatency&) = delete;
  MoeLowLatency& operator=(const MoeLowLatency&) = delete;

  // Collective, one kernel. x: T x H bf16 (16-byte aligned), topk_idx: T x k int32, T <=
  // max_tokens (T may differ across ranks). On return (in stream order) every local expert's rows
  // are in the receive buffer. Dispatch and combine alternate (a dispatch before the previous one
  // was combined is refused on the host): the combine is what tells every rank that the call's
  // buffers are free again.
  //
  // An out-of-range id on any rank, or a rank putting more than max_tokens rows on one expert
  // (only possible when a token names an expert twice), fails the call on every rank alike:
  // counts are zero, the following combine writes NaN, the reason stays on the device until
  // check() reports it. The receive buffer's content is then unspecified.
  LowLatencyDispatched dispatch(const __nv_bfloat16* x, const int* topk_idx, int T, cudaStream_t s);

  // Collective, one kernel, after dispatch (the same T): out[t] = bf16(sum_j w[t, j] y[t, j]), fp32
  // fma in slot order (combine_sum.cuh, as moe_combine), where y[t, j] is the expert output of
  // (t, j) in the receive layout. y: L x row_stride x H bf16 in any device memory of this rank
  // (e.g. the down projection's grouped GEMM output); topk_weights: T x k fp32; out: T x H bf16
  // (16-byte aligned). Returns (in stream order) once every peer has pushed its rows here; y may be
  // overwritten after it.
  void combine(const __nv_bfloat16* y, const float* topk_weights, __nv_bfloat16* out, int T, cudaStream_t s);

  // Synchronizes `s` (Communicator::sync: device errors and wait timeouts throw there), then throws
  // weave::Error with the first failed dispatch's reason since the last check, e.g. "moe
  // low-latency dispatch: expert id 70 on rank 1 (token 7, slot 1) is outside 0..E-1; nothing was
  // dispatched". Every rank reaches the same verdict. Stays usable after it.
  void check(cudaStream_t s);

  const LowLatencyConfig& config() const;
  int row_stride() const;
  int local_experts() const;
  int blocks() const;                    // blocks of both kernels (the same on every rank)
  __nv_bfloat16* receive_buffer() const;  // L x row_stride x H
  unsigned long long dispatches() const;
  runtime::Communicator& communicator() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// SwiGLU on the fixed-stride layout between the two projections of a decode layer, one launch:
// Hout[r, f] = silu(G[r, f]) * G[r, F + f] for rows r of expert l in [l S, l S + counts[l]) (swiglu.hpp's
// math and rounding; the gate is G's first F columns). G: L x S x 2F bf16, Hout: L x S x F bf16,
// both 16-byte aligned; counts: L ints in device memory (LowLatencyDispatched::counts). Rows
// outside the counts are not written. Throws weave::Error for F not a positive multiple of 8,
// L < 1, S < 1, misaligned buffers, or G, Hout or counts shorter than the above
// (weave/common/extent.hpp).
void swiglu_strided(const __nv_bfloat16* G, __nv_bfloat16* Hout, const int* counts, int L, int row_stride, int F,
                    cudaStream_t stream = nullptr);

}  // namespace weave::moe
