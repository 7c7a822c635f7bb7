// fp8 quantiser, quantize.hpp. Plain CUDA kernels, no LCSC: a streaming pass.
//
// Floor: X is read once (2 bytes per element) and Q written once (1 byte), Qt once more (1 byte):
// 3 (4 with Qt) bytes per element / the HBM rate. 8192 x 4096 with Qt moves 134 MB: 28 us at
// H200's 4.8 TB/s peak, ~34-38 us at the 3.5-4 TB/s a device-to-device copy reaches (transpose_fp8
// measured 3.59 TB/s). What a user does without this kernel, a quantise then transpose_fp8,
// moves 3 + 2 bytes per element (Q written, then read and written again as Qt): 5/4 of the floor.
// Current scaling reads X once more (the amax kernel): 5 (6) bytes per element.
//
// One 256-thread block per 128 x 128 tile of X (any rows: the last tile row is cut short):
// - Loads: lane (c, h) of warp w reads rows 16w + 8h .. 16w + 8h + 7 at columns 8c .. 8c + 7
//   (c = lane % 16, h = lane / 16): one 16-byte vector per row, each warp instruction 2 rows x 256
//   contiguous bytes. 8 vectors per thread, 32 KB per block in flight.
// - amax: |x| maxima on bf16x2 words (max.bf16x2 ignores NaN, and is exact). Row maxima (Q Row128):
//   the 16 lanes of a row reduce with 4 xor shuffles of 4 words (two rows per word); lane c then
//   computes row c % 8's scale and reciprocal and hands them out with 8 shuffles. Column maxima (Qt
//   Row128): 8 rows in registers, the two half-warps by one shuffle, the 8 warps through 2 KB of
//   shared memory; 128 threads compute the column scales. Tile maximum (128 x 128 blocks, amax
//   output): warp shuffles, 8 floats of shared memory, one atomicMax per block on the float's bits
//   (non-negative floats order as their bit patterns; +Inf above every finite value).
// - Q: each row's 8 values, times the reciprocal of their scale, convert in pairs
//   (cvt.rn.satfinite.e4m3x2 / e5m2x2) into one 8-byte store; 16 lanes write a row's 128 bytes.
// - Qt: the thread's 8 x 8 bytes (Q's bytes when Qt has the same scales, else converted again with
//   the column or tile scales) are transposed in 4 x 4 blocks with prmt (byte_transpose.cuh) into
//   8 destination rows of 8 bytes (source rows 16w + 8h ..), stored as 8-byte words into a 16 KB
//   destination-major shared tile whose 16-byte chunk w of destination row d sits at chunk
//   w ^ (d / 8 % 8): the 16 lanes of one store instruction (d = 8c + j) cover the 8 chunks twice
//   (two wavefronts for 256 bytes, the minimum) where the plain layout would put them all in one
//   chunk. Then 8 lanes read one destination row's 8 chunks (conflict-free: the swizzle permutes
//   them) and write its 128 contiguous bytes (one cache line), as transpose_fp8 does.
// Ragged tiles: cols is a multiple of 16 and rows (with Qt) a multiple of 16, so an 8-column load
// vector and a 16-row store chunk lie wholly inside or outside X; rows past X are zeros (they add
// nothing to any maximum) and are not stored.
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "gemm_fp8/byte_transpose.cuh"
#include "gemm_fp8/quantize.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"

