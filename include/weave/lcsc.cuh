// The LCSC program template (ParallelKittens): loader, consumer, storer, communicator.
//
// A kernel is a struct K that supplies the roles and its types; this template owns everything
// they share: the persistent grid (one block per SM; the SM count is read from the device),
// warp specialisation, the shared-memory stage ring with its full/empty mbarriers and phase
// bits, the output hand-off between consumers and storer, and the split of the grid into
// compute blocks and `num_comm_sms` communicator blocks.
//
// Block layout (compute blocks): warpgroup 0 is the producer (warp 0 lane 0 = loader, warp 1
// lane 0 = storer, warps 2-3 = aux where K has it, idle otherwise; the producer keeps
// K::kProducerRegs registers), warpgroups 1..K::kConsumers are consumers (K::kConsumerRegs
// registers each). Work item w (an output tile) is handled by compute block w % compute_blocks;
// every role of that block walks the same sequence.
//
// What K provides:
//   using Globals;                      kernel parameters, passed as a __grid_constant__
//   struct Stage;                       one pipeline stage of input tiles (alignas(1024))
//   struct Output;                      the output staging tile (consumers write, storer reads)
//   struct ConsumerState;               registers of one consumer warpgroup
//   kStages, kConsumers, kProducerRegs, kConsumerRegs
//   kStageTxBytes                       TMA bytes that complete one stage's `full` barrier
//   kReleaseLag                         0: a stage is released after consume(); 1: after the
//                                       next consume() (one wgmma batch stays in flight)
//   kOutputParts                        the output tile goes through Output in this many parts
//                                       (a smaller staging buffer leaves room for more stages)
//   kClusterSize (optional, default 1)  CTAs per cluster. Work items are then per cluster: every
//                                       CTA of a cluster walks the same items and stages, a
//                                       stage is free only when the consumers of all CTAs of
//                                       the cluster released it (the loaders may multicast),
//                                       and num_comm_sms must be a multiple of it.
//   host:   static int num_work(const Globals&)
//   device: num_work(g), num_iters(g, w)
//           prologue(g)                                   loader thread, once
//           load(g, Stage&, Mbarrier& full, w, it)        loader thread
//           setup(g) (optional)                           every thread of a compute block, once,
//                                                        before the roles split (HasSetup)
//           tile_of(g, w) (optional)                      loader thread, once per work item; then
//                                                        load(g, Stage&, full, tile_of(g, w), it):
//                                                        what a tile's loads need, worked out once
//                                                        (per K step it measured up to 25 % of a
//                                                        fused GEMM's time, perf-notes session 5)
//           consume(g, ConsumerState&, Stage&, w, it, c)  consumer warpgroup c
//           or, with kOwnsKLoop = true, consume_range(g, ConsumerState&, pipe, w, k_begin, iters,
//           c): the consumer runs K steps k_begin .. k_begin + iters - 1 of item w itself (the
//           template passes 0 and the tile's iters; split-K a range), taking stages with
//           pipe.take() and freeing each with pipe.release(index) (ConsumerPipe below), so that it can keep
//           wgmma batches of different K steps in flight in registers it names statically
//           (such a K has no consume, drain or kReleaseLag)
//           drain(ConsumerState&)                         consumer: all its async math done
//           finish(g, ConsumerState&, Output&, w, c, p)   consumer: registers -> Output, part p
//           store(g, Output&, w, p)                       storer thread; async bulk stores
//           communicator(g, void* smem, i, n)             all threads of comm block i of n
//           store_done(g, compute_blocks) (optional)      storer thread, after its last store
//                                                        completed (fused kernels: final signals)
//   kDynamicTasks = true (optional): tasks handed out at run time instead of the static deal
//   (below, "Dynamic tasks"); K then also provides
//           struct TaskState                              the loader's state between its choices
//           next_task(g, TaskState&, blocks) -> Task      loader thread: the block's next task
//           other_task(g, index, t, n) -> cycles          consumer threads t = 0..n-1 (all of them):
//                                                        a task that is not a work item (they may
//                                                        sync with consumers_sync<K>())
//           task_finished(g, Task, cycles)                one consumer thread, after each task
//           block_exit(g, blocks)                         thread 0, once every role of the block ended
//           (no aux, no store_done; next_task, load and store must not use warp-collective operations:
//           the other lanes of the loader's and storer's warps wait in __syncwarp meanwhile)
//   struct AuxShared + aux(g, AuxShared&, compute_blocks, t) (optional)
//                                       threads t = 0..63 of warps 2-3 of every compute block,
//                                       beside the loader and the storer: fused kernels move data
//                                       with no communicator SM taken from the GEMM. AuxShared is
//                                       K's own shared memory, after the template's. Cluster size
//                                       1 only; a K without aux gets neither code nor memory.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>
#include <cstdint>
#include <cstdio>

