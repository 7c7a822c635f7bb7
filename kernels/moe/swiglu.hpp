// SwiGLU on the expert-grouped rows of the MoE layer (kernels/moe/README.md, "SwiGLU"): between
// the up projection (grouped GEMM with N = 2F) and the down projection (N = H, K = F).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace weave::moe {

// Hout[r, f] = silu(G[r, f]) * G[r, F + f] for rows r < min(*rows, R_cap), f < F, computed in fp32
// from the bf16 inputs and rounded to bf16 once (round to nearest even). The fp32 steps add
// (2^-20 + |gate| 2^-23) relative at most (fast exp and division); a gate below about -87 gives 0
// (the true value is under 1e-36 in magnitude).
//   G: R_cap x 2F bf16, row-major, the up projection's output: the GATE is the first F columns
//      (W_up[e]'s rows 0..F-1), the UP half the last F (rows F..2F-1). Hout: R_cap x F bf16.
//   rows: one int in device memory, the rows actually present (e.g. Dispatched::offsets + L, the
//      sum of the local experts' counts); read by the kernel, never by the host (no
//      synchronisation). Null: all R_cap rows. A negative value counts as 0; rows past R_cap are
//      never touched. Rows of Hout at or past *rows are not written.
// Throws weave::Error before any launch for F not a positive multiple of 8, R_cap < 0, G / Hout
// not 16-byte aligned (rows move as 16-byte vectors), or G, Hout or rows shorter than the above
// (weave/common/extent.hpp).
void swiglu(const __nv_bfloat16* G, __nv_bfloat16* Hout, const int* rows, int R_cap, int F,
            cudaStream_t stream = nullptr);

// The blocks swiglu launches for (R_cap, F) on a device with `sms` SMs (the grid is sized by the
// capacity, capped, and every block strides over the rows the device finds; pure, CPU-tested).
int swiglu_blocks(int R_cap, int F, int sms);

}  // namespace weave::moe