namespace weave::gemm_fp8 {

namespace {

constexpr int kTile = 128;
constexpr int kThreads = 256;  // 8 warps x 16 rows = 128 rows; 16 lanes x 8 columns = 128 columns
constexpr unsigned kFull = 0xffffffffu;
static_assert(kThreads / 32 * 16 == kTile && 16 * 8 == kTile, "one 8 x 8 block per thread");

// What a copy's scales are: one for the whole X, one per (row, 128 columns) of the copy, one per
// 128 x 128 block, or no copy.
enum Kind : int { kNone = 0, kTensor = 1, kRow = 2, kBlock = 3 };

struct Params {
  const __nv_bfloat16* x;
  uint8_t* q;
  uint8_t* qt;
  float* q_scales;
  float* qt_scales;
  const float* scale;  // per tensor: the caller's scale, or (from_amax) the amax it derives from
  float* scale_out;    // current scaling: block 0 writes the derived scale here
  float* amax;         // optional: max |x| (one atomicMax per block)
  int rows, cols, tiles_r, tiles_c;
  bool from_amax;
};

// bf16x2 words as two exact floats (low half: the lower address, the even column).
__device__ __forceinline__ float lo_f(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_f(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ __nv_bfloat162 bf2(uint32_t w) {
  __nv_bfloat162 b;
  memcpy(&b, &w, 4);
  return b;
}
__device__ __forceinline__ uint32_t bits(__nv_bfloat162 b) {
  uint32_t w;
  memcpy(&w, &b, 4);
  return w;
}
// Per half: max(m, |w|). max.bf16x2 returns the other operand where one is NaN: NaN is ignored.
__device__ __forceinline__ uint32_t absmax2(uint32_t m, uint32_t w) { return bits(__hmax2(bf2(m), __habs2(bf2(w)))); }
__device__ __forceinline__ uint32_t max2(uint32_t a, uint32_t b) { return bits(__hmax2(bf2(a), bf2(b))); }

// Two values (one bf16x2 word) times ra, rb (one fp32 multiply each, round to nearest even, no
// contraction) to two fp8 bytes, round to nearest even, saturating; the even column in the low byte.
template <int F>
__device__ __forceinline__ uint32_t cvt2(uint32_t w, float ra, float rb) {
  const float2 f = make_float2(__fmul_rn(lo_f(w), ra), __fmul_rn(hi_f(w), rb));
  return __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, F ? __NV_E5M2 : __NV_E4M3);
}
// A row's 8 values, column j times r[j] (per-column scales) or all times one r.
template <int F>
__device__ __forceinline__ uint2 cvt8(const uint32_t (&w)[4], const float (&r)[8]) {
  return make_uint2(cvt2<F>(w[0], r[0], r[1]) | cvt2<F>(w[1], r[2], r[3]) << 16,
                    cvt2<F>(w[2], r[4], r[5]) | cvt2<F>(w[3], r[6], r[7]) << 16);
}
template <int F>
__device__ __forceinline__ uint2 cvt8(const uint32_t (&w)[4], float r) {
  return make_uint2(cvt2<F>(w[0], r, r) | cvt2<F>(w[1], r, r) << 16, cvt2<F>(w[2], r, r) | cvt2<F>(w[3], r, r) << 16);
}

template <int F>
__device__ __forceinline__ float block_scale(float amax) {
  return scale_from_amax(amax, F ? Fp8::E5M2 : Fp8::E4M3);
}

// F: 0 e4m3, 1 e5m2. QK: Q's scale kind (kTensor, kRow, kBlock); TK: Qt's (kNone: no Qt).
template <int F, int QK, int TK>
__global__ void __launch_bounds__(kThreads, 3) quantize_kernel(const Params p) {
  constexpr bool kTileMax = QK == kBlock || TK == kBlock;
  // Qt's tile, destination-major: byte b of chunk k of destination row d at d * 128 + 16 * (k ^ (d / 8 % 8)) + b.
  __shared__ __align__(16) uint8_t tile[TK != kNone ? kTile * kTile : 16];
  __shared__ __align__(16) __nv_bfloat16 colmax[TK == kRow ? 8 : 1][kTile];  // per warp, per column
  __shared__ __align__(16) float col_r[TK == kRow ? kTile : 4];               // 1 / the column scales
  __shared__ float warp_max[kThreads / 32];

  const int tr = blockIdx.x / p.tiles_c, tc = blockIdx.x % p.tiles_c;
  const int r0 = tr * kTile, c0 = tc * kTile;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c = lane % 16, h = lane / 16;
  const int row0 = r0 + warp * 16 + 8 * h;  // this thread's rows row0 .. row0 + 7, columns c0 + 8c ..
  const bool col_in = c0 + 8 * c < p.cols;

  float r_tensor = 0.f;
  if (QK == kTensor) {
    const float given = __ldg(p.scale);
    const float s = p.from_amax ? block_scale<F>(given) : given;
    r_tensor = __frcp_rn(s);
    if (p.from_amax && blockIdx.x == 0 && threadIdx.x == 0) *p.scale_out = s;
  }

  uint32_t v[8][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (col_in && row0 + i < p.rows) {
      const uint4 t = __ldg(reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(row0 + i) * p.cols + c0 + 8 * c));
      v[i][0] = t.x, v[i][1] = t.y, v[i][2] = t.z, v[i][3] = t.w;
    } else {
      v[i][0] = v[i][1] = v[i][2] = v[i][3] = 0;
    }
  }

  // The tile's maximum, per warp (128 x 128 scales, the amax output).
  const bool tile_max = kTileMax || p.amax != nullptr;
  if (tile_max) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int k = 0; k < 4; ++k) m = absmax2(m, v[i][k]);
    float f = fmaxf(lo_f(m), hi_f(m));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) f = fmaxf(f, __shfl_xor_sync(kFull, f, o));
    if (lane == 0) warp_max[warp] = f;
  }

  // Row scales (Q Row128): row 2j and 2j + 1's maxima in word j, reduced over the row's 16 lanes.
  float r_row[8];
  if (QK == kRow) {
    uint32_t pr[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t a = 0, b = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) a = absmax2(a, v[2 * j][k]), b = absmax2(b, v[2 * j + 1][k]);
      pr[j] = bits(__hmax2(__lows2bfloat162(bf2(a), bf2(b)), __highs2bfloat162(bf2(a), bf2(b))));
    }