#include "weave/common/error.hpp"
#include "weave/tile/cluster.cuh"
#include "weave/tile/mbarrier.cuh"
#include "weave/tile/proxy.cuh"
#include "weave/tile/swizzle.hpp"
#include "weave/tile/tma.cuh"
#include "weave/tile/warpgroup.cuh"

namespace weave::lcsc {

struct Config {
  int num_comm_sms = 0;        // blocks beyond the compute ones run K::communicator
  int max_compute_blocks = 0;  // 0: every SM not given to the communicator
  bool balance_waves = true;   // same number of waves with fewer blocks when that is possible
  int max_clusters = 0;        // clustered kernels: 0 = cudaOccupancyMaxActiveClusters, > 0 overrides
};

template <class K, class = void>
struct ClusterSizeOf {
  static constexpr int value = 1;
};
template <class K>
struct ClusterSizeOf<K, std::void_t<decltype(K::kClusterSize)>> {
  static constexpr int value = K::kClusterSize;
};
template <class K>
constexpr int cluster_size_v = ClusterSizeOf<K>::value;

// Optional dynamic tasks (K::kDynamicTasks = true; "Dynamic tasks" below).
template <class K, class = void>
struct HasDynamicTasks : std::false_type {};
template <class K>
struct HasDynamicTasks<K, std::enable_if_t<K::kDynamicTasks>> : std::true_type {};

// Optional storer epilogue (K::store_done): absent in the plain GEMM, which compiles to nothing.
// A dynamic-task kernel has none (one it inherits is not called: it would count the static deal).
template <class K, class = void>
struct HasStoreDone : std::false_type {};
template <class K>
struct HasStoreDone<K, std::void_t<decltype(&K::store_done)>> : std::bool_constant<!HasDynamicTasks<K>::value> {};

// Optional per-tile load state (K::tile_of); without it, load receives the work index w.
template <class K, class = void>
struct HasTileOf : std::false_type {};
template <class K>
struct HasTileOf<K, std::void_t<decltype(&K::tile_of)>> : std::true_type {};

// Optional aux role (K::aux, which then needs K::AuxShared): without it warps 2-3 idle and the
// shared memory is the template's alone.
template <class K, class = void>
struct HasAux : std::false_type {};
template <class K>
struct HasAux<K, std::void_t<decltype(&K::aux)>> : std::bool_constant<!HasDynamicTasks<K>::value> {};

// Optional per-block setup (K::setup(g)): every thread of each compute block calls it once,
// before the roles split; the template's block barrier follows, so what it writes to K's own
// shared memory (a table the roles read, e.g. the grouped GEMM's per-expert prefixes) is seen by
// every role, and num_work may depend on it. It may use __syncthreads. Without it: no code.
template <class K, class = void>
struct HasSetup : std::false_type {};
template <class K>
struct HasSetup<K, std::void_t<decltype(&K::setup)>> : std::true_type {};

// Optional consumer K loop (K::kOwnsKLoop = true: K::consume_range runs a tile's stages itself);
// without it the template calls consume() per stage.
template <class K, class = void>
struct OwnsKLoop : std::false_type {};
template <class K>
struct OwnsKLoop<K, std::enable_if_t<K::kOwnsKLoop>> : std::true_type {};

// Optional dynamic tasks (K::kDynamicTasks = true). The loader thread asks K::next_task for the
// block's next task at each task boundary and publishes it in a small ring in shared memory that
// the consumers and the storer read in order: a work item (loaded, consumed and stored as in the
// static deal), another task (run by every consumer thread: a tile reduction, say, so a block can
// change role at run time, mKernel's adaptive split), or the end. After another task the loader
// waits until the consumers finished it before it chooses again: a work item it chose meanwhile
// could be the input that task waits for, queued behind it in the same block. Cluster size 1, no
// communicator blocks; no aux role or store_done (ones the kernel inherits are ignored).

enum class TaskKind : int { Work = 0, Other = 1, Done = 2 };
struct Task {
  TaskKind kind = TaskKind::Done;
  int index = -1;  // the work item, or K's index of the other task
};

inline constexpr int kTaskSlots = 4;
// The named barrier of the consumer warpgroups in other tasks (ids 1-7 are the kernels' own: the
// TP aux role 1, attention 2-5, split-K 6-7).
inline constexpr int kConsumersBarrier = 8;

struct TaskRing {
  Task task[kTaskSlots];
  tile::Mbarrier full[kTaskSlots];   // the loader published the slot
  tile::Mbarrier empty[kTaskSlots];  // every consumer warp and the storer took it (another task: finished it)
};

template <class K>
struct SharedStorage {
  typename K::Stage stage[K::kStages];
  typename K::Output out;
  tile::Mbarrier full[K::kStages];
  tile::Mbarrier empty[K::kStages];
  tile::Mbarrier out_full;
  tile::Mbarrier out_empty;
};

// The template's storage first, so that every role but aux sees the same SharedStorage<K>.
template <class K>
struct AuxStorage {
  SharedStorage<K> base;
  typename K::AuxShared aux;
};

template <class K>
struct DynamicStorage {
  SharedStorage<K> base;
  TaskRing ring;
};

template <class K>
using BlockStorage = std::conditional_t<HasAux<K>::value, AuxStorage<K>,
                                        std::conditional_t<HasDynamicTasks<K>::value, DynamicStorage<K>, SharedStorage<K>>>;

template <class K>
constexpr size_t shared_bytes() {
  return sizeof(BlockStorage<K>) + tile::kSwizzleAlign;  // slack to align the dynamic base
}

// The grid as a pure function of (work, device, config): the CPU tests call it directly.
struct Plan {
  int compute_blocks = 0;
  int comm_blocks = 0;
  int grid() const { return compute_blocks + comm_blocks; }
};

// The clusters of `cluster` CTAs that can compute next to cfg's communicator blocks on a device of
// `sm_count` SMs holding at most `max_clusters` clusters (0 = no limit), or weave::Error for a
// config no launch can take. Callers that must refuse a config before any cross-rank step (an
// operator's own checks) call it up front; make_plan calls it again.
inline long long compute_room(const Config& cfg, int sm_count, int cluster = 1, int max_clusters = 0) {
  WEAVE_CHECK(cluster >= 1, "lcsc: cluster size must be >= 1");
  WEAVE_CHECK(cfg.num_comm_sms % cluster == 0, "lcsc: num_comm_sms = ", cfg.num_comm_sms,
              " must be a multiple of the kernel's cluster size ", cluster);
  WEAVE_CHECK(sm_count >= 1, "lcsc: device reports ", sm_count, " SMs");
  WEAVE_CHECK(cfg.num_comm_sms >= 0, "lcsc: num_comm_sms = ", cfg.num_comm_sms, ", want >= 0");
  WEAVE_CHECK(cfg.num_comm_sms < sm_count, "lcsc: num_comm_sms = ", cfg.num_comm_sms,
              " leaves no compute SM on a device with ", sm_count, " SMs");
  WEAVE_CHECK(cfg.max_compute_blocks >= 0, "lcsc: max_compute_blocks = ", cfg.max_compute_blocks,
              ", want >= 0 (0: no limit)");
  long long avail = (sm_count - cfg.num_comm_sms) / cluster;  // in clusters
  if (max_clusters > 0 && max_clusters - cfg.num_comm_sms / cluster < avail)
    avail = max_clusters - cfg.num_comm_sms / cluster;
  if (cfg.max_compute_blocks > 0 && cfg.max_compute_blocks / cluster < avail) avail = cfg.max_compute_blocks / cluster;
  WEAVE_CHECK(avail >= 1, "lcsc: no room for a compute cluster of ", cluster, " CTAs next to ", cfg.num_comm_sms,
              " communicator blocks");
  return avail;
}

// `work` counts work items of one cluster of `cluster` CTAs; `max_clusters` (0 = no limit) is
// how many such clusters the device can hold at once.
inline Plan make_plan(long long work, int sm_count, const Config& cfg, size_t smem_bytes, size_t smem_limit,
                      int cluster = 1, int max_clusters = 0) {
  const long long avail = compute_room(cfg, sm_count, cluster, max_clusters);
  WEAVE_CHECK(smem_bytes <= smem_limit, "lcsc: kernel needs ", smem_bytes,
              " bytes of shared memory per block but the device allows at most ", smem_limit,
              " (reduce the stages or the tile size)");
  WEAVE_CHECK(work >= 0, "lcsc: negative work count");
  Plan p;
  p.comm_blocks = cfg.num_comm_sms;
  long long cc = work < avail ? work : avail;
  if (cfg.balance_waves && cc > 0) {
    const long long waves = (work + cc - 1) / cc;
    cc = (work + waves - 1) / waves;
  }
  p.compute_blocks = static_cast<int>(cc * cluster);
  return p;
}

struct DeviceInfo {
  int sm_count = 0;
  size_t smem_optin = 0;
  int l2_bytes = 0;  // launch planners size working sets by it
};

// Read once per device from the device itself; never assumed.
inline DeviceInfo device_info(int dev) {
  static constexpr int kMax = 64;
  static DeviceInfo cache[kMax];
  static std::atomic<bool> ready[kMax];
  WEAVE_CHECK(dev >= 0 && dev < kMax, "lcsc: device ordinal ", dev, " out of range");
  if (!ready[dev].load(std::memory_order_acquire)) {
    DeviceInfo d;
    int v = 0;
    WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    d.sm_count = v;
    WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    d.smem_optin = static_cast<size_t>(v);
    WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, dev));
    cache[dev] = d;
    ready[dev].store(true, std::memory_order_release);
  }
  return cache[dev];
}

