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

// Cluster launches (B multicast): the `Cluster` CTAs of a cluster take consecutive tile rows of
// one tile column, so a work item is a cluster row, numbered in grouped_tile order over the
// ceil(tiles_m / Cluster) cluster rows (group_m / Cluster of them to a group). G: anything with
// int tiles_m, tiles_n and group_m (the kernels' Globals). `rank()` gives the CTA's rank in its
// cluster, called only where Cluster > 1 (a single-CTA kernel reads no cluster register). With
// odd tile rows the last cluster row's second CTA gets m == tiles_m: the kernels' loads zero-fill
// it and skip its store.
template <int Cluster, class G>
__host__ __device__ inline int clustered_work(const G& g) {
  return (g.tiles_m + Cluster - 1) / Cluster * g.tiles_n;
}
template <int Cluster, class G, class Rank>
__host__ __device__ inline TileCoord clustered_tile(const G& g, int w, Rank&& rank) {
  if constexpr (Cluster == 1) {
    return grouped_tile(w, g.tiles_m, g.tiles_n, g.group_m);
  } else {
    const int group = g.group_m / Cluster > 0 ? g.group_m / Cluster : 1;
    TileCoord t = grouped_tile(w, (g.tiles_m + Cluster - 1) / Cluster, g.tiles_n, group);
    t.m = t.m * Cluster + static_cast<int>(rank());
    return t;
  }
}

}  // namespace weave::gemm
