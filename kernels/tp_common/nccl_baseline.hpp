// The unfused baseline of the TP kernels' tests and benchmark: an NCCL communicator over the same
// ranks as a weave communicator (id through weave's bootstrap). Header-only and without device
// code, so several translation units of one binary may include it. (bench/nccl_ref.cuh has a
// fuller helper for the collectives, with kernels defined in the header: one TU per binary.)
#pragma once
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"

#define WEAVE_TP_NCCL_CHECK(expr)                                                                  \
  do {                                                                                             \
    ncclResult_t r_ = (expr);                                                                      \
    WEAVE_CHECK(r_ == ncclSuccess, #expr, " failed: ", ncclGetErrorString(r_), " (", ncclGetLastError(nullptr), ")"); \
  } while (0)

namespace weave::tp {

class NcclBaseline {
 public:
  explicit NcclBaseline(runtime::Communicator& c) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // never multicast; never override what the machine says
    ncclUniqueId id{};
    if (c.rank() == 0) WEAVE_TP_NCCL_CHECK(ncclGetUniqueId(&id));
    std::vector<char> all(sizeof id * c.world());  // (a vector of the anonymous struct trips nvcc 13.0)
    c.bootstrap().all_gather(&id, all.data(), sizeof id);
    std::memcpy(&id, all.data(), sizeof id);  // rank 0's
    WEAVE_TP_NCCL_CHECK(ncclCommInitRank(&comm_, c.world(), id, c.rank()));
  }
  ~NcclBaseline() {
    if (comm_) {
      ncclCommFinalize(comm_);
      ncclCommDestroy(comm_);
    }
  }
  NcclBaseline(const NcclBaseline&) = delete;
  NcclBaseline& operator=(const NcclBaseline&) = delete;
  ncclComm_t get() const { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
};

}  // namespace weave::tp
