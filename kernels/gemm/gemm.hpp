// Host entry point of the single-GPU bf16 GEMM (kernels/gemm/README.md has the numbers): bf16
// inputs, fp32 accumulation, bf16 or fp32 output, optional bias.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "gemm/layout.hpp"
#include "weave/lcsc.cuh"

namespace weave::gemm {

// M128N256S4: 128x256 with 4 stages and the output staged in two halves (more stages, a short
// consumer wait between the halves).
// M128N256C2: 128x256 in 2-CTA clusters along M that share B through TMA multicast.
// M128N320C2: the same with 320 columns (each CTA loads 128 A rows and 160 B rows per 128 x 320
// tile step: a tenth fewer L2 requests per FLOP, which bind on a misaligned pitch); a bf16 output
// without bias, A either layout, no split-K.
// M64N128: 64x128 for decode shapes (M <= 64): the two consumer warpgroups split N (64 x 64
// each) over the same 64 rows of A, 8 stages.
// M128N192: 128x192, 4 stages: a third more tiles than 128x256 on the same output, so that a
// shape whose 128x256 tiles fill one or two rounds of SMs badly fills them well (wave
// quantisation); A M x K and a bf16 output (bias allowed).
// Swapped: decode (M <= 16 tokens, W stored N x K, A M x K): the weights on the tensor core's M
// side (mma.sync m16n8k16, 16 weight rows x 8 tokens), one block per 16 output columns, loads
// straight into registers (swapped_schedule.hpp). Every epilogue; no communicator SMs.
// M128Nw: 128 x w for a width w of kWideWidths (Options::tile_n): tile counts between those of
// the power-of-two widths, so that more shapes fill whole rounds of SMs (wave quantisation, as
// cuBLAS's 112- and 144-wide tiles do); A M x K, B N x K, a bf16 output (bias allowed); the output
// is staged dense (no swizzle) when w is not a multiple of 64.
// SwappedW: a forward X W^T or an input gradient dY W with few tokens (A M x K; W stored N x K or
// K x N, the wgmma reading it M-major): the operands swapped onto
// the wgmma, 128 weight rows on its M side and w = Options::tile_n (one of kSwappedWidths) tokens
// on its N side, the tile stored transposed; the stages then hold weights, not the empty rows of a
// 128-row token tile. Any number of token tiles (the planner: plan.hpp). A bf16 output without
// bias; split-K.
// SwappedW256: SwappedW (W stored N x K only) with 256 weight rows per tile (each consumer two m64 accumulators sharing
// the token operand: a token row loaded feeds twice the FLOPs), w = Options::tile_n in
// kSwapped256Widths (4 stages up to 128, 3 above), single CTAs, unsplit; for several token tiles of a few hundred
// to a few thousand tokens.
// Auto: the planner's choice (kernels/gemm/plan.hpp).
enum class Tile : int {
  Auto = 0,
  M128N256 = 1,
  M128N128 = 2,
  M128N256S4 = 3,
  M128N256C2 = 4,
  M64N128 = 5,
  M128N192 = 6,
  Swapped = 7,
  M128Nw = 8,
  SwappedW = 9,
  SwappedW256 = 10,
  M128N320C2 = 11
};

// Whether w is one of a tile's width list (kWideWidths, kSwappedWidths, kSwapped256Widths).
template <size_t N>
constexpr bool in_widths(const int (&widths)[N], int w) {
  for (int v : widths)
    if (v == w) return true;
  return false;
}

// The widths of Tile::M128Nw: multiples of 16 (two 8-column blocks per stmatrix) between the
// 64-column grid's 128, 192 and 256, which have their own tiles. 224 and 240 (3 stages) measured
// no faster per iteration than 128x256 and were dropped (docs/perf-notes.md, 2026-12-02g).
inline constexpr int kWideWidths[] = {96, 112, 144, 160, 176, 208};
constexpr bool is_wide_width(int w) { return in_widths(kWideWidths, w); }

// The token widths of Tile::SwappedW (wgmma N), and the most tokens one token tile holds.
// 256 ran at 0.55-0.68 of cuBLAS where 128-row tiles ran 0.78-0.96 (3 stages; docs/perf-notes.md).
// 144 and 176 (the stages of 160 and 192) fit several token tiles closer to M (520 tokens: 3 x 176),
// as do 104, 112 and 120 (the stages of 128; 300 tokens: 3 x 104, cuBLAS's 128 x 104 there);
// 208, the widest with 4 stages, holds 193-208 tokens in one token tile (two of 128 pad as many rows
// as the 128-row tiles).
inline constexpr int kSwappedWidths[] = {32, 64, 96, 104, 112, 120, 128, 144, 160, 176, 192, 208};
inline constexpr int kSwappedWideMaxM = 208;
constexpr bool is_swapped_width(int w) { return in_widths(kSwappedWidths, w); }
// Whether a swapped 128 x w tile runs in 2-CTA clusters: each CTA loads half of the token tile, a
// whole number of 8-row swizzle atoms (104 and 120 run in single CTAs only).
constexpr bool swapped_width_clusters(int w) { return w % 16 == 0; }
// Whether it also runs in 4-CTA clusters (forward weights, N x K): a quarter of the token tile per
// CTA, again whole swizzle atoms.
constexpr bool swapped_width_quads(int w) { return w % 32 == 0; }
// The token widths of Tile::SwappedW256: each consumer holds two w / 2-float accumulators, so w
// stays below ~184 (232 registers); the narrow ones (96-120, the widths cuBLAS's 256-row swapped
// tiles take at 300-1500 tokens) fit ceil(M / w) token tiles closer to M.
inline constexpr int kSwapped256Widths[] = {96, 104, 112, 120, 128, 144, 160, 176};
constexpr bool is_swapped256_width(int w) { return in_widths(kSwapped256Widths, w); }
// The narrowest swapped width that holds M tokens (0: more than kSwappedWideMaxM); with `clusters`,
// the narrowest of those that run in 2-CTA clusters.
constexpr int swapped_width(int M, bool clusters = false) {
  for (int v : kSwappedWidths)
    if (v >= M && (!clusters || swapped_width_clusters(v))) return v;
  return 0;
}

// The type of Options::bias.
enum class BiasType : int { None = 0, BF16 = 1, F32 = 2 };

struct Options {
  bool accumulate = false;  // C += A * B (+ bias) instead of C = A * B (+ bias)
  Tile tile = Tile::Auto;
  int group_m = 0;  // tile rows per raster group; 0 = default
  lcsc::Config lcsc;  // num_comm_sms, grid limits
  // Split-K of the last partial round (kernels/gemm/split_k.hpp): 0 = the planner decides
  // (kernels/gemm/plan.hpp; with a given tile, no split), 1 = never, n > 1 = n K ranges. Only the
  // 128x256, 128x192 and 64x128 tiles with the default epilogue (A M x K, bf16 C, no bias) split.
  int split_k = 0;
  int tile_n = 0;  // the width of Tile::M128Nw (kWideWidths), SwappedW (kSwappedWidths) or SwappedW256
                   // (kSwapped256Widths); unused by the others
  // A forced SwappedW's CTAs per cluster: 1, 2 (the token tile multicast; widths that are multiples of
  // 16), 4 (widths that are multiples of 32, B as N x K; never the planner's), or 0: 2 on a
  // misaligned pitch where the width allows it, as the planner runs it. Unused by the other tiles.
  int tile_cluster = 0;
  ALayout a_layout = ALayout::MK;      // KM: A stored K x M (weight gradient dY^T X); M % 8 == 0
  BiasType bias_type = BiasType::None;  // BF16 / F32: bias points to N values of that type
  const void* bias = nullptr;          // added to every row of C in fp32, before rounding
};

// C (M x N, row-major, ldc = N) = A * B (+ bias), or C += that with accumulate. A is M x K
// row-major, or K x M with opt.a_layout = KM; B as `b` says. Throws weave::Error for shapes TMA
// cannot address (K and N must be multiples of 8, and M too when A is K x M; pointers 16-byte
// aligned), for an operand whose device allocation is shorter than the shape needs
// (weave/common/extent.hpp), a bias type without a pointer (or the reverse), or a bad config.
// M128N256S4 (experimental) takes only the defaults: A M x K, bf16 output, no bias; M128N256C2 and M128N320C2 a
// bf16 output without bias (A either layout); M128N192 takes A M x K and a bf16 output; M128Nw
// takes A M x K, B N x K, a bf16 output and opt.tile_n in kWideWidths; Swapped takes M <= 16,
// A M x K, B N x K and no communicator SMs; SwappedW takes A M x K, B N x K, a bf16 output without
// bias, opt.tile_n in kSwappedWidths and opt.tile_cluster in 0, 1, 2, 4; SwappedW256 the same with
// opt.tile_n in kSwapped256Widths and no cluster. Returns the grid it launched.
lcsc::Plan gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K, BLayout b,
                const Options& opt = {}, cudaStream_t stream = nullptr);
