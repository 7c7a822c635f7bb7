// An NCCL communicator over the same ranks as a weave communicator (the unique id travels through
// weave's bootstrap): the baseline side of every multi-GPU test and benchmark. Host code only, so
// any number of translation units of one binary may include it.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"

#define WEAVE_NCCL_CHECK(expr)                                                                                        \
  do {                                                                                                                \
    ncclResult_t r_ = (expr);                                                                                         \
    if (r_ != ncclSuccess)                                                                                            \
      ::weave::detail::fail(                                                                                          \
          __FILE__, __LINE__,                                                                                         \
          ::weave::detail::concat(#expr, " failed: ", ncclGetErrorString(r_), " (", ncclGetLastError(nullptr), ")")); \
  } while (0)

namespace weave::bench {

class NcclComm {
 public:
  explicit NcclComm(runtime::Communicator& c) {
    // NVLink multicast must stay off on the shared GPU machines (HARDWARE.md). The variable is
    // set there already; set it where it is missing, never override what the machine says.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclUniqueId id{};
    if (c.rank() == 0) WEAVE_NCCL_CHECK(ncclGetUniqueId(&id));
    // Raw bytes: nvcc 13's front end crashes on std::vector of the anonymous ncclUniqueId struct.
    std::vector<char> all(c.world() * sizeof id);
    c.bootstrap().all_gather(&id, all.data(), sizeof id);
    std::memcpy(&id, all.data(), sizeof id);  // rank 0's
    WEAVE_NCCL_CHECK(ncclCommInitRank(&comm_, c.world(), id, c.rank()));
  }
  ~NcclComm() {
    if (!comm_) return;
    // Finalize and destroy wait for every rank. After a device error (a timed-out weave wait
    // traps) the peers may never get there: abort, which is local.
    if (cudaDeviceSynchronize() != cudaSuccess) {
      ncclCommAbort(comm_);
    } else {
      ncclCommFinalize(comm_);
      ncclCommDestroy(comm_);
    }
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ncclComm_t get() const { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
};

// NCCL restricted to its network transport (issue 22's baseline): sockets, no P2P or shared
// memory, on loopback when the ranks are simulated nodes of one host. Set where unset (as for
// NVLS above): a value the caller chose stays. Returns the values in effect, for the rows.
inline std::string nccl_network_environment(bool loopback) {
  setenv("NCCL_P2P_DISABLE", "1", 0);
  setenv("NCCL_SHM_DISABLE", "1", 0);
  setenv("NCCL_NET", "Socket", 0);
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // the GPU machines' rule (HARDWARE.md)
  if (loopback) setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  std::string e;
  for (const char* v : {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET", "NCCL_SOCKET_IFNAME"}) {
    const char* x = getenv(v);
    e += std::string(e.empty() ? "" : " ") + v + "=" + (x ? x : "");
  }
  return e;
}

}  // namespace weave::bench