#pragma unroll
    for (int o = 1; o < 16; o <<= 1)
#pragma unroll
      for (int j = 0; j < 4; ++j) pr[j] = max2(pr[j], __shfl_xor_sync(kFull, pr[j], o));
    const int mine = c % 8;  // the row this lane computes the scale of
    uint32_t w = pr[0];
#pragma unroll
    for (int j = 1; j < 4; ++j)
      if (mine / 2 == j) w = pr[j];
    const float s = block_scale<F>(mine % 2 ? hi_f(w) : lo_f(w));
    if (c < 8 && row0 + c < p.rows) p.q_scales[static_cast<size_t>(tc) * p.rows + row0 + c] = s;
    const float r = __frcp_rn(s);
#pragma unroll
    for (int i = 0; i < 8; ++i) r_row[i] = __shfl_sync(kFull, r, (lane & 16) | i);
  }

  // Column maxima (Qt Row128): the thread's 8 rows, the other half-warp's 8, then the 8 warps.
  if (TK == kRow) {
    uint32_t cm[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int k = 0; k < 4; ++k) cm[k] = absmax2(cm[k], v[i][k]);
#pragma unroll
    for (int k = 0; k < 4; ++k) cm[k] = max2(cm[k], __shfl_xor_sync(kFull, cm[k], 16));
    if (h == 0) *reinterpret_cast<uint4*>(&colmax[warp][8 * c]) = make_uint4(cm[0], cm[1], cm[2], cm[3]);
  }
  if (tile_max || TK == kRow) __syncthreads();

  float r_blk = 0.f;
  if (tile_max) {
    float t = warp_max[0];
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) t = fmaxf(t, warp_max[w]);
    const float s = block_scale<F>(t);
    if (threadIdx.x == 0) {
      if (p.amax) atomicMax(reinterpret_cast<unsigned*>(p.amax), __float_as_uint(t));
      if (QK == kBlock) p.q_scales[static_cast<size_t>(tr) * p.tiles_c + tc] = s;
      if (TK == kBlock) p.qt_scales[static_cast<size_t>(tc) * p.tiles_r + tr] = s;
    }
    r_blk = __frcp_rn(s);
  }
  float r_col[8];
  if (TK == kRow) {
    if (threadIdx.x < kTile) {
      float m = 0.f;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, __bfloat162float(colmax[w][threadIdx.x]));
      const float s = block_scale<F>(m);
      if (c0 + static_cast<int>(threadIdx.x) < p.cols)
        p.qt_scales[static_cast<size_t>(tr) * p.cols + c0 + threadIdx.x] = s;
      col_r[threadIdx.x] = __frcp_rn(s);
    }
    __syncthreads();
    const float4 a = *reinterpret_cast<const float4*>(&col_r[8 * c]);
    const float4 b = *reinterpret_cast<const float4*>(&col_r[8 * c + 4]);
    r_col[0] = a.x, r_col[1] = a.y, r_col[2] = a.z, r_col[3] = a.w;
    r_col[4] = b.x, r_col[5] = b.y, r_col[6] = b.z, r_col[7] = b.w;
  }

  // Q: 8 bytes per row, 16 lanes per 128-byte row segment.
  uint2 qw[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    qw[i] = cvt8<F>(v[i], QK == kRow ? r_row[i] : QK == kBlock ? r_blk : r_tensor);
    if (col_in && row0 + i < p.rows)
      *reinterpret_cast<uint2*>(p.q + static_cast<size_t>(row0 + i) * p.cols + c0 + 8 * c) = qw[i];
  }
  if constexpr (TK != kNone) {
    // Qt: Q's bytes where the scales are the same, else X converted with Qt's own scales.
    uint2 tw[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (TK == QK && QK != kRow) tw[i] = qw[i];
      else if (TK == kRow) tw[i] = cvt8<F>(v[i], r_col);
      else tw[i] = cvt8<F>(v[i], TK == kBlock ? r_blk : r_tensor);
    }
    // o[g][j]: column j's bytes of rows 4g .. 4g + 3 (of the thread's 8).
    uint32_t o[2][8];
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      transpose4x4(tw[4 * g].x, tw[4 * g + 1].x, tw[4 * g + 2].x, tw[4 * g + 3].x, o[g][0], o[g][1], o[g][2], o[g][3]);
      transpose4x4(tw[4 * g].y, tw[4 * g + 1].y, tw[4 * g + 2].y, tw[4 * g + 3].y, o[g][4], o[g][5], o[g][6], o[g][7]);
    }
    // Destination row d = 8c + j (source column), chunk `warp` (source rows 16 warp ..), half h.
    uint8_t* const out = tile + 16 * (warp ^ (c % 8)) + 8 * h;
