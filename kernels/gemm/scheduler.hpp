// Persistent tile order for GEMM-shaped work, as a pure function (CPU-tested).
//
// Tiles are numbered in groups of `group_m` tile rows: inside a group the order runs down the
// rows first, then across the columns. Consecutive tile indices (which the persistent grid
// runs at the same time) then share a few B column panels and a few A row panels, so most
// operand reads hit L2 ("grouped rasterisation"; {8, N, M/8} in the ThunderKittens paper).
#pragma once

namespace weave::gemm {

struct TileCoord {
  int m;  // tile row
  int n;  // tile column
};

__host__ __device__ inline int ceil_div(long long a, long long b) { return static_cast<int>((a + b - 1) / b); }

__host__ __device__ inline TileCoord grouped_tile(int t, int tiles_m, int tiles_n, int group_m) {
  const int per_group = group_m * tiles_n;
  const int grp = t / per_group;
  const int first_m = grp * group_m;
  const int rows = tiles_m - first_m < group_m ? tiles_m - first_m : group_m;
  const int r = t - grp * per_group;
  return {first_m + r % rows, r / rows};
}

}  // namespace weave::gemm
