// The expert-parallel MoE layer forward, non-fused (kernels/moe/README.md, "The layer"):
// dispatch -> grouped GEMM (up: gate and up, N = 2F, K = H) -> SwiGLU -> grouped GEMM (down:
// N = H, K = F, into the exchange's output buffer) -> combine; fused; and the low-latency (decode)
// layer on MoeLowLatency's fixed-stride layout. Collective; stream order only, no host
// synchronisation (the per-expert counts stay on the device).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/exchange.hpp"
#include "moe/gemm_combine.hpp"
#include "moe/grouped_gemm.hpp"
#include "moe/low_latency.hpp"

namespace weave::moe {

// The layer's local scratch, sized by the exchange's capacity: the up projection's output G
// (capacity x 2F) and the SwiGLU output (capacity x F), bf16, plain device memory (never read by
// a peer). One per (exchange, F); calls on one scratch must be in one stream's order.
class MoeLayerScratch {
 public:
  MoeLayerScratch(const MoeExchange& ex, int ffn);
  ~MoeLayerScratch();
  MoeLayerScratch(const MoeLayerScratch&) = delete;
  MoeLayerScratch& operator=(const MoeLayerScratch&) = delete;

  int ffn() const { return F_; }
  int capacity() const { return cap_; }
  __nv_bfloat16* up_output() const { return G_; }      // capacity x 2F: gate (first F columns), up
  __nv_bfloat16* swiglu_output() const { return H_; }  // capacity x F

 private:
  int F_ = 0, cap_ = 0, device_ = 0;
  __nv_bfloat16* G_ = nullptr;
  __nv_bfloat16* H_ = nullptr;
};

// Collective (every rank, same exchange config and F). On this rank:
//   x: T x H bf16 tokens, topk_idx: T x k int32, topk_weights: T x k fp32 (T <= max_tokens);
//   W_up: L x 2F x H bf16, this rank's L = E / W experts (local expert l is global expert
//     rank * L + l), nn.Linear layout (out x in); rows 0..F-1 of W_up[l] are the GATE projection,
//     rows F..2F-1 the UP projection (swiglu.hpp's G layout);
//   W_down: L x H x F bf16 (out x in);
//   out: T x H bf16, out[t] = sum_j w[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = idx[t, j].
// Needs the exchange's output buffer (ExchangeConfig::output_buffer): the down projection writes
// there and combine reads it from the peers. Errors: the exchange's argument checks (weave::Error
// at once, on every rank); a failed dispatch (bad expert id, capacity) leaves zero counts, so the
// GEMMs and SwiGLU do nothing and combine writes NaN, and MoeExchange::check reports it; the
// grouped GEMMs' own refusals go to `gemm_opt.status` (grouped_gemm.hpp's check_status). The GEMMs
// split K only when gemm_opt.split_k forces it (2..): its default 0 runs here as 1, so that this
// layer, the fused one and the low-latency one give the same bits.
void moe_layer_forward(MoeExchange& ex, MoeLayerScratch& scratch, const __nv_bfloat16* x, const int* topk_idx,
                       const float* topk_weights, int T, const __nv_bfloat16* W_up, const __nv_bfloat16* W_down,
                       __nv_bfloat16* out, cudaStream_t stream, const GroupedGemmOptions& gemm_opt = {});

// The same layer, fused: dispatch_gemm (the up projection's tiles of an expert start once its rows
// have arrived; dispatch_gemm.hpp) -> SwiGLU -> gemm_combine (the down projection's tiles pushed to
// their tokens' home ranks as they finish, then the weighted sum there; gemm_combine.hpp). Same arguments, result and error behaviour as moe_layer_forward, bit
// for bit the same output; `gc` must be made on `ex` (the exchange's output buffer is not used).
// gemm_opt applies to both GEMMs; its layout must be NK and num_comm_sms 0.
void moe_layer_forward_fused(MoeExchange& ex, MoeGemmCombine& gc, MoeLayerScratch& scratch, const __nv_bfloat16* x,
                             const int* topk_idx, const float* topk_weights, int T, const __nv_bfloat16* W_up,
                             const __nv_bfloat16* W_down, __nv_bfloat16* out, cudaStream_t stream,
                             const GroupedGemmOptions& gemm_opt = {});

// The low-latency layer's local scratch, sized by the fixed-stride layout (R = L x row_stride rows):
// the up projection's output G (R x 2F), the SwiGLU output (R x F) and the down projection's
// output Y (R x H, which combine reads), bf16, plain device memory. One per (MoeLowLatency, F).
class MoeLowLatencyScratch {
 public:
  MoeLowLatencyScratch(const MoeLowLatency& ll, int ffn);
  ~MoeLowLatencyScratch();
  MoeLowLatencyScratch(const MoeLowLatencyScratch&) = delete;
  MoeLowLatencyScratch& operator=(const MoeLowLatencyScratch&) = delete;

  int ffn() const { return F_; }
  int rows() const { return R_; }
  int hidden() const { return hidden_; }
  __nv_bfloat16* up_output() const { return G_; }      // R x 2F: gate (first F columns), up
  __nv_bfloat16* swiglu_output() const { return H_; }  // R x F
  __nv_bfloat16* expert_output() const { return Y_; }  // R x H

 private:
  int F_ = 0, R_ = 0, hidden_ = 0, device_ = 0;
  __nv_bfloat16* G_ = nullptr;  // one allocation: G, then H, then Y
  __nv_bfloat16* H_ = nullptr;
  __nv_bfloat16* Y_ = nullptr;
};

// The decode layer (at most max_tokens tokens per rank and call): ll.dispatch -> grouped GEMM (up,
// row_stride S) -> swiglu_strided -> grouped GEMM (down, row_stride S) -> ll.combine. Collective;
// arguments, weights and result as moe_layer_forward (x, topk_idx, topk_weights, T <= max_tokens,
// W_up L x 2F x H, W_down L x H x F, out T x H). What the GEMMs and SwiGLU would refuse is agreed
// with every rank before the dispatch; a failed dispatch leaves zero counts (ll.check reports it).
// gemm_opt's row_stride is set to S. Returns the dispatch's result (its counts, on the device).
LowLatencyDispatched moe_low_latency_forward(MoeLowLatency& ll, MoeLowLatencyScratch& scratch, const __nv_bfloat16* x,
                                             const int* topk_idx, const float* topk_weights, int T,
                                             const __nv_bfloat16* W_up, const __nv_bfloat16* W_down,
                                             __nv_bfloat16* out, cudaStream_t stream,
                                             const GroupedGemmOptions& gemm_opt = {});

}  // namespace weave::moe
