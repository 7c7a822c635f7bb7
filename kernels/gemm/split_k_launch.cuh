// Host side of split-K (split_k.cuh): the workspace and the launch. Included by run.cuh, whose
// users (the GEMM's translation units) instantiate it.
#pragma once
#include <cuda_runtime.h>

#include "gemm/split_k.cuh"
#include "gemm/split_k_workspace.hpp"
#include "weave/common/error.hpp"
#include "weave/lcsc.cuh"
#include "weave/tile/tma.hpp"

namespace weave::gemm {

// Runs Base with the items of its last partial round on `workers` workers split `splits` ways;
// launches Base as it is when nothing would be split.
template <class Base, class OutT>
lcsc::Plan launch_split_k(const typename Base::Globals& base, const OutT* C, int workers, int splits,
                          const lcsc::Config& cfg, cudaStream_t stream) {
  using K = SplitKKernel<Base>;
  constexpr int Cl = Base::kClusterSize;
  const int items = Base::num_work(base);
  typename K::Globals g{};
  static_cast<typename Base::Globals&>(g) = base;
  g.sk = make_split_k(items, (base.K + Base::BK - 1) / Base::BK, workers, splits);
  if (g.sk.dp_items == items) return lcsc::launch<Base>(base, cfg, stream);
  const size_t tail = static_cast<size_t>(tail_items(g.sk));
  if constexpr (Base::BM == 128 && !Base::kTransOut)
    g.c_half = tile::encode(tile::tma_2d(C, base.M, base.N, base.N, 64, Base::kOutBlockCols, Base::kOutSwizzle));
  lcsc::Config run = cfg;
  run.balance_waves = false;  // the split count was chosen for this many workers
  run.max_compute_blocks = workers * Cl;
  const SplitKWorkspace ws = split_k_workspace(stream, tail * g.sk.splits * Cl * 2 * K::kSlotFloats * sizeof(float),
                                               tail * Cl * 2 * sizeof(int));
  g.partials = ws.partials;
  g.counters = ws.counters;
  return lcsc::launch<K>(g, run, stream);
}

}  // namespace weave::gemm