// The same with an fp32 output (C += accumulates in fp32 through TMA reduce-add stores).
lcsc::Plan gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C, int M, int N, int K, BLayout b,
                const Options& opt = {}, cudaStream_t stream = nullptr);

// The tile and split-K choice gemm() makes for these arguments on the current device (the
// planner, kernels/gemm/plan.hpp, when opt.tile is Auto).
struct Launch {
  Tile tile = Tile::M128N256;
  int splits = 1;   // K ranges of each item of the last partial round
  int workers = 0;  // compute blocks (clusters for the cluster tile) the split was planned for
  int width = 0;    // Tile::M128Nw, SwappedW, SwappedW256: its width
  int cluster = 1;  // Tile::SwappedW: 2 (4) = 2-CTA (4-CTA) clusters multicasting the token tile
};
Launch choose_launch(int M, int N, int K, BLayout b, const Options& opt = {}, bool f32_out = false);

// Pure functions (CPU-tested).
// The planner's launch for opt.tile Auto on a device of sm_count compute blocks (its SMs less
// opt.lcsc.num_comm_sms) and pair_clusters 2-CTA clusters: what choose_launch returns there, with
// no device (weave-bench gemm --list --plan-sms N).
Launch plan_launch(int M, int N, int K, BLayout b, int sm_count, int pair_clusters, const Options& opt = {},
                   bool f32_out = false);
