// Ring attention forward across nodes (one rank per node) over the network path, in one
// persistent kernel per call (README.md beside this file): the single-node ring attention's
// sharding, layouts and results (kernels/ring_attention/ring_attention.hpp), with K and V
// travelling between rail peers through the command ring, the host proxy and libfabric.
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "net_common/call.hpp"
#include "ring_attention/ring_attention.hpp"
#include "weave/net/net_path.hpp"

namespace weave::net {

struct NetRingOptions {
  int send_blocks = 2;  // inter-node send blocks (then compute)
  int recv_blocks = 4;  // inter-node receive blocks (then compute)
};

class NetRingAttention {
 public:
  // One rank per node (the path's G = 1), at most 8 nodes, the path in GPU mode. Not collective.
  explicit NetRingAttention(NetPath& path, NetRingOptions opts = {});
  ~NetRingAttention();
  NetRingAttention(const NetRingAttention&) = delete;
  NetRingAttention& operator=(const NetRingAttention&) = delete;

  // Collective (every rank, same order, same shape and options), stream-ordered on one path.
  // q, k, v, o, lse, s and opt as sp::RingAttention::forward (this rank's rows in `opt.sharding`
  // order; o may be q; lse may be null); opt.num_comm_sms is not used (the send and receive
  // blocks are NetRingOptions'). Errors as NetAgGemm::run (net_tp.hpp): a bad argument throws
  // before anything is queued, on every rank for a new shape; finish() reports a transfer failure.
  void forward(const sp::bf16* q, const sp::bf16* k, const sp::bf16* v, sp::bf16* o, float* lse, const sp::RingShape& s,
               const sp::RingOptions& opt, cudaStream_t stream);
  void finish(cudaStream_t stream);

 private:
  NetPath& path_;
  NetRingOptions opt_;
  std::vector<long long> agreed_;
  DeviceCounters ready_;       // per (batch, slice)
  sp::bf16* kv_ = nullptr;     // the gathered K then V (local device memory), grown on demand
  size_t kv_elems_ = 0;
};

}  // namespace weave::net
