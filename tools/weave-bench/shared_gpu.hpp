// Which GPU each rank has, and ranks sharing one (weave-run --share-gpus, WEAVE_SHARE_GPUS=1): NCCL
// refuses two ranks on one device, so the benchmarks that time NCCL baselines leave those rows out
// there and check weave's (whose times then mean nothing: the ranks' kernels time-slice).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::bench {

// What a rank sees of its GPU, before anything is made or from a communicator: whether there is
// one, which device, and its UUID (all zeros without one).
struct GpuView {
  int32_t count, device;
  unsigned char uuid[16];
};
// `device` < 0: local_rank % the visible GPUs (NetPath's default choice).
inline GpuView gpu_view(int local_rank, int device = -1) {
  GpuView v{};
  if (cudaGetDeviceCount(&v.count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no GPU: the caller reports it, nothing is thrown
    v.count = 0;
  }
  v.device = v.count > 0 ? (device >= 0 ? device : local_rank % v.count) : -1;
  if (v.count > 0) {
    cudaDeviceProp p{};
    WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&p, v.device));
    std::memcpy(v.uuid, p.uuid.bytes, sizeof v.uuid);
  }
  return v;
}
inline bool same_gpu(const GpuView& a, const GpuView& b) { return std::memcmp(a.uuid, b.uuid, sizeof a.uuid) == 0; }
// "" when no two ranks of `all` (every rank's view, by rank) share a GPU, else the first two that do.
inline std::string first_shared(const std::vector<GpuView>& all) {
  for (size_t r = 0; r < all.size(); ++r)
    for (size_t q = r + 1; q < all.size(); ++q)
      if (same_gpu(all[r], all[q])) return weave::detail::concat("ranks ", r, " and ", q, " share one GPU");
  return "";
}

// first_shared over the communicator's ranks. Collective.
inline std::string shared_gpu(runtime::Communicator& comm) {
  const GpuView mine = gpu_view(comm.local_rank(), comm.device());
  std::vector<GpuView> all(static_cast<size_t>(comm.world()));
  comm.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  return first_shared(all);
}

}  // namespace weave::bench
