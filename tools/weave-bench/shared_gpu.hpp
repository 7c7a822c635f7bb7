// Ranks sharing one GPU (weave-run --share-gpus, WEAVE_SHARE_GPUS=1): NCCL refuses two ranks on one
// device, so the benchmarks that time NCCL baselines leave those rows out there and check weave's
// (whose times then mean nothing: the ranks' kernels time-slice).
#pragma once
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::bench {

// "" when every rank has a GPU of its own, else which two ranks share one. Collective.
inline std::string shared_gpu(runtime::Communicator& comm) {
  struct Uuid {
    unsigned char b[16];
  };
  Uuid mine{};
  cudaDeviceProp p{};
  WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&p, comm.device()));
  std::memcpy(mine.b, p.uuid.bytes, sizeof mine.b);
  std::vector<Uuid> all(static_cast<size_t>(comm.world()));
  comm.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  for (size_t r = 0; r < all.size(); ++r)
    for (size_t q = r + 1; q < all.size(); ++q)
      if (std::memcmp(all[r].b, all[q].b, sizeof mine.b) == 0)
        return weave::detail::concat("ranks ", r, " and ", q, " share one GPU");
  return "";
}

}  // namespace weave::bench
