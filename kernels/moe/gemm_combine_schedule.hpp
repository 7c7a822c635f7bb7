// The pure index functions of the fused gemm_combine (gemm_combine_kernel.cuh; README.md, "Fused
// gemm_combine"): where a finished output tile's rows and columns go, and what the home rank's
// final sum waits for. CPU-tested in tests/moe/test_moe_gemm_combine_cpu.cu (every (token, slot,
// column) of every home rank written exactly once over all ranks' tiles, for random and
// adversarial routings).
//
// Landing buffer of home rank s (symmetric, max_tokens x k x H bf16): row t * k + j holds the
// expert output of (token t, slot j), whichever rank computed it. The grouped row's RowMeta (written
// by the dispatch: source rank, token, primary row, slot) names that row; every (token, slot) of a
// successful dispatch has exactly one grouped row on exactly one rank, so every landing row of
// [0, T_s k) is written exactly once per call, and the sum needs no atomics.
#pragma once
#include <cstdint>

#include "moe/exchange_plan.hpp"
#include "moe/grouped_gemm_schedule.hpp"  // __host__ __device__: include from .cu files only
#include "weave/common/host_device.hpp"
#include "weave/tile/swizzle.hpp"

namespace weave::moe {

// The producer warpgroup's two idle warps (lcsc.cuh's aux role) push a staged tile: warp a takes
// rows a, a + 2, ... of it; lane i the 16 bytes of columns 8 i .. 8 i + 7 of the 256-column tile
// (32 lanes x 8 = kGroupedBN: one 512-byte contiguous write per row and warp).
constexpr int kAuxWarps = 2;
static_assert(32 * 8 == kGroupedBN, "one lane per 8 columns of the tile");

// Rows of a tile with `rows` valid rows that aux warp `warp` pushes, and its i-th one.
WEAVE_HD inline int aux_rows(int rows, int warp) {
  return rows > warp ? (rows - warp + kAuxWarps - 1) / kAuxWarps : 0;
}
WEAVE_HD inline int aux_row(int warp, int i) { return warp + kAuxWarps * i; }

// The first column lane `lane` pushes of column tile n (inside H when < H: H % 8 == 0, so a lane's
// 8 columns are all in or all out).
WEAVE_HD inline int push_col(int n, int lane) { return n * kGroupedBN + 8 * lane; }

// Byte offset of (row, lane's 16 bytes) in the staging tile the GEMM's consumers wrote: 64-column
// blocks of 128 rows x 128 bytes with the 128-byte swizzle (what the dense kernel's TMA store reads).
WEAVE_HD inline uint32_t stage_offset(int row, int lane) {
  return static_cast<uint32_t>(lane / 8) * kGroupedBM * 128u +
         tile::swizzled_offset(tile::Swizzle::B128, static_cast<uint32_t>(row), static_cast<uint32_t>(lane % 8) * 16u);
}

// The landing row (token * k + slot) on rank m.src a grouped row goes to, or -1 when the metadata is
// out of range (never for a dispatch's rows; checked so that a stale row can never write outside a
// peer's buffer).
WEAVE_HD inline long long landing_row(const RowMeta& m, int world, int k, int max_tokens) {
  if (m.src < 0 || m.src >= world || m.slot < 0 || m.slot >= k || m.token < 0 || m.token >= max_tokens) return -1;
  return static_cast<long long>(m.token) * k + m.slot;
}

// Signals the home rank's final sum waits for per call: every compute block of every rank's GEMM
// signals every rank once when its pushes are complete (whether it had tiles or not), so the count
// does not depend on the routing and a failed dispatch (no tiles anywhere) still completes it. All
// ranks launch the same number of compute blocks (the host checks it across ranks); the final sum
// waits for the running total of this over the calls so far (counters are never reset).
WEAVE_HD inline unsigned long long landed_per_round(int world, int compute_blocks) {
  return static_cast<unsigned long long>(world) * static_cast<unsigned long long>(compute_blocks);
}

}  // namespace weave::moe
