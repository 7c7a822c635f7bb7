// fp8 transpose for the gradient GEMMs (kernels/gemm_fp8/README.md, "Gradient layouts").
//
// Hopper's fp8 wgmma reads both operands K-major only, so gemm_fp8::gemm (C = A * B^T, A M x K and
// B N x K row-major) cannot take a transposed operand; the two backward GEMMs of a linear layer
// need one (Transformer Engine and DeepGEMM make transposed fp8 copies the same way):
//
//   forward  Y  = X W^T      X  M x K_in (tokens x features), W N_out x K_in (nn.Linear), Y M x N_out
//   dgrad    dX = dY W       reduction over N_out, which runs along W's rows: B must be W^T
//   wgrad    dW = dY^T X     reduction over the M tokens: both operands must be token-major
//
//   dgrad:  transpose_fp8(W, Wt, N_out, K_in);          // Wt: K_in x N_out
//           gemm(dY, Fp8::E5M2, Wt, Fp8::E4M3, dX, M, K_in, N_out, sa, sb);
//           // A = dY (M x N_out), B = Wt (K_in x N_out), C = dX (M x K_in), the GEMM's K = N_out
//   wgrad:  transpose_fp8(dY, dYt, M, N_out);           // dYt: N_out x M
//           transpose_fp8(X, Xt, M, K_in);              // Xt:  K_in x M
//           gemm(dYt, Fp8::E5M2, Xt, Fp8::E4M3, dW, N_out, K_in, M, sa, sb);
//           // A = dYt (N_out x M), B = Xt (K_in x M), C = dW (N_out x K_in), the GEMM's K = M
//
// dY is e5m2 (gradients need the range), W and X e4m3: e5m2 x e4m3 is one of gemm_fp8's type pairs.
// Per-tensor scales are unchanged by a transpose. With block scales (gemm_block_scaled), dgrad's
// weight scales transpose too: W's 128 x 128 block scales, a ceil(N_out/128) x ceil(K_in/128) float
// matrix sW[ob * ceil(K_in/128) + ib], become Wt's scale_b[ib * ceil(N_out/128) + ob] (a tiny array:
// on the host or with any transpose); dY's per-(row, 128-column) scales are already scale_a's
// layout. Block-scaled wgrad needs dY and X quantised along the tokens (scales per 128 tokens), which
// is a different quantisation, not a transpose of the forward's: quantize.hpp writes those copies
// (and every per-tensor or weight Qt without a separate transpose pass) from the bf16 tensors.
//
// Shapes: rows and cols multiples of 16 (16-byte vectors; the transposed matrix's row is `rows`
// bytes, and the GEMM's TMA needs 16-byte row pitches anyway), so wgrad's token count M must be
// padded to a multiple of 16 (zero rows add nothing to dW).
#pragma once
#include <cuda_runtime.h>

namespace weave::gemm_fp8 {

// dst (cols x rows, row-major) = src^T (src rows x cols, row-major), one byte per element (e4m3 or
// e5m2: the bytes are copied exactly, NaN and Inf codes included). Asynchronous on `stream`.
// rows and cols positive multiples of 16; src and dst 16-byte aligned device pointers to
// allocations of at least rows * cols bytes (weave/common/extent.hpp), not overlapping (no
// in-place transpose). Anything else throws weave::Error before anything is launched.
void transpose_fp8(const void* src, void* dst, int rows, int cols, cudaStream_t stream = nullptr);

}  // namespace weave::gemm_fp8
