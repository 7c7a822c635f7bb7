// TMA tensor-map description on the host. `TmaParams` is a plain value computed without a GPU
// (the CPU tests check it); `encode` hands it to cuTensorMapEncodeTiled through the driver
// table, so nothing links libcuda. Elements outside the tensor read as zero (the "partial tile"
// rule: a box hanging over an edge is zero-filled on load and clipped on store).
#pragma once
#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "weave/common/driver.hpp"
#include "weave/common/error.hpp"
#include "weave/tile/swizzle.hpp"
#include "weave/tile/types.cuh"

namespace weave::tile {

struct TmaParams {
  CUtensorMapDataType type{};
  int elem_bytes = 0;
  uint32_t rank = 2;
  uint64_t dims[5] = {};     // elements, innermost first
  uint64_t strides[4] = {};  // bytes, of dims 1..rank-1
  uint32_t box[5] = {};      // elements
  Swizzle swizzle = Swizzle::None;
  const void* base = nullptr;

  uint32_t box_bytes() const {
    uint64_t b = elem_bytes;
    for (uint32_t i = 0; i < rank; ++i) b *= box[i];
    return static_cast<uint32_t>(b);
  }
};

// A row-major 2-D matrix `rows` x `cols` (row pitch `ld` elements) read or written in boxes of
// `box_rows` x `box_cols`. Throws weave::Error when TMA would reject the combination, naming
// the rule that was broken.
inline TmaParams tma_2d(CUtensorMapDataType type, int elem_bytes, const void* base, uint64_t rows,
                        uint64_t cols, uint64_t ld, uint32_t box_rows, uint32_t box_cols, Swizzle sw) {
  WEAVE_CHECK(rows >= 1 && cols >= 1, "TMA: empty matrix ", rows, "x", cols);
  WEAVE_CHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0, "TMA: base address must be 16-byte aligned");
  WEAVE_CHECK((ld * elem_bytes) % 16 == 0,
              "TMA: row pitch must be a multiple of 16 bytes (", ld, " elements of ", elem_bytes,
              " bytes); for 16-bit types the leading dimension must be a multiple of 8");
  WEAVE_CHECK(ld >= cols, "TMA: leading dimension ", ld, " < columns ", cols);
  WEAVE_CHECK(ld * elem_bytes < (1ull << 40), "TMA: row pitch too large");
  WEAVE_CHECK(box_rows >= 1 && box_rows <= 256 && box_cols >= 1 && box_cols <= 256,
              "TMA: box dimensions must be in [1, 256], got ", box_rows, "x", box_cols);
  WEAVE_CHECK((box_cols * elem_bytes) % 16 == 0, "TMA: inner box must be a multiple of 16 bytes");
  if (sw != Swizzle::None)
    WEAVE_CHECK(box_cols * static_cast<uint32_t>(elem_bytes) <= static_cast<uint32_t>(swizzle_bytes(sw)),
                "TMA: with a ", swizzle_bytes(sw), "-byte swizzle the inner box may span at most ",
                swizzle_bytes(sw), " bytes, got ", box_cols * elem_bytes);
  TmaParams p;
  p.type = type;
  p.elem_bytes = elem_bytes;
  p.rank = 2;
  p.dims[0] = cols;
  p.dims[1] = rows;
  p.strides[0] = ld * elem_bytes;
  p.box[0] = box_cols;
  p.box[1] = box_rows;
  p.swizzle = sw;
  p.base = base;
  return p;
}


template <class T>
TmaParams tma_2d(const T* base, uint64_t rows, uint64_t cols, uint64_t ld, uint32_t box_rows, uint32_t box_cols,
                 Swizzle sw) {
  return tma_2d(dtype<T>::tma, dtype<T>::bytes, base, rows, cols, ld, box_rows, box_cols, sw);
}

// How many bytes around a TMA load's sectors L2 fetches with them. `auto`: 128 for a map whose row
// pitch is off the 128-byte grid, 256 for the rest. With such a pitch a 128-byte box row straddles two
// lines, so 256-byte promotion can pull in two segments per row (not profiled). Measured: 46 misaligned
// rows of the models and drawn sets ran 0.98 as long at 128 as at 256 in geomean (down to 0.87), 117
// aligned rows 1.003 (docs/perf-notes.md, 2026-12-07 fourth session). A fixed value (none, 64, 128,
// 256) applies to every map, for A/B runs ($WEAVE_TMA_L2_PROMOTION).
struct L2Promotion {
  bool by_pitch = true;
  CUtensorMapL2promotion fixed = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;

  // pitch_bytes: the map's row pitch (0 for rank 1).
  CUtensorMapL2promotion for_pitch(uint64_t pitch_bytes) const {
    if (!by_pitch) return fixed;
    return pitch_bytes % 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  }
};

// `v`: auto (also null or empty), none, 64, 128 or 256.
inline L2Promotion parse_l2_promotion(const char* v) {
  if (v == nullptr || *v == 0 || std::strcmp(v, "auto") == 0) return {};
  if (std::strcmp(v, "256") == 0) return {false, CU_TENSOR_MAP_L2_PROMOTION_L2_256B};
  if (std::strcmp(v, "128") == 0) return {false, CU_TENSOR_MAP_L2_PROMOTION_L2_128B};
  if (std::strcmp(v, "64") == 0) return {false, CU_TENSOR_MAP_L2_PROMOTION_L2_64B};
  if (std::strcmp(v, "none") == 0) return {false, CU_TENSOR_MAP_L2_PROMOTION_NONE};
  throw Error(std::string("WEAVE_TMA_L2_PROMOTION must be auto, none, 64, 128 or 256, got '") + v + "'");
}

}  // namespace weave::tile

namespace weave {
// $WEAVE_TMA_L2_PROMOTION through parse_l2_promotion, read once (src/runtime/env.cpp: the tile
// layer reads no environment itself).
tile::L2Promotion tma_l2_promotion_by_env();
}  // namespace weave

namespace weave::tile {

inline CUtensorMap encode(const TmaParams& p) {
  CUtensorMap m;
  CUtensorMapSwizzle sw = CU_TENSOR_MAP_SWIZZLE_NONE;
  switch (p.swizzle) {
    case Swizzle::None: sw = CU_TENSOR_MAP_SWIZZLE_NONE; break;
    case Swizzle::B32: sw = CU_TENSOR_MAP_SWIZZLE_32B; break;
    case Swizzle::B64: sw = CU_TENSOR_MAP_SWIZZLE_64B; break;
    case Swizzle::B128: sw = CU_TENSOR_MAP_SWIZZLE_128B; break;
  }
  cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  WEAVE_CU_CHECK(drv().tensorMapEncodeTiled(
      &m, p.type, p.rank, const_cast<void*>(p.base), reinterpret_cast<const cuuint64_t*>(p.dims),
      reinterpret_cast<const cuuint64_t*>(p.strides), reinterpret_cast<const cuuint32_t*>(p.box), elem_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, sw, tma_l2_promotion_by_env().for_pitch(p.rank > 1 ? p.strides[0] : 0),
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}

}  // namespace weave::tile
