// fp8 quantiser: bf16 X -> the fp8 operands and scales gemm_fp8 takes (kernels/gemm_fp8/README.md,
// "Quantiser"), in one pass over X.
//
// X is rows x cols bf16, row-major. Outputs:
//   Q  (rows x cols fp8, row-major): X quantised, the K-major operand of the forward GEMM (K = cols);
//   Qt (cols x rows fp8, row-major, optional): X^T quantised, the K-major operand of a gradient GEMM
//      (K = rows), written from the same read of X (no transpose_fp8 pass);
//   scales in exactly the layouts gemm_fp8 / gemm_block_scaled read.
//
// Scale semantics: a scale is what gemm_fp8 multiplies by (x ~ scale * q, as the GEMM's
// C = scale_a scale_b A B^T). Quantisation divides by it, as a multiply by its reciprocal:
//   q = fp8_rne_satfinite(x * r),  r = 1 / scale (one correctly rounded fp32 reciprocal),
// x * r one fp32 multiply (round to nearest even), then the cuda_fp8 conversion: round to nearest
// even, saturating (|x * r| above the format's largest finite value, +-Inf included, becomes
// +-448 (e4m3) or +-57344 (e5m2)), NaN stays NaN (some NaN code), signed zeros keep their sign.
// A scale computed here (current scaling, blocks) is scale_from_amax(amax) below: amax / max_finite
// (one fp32 division), at least 2^-126, so that r = 1 / scale is finite; amax = max |x| over the
// block, NaN ignored, +Inf when the block holds an Inf (then scale = Inf, r = 0: the block's finite
// values quantise to 0 and its infinities to NaN, so a GEMM using the block gives NaN, not a
// silently finite result).
//
// Modes:
//   quantize_fp8          per tensor, the caller's scale (delayed scaling, as Transformer Engine):
//                         *scale is read on the device; *amax (optional) = max |x| of this X, for the
//                         next step's scale. Q and Qt share the scale; Qt's bytes are Q's transposed.
//   quantize_fp8_current  per tensor, current scaling: a first kernel reduces amax (reading X once
//                         more: 2 of the 3 (4 with Qt) bytes per element again), then the quantiser
//                         writes *scale = scale_from_amax(amax) and Q / Qt with it.
//   quantize_fp8_blocks   DeepSeek-V3 block scales, each copy its own kind:
//     Blocks::Row128     1 x 128: one scale per (row, 128 columns) of that copy: gemm_block_scaled's
//                        scale_a for the copy as A: Q's is ceil(cols/128) x rows (q_scales[cb * rows + r]),
//                        Qt's ceil(rows/128) x cols (qt_scales[rb * cols + c]: per X column and 128
//                        rows of X, i.e. along the tokens, as wgrad's A = dY^T needs);
//     Blocks::Block128   128 x 128: gemm_block_scaled's scale_b for the copy as B: Q's
//                        ceil(rows/128) x ceil(cols/128) (q_scales[rb * ceil(cols/128) + cb]), Qt's the
//                        same scales transposed, ceil(cols/128) x ceil(rows/128) (qt_scales[cb *
//                        ceil(rows/128) + rb]); with Block128 for both, Qt's bytes are Q's transposed.
//   Supported: Q Row128 or Block128; Qt none, Row128 or Block128 (all six combinations). A linear
//   layer's uses (X M x K_in activations, W N_out x K_in weights, dY M x N_out gradients, e5m2):
//     X:  Q Row128  (forward A),              Qt Block128 (wgrad B = X^T, K_in x M)
//     W:  Q Block128 (forward B),             Qt Block128 (dgrad B = W^T, K_in x N_out)
//     dY: Q Row128  (dgrad A, e5m2),          Qt Row128  (wgrad A = dY^T, N_out x M, e5m2)
//   so forward gemm_block_scaled(Xq, Wq, Y, M, N_out, K_in, sX, sW), dgrad (dYq, Wt, dX, M, K_in,
//   N_out, sdY, sWt), wgrad (dYt, Xt, dW, N_out, K_in, M, sdYt, sXt).
//
// Types: e4m3 or e5m2 output in every mode (gemm_fp8 takes e4m3 x e4m3, e5m2 x e4m3, e4m3 x e5m2).
// Shapes: rows >= 1 (any) and cols a positive multiple of 16 (a row of Q is cols bytes, gemm_fp8's
// K: 16-byte TMA pitches; 16-byte vector loads of X); with Qt, rows a multiple of 16 too (a row of Qt
// is rows bytes), so wgrad's tokens are padded to 16 (zero rows add nothing). x, q, qt 16-byte
// aligned, scales and amax 4-byte aligned, device allocations at least as long as the shape needs
// (weave/common/extent.hpp), outputs not overlapping X or each other. Anything else throws
// weave::Error before anything is launched. All calls are asynchronous on `stream`; amax is
// overwritten (zeroed on the stream first), not accumulated across calls.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "gemm_fp8/gemm_fp8.hpp"
#include "weave/common/host_device.hpp"

