// One plain (unfused) GEMM on a TP call's inputs, for the host-only variants (ag_gemm 8 and 9,
// gemm_rs 3 and 4): bf16 through gemm::gemm with B's layout, fp8 through gemm_fp8::gemm with the
// call's per-tensor scales.
#pragma once
#include "gemm/gemm.hpp"
#include "gemm_fp8/gemm_fp8.hpp"
#include "tp_common/host.hpp"

namespace weave::tp {

// C (rows x N, bf16) = A (rows x K at `a`, the inputs' type) * B, or C += A * B with `accumulate`
// (bf16 only: the fp8 GEMM has no accumulating epilogue, and its callers never ask for one).
inline void plain_gemm(const Inputs& in, const void* a, bf16* C, int rows, int N, int K, cudaStream_t s,
                       bool accumulate = false) {
  if (in.fp8) {
    WEAVE_CHECK(!accumulate, "tp: the fp8 GEMM cannot accumulate into C");
    gemm_fp8::gemm(a, gemm_fp8::Fp8::E4M3, in.b, gemm_fp8::Fp8::E4M3, C, rows, N, K, in.scale_a, in.scale_b, {}, s);
    return;
  }
  gemm::Options o;
  o.accumulate = accumulate;
  gemm::gemm(static_cast<const bf16*>(a), static_cast<const bf16*>(in.b), C, rows, N, K, in.bl, o, s);
}

}  // namespace weave::tp
