// LCSC (weave/lcsc.cuh) with one more role: the producer warpgroup's warps 2-3, idle in the plain
// template, run K::aux(g, smem, compute_blocks) beside the loader and the storer of every compute
// block. Fused kernels use it to move data with no communicator SM taken from the GEMM (an
// intra-SM schedule). K adds `struct AuxShared` (its own shared memory, after the template's)
// and `aux`; everything else (roles, pipeline, plan) is lcsc.cuh's. Cluster size 1 only.
// Additive: a kernel launched through lcsc::launch is unchanged.
#pragma once
#include "weave/lcsc.cuh"

namespace weave::tp::aux {

template <class K>
struct Storage {
  lcsc::SharedStorage<K> base;
  typename K::AuxShared aux;
};

template <class K>
constexpr size_t shared_bytes() {
  return sizeof(Storage<K>) + tile::kSwizzleAlign;
}

template <class K>
__global__ void __launch_bounds__(128 * (1 + K::kConsumers), 1)
    kernel(const __grid_constant__ typename K::Globals g, const int compute_blocks) {
  static_assert(lcsc::cluster_size_v<K> == 1, "lcsc_aux: clusters are not supported");
  extern __shared__ __align__(16) uint8_t aux_smem[];
  auto& st = *reinterpret_cast<Storage<K>*>(&lcsc::detail::shared_storage<K>(aux_smem));
  auto& s = st.base;
  if (static_cast<int>(blockIdx.x) >= compute_blocks) {
    const int i = blockIdx.x - compute_blocks;
    K::communicator(g, &s, i, static_cast<int>(gridDim.x) - compute_blocks);
    return;
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < K::kStages; ++i) {
      s.full[i].init(1);
      s.empty[i].init(4 * K::kConsumers);
    }
    s.out_full.init(4 * K::kConsumers);
    s.out_empty.init(1);
    tile::fence_barrier_init();
  }
  __syncthreads();
  const int wg = tile::warpgroup_index();
  if (wg == 0) {
    tile::warpgroup_reg_dealloc<K::kProducerRegs>();
    const int warp = tile::warp_in_warpgroup();
    if (warp == 0) {
      if (tile::lane_id() == 0) lcsc::detail::run_loader<K>(g, s, compute_blocks);
    } else if (warp == 1) {
      if (tile::lane_id() == 0) lcsc::detail::run_storer<K>(g, s, compute_blocks);
    } else {
      K::aux(g, st.aux, compute_blocks, static_cast<int>(threadIdx.x) - 64);
    }
  } else {
    tile::warpgroup_reg_alloc<K::kConsumerRegs>();
    lcsc::detail::run_consumer<K>(g, s, compute_blocks, wg - 1);
  }
}

// lcsc::launch for this kernel: the same plan, validation and shared-memory opt-in.
template <class K>
lcsc::Plan launch(const typename K::Globals& g, const lcsc::Config& cfg, cudaStream_t stream) {
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  const lcsc::DeviceInfo info = lcsc::device_info(dev);
  constexpr size_t smem = shared_bytes<K>();
  constexpr int threads = 128 * (1 + K::kConsumers);
  static std::atomic<uint64_t> raised{0};  // per device ordinal < 64
  if (!(raised.load(std::memory_order_acquire) & (1ull << dev))) {
    WEAVE_CHECK(smem <= info.smem_optin, "lcsc_aux: kernel needs ", smem, " bytes of shared memory, the device allows ",
                info.smem_optin);
    WEAVE_CUDA_CHECK(cudaFuncSetAttribute(kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    raised.fetch_or(1ull << dev, std::memory_order_release);
  }
  const lcsc::Plan p = lcsc::make_plan(K::num_work(g), info.sm_count, cfg, smem, info.smem_optin);
  if (p.grid() == 0) return p;
  kernel<K><<<p.grid(), threads, smem, stream>>>(g, p.compute_blocks);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  return p;
}

}  // namespace weave::tp::aux
