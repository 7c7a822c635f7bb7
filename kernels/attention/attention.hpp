// Host entry point of the single-GPU attention forward (kernels/attention/README.md has the
// design and the numbers). Backward is not implemented.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace weave::attention {

// Q (B, S, Hq, D), K and V (B, S, Hkv, D), O (B, S, Hq, D): bf16, contiguous, row-major.
// LSE (B, Hq, S): fp32, natural log of the softmax denominator including the scale,
// lse = max_j(s_ij) + log(sum_j exp(s_ij - max)), s_ij = scale * q_i . k_j.
struct Shape {
  int B = 1, S = 1, Hq = 1, Hkv = 1, D = 128;
};

struct Options {
  bool causal = false;        // key j attends query i only when j <= i
  float softmax_scale = 0.f;  // 0: 1/sqrt(D)
  bool pingpong = true;       // the two consumer warpgroups take turns issuing their GEMMs
  // Persistent: one CTA per SM taking tiles from an atomic counter (longest first for causal),
  // the next tile's Q and first K loading under this tile's epilogue. PerTile: one CTA per
  // tile. Auto: persistent only where it measured faster (D = 128, S <= 8192; README.md).
  enum class Schedule : int { Auto = 0, Persistent = 1, PerTile = 2 };
  Schedule schedule = Schedule::Auto;
  // Tile order: sections of this many (batch, head) pairs run side by side, query blocks
  // slowest inside a section. 0: as many heads as fit K and V in half of L2 (at least 1).
  int heads_per_section = 0;
};

// The schedule Auto picks for a shape.
Options::Schedule auto_schedule(const Shape& s, bool causal);

// O and LSE (LSE may be null: not written). Throws weave::Error before launching for D not
// in {64, 128}, Hq not a multiple of Hkv, non-positive sizes, null or misaligned pointers
// (16 bytes; LSE 4 bytes).
void forward(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, __nv_bfloat16* o, float* lse,
             const Shape& s, const Options& opt = {}, cudaStream_t stream = nullptr);

// Pure functions (CPU-tested).
void validate(const Shape& s, const void* q, const void* k, const void* v, const void* o, const void* lse);
constexpr int kBlockM = 128;  // query rows per CTA (two consumer warpgroups of 64)
constexpr int kBlockN = 128;  // key/value rows per pipeline stage
// Key blocks a query block visits: all ceil(S / kBlockN), or for causal only those up to the
// block holding the query block's last row.
int num_kv_blocks(int S, int m_block, bool causal);
// FLOPs of the forward: 4 * B * S^2 * Hq * D, halved for causal (the convention).
double flops(const Shape& s, bool causal);

}  // namespace weave::attention
