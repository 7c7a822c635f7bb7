// The swapped decode GEMM's work split, as pure functions (CPU-tested in test_gemm_cpu).
//
// C (M x N) = X (M x K) * W^T with W stored N x K and few tokens (M <= kMaxTokens): the weights
// go on the tensor core's M side (mma.sync: 16 weight rows x 8 tokens per instruction), so a
// multiply carries 16 rows of W for every 8 tokens instead of 64 rows of X, of which 1-16 live.
// A block owns 1 or 2 strips of 16 weight rows (16 output columns each) over all of K; its warps
// take K chunks round-robin and sum their partials through shared memory at the end. bf16 (the
// bf16 GEMM) and fp8 (kernels/gemm_fp8, per-tensor scales) share the kernel: it works in bytes.
//
// The K order inside a chunk is permuted. A chunk is 256 bytes of each row (128 bf16 or 256 fp8
// values): lane (g, c) loads 16 contiguous bytes of its row at byte 16c + 64j for j = 0..3, and
// feeds bytes 8h..8h+7 of vector j to multiply q = 2j + h as the k that the mma layout gives it
// (m16n8k16 bf16: 2c, 2c+1, 2c+8, 2c+9; m16n8k32 fp8: 4c..4c+3, 4c+16..4c+19). A dot product does
// not depend on the order of its terms, and X is loaded with the same map, so every k still meets
// its partner; what it buys is full 16-byte loads, 64 contiguous bytes of a row per instruction,
// and no shared-memory staging.
#pragma once

#include "gemm/scheduler.hpp"

