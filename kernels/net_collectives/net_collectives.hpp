// Inter-node collectives over the network path (NetPath) for N nodes of G ranks each (rank =
// node * G + local): every network transfer goes between rail peers (the ranks of one local index)
// through the host proxy and libfabric; at G > 1 the node's ranks also exchange over NVLink,
// through the single-node collectives on a node-local communicator (README.md next to this file).
// In place on a device buffer of `count` elements, sharded over all N * G ranks in rank order as
// the single-node collectives shard it (hierarchy.hpp: near-equal in 16-byte units), the same at
// any G:
//   all_gather      rank q's shard is its input; afterwards every shard holds its owner's input.
//   reduce_scatter  the whole buffer is every rank's input; afterwards rank q's shard holds the
//                   sum over ranks (fp32 accumulation; rounded once at G = 1, at G > 1 once more
//                   for the node's partial); the other shards are left as they were.
//   all_reduce      every element holds the sum (the ring of hierarchy.hpp between rail peers:
//                   N - 1 reduce-scatter hops, each adding in fp32 and rounding to the dtype, then
//                   N - 1 forwarding hops; at G > 1 over node part l, between an NVLink
//                   reduce-scatter and an NVLink all-gather).
// Calls are collective (every rank, same order, same count and dtype) and stream-ordered on one
// path; finish() after the last one reports a failure.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "net_common/call.hpp"
#include "weave/net/net_path.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::net {

namespace coll {
struct Layout;  // layout.hpp
}

enum class NetDtype { bf16, fp32 };
size_t dtype_bytes(NetDtype d);

struct NetCollOptions {
  long long chunk_bytes = 256 << 10;  // network piece: a multiple of 16 (the tuned parameter)
  int send_blocks = 4;                // inter-node send blocks
  int recv_blocks = 8;                // inter-node receive blocks
  // G > 1: reduce_scatter's node partials (N x the largest shard, 16-aligned), allocated in the
  // node communicator's heap by the constructor.
  size_t node_scratch_bytes = 64u << 20;
  // G > 1: one fused kernel per call (NVLink and network roles in one grid, pipelined per network
  // piece: net_coll_fused_kernel.cuh) instead of the host-composed phases. Off by default until it
  // has run on a GPU; every rank must pass the same value (part of the agreed call).
  bool fused = false;
};

class NetCollectives {
 public:
  // One rank per node (G = 1). Throws weave::Error when the path is not in GPU mode, has more
  // than one rank per node (use the constructor below) or the options are malformed.
  explicit NetCollectives(NetPath& path, NetCollOptions opts = {});
  // Any G. `node` is this node's communicator: its G ranks only, rank = this rank's local index
  // (Communicator(runtime::node_launch_info(...), ...)); it must outlive this object, and at
  // G > 1 the calls' buffers must lie in its heap (or be registered with it). Collective over the
  // job: at G > 1 it makes the node's single-node Collectives and allocates its scratch in the
  // node's heap (node_scratch_bytes and G x 16 bytes; the destructor, collective too, frees them).
  NetCollectives(NetPath& path, runtime::Communicator& node, NetCollOptions opts = {});
  ~NetCollectives();

  // Each enqueues its phases on `stream` (none for count == 0 or one rank) and returns without
  // waiting: at G = 1 one network kernel; at G > 1 the NVLink phases (the single-node collectives'
  // kernels) and, with more than one node, the network kernel between them. Throws weave::Error,
  // launching nothing, when the call does not fit the path or the node scratch (its message names
  // the option to raise), the buffer is not in the node's heap at G > 1, or the path has failed.
  void all_gather(void* buf, long long count, NetDtype dtype, cudaStream_t stream);
  void reduce_scatter(void* buf, long long count, NetDtype dtype, cudaStream_t stream);
  void all_reduce(void* buf, long long count, NetDtype dtype, cudaStream_t stream);

  // Waits for `stream`, then throws the first failure: at G > 1 the node communicator's
  // (Communicator::sync; it also aborts the path, releasing the rail peers), then the network
  // path's (NetPath::finish).
  void finish(cudaStream_t stream);

  // Rank q's shard of a `count`-element buffer over `world` = N * G ranks, in elements.
  static void shard(int world, long long count, NetDtype dtype, int q, long long* first, long long* n);

 private:
  struct Node;  // the NVLink phases (G > 1)
  void launch(int coll, void* buf, long long count, NetDtype dtype, cudaStream_t stream);
  // The network phase (kernel.cuh): reads reduce_scatter's partials from `src`, writes `buf`.
  void net_phase(const coll::Layout& L, char* buf, const char* src, NetDtype dtype, cudaStream_t stream,
                 const char* name);
  // G > 1 with NetCollOptions::fused: the whole call as one kernel (net_coll_fused_kernel.cuh).
  void fused_call(const coll::Layout& L, char* buf, NetDtype dtype, cudaStream_t stream, const char* name);
  NetPath& path_;
  NetCollOptions opt_;
  std::unique_ptr<Node> node_;
  AgreedKeys agreed_;  // keys every rank checked together (net_common/call.hpp)
};

}  // namespace weave::net
