// Host pieces of the hierarchical inter-node fused kernels (nodes of G > 1 ranks: net_tp, the
// ring attention): the node communicator a constructor takes, the check that a buffer node peers
// write lies in its heap, and finish() on the node then on the path.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "weave/common/error.hpp"
#include "weave/net/net_path.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::net {

// The hierarchical constructors' node communicator: `node` must be this node's (its G ranks, rank
// = this rank's local index, the path's GPU); returns it at G > 1, null at G = 1 (the one-rank form).
inline runtime::Communicator* node_of(const NetPath& path, runtime::Communicator& node, const char* who) {
  const NetTopo t = path.topo();
  const int local = path.rank() % t.gpus;
  WEAVE_CHECK(node.world() == t.gpus && node.rank() == local, who, ": the node communicator has rank ", node.rank(),
              " of ", node.world(), " but this rank is local rank ", local, " of a node of ", t.gpus,
              " ranks (make it over runtime::node_launch_info)");
  WEAVE_CHECK(node.device() == path.device(), who, ": the node communicator uses GPU ", node.device(),
              " but the network path GPU ", path.device());
  return t.gpus > 1 ? &node : nullptr;
}

// finish() of the hierarchical forms: the node communicator first (a device error or a timed-out
// NVLink wait; it also fails the path, so that the rail peers stop waiting), then the path.
inline void finish_on(NetPath& path, runtime::Communicator* node, cudaStream_t stream) {
  if (node) {
    try {
      node->sync(stream);
    } catch (const Error& e) {
      path.abort(e.what());
      throw;
    }
  }
  path.finish(stream);
}

// `p` (bytes long) lies in the node communicator's heap, which the node peers write or read.
inline void check_in_node_heap(runtime::Communicator& node, const void* p, size_t bytes, const char* who,
                               const char* name, const char* why) {
  try {
    (void)node.peers(p, bytes);
  } catch (const Error& e) {
    throw Error(detail::concat("weave: ", who, ": with ", node.world(), " ranks per node ", name,
                               " must lie in the node communicator's heap (", why, "): ", e.what()));
  }
}

}  // namespace weave::net
