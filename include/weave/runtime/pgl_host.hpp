// Building a pgl on the host: per-rank addresses from the communicator, one TMA descriptor per rank.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "weave/common/driver.hpp"
#include "weave/common/error.hpp"
#include "weave/pgl.cuh"
#include "weave/runtime/communicator.hpp"

namespace weave::runtime {

template <class T>
constexpr CUtensorMapDataType tma_dtype() {
  if constexpr (std::is_same_v<T, float>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  else if constexpr (std::is_same_v<T, __half>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  else if constexpr (std::is_same_v<T, int>) return CU_TENSOR_MAP_DATA_TYPE_INT32;
  else static_assert(sizeof(T) == 0, "pgl supports float, __half, __nv_bfloat16 and int");
}

// A rows x cols row-major view with pitch `ld` (elements) of the symmetric buffer at `ptr` (in the
// heap or registered), cut into tile_rows x tile_cols tiles. Validates everything TMA would
// reject, before any launch.
template <class T, int W = kMaxWorld>
pgl<T, W> make_pgl(const Communicator& c, T* ptr, int rows, int cols, long long ld, int tile_rows, int tile_cols) {
  WEAVE_CHECK(c.world() <= W, "pgl: world ", c.world(), " exceeds this view's maximum ", W);
  WEAVE_CHECK(rows > 0 && cols > 0 && ld >= cols, "pgl: bad shape ", rows, " x ", cols, " with pitch ", ld);
  WEAVE_CHECK(tile_rows >= 1 && tile_rows <= 256 && tile_cols >= 1 && tile_cols <= 256,
              "pgl: tile ", tile_rows, " x ", tile_cols, " outside TMA's 1..256 box");
  WEAVE_CHECK(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "pgl: base address ", static_cast<void*>(ptr),
              " is not 16-byte aligned (TMA needs it)");
  WEAVE_CHECK((ld * sizeof(T)) % 16 == 0, "pgl: row pitch of ", ld * sizeof(T),
              " bytes is not a multiple of 16 (TMA needs it)");
  WEAVE_CHECK((tile_cols * sizeof(T)) % 16 == 0, "pgl: tile row of ", tile_cols * sizeof(T),
              " bytes is not a multiple of 16 (TMA needs it)");
  const size_t bytes = (size_t(rows - 1) * ld + cols) * sizeof(T);
  PeerPtrs pp = c.peers(ptr, bytes);
  pgl<T, W> p{};
  p.world = c.world();
  p.rank = c.rank();
  p.rows = rows;
  p.cols = cols;
  p.ld = ld;
  p.tile_rows = tile_rows;
  p.tile_cols = tile_cols;
  for (int r = 0; r < p.world; ++r) {
    p.ptr[r] = static_cast<T*>(pp[r]);
    cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    cuuint64_t strides[1] = {cuuint64_t(ld * sizeof(T))};
    cuuint32_t box[2] = {cuuint32_t(tile_cols), cuuint32_t(tile_rows)};
    cuuint32_t estr[2] = {1, 1};
    WEAVE_CU_CHECK(drv().tensorMapEncodeTiled(&p.tma[r], tma_dtype<T>(), 2, pp[r], dims, strides, box, estr,
                                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                              CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  }
  return p;
}

}  // namespace weave::runtime
