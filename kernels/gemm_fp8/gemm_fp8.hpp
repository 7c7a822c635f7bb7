// Host entry points of the fp8 GEMMs (kernels/gemm_fp8/README.md).
//
//   C (bf16, M x N, row-major) = scale * A * B^T
//   A: fp8 M x K row-major, B: fp8 N x K row-major (like nn.Linear's weight), fp32 accumulation.
//
// gemm: per-tensor scales, scale = *scale_a * *scale_b (device pointers to one float each, read
//       by the kernel: no host synchronisation).
// gemm_block_scaled: DeepSeek-V3 block scales. scale_a holds one float per (row, 128-K block),
//       stored K-block-major: scale_a[kb * M + m] (a ceil(K/128) x M row-major matrix); scale_b one
//       per (128 x 128) block of B: scale_b[nb * ceil(K/128) + kb] (ceil(N/128) x ceil(K/128)).
//       C[m, n] = sum_kb scale_a[kb, m] * scale_b[n / 128, kb] * sum_{k in kb} A[m, k] B[n, k],
//       each block's partial sum promoted to fp32 on the CUDA cores.
//
// Operand types: e4m3 x e4m3, e5m2 x e4m3, e4m3 x e5m2 (e5m2 for gradients); e5m2 x e5m2 is
// rejected (cuBLASLt has no such kernel either). Any M >= 1; K a multiple of 16 and N a multiple of
// 8 (TMA row pitches of 16 bytes: K bytes for A and B, 2N bytes for C); A, B, C 16-byte aligned,
// scales 4-byte aligned. Anything else, a null pointer, or a device allocation shorter than the
// shape needs (weave/common/extent.hpp) throws weave::Error before anything is launched.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "weave/lcsc.cuh"