#pragma unroll
    for (int j = 0; j < 8; ++j) *reinterpret_cast<uint2*>(out + (8 * c + j) * kTile) = make_uint2(o[0][j], o[1][j]);
    __syncthreads();
#pragma unroll
    for (int it = 0; it < kTile * kTile / 16 / kThreads; ++it) {
      const int id = it * kThreads + threadIdx.x;
      const int d = id / 8, x = id % 8;  // destination row d of the tile, chunk x (source rows 16x ..)
      if (c0 + d < p.cols && r0 + 16 * x < p.rows) {
        const uint4 val = *reinterpret_cast<const uint4*>(tile + d * kTile + 16 * (x ^ (d / 8 % 8)));
        *reinterpret_cast<uint4*>(p.qt + static_cast<size_t>(c0 + d) * p.rows + r0 + 16 * x) = val;
      }
    }
  }
}

// *amax = max |x| over n16 16-byte vectors (current scaling's first pass); amax zeroed before.
__global__ void __launch_bounds__(kThreads) amax_kernel(const uint4* __restrict__ x, size_t n16, float* amax) {
  __shared__ float warp_max[kThreads / 32];
  uint32_t m = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {  // four independent loads in flight per thread
    uint4 t[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) t[u] = __ldg(x + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; ++u) m = absmax2(absmax2(absmax2(absmax2(m, t[u].x), t[u].y), t[u].z), t[u].w);
  }
  for (; i < n16; i += stride) {
    const uint4 t = __ldg(x + i);
    m = absmax2(absmax2(absmax2(absmax2(m, t.x), t.y), t.z), t.w);
  }
  float f = fmaxf(lo_f(m), hi_f(m));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) f = fmaxf(f, __shfl_xor_sync(kFull, f, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = f;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) f = fmaxf(f, warp_max[w]);
    atomicMax(reinterpret_cast<unsigned*>(amax), __float_as_uint(f));
  }
}

template <int F>
void launch_kinds(int qk, int tk, const Params& p, unsigned grid, cudaStream_t st) {
#define WEAVE_QUANTIZE_CASE(Q, T) \
  if (qk == Q && tk == T) {                                   \
    quantize_kernel<F, Q, T><<<grid, kThreads, 0, st>>>(p);   \
    return;                                                   \
  }
  WEAVE_QUANTIZE_CASE(kTensor, kNone)
  WEAVE_QUANTIZE_CASE(kTensor, kTensor)
  WEAVE_QUANTIZE_CASE(kRow, kNone)
  WEAVE_QUANTIZE_CASE(kRow, kRow)
  WEAVE_QUANTIZE_CASE(kRow, kBlock)
  WEAVE_QUANTIZE_CASE(kBlock, kNone)
  WEAVE_QUANTIZE_CASE(kBlock, kBlock)
  WEAVE_QUANTIZE_CASE(kBlock, kRow)
#undef WEAVE_QUANTIZE_CASE
  WEAVE_CHECK(false, "quantize_fp8: no kernel for scale kinds ", qk, ", ", tk);
}

