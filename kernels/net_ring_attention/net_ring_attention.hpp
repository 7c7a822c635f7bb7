// Ring attention forward across nodes over the network path, in one persistent kernel per call
// (README.md beside this file): the single-node ring attention's sharding, layouts and results
// (kernels/ring_attention/ring_attention.hpp) over all W = nodes x G ranks, with K and V
// travelling between rail peers through the command ring, the host proxy and libfabric, and at
// G > 1 ranks per node over NVLink inside the node (the hierarchical form).
#pragma once
#include <cuda_runtime.h>

#include <vector>

#include "net_common/call.hpp"
#include "ring_attention/ring_attention.hpp"
#include "weave/net/net_path.hpp"
#include "weave/runtime/call.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::net {

struct NetRingOptions {
  int send_blocks = 2;  // inter-node send blocks (then compute)
  int recv_blocks = 4;  // inter-node receive blocks (then compute)
  int push_blocks = 2;  // G > 1: NVLink push blocks of the own K/V into the node peers (then compute)
};

class NetRingAttention {
 public:
  // One rank per node (the path's G = 1), at most 8 nodes, the path in GPU mode. Not collective.
  explicit NetRingAttention(NetPath& path, NetRingOptions opts = {});
  // Nodes of any number of ranks (W = nodes x G <= 8): `node` is this node's communicator
  // (runtime::node_launch_info, as NetAgGemm(path, node, opts) takes it). At G = 1 the same as
  // the form above.
  NetRingAttention(NetPath& path, runtime::Communicator& node, NetRingOptions opts = {});
  ~NetRingAttention();
  NetRingAttention(const NetRingAttention&) = delete;
  NetRingAttention& operator=(const NetRingAttention&) = delete;

  // Collective (every rank, same order, same shape and options), stream-ordered on one path.
  // q, k, v, o, lse, s and opt as sp::RingAttention::forward (this rank's rows in `opt.sharding`
  // order; o may be q; lse may be null); opt.num_comm_sms is not used (the send and receive
  // blocks are NetRingOptions'). Errors as NetAgGemm::run (net_tp.hpp): a bad argument throws
  // before anything is queued, on every rank for a new shape; finish() reports a transfer failure.
  // G = 1 only: the gathered K and V are the object's (device memory, grown on demand).
  void forward(const sp::bf16* q, const sp::bf16* k, const sp::bf16* v, sp::bf16* o, float* lse, const sp::RingShape& s,
               const sp::RingOptions& opt, cudaStream_t stream);
  // Any G: the gathered K and V of the whole sequence, (B, S, Hkv, D) each in global row order,
  // are the caller's k_gathered and v_gathered (overlapping no other argument). Once this rank's
  // call ended they hold every other rank's rows (for a backward pass), and this rank's own unless
  // those are read in place from k and v (own chunks on 128-row key blocks, ring_attention
  // README). At G > 1 both must lie in the node communicator's heap (the node peers write into
  // them), on every rank.
  void forward(const sp::bf16* q, const sp::bf16* k, const sp::bf16* v, sp::bf16* o, float* lse,
               sp::bf16* k_gathered, sp::bf16* v_gathered, const sp::RingShape& s, const sp::RingOptions& opt,
               cudaStream_t stream);
  // Waits for `stream`, then throws the first failure: at G > 1 the node communicator's (a
  // timed-out NVLink wait; it also fails the path), then the path's (NetPath::finish).
  void finish(cudaStream_t stream);

 private:
  void call(const sp::bf16* q, const sp::bf16* k, const sp::bf16* v, sp::bf16* o, float* lse, sp::bf16* gk,
            sp::bf16* gv, const sp::RingShape& s, const sp::RingOptions& opt, cudaStream_t stream);
  NetPath& path_;
  NetRingOptions opt_;
  runtime::Communicator* node_ = nullptr;  // G > 1
  AgreedKeys agreed_;  // keys every rank checked together (net_common/call.hpp)
  DeviceCounters ready_;       // G = 1: per (batch, slice)
  sp::bf16* kv_ = nullptr;     // G = 1: the gathered K then V (local device memory), grown on demand
  size_t kv_elems_ = 0;
  runtime::ShapeSignals sig_{"net.ring_attention"};  // G > 1: ready and arrive sets on the node
};

}  // namespace weave::net