namespace detail {

template <class K>
__device__ __forceinline__ SharedStorage<K>& shared_storage(uint8_t* raw) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (a + tile::kSwizzleAlign - 1) & ~uintptr_t(tile::kSwizzleAlign - 1);
  return *reinterpret_cast<SharedStorage<K>*>(aligned);
}

template <class K>
__device__ __forceinline__ typename K::AuxShared& aux_shared(SharedStorage<K>& s) {
  return reinterpret_cast<AuxStorage<K>&>(s).aux;
}

// This CTA's first work item and the stride: work is dealt out per cluster.
template <class K>
__device__ __forceinline__ int first_work() {
  return static_cast<int>(blockIdx.x) / cluster_size_v<K>;
}
template <class K>
__device__ __forceinline__ int work_stride(int compute_blocks) {
  return compute_blocks / cluster_size_v<K>;
}

template <class K>
__device__ __forceinline__ void release(SharedStorage<K>& s, uint32_t index) {
  __syncwarp();
  if (tile::lane_id() == 0) {
    if constexpr (cluster_size_v<K> == 1) {
      s.empty[index].arrive();
    } else {
#pragma unroll
      for (int r = 0; r < cluster_size_v<K>; ++r) tile::cluster::arrive_remote(s.empty[index], r);
    }
  }
}

