// The TP kernels' own host pieces beside net_common/call.hpp: the object's checks and the launch of
// a numbered call on the LCSC template.
#pragma once
#include <cuda_runtime.h>

#include "net_common/call.hpp"
#include "net_tp/net_tp.hpp"
#include "weave/common/error.hpp"
#include "weave/lcsc.cuh"

namespace weave::net::tp_net {

inline void check_object(const NetPath& path, const NetTpOptions& o, const char* who, bool any_g = false) {
  WEAVE_CHECK(any_g || path.topo().gpus == 1, who, ": ", path.topo().nodes, " nodes of ", path.topo().gpus,
              " ranks: this constructor takes one rank per node; the hierarchical form takes the node's communicator "
              "too (path, node, opts)");
  check_path(path, o.send_blocks, o.recv_blocks, who, any_g);
  WEAVE_CHECK(o.push_blocks >= 1 && o.push_blocks <= 32, who, ": push_blocks (", o.push_blocks, ") must be 1 to 32");
  WEAVE_CHECK(o.chunk_bytes >= 16 && o.chunk_bytes % 16 == 0, who, ": chunk_bytes (", o.chunk_bytes,
              ") must be a positive multiple of 16");
}

inline void check_room(const NetPath& path, const NetTpOptions& o, const char* who, long long send_needed,
                       long long recv_needed, long long flags_needed, int extra_blocks = 0) {
  net::check_room(path, who, send_needed, recv_needed, flags_needed, o.send_blocks + o.recv_blocks + extra_blocks,
                  "raise NetTpOptions::chunk_bytes or NetPathOptions::proxy.flags");
}

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

// The call on the path (net_common/call.hpp's launch_numbered), K launched with the options'
// communicator blocks; `extra_blocks`: those beyond the send and receive ones (the NVLink push at
// G > 1).
template <class K, class G>
void launch_call(NetPath& path, G& g, long long commands, const NetTpOptions& o, cudaStream_t stream, const char* who,
                 int extra_blocks = 0) {
  g.send_blocks = o.send_blocks;
  lcsc::Config cfg;
  cfg.num_comm_sms = o.send_blocks + o.recv_blocks + extra_blocks;
  launch_numbered(path, g, commands, who, [&] { lcsc::launch<K>(g, cfg, stream); });
}

// launch_call of the kernel for the options' B layout: KNK (N x K) or KKN (K x N).
template <class KNK, class KKN, class G>
void launch_for_b(NetPath& path, G& g, long long commands, const NetTpOptions& o, cudaStream_t stream, const char* who,
                  int extra_blocks = 0) {
  if (o.b == gemm::BLayout::NK)
    launch_call<KNK>(path, g, commands, o, stream, who, extra_blocks);
  else
    launch_call<KKN>(path, g, commands, o, stream, who, extra_blocks);
}

}  // namespace weave::net::tp_net