void launch(Fp8 type, int qk, int tk, Params p, cudaStream_t st) {
  p.tiles_r = (p.rows + kTile - 1) / kTile;
  p.tiles_c = (p.cols + kTile - 1) / kTile;
  const long long tiles = static_cast<long long>(p.tiles_r) * p.tiles_c;
  WEAVE_CHECK(tiles <= INT_MAX, "quantize_fp8: ", p.rows, " x ", p.cols, " has more than 2^31 - 1 tiles");
  if (type == Fp8::E5M2) launch_kinds<1>(qk, tk, p, static_cast<unsigned>(tiles), st);
  else launch_kinds<0>(qk, tk, p, static_cast<unsigned>(tiles), st);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

int kind(Blocks b) { return b == Blocks::Row128 ? kRow : b == Blocks::Block128 ? kBlock : kNone; }

bool disjoint(const void* a, size_t na, const void* b, size_t nb) {
  const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x + na <= y || y + nb <= x;
}

// The pointer checks every entry point makes: x, q (required), qt (optional), 16-byte aligned,
// long enough, Q and Qt not overlapping X or each other.
void check_data(const char* who, const __nv_bfloat16* x, const void* q, const void* qt, int rows, int cols) {
  WEAVE_CHECK(x && q, who, ": null pointer (x ", static_cast<const void*>(x), ", q ", q,
              "); qt may be null (no transposed copy), x and q may not");
  WEAVE_CHECK(is_aligned(x), who, ": x (", static_cast<const void*>(x), ") is not 16-byte aligned (16-byte vector loads)");
  WEAVE_CHECK(is_aligned(q), who, ": q (", q, ") is not 16-byte aligned (vector stores; gemm_fp8's TMA base address)");
  WEAVE_CHECK(!qt || is_aligned(qt), who, ": qt (", qt,
              ") is not 16-byte aligned (vector stores; gemm_fp8's TMA base address)");
  const size_t n = static_cast<size_t>(rows) * cols;
  WEAVE_CHECK(disjoint(x, 2 * n, q, n), who, ": q (", q, ") overlaps x (", static_cast<const void*>(x), ")");
  WEAVE_CHECK(!qt || (disjoint(x, 2 * n, qt, n) && disjoint(q, n, qt, n)), who, ": qt (", qt, ") overlaps x (",
              static_cast<const void*>(x), ") or q (", q, ")");
  check_extent(who, "x", x, 2 * n);
  check_extent(who, "q", q, n);
  if (qt) check_extent(who, "qt", qt, n);
}

// A float array the kernels read or write: 4-byte aligned, `count` floats long.
void check_floats(const char* who, const char* name, const float* p, size_t count) {
  WEAVE_CHECK(p, who, ": ", name, " is a null pointer (a device pointer to ", count, " float", count == 1 ? "" : "s",
              ")");
  WEAVE_CHECK(is_aligned(p, 4), who, ": ", name, " (", static_cast<const void*>(p), ") is not 4-byte aligned");
  check_extent(who, name, p, count * sizeof(float));
}

Params params(const __nv_bfloat16* x, int rows, int cols, void* q, void* qt) {
  Params p{};
  p.x = x, p.q = static_cast<uint8_t*>(q), p.qt = static_cast<uint8_t*>(qt), p.rows = rows, p.cols = cols;
  return p;
}

}  // namespace

size_t quantize_scale_count(Blocks b, int rows, int cols) {
  if (b == Blocks::Row128) return block_scale_a_count(rows, cols);
  if (b == Blocks::Block128) return block_scale_b_count(rows, cols);
  return 0;
}

double quantize_floor_bytes(int rows, int cols, Blocks q, Blocks qt, bool transpose) {
  const double n = static_cast<double>(rows) * cols;
  const double scales = static_cast<double>(quantize_scale_count(q, rows, cols) + quantize_scale_count(qt, cols, rows));
  return 2 * n + n + (transpose ? n : 0) + 4 * scales;
}

const char* blocks_name(Blocks b) {
  switch (b) {
    case Blocks::None: return "none";
    case Blocks::Row128: return "1x128";
    case Blocks::Block128: return "128x128";
  }
  return "?";
}

void validate_quantize(int rows, int cols, Fp8 type, bool transpose) {
  WEAVE_CHECK(rows >= 1 && cols >= 1, "quantize_fp8: rows and cols must be positive, got ", rows, " x ", cols);
  WEAVE_CHECK(cols % 16 == 0, "quantize_fp8: cols = ", cols,
              " is not a multiple of 16 (a row of Q is cols bytes: gemm_fp8's K, 16-byte TMA row pitches)");
  WEAVE_CHECK(!transpose || rows % 16 == 0, "quantize_fp8: rows = ", rows,
              " is not a multiple of 16, which the transposed copy needs (a row of Qt is rows bytes: gemm_fp8's "
              "16-byte TMA row pitches; pad the tokens to 16)");
  WEAVE_CHECK(type == Fp8::E4M3 || type == Fp8::E5M2, "quantize_fp8: unknown fp8 type code ", static_cast<int>(type));
  WEAVE_CHECK(static_cast<long long>(rows) * cols <= (1ll << 40), "quantize_fp8: ", rows, " x ", cols,
              " is too large");
}