// What a kernel that owns its K loop (kOwnsKLoop) gets: the consumer's place in the stage ring.
template <class K>
struct ConsumerPipe {
  SharedStorage<K>& s;
  tile::PipeState<K::kStages>& ps;
  struct Taken {
    typename K::Stage& stage;
    uint32_t index;
  };
  // Waits until the next stage's loads landed.
  __device__ __forceinline__ Taken take() {
    s.full[ps.index].wait(ps.phase);
    Taken t{s.stage[ps.index], ps.index};
    ps.advance();
    return t;
  }
  __device__ __forceinline__ void release(uint32_t index) { detail::release<K>(s, index); }
};

template <class K>
__device__ __forceinline__ void load_work(const typename K::Globals& g, SharedStorage<K>& s,
                                          tile::PipeState<K::kStages>& ps, int w) {
  const int iters = K::num_iters(g, w);
  auto t = [&] {
    if constexpr (HasTileOf<K>::value) return K::tile_of(g, w);
    else return w;
  }();
  for (int it = 0; it < iters; ++it) {
    s.empty[ps.index].wait(ps.phase ^ 1);
    s.full[ps.index].arrive_expect_tx(K::kStageTxBytes);
    K::load(g, s.stage[ps.index], s.full[ps.index], t, it);
    ps.advance();
  }
}

