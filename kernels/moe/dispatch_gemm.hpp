// The fused dispatch_gemm of issue 21 (kernels/moe/README.md, "Fused dispatch_gemm"): moe_dispatch
// and the up projection's grouped GEMM in one kernel, whose tiles of an expert start as soon as
// that expert's rows have arrived from every rank, instead of after the whole exchange. The rows
// move through the GEMM's idle producer warps (no communicator SM). Collective; stream order only,
// no host synchronisation.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "moe/exchange.hpp"
#include "moe/grouped_gemm.hpp"

namespace weave::moe {

// Collective (every rank, same exchange). Exactly ex.dispatch(x, topk_idx, T, s) followed by
// grouped_gemm(d.rows, W, Y, d.counts, L, N, H, capacity, s, opt), bit for bit (the grouped buffer,
// its metadata, the counts and Y), returning the same Dispatched:
//   x: T x H bf16, topk_idx: T x k int32 (T <= max_tokens), as dispatch;
//   W: L x N x H bf16, this rank's experts (nn.Linear out x in; the layer's up projection has
//     N = 2F: gate rows, then up rows); N a multiple of 8;
//   Y: capacity x N bf16 (local), rows past the rank's received rows untouched.
// Errors as dispatch's (a bad id or a capacity overflow fails the call on every rank alike: nothing
// sent, nothing computed, MoeExchange::check says why) and the grouped GEMM's argument checks, on
// every rank before anything is launched. opt: group_m, status and max_compute_blocks as
// grouped_gemm's; the layout must be NK and num_comm_sms 0 (the rows move through the compute
// blocks' idle warps).
Dispatched dispatch_gemm(MoeExchange& ex, const __nv_bfloat16* x, const int* topk_idx, int T, const __nv_bfloat16* W,
                         int N, __nv_bfloat16* Y, cudaStream_t s, const GroupedGemmOptions& opt = {});

// What dispatch_gemm's GEMM part would refuse on this rank ("" if nothing), without the dispatch's
// own checks or the agreement (the fused layer checks it before its first launch).
std::string dispatch_gemm_problem(const MoeExchange& ex, const __nv_bfloat16* W, int N, const __nv_bfloat16* Y,
                                  const GroupedGemmOptions& opt);

}  // namespace weave::moe
