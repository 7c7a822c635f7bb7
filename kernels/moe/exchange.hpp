// Expert-parallel MoE dispatch and combine (issue 21), the non-fused version: token rows go to
// the ranks of their experts once per rank and land in each receiver's expert-grouped buffer
// (layout.hpp's receiver layout), and expert output rows come back weighted and summed. Every
// call is collective; nothing synchronizes with the host (counts and offsets stay on the device).
// Design, schedule and reasons: README.md next to this file.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moe/exchange_plan.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::moe {

struct ExchangeConfig {
  int experts = 0;     // E, a multiple of the world size, at most kMaxExchangeExperts
  int hidden = 0;      // H, a multiple of 8 (rows move as 16-byte vectors)
  int topk = 0;        // k, 1..kMaxTopk
  int max_tokens = 0;  // the most tokens any rank passes to one call
  // Rows of each rank's grouped buffer (layout.hpp's receive_capacity gives a safe one for
  // balanced routing; worst_case_rows for any top-k routing).
  int capacity = 0;
  // Also allocate a symmetric capacity x H buffer for the experts' output rows (expert_output()),
  // which combine reads from peers: the grouped GEMM can write there directly.
  bool output_buffer = true;
};

// What dispatch produced on this rank, all device memory owned by the exchange and valid until
// its next dispatch.
struct Dispatched {
  __nv_bfloat16* rows = nullptr;   // grouped buffer: rows [offsets[l], offsets[l + 1]) for local expert l
  const int* counts = nullptr;     // L: rows per local expert (zero after a failed call)
  const int* offsets = nullptr;    // L + 1: exclusive prefix of counts
  const RowMeta* meta = nullptr;   // capacity: source rank, token, primary row and slot of each row
  int capacity = 0;
  int local_experts = 0;
  const int* failed = nullptr;     // device int: nonzero when the call failed (on every rank alike)
  int tokens = 0;                  // this rank's T of the call
  unsigned long long call = 0;     // the exchange's dispatch number (1, 2, ...): gemm_combine checks it
};

namespace detail {
struct DispatchArgs;  // exchange_kernels.cuh
}

// A fused operator built on the dispatch (dispatch_gemm.hpp): its name and plan values join the
// call's cross-rank agreement, its own local checks the call's, and `launch` replaces the push and
// duplication kernels (the routing steps before them are the dispatch's). Its kernel runs
// `aux_warps` warps that signal the exchange's fused counters (dispatch_gemm_schedule.hpp).
struct FusedDispatch {
  std::string op, what;
  std::vector<long long> values;
  std::string problem;
  int aux_warps = 0;
  std::function<void(const detail::DispatchArgs&, cudaStream_t)> launch;
};

class MoeExchange {
 public:
  // Collective (every rank, same config, checked): allocates the symmetric buffers and signals.
  MoeExchange(runtime::Communicator& comm, const ExchangeConfig& cfg);
  ~MoeExchange();
  MoeExchange(const MoeExchange&) = delete;
  MoeExchange& operator=(const MoeExchange&) = delete;

  // Collective. x: T x H bf16 (row-major, 16-byte aligned), topk_idx: T x k int32, T <= max_tokens
  // (T may differ across ranks). Sends each token once to every rank holding one of its experts;
  // on return (in stream order) this rank's grouped buffer holds every (token, slot) routed to its
  // experts, duplicated per expert. Stream order only: no host synchronization.
  //
  // An out-of-range id on any rank, or any rank's rows past the capacity, makes the call fail on
  // every rank alike: nothing is sent, counts are zero, the following combine writes NaN, and the
  // reason is kept on the device until check() reports it (as weave::Error, on every rank).
  Dispatched dispatch(const __nv_bfloat16* x, const int* topk_idx, int T, cudaStream_t s);
  // The same call with `fused`'s kernel in place of the push and duplication (dispatch_gemm.hpp).
  Dispatched dispatch(const __nv_bfloat16* x, const int* topk_idx, int T, cudaStream_t s,
                      const FusedDispatch& fused);

  // Collective, after dispatch (same T): out[t] = sum_j w[t, j] * Y_rank(t, j)[row(t, j)], fp32 sum
  // in slot order, bf16 result. y: the experts' output rows in the grouped layout (capacity x H,
  // symmetric: expert_output() or any heap / registered buffer); topk_weights: T x k fp32; out:
  // T x H bf16. Returns once every peer has read this rank's y (y may then be overwritten).
  void combine(const __nv_bfloat16* y, const float* topk_weights, __nv_bfloat16* out, int T, cudaStream_t s);

  // Synchronizes `s` (through Communicator::sync: device errors and wait timeouts throw there) and
  // throws weave::Error with the first failed dispatch's reason since the last check, naming the
  // expert and the count (overflow) or the rank, token, slot and id (out-of-range id). Every rank
  // reaches the same verdict. The exchange stays usable after it.
  void check(cudaStream_t s);

  __nv_bfloat16* expert_input() const;   // the grouped buffer (symmetric, capacity x H)
  __nv_bfloat16* expert_output() const;  // the output buffer (nullptr without output_buffer)
  const ExchangeConfig& config() const;
  // Dispatches launched on this exchange so far (the last one's Dispatched::call).
  unsigned long long dispatches() const;
  // The communicator the exchange was made on (for operators built on it, e.g. layer.hpp's
  // cross-rank argument check).
  runtime::Communicator& communicator() const;
  // The smallest SM count of all ranks (the exchange's grids; fused kernels size theirs by it).
  int min_sm_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The operators under the names of issue 21.
inline Dispatched moe_dispatch(MoeExchange& ex, const __nv_bfloat16* x, const int* topk_idx, int T,
                               cudaStream_t s) {
  return ex.dispatch(x, topk_idx, T, s);
}
inline void moe_combine(MoeExchange& ex, const __nv_bfloat16* y, const float* topk_weights, __nv_bfloat16* out,
                        int T, cudaStream_t s) {
  ex.combine(y, topk_weights, out, T, s);
}

}  // namespace weave::moe