template <class K>
__device__ __forceinline__ void consume_work(const typename K::Globals& g, SharedStorage<K>& s,
                                             tile::PipeState<K::kStages>& ps, uint32_t& out_phase,
                                             typename K::ConsumerState& st, int w, int c) {
  const int iters = K::num_iters(g, w);
  if constexpr (OwnsKLoop<K>::value) {
    ConsumerPipe<K> pipe{s, ps};
    K::consume_range(g, st, pipe, w, 0, iters, c);
  } else {
    uint32_t prev = 0;
    for (int it = 0; it < iters; ++it) {
      s.full[ps.index].wait(ps.phase);
      K::consume(g, st, s.stage[ps.index], w, it, c);
      if constexpr (K::kReleaseLag == 1) {
        if (it > 0) release<K>(s, prev);
        prev = ps.index;
      } else {
        release<K>(s, ps.index);
      }
      ps.advance();
    }
    K::drain(st);
    if constexpr (K::kReleaseLag == 1)
      if (iters > 0) release<K>(s, prev);
  }
#pragma unroll 1
  for (int part = 0; part < K::kOutputParts; ++part) {
    s.out_empty.wait(out_phase ^ 1);
    K::finish(g, st, s.out, w, c, part);
    tile::fence_proxy_async_shared();  // the storer's TMA (async proxy) reads what we wrote
    __syncwarp();
    if (tile::lane_id() == 0) s.out_full.arrive();
    out_phase ^= 1;
  }
}

template <class K>
__device__ __forceinline__ void store_work(const typename K::Globals& g, SharedStorage<K>& s, uint32_t& out_phase,
                                           int w) {
  for (int part = 0; part < K::kOutputParts; ++part) {
    s.out_full.wait(out_phase);
    K::store(g, s.out, w, part);
    tile::tma::commit_group();
    tile::tma::wait_group_read<0>();
    s.out_empty.arrive();
    out_phase ^= 1;
  }
}

template <class K>
__device__ __forceinline__ void run_loader(const typename K::Globals& g, SharedStorage<K>& s, int compute_blocks) {
  tile::PipeState<K::kStages> ps;
  K::prologue(g);
  const int work = K::num_work(g);
  for (int w = first_work<K>(); w < work; w += work_stride<K>(compute_blocks)) load_work<K>(g, s, ps, w);
}

template <class K>
__device__ __forceinline__ void run_consumer(const typename K::Globals& g, SharedStorage<K>& s, int compute_blocks,
                                             int c) {
  tile::PipeState<K::kStages> ps;
  uint32_t out_phase = 0;
  typename K::ConsumerState st;
  const int work = K::num_work(g);
  for (int w = first_work<K>(); w < work; w += work_stride<K>(compute_blocks))
    consume_work<K>(g, s, ps, out_phase, st, w, c);
}

