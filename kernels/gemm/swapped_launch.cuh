// Launches the swapped decode kernel in the configuration swapped::config() (bf16) or
// config_fp8() (fp8) picks: the one place that maps a Config to an instantiation (the bf16 GEMM's
// swapped.cu and the fp8 GEMM's swapped_fp8.cu instantiate it for their element types).
#pragma once
#include "gemm/swapped_kernel.cuh"
#include "weave/common/error.hpp"
#include "weave/lcsc.cuh"

namespace weave::gemm::swapped {

template <class Op, int NB, int S, int W, int D, class OutT>
void run(const Params& p, cudaStream_t stream) {
  swapped_kernel<Op, NB, S, OutT, W, D><<<ceil_div(p.N, kRows * S), W * 32, 0, stream>>>(p);
}

// Throws weave::Error for M outside 1..kMaxTokens; the rest of the arguments are the caller's to
// check. Returns the blocks launched.
template <class Op, class OutT>
lcsc::Plan launch_config(const Params& p, int sm_count, cudaStream_t stream) {
  WEAVE_CHECK(p.M >= 1 && p.M <= kMaxTokens, "gemm: the swapped decode tile takes 1..", kMaxTokens, " rows, got M = ",
              p.M);
  const Config c = Op::kBytes == 1 ? config_fp8(p.M, p.N, p.K, sm_count) : config(p.M, p.N, p.K, sm_count);
  if (token_blocks(p.M) == 1) {
    if (c.warps == 4) run<Op, 1, 1, 4, 1, OutT>(p, stream);
    else if (c.warps == 8) run<Op, 1, 1, 8, 1, OutT>(p, stream);
    else run<Op, 1, 1, 16, 1, OutT>(p, stream);
  } else if (c.strips_per_block == 1) {
    if (c.warps == 8) run<Op, 2, 1, 8, 2, OutT>(p, stream);
    else run<Op, 2, 1, 16, 2, OutT>(p, stream);
  } else {
    if (c.warps == 4) run<Op, 2, 2, 4, 2, OutT>(p, stream);
    else run<Op, 2, 2, 8, 2, OutT>(p, stream);
  }
  WEAVE_CUDA_CHECK(cudaGetLastError());
  return {blocks(p.N, c), 0};
}

}  // namespace weave::gemm::swapped