void validate_shape(int M, int N, int K);
// Everything gemm checks before it touches the device: the shape, A's layout (M % 8 when K x M),
// 16-byte aligned A, B, C and bias, the bias type against its pointer, and the tile against the
// options. f32_out: C is float.
void validate_args(const void* A, const void* B, const void* C, int M, int N, int K, const Options& opt,
                   bool f32_out);
// Its part on the tile (also choose_launch's): a known tile, the widths of each tile's list, and
// the A layouts and epilogues each tile has.
void validate_tile(const Options& opt, bool f32_out);
int default_group_m(Tile t, int K);
const char* tile_name(Tile t);
// A width list as text ("96, 112, ..."), for messages; kWideWidths' and kSwappedWidths'.
std::string widths_text(const int* widths, size_t count);
std::string wide_widths_text();
std::string swapped_widths_text();
std::string swapped256_widths_text();
// "128x256", "128x144" (M128Nw with its width), "sw128x96" (SwappedW), "sw256x144" (SwappedW256),
// with "/k3" for a split.
std::string launch_name(const Launch& l);
// The same from a tile's name, its width (> 0: the 128 x w tile) and its split, for the fp8 GEMM's
// launches too.
std::string launch_label(const char* tile, int width, int splits);

}  // namespace weave::gemm
