// The TP kernels' own host pieces beside net_common/call.hpp: the object's checks and the launch of
// a numbered call on the LCSC template.
#pragma once
#include <cuda_runtime.h>

#include "net_common/call.hpp"
#include "net_common/node.hpp"
#include "net_tp/net_tp.hpp"
#include "weave/common/error.hpp"
#include "weave/lcsc.cuh"

namespace weave::net::tp_net {

inline void check_object(const NetPath& path, const NetTpOptions& o, const char* who, bool any_g = false) {
  check_path(path, o.send_blocks, o.recv_blocks, who, any_g);
  WEAVE_CHECK(!o.adaptive || path.topo().gpus == 1, who, ": NetTpOptions::adaptive is built for one rank per node (",
              path.topo().gpus, " here; use send_blocks / recv_blocks)");
  WEAVE_CHECK(o.push_blocks >= 1 && o.push_blocks <= 32, who, ": push_blocks (", o.push_blocks, ") must be 1 to 32");
  WEAVE_CHECK(o.chunk_bytes >= 16 && o.chunk_bytes % 16 == 0, who, ": chunk_bytes (", o.chunk_bytes,
              ") must be a positive multiple of 16");
}

inline void check_room(const NetPath& path, const NetTpOptions& o, const char* who, long long send_needed,
                       long long recv_needed, long long flags_needed, int extra_blocks = 0) {
  net::check_room(path, who, send_needed, recv_needed, flags_needed,
                  o.adaptive ? 0 : o.send_blocks + o.recv_blocks + extra_blocks,
                  "raise NetTpOptions::chunk_bytes or NetPathOptions::proxy.flags");
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

// The adaptive split's call (net_gemm_rs_adaptive.cuh, net_ag_adaptive_kernel.cuh): no communicator blocks, every SM a block
// of the split (none left out to balance the GEMM's waves: the blocks beyond them communicate).
template <class KNK, class KKN, class G>
void launch_adaptive(NetPath& path, G& g, long long commands, const NetTpOptions& o, cudaStream_t stream,
                     const char* who) {
  g.send_blocks = 0;
  lcsc::Config cfg;
  cfg.balance_waves = false;
  launch_numbered(path, g, commands, who, [&] {
    if (o.b == gemm::BLayout::NK) lcsc::launch<KNK>(g, cfg, stream);
    else lcsc::launch<KKN>(g, cfg, stream);
  });
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
