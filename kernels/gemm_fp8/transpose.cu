// fp8 (byte) transpose, transpose.hpp. A plain CUDA kernel, no LCSC: it is a copy.
//
// Floor: it moves 2 * rows * cols bytes (each byte read once and written once), so its time is
// at least 2 * rows * cols / (HBM rate): 8192 x 8192 moves 134 MB, 28 us at H200's 4.8 TB/s
// peak, ~34-38 us at the 3.5-4 TB/s a device-to-device copy can expect to reach. Measured 37.4 us
// (3.59 TB/s) on one H200 (the GPU test Fp8Transpose prints it; kernels/gemm_fp8/README.md).
//
// One 256-thread block per 128 x 128-byte tile:
// - Loads: lane (c, q) of warp w reads four 16-byte vectors, rows 4q .. 4q + 3 (q = 4w + lane / 8)
//   at columns 16c .. 16c + 15 (c = lane % 8); each warp instruction reads 4 rows x 128
//   contiguous bytes. A tile is 16 KB in flight per block, 8 blocks per SM (16 KB of shared memory
//   each): ~128 KB per SM, past what the latency x bandwidth product needs.
// - In registers: each of the thread's four 4 x 4 byte blocks (4 rows x one 32-bit word) is
//   transposed with 8 byte permutes (prmt), giving one word per source column: the 4 bytes of
//   rows 4q .. 4q + 3 in that column, i.e. word q of the destination row.
// - Shared memory holds the tile destination-major (128 destination rows x 32 words). A word
//   store puts word q of destination row d at chunk (q / 4) ^ ((d / 16) % 8) of the row's eight
//   16-byte chunks: the XOR swizzle makes each warp's 32 word stores hit 32 different banks (lanes
//   differ in q % 4 and in d / 16 = c), where the plain layout would be 8-way conflicted, and it
//   keeps each chunk's 4 words contiguous for the 16-byte reads below.
// - Stores: eight consecutive lanes read one destination row's eight chunks (conflict-free: the
//   swizzle permutes them) and write its 128 contiguous bytes, one cache line.
// 128 x 128 rather than 64 x 64: a destination row segment of 128 bytes is a whole line (64 would
// be two sectors of one), and the tile gives every thread exactly one quad of rows to load.
// Partial tiles: rows and cols are multiples of 16, so a quad (4 rows), a load vector (16 columns)
// and a store vector (16 rows) lie wholly inside or wholly outside the matrix.
#include <climits>
#include <cstdint>

#include "gemm_fp8/byte_transpose.cuh"
#include "gemm_fp8/transpose.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"

namespace weave::gemm_fp8 {

namespace {

constexpr int kTile = 128;     // bytes per side
constexpr int kThreads = 256;  // 8 warps x 4 quads = 32 quads = 128 rows, 8 lanes per 128 bytes
static_assert(kThreads / 32 * 4 * 4 == kTile && 8 * 16 == kTile, "one load quad per thread");

__global__ void __launch_bounds__(kThreads) transpose_fp8_kernel(const uint8_t* __restrict__ src,
                                                                 uint8_t* __restrict__ dst, int rows, int cols,
                                                                 int tiles_c) {
  // Destination-major tile: word (d, q) at d * 32 + 4 * ((q / 4) ^ ((d / 16) % 8)) + q % 4.
  __shared__ __align__(16) uint32_t tile[kTile * kTile / 4];
  const int r0 = (blockIdx.x / tiles_c) * kTile, c0 = (blockIdx.x % tiles_c) * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Load this thread's quad: rows 4q .. 4q + 3 of the tile, columns 16c .. 16c + 15.
  const int c = lane % 8, q = warp * 4 + lane / 8;
  uint32_t a[4][4];
  if (r0 + 4 * q < rows && c0 + 16 * c < cols) {
    const uint8_t* p = src + static_cast<size_t>(r0 + 4 * q) * cols + c0 + 16 * c;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p + static_cast<size_t>(i) * cols));
      a[i][0] = v.x, a[i][1] = v.y, a[i][2] = v.z, a[i][3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i][0] = a[i][1] = a[i][2] = a[i][3] = 0;
  }
  // Word b of the four rows holds columns 16c + 4b .. 16c + 4b + 3: destination rows d = 16c + 4b + j,
  // whose swizzle (d / 16) % 8 is c. Bank of lane (c, q): 4 * ((q / 4) ^ c) + q % 4, all 32 distinct.
  uint32_t* const out = tile + 16 * c * 32 + 4 * ((q / 4) ^ c) + q % 4;
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    uint32_t o[4];
    transpose4x4(a[0][b], a[1][b], a[2][b], a[3][b], o[0], o[1], o[2], o[3]);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[(4 * b + j) * 32] = o[j];
  }
  __syncthreads();

  // Store: destination row d of the tile (source column c0 + d), chunk x (source rows 16x .. 16x + 15).
#pragma unroll
  for (int it = 0; it < kTile * kTile / 16 / kThreads; ++it) {
    const int id = it * kThreads + threadIdx.x;
    const int d = id / 8, x = id % 8;
    if (c0 + d < cols && r0 + 16 * x < rows) {
      const uint4 v = *reinterpret_cast<const uint4*>(tile + d * 32 + 4 * (x ^ ((d / 16) % 8)));
      *reinterpret_cast<uint4*>(dst + static_cast<size_t>(c0 + d) * rows + r0 + 16 * x) = v;
    }
  }
}

}  // namespace

void transpose_fp8(const void* src, void* dst, int rows, int cols, cudaStream_t stream) {
  WEAVE_CHECK(rows >= 1 && cols >= 1, "transpose_fp8: rows and cols must be positive, got ", rows, " x ", cols);
  WEAVE_CHECK(rows % 16 == 0, "transpose_fp8: rows = ", rows,
              " is not a multiple of 16 (16-byte vectors: a row of the transposed matrix is `rows` bytes)");
  WEAVE_CHECK(cols % 16 == 0, "transpose_fp8: cols = ", cols,
              " is not a multiple of 16 (16-byte vectors: a row of the source matrix is `cols` bytes)");
  WEAVE_CHECK(src && dst, "transpose_fp8: null pointer (src ", src, ", dst ", dst, ")");
  WEAVE_CHECK(is_aligned(src), "transpose_fp8: src (", src, ") is not 16-byte aligned (16-byte vector loads)");
  WEAVE_CHECK(is_aligned(dst), "transpose_fp8: dst (", dst, ") is not 16-byte aligned (16-byte vector stores)");
  const size_t bytes = static_cast<size_t>(rows) * cols;
  const uintptr_t s = reinterpret_cast<uintptr_t>(src), d = reinterpret_cast<uintptr_t>(dst);
  WEAVE_CHECK(s + bytes <= d || d + bytes <= s, "transpose_fp8: src (", src, ") and dst (", dst, ") overlap (", bytes,
              " bytes each); the transpose is out of place");
  check_extent("transpose_fp8", "src", src, bytes);
  check_extent("transpose_fp8", "dst", dst, bytes);
  const long long tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
  WEAVE_CHECK(tiles_r * tiles_c <= INT_MAX, "transpose_fp8: ", rows, " x ", cols, " has more than 2^31 - 1 tiles");
  transpose_fp8_kernel<<<static_cast<unsigned>(tiles_r * tiles_c), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), rows, cols, static_cast<int>(tiles_c));
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace weave::gemm_fp8
