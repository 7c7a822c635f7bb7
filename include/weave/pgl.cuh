// pgl: parallel global layout. One identically shaped buffer on every rank of the NVLink domain,
// addressed by tile coordinates. Passed to kernels by value (__grid_constant__).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "weave/config.hpp"

namespace weave {

// A 2-D row-major view (rows x cols, row pitch `ld` elements) of the same symmetric buffer on each
// rank, with a TMA descriptor per rank whose box is one tile (tile_rows x tile_cols).
template <class T, int MaxWorld = kMaxWorld>
struct pgl {
  CUtensorMap tma[MaxWorld];  // first: 64-byte alignment for cp.async.bulk.tensor
  T* ptr[MaxWorld];           // the buffer's base as mapped on this rank, for every rank
  int world;
  int rank;
  int rows, cols;
  long long ld;
  int tile_rows, tile_cols;

  __host__ __device__ T* on(int r) const { return ptr[r]; }
  __host__ __device__ int tiles_r() const { return (rows + tile_rows - 1) / tile_rows; }
  __host__ __device__ int tiles_c() const { return (cols + tile_cols - 1) / tile_cols; }
  __host__ __device__ static constexpr int max_world() { return MaxWorld; }
};

}  // namespace weave
