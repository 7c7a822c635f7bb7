// Host pieces both inter-node TP kernels share: the object's checks, this rank's operand checks,
// the once-per-shape agreement over the bootstrap, the room a call needs on the path, and the
// launch of a numbered call.
#pragma once
#include <cuda_runtime.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "net_tp/net_tp.hpp"
#include "weave/common/error.hpp"
#include "weave/lcsc.cuh"

namespace weave::net::tp_net {

// The operator's identity, the first entry of every agreed key: ranks calling different
// operators with equal shapes must not meet in the device.
inline constexpr long long kOpAgGemm = 1, kOpGemmRs = 2, kOpGemmAr = 3;

struct Buffer {
  const char* name;
  const void* p;
  size_t bytes;
};

// The constructor's checks: GPU mode, one rank per node, at most kMaxWorld nodes, the options.
void check_object(const NetPath& path, const NetTpOptions& o, const char* who);
// Non-null, 16-byte aligned device memory at least as long as the shape says.
void check_buffers(const char* who, std::initializer_list<Buffer> bufs);
// The call's bytes and flags fit the path; the communicator blocks leave compute SMs.
void check_room(const NetPath& path, const NetTpOptions& o, const char* who, long long send_needed,
                long long recv_needed, long long flags_needed);
// A new `key` (shape and options) is agreed with every rank once: each rank's verdict (`problem`
// empty: its arguments are fine) and key are exchanged, and any rank's problem or a differing key
// throws on every rank. On a key agreed before, a problem of this rank alone fails the path
// (NetPath::abort: the peers' kernels, already launched, are released) and throws.
void agree(NetPath& path, std::vector<long long>& agreed, const std::vector<long long>& key,
           const std::string& problem, const char* who);

// Numbers the call (`commands` queued by this rank), fills its fields into g, launches K with the
// options' communicator blocks; a launch failure fails the path (the peers would wait) and throws.
template <class K, class G>
void launch_call(NetPath& path, G& g, long long commands, const NetTpOptions& o, cudaStream_t stream, const char* who) {
  const NetPath::Call call = path.begin_call(static_cast<uint64_t>(commands));
  g.h = path.handle();
  g.call = call.index;
  g.commands_before = call.commands_before;
  g.recv_base = call.recv_offset;
  g.flag_base = call.flag_offset;
  g.send_blocks = o.send_blocks;
  lcsc::Config cfg;
  cfg.num_comm_sms = o.send_blocks + o.recv_blocks;
  try {
    lcsc::launch<K>(g, cfg, stream);
  } catch (const Error& e) {
    const std::string why = weave::detail::concat(who, ": launch failed on rank ", path.rank(), ": ", e.what());
    path.abort(why);
    throw Error(weave::detail::concat("weave: ", why));
  }
}

}  // namespace weave::net::tp_net
