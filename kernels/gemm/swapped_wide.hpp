// The swapped 128 x w tiles (Tile::SwappedW, w in kSwappedWidths) and 256 x w tiles (SwappedW256,
// w in kSwapped256Widths): a forward X W^T with few tokens run as D = W X^T on the LCSC GEMM kernel
// (gemm_kernel.cuh, TransOut), 128 or 256 weight rows per tile on the wgmma's M side and w tokens on
// its N side, D stored transposed into C. Instantiated in swapped_wide.cu, swapped_wide_mid.cu,
// swapped_wide_large.cu and swapped_wide_odd.cu (translation units that build in parallel), and
// swapped_wide256{,_narrow}.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gemm/gemm.hpp"

namespace weave::gemm::detail {

// The shared memory a swapped tile's stages share with its staging tile (w x 128 bf16, in one or
// two parts): 227 KB less the barriers and the split-K flags' extra 1 KB.
constexpr int swapped_stage_budget(int w) { return 227 * 1024 - 2048 - 1024 - 128 * w * 2; }

// Stages of a swapped 128 x w tile: as many as fit beside its staging tile: w = 32 gets 10, 64 8,
// 96 7, 104 to 128 6, 144 and 160 5, 176 to 208 4. A memory-bound row wants weight bytes in flight, and a
// stage is 16 KB of weights plus w rows of tokens.
constexpr int swapped_wide_stages(int w) {
  const int stages = swapped_stage_budget(w) / ((128 + w) * 128);
  return stages > 10 ? 10 : stages;
}

// Stages of a swapped 256 x w tile (Tile::SwappedW256): its staging tile is the same w x 128 bf16
// (two parts of 64 weight rows per consumer), its stages 32 KB of weights plus w token rows: 4 at
// w = 96-128, 3 at 144-176.
constexpr int swapped256_stages(int w) { return swapped_stage_budget(w) / ((256 + w) * 128); }

// One width's launch: X (M x K) the tokens, W the weights (wl NK: N x K, a forward X W^T; KN: K x N,
// an input gradient dY W), C (M x N) bf16; split.splits > 1 splits the last partial round on
// split.workers (clusters when split.cluster is 2 or 4).
template <int Width>
lcsc::Plan run_swapped_width(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* C, int M, int N, int K,
                             BLayout wl, const Options& opt, int group_m, cudaStream_t stream, const Launch& split);

// The 4-CTA clusters of the swapped 128 x w tile the device holds at once next to cfg's communicator
// blocks (cfg.balance_waves off), as the runtime's occupancy query reports them: one CTA per SM and a
// cluster within one GPC, so fewer than a quarter of the SMs where GPCs' SM counts are not multiples
// of 4 (the measured count: perf-notes, 2026-12-07 second session).
int swapped_quad_clusters(const lcsc::Config& cfg);

// The launch for opt.tile_n / split.width (one of kSwappedWidths, else a weave::Error).
lcsc::Plan run_swapped_wide(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* C, int M, int N, int K,
                            BLayout wl, const Options& opt, int group_m, cudaStream_t stream, const Launch& split);

// One width's swapped 256 x w launch, unsplit, single CTAs.
template <int Width>
lcsc::Plan run_swapped256_width(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* C, int M, int N,
                                int K, const Options& opt, int group_m, cudaStream_t stream);

// The swapped 256 x w tile of width opt.tile_n / split.width (one of kSwapped256Widths; 128 and wider
// in swapped_wide256.cu, the narrower ones in swapped_wide256_narrow.cu).
lcsc::Plan run_swapped_wide256(const __nv_bfloat16* X, const __nv_bfloat16* W, __nv_bfloat16* C, int M, int N, int K,
                               const Options& opt, int group_m, cudaStream_t stream, const Launch& split);

}  // namespace weave::gemm::detail