namespace weave::gemm::swapped {

inline constexpr int kRows = 16;          // weight rows (output columns) per strip
inline constexpr int kChunkBytes = 256;   // of each row per warp per step: 4 vectors x 4 lanes x 16 bytes
inline constexpr int kVectors = 4;        // 16-byte loads per lane per row per chunk
inline constexpr int kMultiplies = 8;     // mma instructions per chunk per (strip, token block)
inline constexpr int kMaxTokens = 16;     // up to 2 n8 blocks of tokens (at 24 and 32 the 64x128
                                          // tile was faster: 32x8192x8192 in 39 us against 45)

// The first of the 8 consecutive bytes (from the chunk's start) that lane column c feeds to
// multiply q (0..7) of a chunk.
__host__ __device__ constexpr int chunk_byte(int c, int q) { return 16 * c + 64 * (q / 2) + 8 * (q % 2); }

// The logical k (within multiply q's k range) that byte e (0..7) of lane column c's 8 stands for,
// for elements of `bytes` bytes (2: bf16, m16n8k16; 1: fp8, m16n8k32). The mma's A layout gives
// lane column c two words per row: word 0 the first half of its k, word 2 the second.
__host__ __device__ constexpr int logical_k(int c, int e, int bytes) {
  return bytes == 2 ? (e < 4 ? 2 * c + e / 2 : 2 * c + 8 + (e - 4) / 2) : (e < 4 ? 4 * c + e : 4 * c + 16 + (e - 4));
}

// n8 token blocks for M tokens.
__host__ __device__ constexpr int token_blocks(int M) { return M <= 8 ? 1 : 2; }

__host__ __device__ inline int strips(int N) { return ceil_div(N, kRows); }
// Chunks over K elements of `bytes` bytes.
__host__ __device__ inline int chunks(int K, int bytes) { return ceil_div(static_cast<long long>(K) * bytes, kChunkBytes); }

// A launch configuration: strips per block, warps per block, chunks in flight per warp.
struct Config {
  int strips_per_block, warps, depth;
};

// The configuration for M tokens, N weight rows and K (bf16) on `sm_count` SMs, fitted to a sweep of every
// (strips, warps, depth) in {1, 2} x {4, 8, 16} x {1, 2} on 42 decode shapes at power-capped
// clocks (docs/perf-notes.md, "swapped"); every count is relative to the SM count.
// One token block (M <= 8): one strip per block, the fewest warps that give every SM 16 (the
// weight loads in flight: fewer starve DRAM, more shorten each warp's K run), and 8 where the
// strips are very many (12 per SM: a row pitch of a power of two, 28672 x 8192, ran 7 % slower
// on 4); then more warps while a warp's run along K would pass kMaxChunksPerWarp chunks. Two
// token blocks: each X fragment also feeds a second strip (half the X bytes per weight byte) and
// each warp keeps two chunks in flight, with the fewest warps that give every SM 19
// such units; one strip per block where strips are very many (8 per SM) or fewer than the SMs.
// Below kOneStripBelow strips per SM, one strip per block at 8 warps: paired there, the blocks are
// about as many as the SMs or fewer (one block per SM, some SMs idle). In
// three sweeps (2026-12-02d and g, 2026-12-06 tenth session) one strip ran 2-7 % faster at 256 and 320
// strips in bf16 and 10-24 % in fp8, and 26 % slower at 448 in bf16.
inline constexpr int kOneStripBelow = 3;
// 64 chunks: 16 KB of a row. 1 x 16384 x 53248 (416 chunks, 1024 strips: 4 warps by the rule
// above, 104 chunks each) ran 0.92 / 0.97 / 0.98 of cuBLAS on 4 / 8 / 16 warps on an H200
// (2026-12-02d sweep) and 0.73 / 0.78 / 0.78 on an H100; 1 x 16424 x 53296 0.59 / 0.68 / 0.77 (H100,
// 2026-12-07d). A lower bound would also move 7144 x 53288 (447 strips, 8 warps, 52 chunks each),
// which ran 0.86 on 8 warps and 0.76 on 16 (H100).
inline constexpr int kMaxChunksPerWarp = 64;

// One token block's warps per block, shared by the bf16 and fp8 rules: the fewest from `w` on
// (4, 8, 16) that give every SM `per_sm` warps over `s` strips and leave each warp at most
// `max_chunks` of a row's `c` chunks.
__host__ __device__ inline int fewest_warps(int w, long long s, long long sms, int per_sm, long long c,
                                            int max_chunks) {
  while (w < 16 && (s * w < per_sm * sms || c > static_cast<long long>(max_chunks) * w)) w *= 2;
  return w;
}

__host__ __device__ inline Config config(int M, int N, int K, int sm_count) {
  const long long s = strips(N), sms = sm_count;
  if (token_blocks(M) == 1)
    return {1, fewest_warps(s >= 12 * sms ? 8 : 4, s, sms, 16, chunks(K, 2), kMaxChunksPerWarp), 1};
  if (s >= 8 * sms) return {1, 8, 2};
  if (s < sms) return {1, 16, 2};
  if (s < kOneStripBelow * sms) return {1, 8, 2};
  // From kOneStripBelow strips per SM on, 8 warps always give the 19 units
  const long long pairs = (s + 1) / 2;
  return {2, pairs * 4 * 2 >= 19 * sms ? 4 : 8, 2};
}

// fp8 (1-byte elements: a row is half the chunks of bf16's at the same K), fitted to
// `weave-bench swapped_sweep --dtype fp8` (docs/perf-notes.md, 2026-12-02g). One token block: one
// strip per block and the fewest warps that give every SM 12 and leave each warp at most 8
// chunks of a row (long rows want more warps than bf16's rule gives: 1 x 16384 x 53248 ran 0.80
// of cuBLASLt on 4 warps, 0.99 on 16). Two token blocks: bf16's rule (the sweep's fits for it
// lost on as many rows as they won).
__host__ __device__ inline Config config_fp8(int M, int N, int K, int sm_count) {
  if (token_blocks(M) != 1) return config(M, N, K, sm_count);
  return {1, fewest_warps(4, strips(N), sm_count, 12, chunks(K, 1), 8), 1};
}

__host__ __device__ inline int blocks(int N, const Config& c) { return ceil_div(N, kRows * c.strips_per_block); }

}  // namespace weave::gemm::swapped