template <class K>
__device__ __forceinline__ void run_storer(const typename K::Globals& g, SharedStorage<K>& s, int compute_blocks) {
  uint32_t out_phase = 0;
  const int work = K::num_work(g);
  for (int w = first_work<K>(); w < work; w += work_stride<K>(compute_blocks)) store_work<K>(g, s, out_phase, w);
  tile::tma::wait_group<0>();
  if constexpr (HasStoreDone<K>::value) K::store_done(g, compute_blocks);
}

// ---- Dynamic tasks: the same per-item bodies (load_work, consume_work, store_work) as the
// static loops, with the items chosen at run time.

template <class K>
__device__ __forceinline__ TaskRing& task_ring(SharedStorage<K>& s) {
  return reinterpret_cast<DynamicStorage<K>&>(s).ring;
}

template <class K>
__device__ __forceinline__ void run_loader_dynamic(const typename K::Globals& g, SharedStorage<K>& s,
                                                   int compute_blocks) {
  TaskRing& r = task_ring<K>(s);
  tile::PipeState<K::kStages> ps;
  tile::PipeState<kTaskSlots> ts;
  typename K::TaskState state{};
  K::prologue(g);
  for (;;) {
    const Task t = K::next_task(g, state, compute_blocks);
    r.empty[ts.index].wait(ts.phase ^ 1);
    r.task[ts.index] = t;
    r.full[ts.index].arrive();
    if (t.kind == TaskKind::Done) return;
    if (t.kind == TaskKind::Work) load_work<K>(g, s, ps, t.index);
    else r.empty[ts.index].wait(ts.phase);  // the consumers finished it (see HasDynamicTasks)
    ts.advance();
  }
}

template <class K>
__device__ __forceinline__ void run_consumer_dynamic(const typename K::Globals& g, SharedStorage<K>& s, int c) {
  TaskRing& r = task_ring<K>(s);
  tile::PipeState<K::kStages> ps;
  tile::PipeState<kTaskSlots> ts;
  uint32_t out_phase = 0;
  typename K::ConsumerState st;
  constexpr int n = 128 * K::kConsumers;
  const int t_id = static_cast<int>(threadIdx.x) - 128;
  auto release_task = [&] {
    __syncwarp();
    if (tile::lane_id() == 0) r.empty[ts.index].arrive();
  };
  for (;;) {
    r.full[ts.index].wait(ts.phase);
    const Task t = r.task[ts.index];
    if (t.kind == TaskKind::Done) return;
    if (t.kind == TaskKind::Work) {
      release_task();
      const long long t0 = clock64();
      consume_work<K>(g, s, ps, out_phase, st, t.index, c);
      if (t_id == 0) K::task_finished(g, t, static_cast<unsigned long long>(clock64() - t0));
    } else {
      const unsigned long long cycles = K::other_task(g, t.index, t_id, n);
      if (t_id == 0) K::task_finished(g, t, cycles);
      release_task();
    }
    ts.advance();
  }
}

template <class K>
__device__ __forceinline__ void run_storer_dynamic(const typename K::Globals& g, SharedStorage<K>& s) {
  TaskRing& r = task_ring<K>(s);
  tile::PipeState<kTaskSlots> ts;
  uint32_t out_phase = 0;
  for (;;) {
    r.full[ts.index].wait(ts.phase);
    const Task t = r.task[ts.index];
    if (t.kind == TaskKind::Done) break;
    r.empty[ts.index].arrive();
    ts.advance();
    if (t.kind == TaskKind::Work) store_work<K>(g, s, out_phase, t.index);
  }
  tile::tma::wait_group<0>();
}

