// The fused gemm_combine of issue 21 (kernels/moe/README.md, "Fused gemm_combine"): the down
// projection's grouped GEMM whose finished output tiles go straight to their tokens' home ranks,
// instead of a GEMM into the exchange's output buffer followed by moe_combine's pull. Each tile's
// rows are pushed (bf16, by the GEMM's idle producer warps, as soon as the tile is done) into row
// token * k + slot of the home rank's landing buffer; the home rank then sums its k rows per token
// with the router weights in fp32 (moe_combine's math, bit for bit). Collective; stream order only,
// no host synchronisation.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "moe/exchange.hpp"
#include "moe/grouped_gemm.hpp"

namespace weave::moe {

class MoeGemmCombine {
 public:
  // Collective (every rank, on the same exchange): the symmetric landing buffer (max_tokens x k x H
  // bf16 per rank) and the signal set. The exchange must outlive this object.
  explicit MoeGemmCombine(MoeExchange& ex);
  ~MoeGemmCombine();
  MoeGemmCombine(const MoeGemmCombine&) = delete;
  MoeGemmCombine& operator=(const MoeGemmCombine&) = delete;

  // Collective, once per dispatch, after it (d: the exchange's latest dispatch, in stream order):
  //   out[t] = sum_j w[t, j] * (h[row(t, j)] W_down[l]^T), fp32 sum in slot order, bf16 out,
  // with the expert outputs rounded to bf16 first (exactly grouped_gemm + moe_combine).
  //   h: the rows' inputs in the grouped layout (capacity x F bf16, local: SwiGLU's output);
  //   W_down: L x H x F bf16 (nn.Linear out x in), this rank's experts; F a multiple of 8;
  //   topk_weights: T x k fp32; out: T x H bf16; T = the dispatch's T on this rank.
  // Ordering: peers write this rank's landing buffer again once the exchange's next dispatch has
  // exchanged its counts, so that dispatch must follow run() in stream order (the same stream, or
  // one that waits for it), as it does in the layer.
  // A failed dispatch (bad id, capacity) computes nothing and writes NaN, as moe_combine does
  // (MoeExchange::check reports why). Argument errors throw weave::Error on every rank before
  // anything is launched. opt: group_m and status as grouped_gemm's; the layout must be NK and
  // num_comm_sms 0 (the push uses the compute blocks' idle warps, no communicator SM).
  void run(const Dispatched& d, const __nv_bfloat16* h, const __nv_bfloat16* W_down, int F,
           const float* topk_weights, __nv_bfloat16* out, int T, cudaStream_t s, const GroupedGemmOptions& opt = {});

  __nv_bfloat16* landing() const;  // this rank's landing buffer (max_tokens x k x H bf16)
  MoeExchange& exchange() const;
  // What run() would refuse on this rank ("" if nothing), without the cross-rank agreement; d null:
  // for the call after a dispatch not launched yet (the fused layer checks it before its dispatch,
  // layer.hpp), so the checks that need the Dispatched are left out.
  std::string problem(const Dispatched* d, const __nv_bfloat16* h, const __nv_bfloat16* W_down, int F,
                      const float* topk_weights, const __nv_bfloat16* out, int T, const GroupedGemmOptions& opt) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The operator under issue 21's name.
inline void gemm_combine(MoeGemmCombine& gc, const Dispatched& d, const __nv_bfloat16* h, const __nv_bfloat16* W_down,
                         int F, const float* topk_weights, __nv_bfloat16* out, int T, cudaStream_t s,
                         const GroupedGemmOptions& opt = {}) {
  gc.run(d, h, W_down, F, topk_weights, out, T, s, opt);
}

}  // namespace weave::moe