void validate_blocks(Blocks q, Blocks qt, bool transpose) {
  const auto known = [](Blocks b) { return b == Blocks::None || b == Blocks::Row128 || b == Blocks::Block128; };
  WEAVE_CHECK(known(q) && known(qt), "quantize_fp8_blocks: unknown Blocks code (q ", static_cast<int>(q), ", qt ",
              static_cast<int>(qt), ")");
  WEAVE_CHECK(q != Blocks::None, "quantize_fp8_blocks: q_blocks is none; Q takes Row128 (1 x 128, gemm_block_scaled's "
              "scale_a) or Block128 (128 x 128, its scale_b); per-tensor scales are quantize_fp8 / quantize_fp8_current");
  WEAVE_CHECK(transpose == (qt != Blocks::None), "quantize_fp8_blocks: ",
              transpose ? "qt is given but qt_blocks is none (Row128 or Block128 for a transposed copy)"
                        : "qt_blocks is not none but qt is null (no transposed copy to scale)");
}

void quantize_fp8(const __nv_bfloat16* x, int rows, int cols, Fp8 type, void* q, void* qt, const float* scale,
                  float* amax, cudaStream_t stream) {
  const char* who = "quantize_fp8";
  validate_quantize(rows, cols, type, qt != nullptr);
  check_data(who, x, q, qt, rows, cols);
  check_floats(who, "scale", scale, 1);
  if (amax) check_floats(who, "amax", amax, 1);
  WEAVE_CHECK(!amax || disjoint(scale, 4, amax, 4), who, ": scale and amax are the same float (amax is zeroed "
              "before the kernel reads the scale)");
  Params p = params(x, rows, cols, q, qt);
  p.scale = scale, p.amax = amax;
  if (amax) WEAVE_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  launch(type, kTensor, qt ? kTensor : kNone, p, stream);
}

void quantize_fp8_current(const __nv_bfloat16* x, int rows, int cols, Fp8 type, void* q, void* qt, float* scale,
                          float* amax, cudaStream_t stream) {
  const char* who = "quantize_fp8_current";
  validate_quantize(rows, cols, type, qt != nullptr);
  check_data(who, x, q, qt, rows, cols);
  check_floats(who, "scale", scale, 1);
  check_floats(who, "amax", amax, 1);
  WEAVE_CHECK(disjoint(scale, 4, amax, 4), who, ": scale and amax are the same float");
  // Pass 1: amax. A grid of 8 blocks per SM with 4 loads in flight per thread: 128 KB per SM.
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const size_t n16 = static_cast<size_t>(rows) * cols / 8;
  const size_t blocks = std::min<size_t>(static_cast<size_t>(sms) * 8, (n16 + kThreads - 1) / kThreads);
  WEAVE_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  amax_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(x), n16, amax);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  // Pass 2: the quantiser with the scale derived from it (and written by block 0).
  Params p = params(x, rows, cols, q, qt);
  p.scale = amax, p.from_amax = true, p.scale_out = scale;
  launch(type, kTensor, qt ? kTensor : kNone, p, stream);
}

void quantize_fp8_blocks(const __nv_bfloat16* x, int rows, int cols, Fp8 type, void* q, Blocks q_blocks,
                         float* q_scales, void* qt, Blocks qt_blocks, float* qt_scales, float* amax,
                         cudaStream_t stream) {
  const char* who = "quantize_fp8_blocks";
  validate_quantize(rows, cols, type, qt != nullptr);
  validate_blocks(q_blocks, qt_blocks, qt != nullptr);
  check_data(who, x, q, qt, rows, cols);
  check_floats(who, "q_scales", q_scales, quantize_scale_count(q_blocks, rows, cols));
  if (qt) check_floats(who, "qt_scales", qt_scales, quantize_scale_count(qt_blocks, cols, rows));
  if (amax) check_floats(who, "amax", amax, 1);
  Params p = params(x, rows, cols, q, qt);
  p.q_scales = q_scales, p.qt_scales = qt_scales, p.amax = amax;
  if (amax) WEAVE_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  launch(type, kind(q_blocks), kind(qt_blocks), p, stream);
}

}  // namespace weave::gemm_fp8