// A dynamic-task kernel's block: the ring's barriers, the roles, then K::block_exit.
template <class K>
__device__ __forceinline__ void run_dynamic_block(const typename K::Globals& g, SharedStorage<K>& s,
                                                  int compute_blocks) {
  static_assert(cluster_size_v<K> == 1, "lcsc: dynamic tasks need cluster size 1");
  TaskRing& r = task_ring<K>(s);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kTaskSlots; ++i) {
      r.full[i].init(1);
      r.empty[i].init(4 * K::kConsumers + 1);  // every consumer warp and the storer
    }
    tile::fence_barrier_init();
  }
  __syncthreads();
  const int wg = tile::warpgroup_index();
  if (wg == 0) {
    tile::warpgroup_reg_dealloc<K::kProducerRegs>();
    const int warp = tile::warp_in_warpgroup();
    if (warp == 0 && tile::lane_id() == 0) run_loader_dynamic<K>(g, s, compute_blocks);
    else if (warp == 1 && tile::lane_id() == 0) run_storer_dynamic<K>(g, s);
  } else {
    tile::warpgroup_reg_alloc<K::kConsumerRegs>();
    run_consumer_dynamic<K>(g, s, wg - 1);
  }
  __syncwarp();      // the loader's and the storer's warps reconverge before the block barrier
  __syncthreads();  // every role ended, and with it the block's accounting
  if (threadIdx.x == 0) K::block_exit(g, compute_blocks);
}

}  // namespace detail

// Consumer threads of a dynamic-task kernel meet here inside K::other_task.
template <class K>
__device__ __forceinline__ void consumers_sync() {
  tile::named_barrier_sync(kConsumersBarrier, 128 * K::kConsumers);
}

template <class K>
__global__ void __launch_bounds__(128 * (1 + K::kConsumers), 1)
    lcsc_kernel(const __grid_constant__ typename K::Globals g, const int compute_blocks) {
  static_assert(!HasAux<K>::value || cluster_size_v<K> == 1, "lcsc: the aux role needs cluster size 1");
  extern __shared__ __align__(16) uint8_t lcsc_smem[];
  if (static_cast<int>(blockIdx.x) >= compute_blocks) {
    const int i = blockIdx.x - compute_blocks;
    K::communicator(g, &detail::shared_storage<K>(lcsc_smem), i, static_cast<int>(gridDim.x) - compute_blocks);
    return;
  }
  constexpr int C = cluster_size_v<K>;
  auto& s = detail::shared_storage<K>(lcsc_smem);
  if (threadIdx.x == 0) {
    for (int i = 0; i < K::kStages; ++i) {
      s.full[i].init(1);
      s.empty[i].init(4 * K::kConsumers * C);  // one arrival per consumer warp of the cluster
    }
    s.out_full.init(4 * K::kConsumers);
    s.out_empty.init(1);
    tile::fence_barrier_init();
  }
  if constexpr (HasSetup<K>::value) K::setup(g);
  if constexpr (HasDynamicTasks<K>::value) {
    detail::run_dynamic_block<K>(g, s, compute_blocks);  // its own barrier follows the ring's set-up
    return;
  }
  if constexpr (C > 1) tile::cluster::sync();  // peers arrive on our barriers from here on
  else __syncthreads();
  const int wg = tile::warpgroup_index();
  if (wg == 0) {
    tile::warpgroup_reg_dealloc<K::kProducerRegs>();
    const int warp = tile::warp_in_warpgroup();
    if (warp == 0) {
      if (tile::lane_id() == 0) detail::run_loader<K>(g, s, compute_blocks);
    } else if (warp == 1) {
      if (tile::lane_id() == 0) detail::run_storer<K>(g, s, compute_blocks);
    } else if constexpr (HasAux<K>::value) {
      K::aux(g, detail::aux_shared<K>(s), compute_blocks, static_cast<int>(threadIdx.x) - 64);
    }
  } else {
    tile::warpgroup_reg_alloc<K::kConsumerRegs>();
    detail::run_consumer<K>(g, s, compute_blocks, wg - 1);
  }
  // No CTA leaves while a peer may still arrive on its barriers or multicast into it.
  if constexpr (C > 1) tile::cluster::sync();
}