namespace weave::gemm_fp8 {

// The scale blocks of one fp8 copy (quantize_fp8_blocks).
enum class Blocks : int { None = 0, Row128 = 1, Block128 = 2 };

// Largest finite value of the format: 448 (e4m3), 57344 (e5m2).
WEAVE_HD inline float fp8_max_finite(Fp8 t) { return t == Fp8::E5M2 ? 57344.f : 448.f; }

// The scale of a block (or tensor) whose largest |x| is amax: amax / max_finite, at least 2^-126
// (the smallest normal float: an all-zero block gets it too, so 1 / scale stays finite). The
// kernels and the host agree bit for bit (IEEE division, no fast math).
WEAVE_HD inline float scale_from_amax(float amax, Fp8 t) {
  const float s = amax / fp8_max_finite(t);
  const float lo = 1.17549435e-38f;  // 2^-126
  return s >= lo ? s : lo;           // NaN (not produced by the kernels' amax) -> 2^-126 too
}

// Floats a copy's scale array holds: rows x cols is the copy's own shape (cols x rows for Qt).
// Row128: ceil(cols/128) * rows (block_scale_a_count(rows, cols)); Block128: ceil(rows/128) *
// ceil(cols/128) (block_scale_b_count(rows, cols)); None: 0.
size_t quantize_scale_count(Blocks b, int rows, int cols);
// The bytes one call must move at least (the floor): X read once (2 per element), Q written (1),
// Qt written (1 more), the scale arrays written.
double quantize_floor_bytes(int rows, int cols, Blocks q, Blocks qt, bool transpose);
// The checks that need no pointers; throw weave::Error. Shape and type (every mode):
void validate_quantize(int rows, int cols, Fp8 type, bool transpose);
// quantize_fp8_blocks' combination: q Row128 or Block128; qt None exactly when there is no Qt.
void validate_blocks(Blocks q, Blocks qt, bool transpose);
const char* blocks_name(Blocks b);

// Per tensor, the caller's scale (device pointer, read by the kernel). qt may be null (no Qt);
// amax may be null (not computed).
void quantize_fp8(const __nv_bfloat16* x, int rows, int cols, Fp8 type, void* q, void* qt, const float* scale,
                  float* amax = nullptr, cudaStream_t stream = nullptr);
// Per tensor, current scaling: *amax = max |x|, then *scale = scale_from_amax(*amax) and Q / Qt
// with it (two kernels; amax and scale device pointers, both required).
void quantize_fp8_current(const __nv_bfloat16* x, int rows, int cols, Fp8 type, void* q, void* qt, float* scale,
                          float* amax, cudaStream_t stream = nullptr);
// Block scales: Q with q_blocks (Row128 or Block128) into q_scales; Qt (null for none, then
// qt_blocks None) with qt_blocks into qt_scales; amax (optional) = max |x| of the whole X.
void quantize_fp8_blocks(const __nv_bfloat16* x, int rows, int cols, Fp8 type, void* q, Blocks q_blocks,
                         float* q_scales, void* qt, Blocks qt_blocks, float* qt_scales, float* amax = nullptr,
                         cudaStream_t stream = nullptr);

}  // namespace weave::gemm_fp8