namespace weave::gemm_fp8 {

enum class Fp8 : int { E4M3 = 0, E5M2 = 1 };

// M128N256: two consumers of 64 x 256, 3 stages of 48 KB + a 64 KB output tile (208 KB).
// M128N128: two consumers of 64 x 128, 6 stages of 32 KB + a 32 KB output tile (224 KB); per-tensor
// and block scales.
// M128N192: two consumers of 64 x 192, 4 stages of 40 KB + a 48 KB output tile (208 KB); block
// scales only (their faster tile).
// Swapped: decode (M <= 16 tokens): the bf16 GEMM's swapped tile with fp8 multiplies (mma.sync
// m16n8k32; kernels/gemm/swapped_schedule.hpp); per-tensor scales, no communicator SMs.
// M128Nw: 128 x w, w = Options::tile_n in gemm::kWideWidths (the bf16 GEMM's 128 x w tiles, for
// wave quantisation); B e4m3 (wide_pair).
// M64N128: 64 x 128, the two consumers splitting N over the same 64 rows of A, 8 stages (the bf16
// GEMM's decode / narrow tile: M <= 64, and up to M = 256 where its tile count fills the machine).
// SwappedW: the bf16 GEMM's swapped 128 x w tile (w = Options::tile_n in gemm::kSwappedWidths, one
// or several token tiles): 128 weight rows on the wgmma's M side, the tokens on its N side, the tile
// stored transposed; B e4m3 (wide_pair), single CTAs.
// M128N256C2: the 128 x 256 tile in 2-CTA clusters, tile rows 2i and 2i + 1 sharing B (each CTA
// loads half and multicasts it): a pitch off the 128-byte grid doubles TMA's L2 requests, and the
// pair halves B's (the bf16 GEMM's cluster tile). Every type pair, split-K; workers are clusters.
enum class Tile : int {
  Auto = 0,
  M128N256 = 1,
  M128N128 = 2,
  Swapped = 3,
  M128Nw = 4,
  M64N128 = 5,
  M128N192 = 6,
  SwappedW = 7,
  M128N256C2 = 8
};

struct Options {
  Tile tile = Tile::Auto;
  int group_m = 0;    // tile rows per raster group; 0 = default_group_m
  lcsc::Config lcsc;  // num_comm_sms, grid limits
  // Split-K of the last partial round (per-tensor 128x256, 128 x w and 64x128 tiles, both block-scaled
  // tiles; kernels/gemm/split_k.hpp):
  // 0 = the bf16 GEMM's planner decides (kernels/gemm/plan.hpp), 1 = never, n > 1 = n K ranges.
  int split_k = 0;
  int tile_n = 0;  // the width of Tile::M128Nw (gemm::kWideWidths) or SwappedW (gemm::kSwappedWidths)
  // Block scales: how B's scales are loaded (gemm_fp8_kernel.cuh, BlockScales): 0 = per lane when
  // scale_a is at least half of L2 (block_lane_scales), 1 = never, 2 = always.
  int lane_scales = 0;
};

// The tile and split gemm() runs for these arguments (the planner when opt.tile is Auto).
struct Launch {
  Tile tile = Tile::M128N256;
  int splits = 1;
  int workers = 0;  // compute blocks (clusters for M128N256C2) the split was planned for
  int width = 0;    // Tile::M128Nw, SwappedW: its width
};

lcsc::Plan gemm(const void* A, Fp8 a_type, const void* B, Fp8 b_type, __nv_bfloat16* C, int M, int N, int K,
                const float* scale_a, const float* scale_b, const Options& opt = {}, cudaStream_t stream = nullptr);

lcsc::Plan gemm_block_scaled(const void* A, Fp8 a_type, const void* B, Fp8 b_type, __nv_bfloat16* C, int M, int N,
                             int K, const float* scale_a, const float* scale_b, const Options& opt = {},
                             cudaStream_t stream = nullptr);

// Typed forms of the supported combinations.
inline lcsc::Plan gemm(const __nv_fp8_e4m3* A, const __nv_fp8_e4m3* B, __nv_bfloat16* C, int M, int N, int K,
                       const float* scale_a, const float* scale_b, const Options& opt = {},
                       cudaStream_t stream = nullptr) {
  return gemm(A, Fp8::E4M3, B, Fp8::E4M3, C, M, N, K, scale_a, scale_b, opt, stream);
}
inline lcsc::Plan gemm(const __nv_fp8_e5m2* A, const __nv_fp8_e4m3* B, __nv_bfloat16* C, int M, int N, int K,
                       const float* scale_a, const float* scale_b, const Options& opt = {},
                       cudaStream_t stream = nullptr) {
  return gemm(A, Fp8::E5M2, B, Fp8::E4M3, C, M, N, K, scale_a, scale_b, opt, stream);
}
inline lcsc::Plan gemm(const __nv_fp8_e4m3* A, const __nv_fp8_e5m2* B, __nv_bfloat16* C, int M, int N, int K,
                       const float* scale_a, const float* scale_b, const Options& opt = {},
                       cudaStream_t stream = nullptr) {
  return gemm(A, Fp8::E4M3, B, Fp8::E5M2, C, M, N, K, scale_a, scale_b, opt, stream);
}

// Pure functions (CPU-tested).
void validate_shape(int M, int N, int K);
void validate_types(Fp8 a, Fp8 b);
// The launch for `sm_count` compute blocks: the bf16 GEMM's planner (plan.hpp) with an fp8
// iteration (128 K bytes) counted as a bf16 one (64 K, the same bytes per stage), the 64x128
// tile, no 128x192 tile, and a K-byte row pitch off the 128-byte grid as a misaligned one.
// wide: the 128 x w and swapped 128 x w tiles may be chosen (wide_pair of the operand types).
// pair_clusters: the 2-CTA clusters the device holds (0: no cluster tile), as the bf16 planner's.
Launch plan_launch(int M, int N, int K, int sm_count, const Options& opt = {}, bool wide = false,
                   int pair_clusters = 0);
// The same on the current device (what gemm() runs).
Launch choose_launch(int M, int N, int K, const Options& opt = {}, Fp8 a_type = Fp8::E4M3, Fp8 b_type = Fp8::E4M3);
// gemm_block_scaled's launch for `sm_count` compute blocks. Tile: opt.tile when it is M128N128 or
// M128N192; for Auto, the one whose rounds of tiles over the compute blocks cost less, a 128x192
// tile counted as kBlock192Cost 128x128 tiles (any other tile throws). Split-K of the last
// partial round by the bf16 planner's rule (gemm::split_choice in kernels/gemm/plan.hpp: the
// split count, the exchange's cost, the slowdown of split rounds above decode sizes, a split only
// when >= 5 % faster by the model); opt.split_k 1 never splits, n > 1 splits n ways.
Launch plan_block_launch(int M, int N, int K, int sm_count, const Options& opt = {});
// The same on the current device (what gemm_block_scaled() runs).
Launch choose_block_launch(int M, int N, int K, const Options& opt = {});
// Whether gemm_block_scaled loads B's scales per lane (opt.lane_scales; for 0, whether scale_a,
// ceil(K/128) x M floats, is at least half of `l2_bytes`).
bool block_lane_scales(int M, int K, long long l2_bytes, const Options& opt = {});
// A 128x192 tile's time in 128x128 tiles: 1.5x the work at 1055 against 985 TFLOP/s (the core
// set's geomeans, one H200, bench/results/2026-12-03b-h200-gemm-fp8-block-variants.jsonl).
inline constexpr double kBlock192Cost = 1.40;
int default_group_m(Tile t, int K);
const char* tile_name(Tile t);
// "128x256", "128x144" (M128Nw with its width), "sw128x96" (SwappedW), with "/k3" for a split.
std::string launch_name(const Launch& l);
const char* type_name(Fp8 t);
// Whether the 128 x w and swapped 128 x w tiles take the pair: B e4m3 (the forward pass's e4m3 x e4m3
// and the gradients' e5m2 x e4m3, dY times the weights).
bool wide_pair(Fp8 a, Fp8 b);
inline int k_blocks(int K) { return (K + 127) / 128; }
// Floats each block-scale array holds (what its allocation must cover).
inline size_t block_scale_a_count(int M, int K) { return static_cast<size_t>(k_blocks(K)) * M; }
inline size_t block_scale_b_count(int N, int K) { return static_cast<size_t>((N + 127) / 128) * k_blocks(K); }

}  // namespace weave::gemm_fp8