// The grid launch<K> would use for `work` items on the current device (raising the kernel's
// shared-memory limit and measuring how many clusters fit, once per device): a kernel whose work
// choice depends on its worker count (the GEMM planner, kernels/gemm/plan.hpp) asks here first.
template <class K>
Plan plan_for(long long work, const Config& cfg) {
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  const DeviceInfo info = device_info(dev);
  constexpr size_t smem = shared_bytes<K>();
  constexpr int C = cluster_size_v<K>;
  constexpr int threads = 128 * (1 + K::kConsumers);
  WEAVE_CHECK(smem <= info.smem_optin, "lcsc: kernel needs ", smem,
              " bytes of shared memory per block but the device allows at most ", info.smem_optin,
              HasAux<K>::value ? " (reduce the stages, the tile size or K::AuxShared)"
                               : " (reduce the stages or the tile size)");
  static std::atomic<uint64_t> raised{0};  // per device ordinal < 64
  static int max_clusters[64] = {};
  if (!(raised.load(std::memory_order_acquire) & (1ull << dev))) {
    WEAVE_CUDA_CHECK(cudaFuncSetAttribute(lcsc_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    if constexpr (C > 1) {
      cudaLaunchConfig_t q{};
      cudaLaunchAttribute a{};
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = C;
      a.val.clusterDim.y = a.val.clusterDim.z = 1;
      q.gridDim = dim3(C * info.sm_count);
      q.blockDim = dim3(threads);
      q.dynamicSmemBytes = smem;
      q.attrs = &a;
      q.numAttrs = 1;
      int n = 0;
      WEAVE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, lcsc_kernel<K>, &q));
      WEAVE_CHECK(n >= 1, "lcsc: the device cannot hold one cluster of ", C, " blocks of this kernel");
      max_clusters[dev] = n;
    }
    raised.fetch_or(1ull << dev, std::memory_order_release);
  }
  return make_plan(work, info.sm_count, cfg, smem, info.smem_optin, C,
                   cfg.max_clusters > 0 ? cfg.max_clusters : max_clusters[dev]);
}

// Computes the grid, raises the shared-memory limit, validates the config, launches.
// Returns the plan it launched (grid 0: nothing to do, nothing launched).
template <class K>
Plan launch(const typename K::Globals& g, const Config& cfg, cudaStream_t stream) {
  constexpr size_t smem = shared_bytes<K>();
  constexpr int C = cluster_size_v<K>;
  constexpr int threads = 128 * (1 + K::kConsumers);
  if constexpr (HasDynamicTasks<K>::value)
    WEAVE_CHECK(cfg.num_comm_sms == 0, "lcsc: a dynamic-task kernel's blocks choose their roles; num_comm_sms = ",
                cfg.num_comm_sms, " must be 0");
  const Plan p = plan_for<K>(K::num_work(g), cfg);
  if (p.grid() == 0) return p;
  cudaLaunchAttribute a{};
  if constexpr (HasDynamicTasks<K>::value) {
    // Cooperative: every block resident at once, or no launch. A dynamic-task block may wait for
    // work that only another block of the grid would claim (a reduction for an unclaimed tile),
    // so a block left unscheduled behind another kernel could stall the ones running.
    a.id = cudaLaunchAttributeCooperative;
    a.val.cooperative = 1;
  } else if constexpr (C > 1) {
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = C;
    a.val.clusterDim.y = a.val.clusterDim.z = 1;
  }
  if constexpr (C == 1 && !HasDynamicTasks<K>::value) {
    lcsc_kernel<K><<<p.grid(), threads, smem, stream>>>(g, p.compute_blocks);
  } else {
    cudaLaunchConfig_t q{};
    q.gridDim = dim3(p.grid());
    q.blockDim = dim3(threads);
    q.dynamicSmemBytes = smem;
    q.stream = stream;
    q.attrs = &a;
    q.numAttrs = 1;
    WEAVE_CUDA_CHECK(cudaLaunchKernelEx(&q, lcsc_kernel<K>, g, p.compute_blocks));
  }
  WEAVE_CUDA_CHECK(cudaGetLastError());
  return p;
}

}  // namespace weave::lcsc
