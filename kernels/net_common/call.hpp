// Host pieces every inter-node kernel's call shares (kernels/net_tp, kernels/net_ring_attention,
// kernels/net_collectives):
// the object's checks, this rank's buffer checks, the room a call needs on the path, the
// cross-rank agreement of every call through the path's calls' mailbox, and device counters
// zeroed per call.
#pragma once
#include <cuda_runtime.h>

#include <exception>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/net/net_path.hpp"

namespace weave::net {

// The operator's identity, the first entry of every agreed key: ranks calling different
// operators with equal shapes must not meet in the device.
inline constexpr long long kOpAgGemm = 1, kOpGemmRs = 2, kOpGemmAr = 3, kOpRingAttention = 4, kOpAllGather = 5,
                          kOpReduceScatter = 6, kOpAllReduce = 7;
// The operator's name in messages ("operator 9" for an id not above).
const char* op_name(long long op);

struct Buffer {
  const char* name;
  const void* p;
  size_t bytes;
};

// An object's checks: GPU mode, one rank per node (any number with `any_g`), at most kMaxWorld
// ranks in all, 1..32 send and receive blocks each.
void check_path(const NetPath& path, int send_blocks, int recv_blocks, const char* who, bool any_g = false);
// Non-null, 16-byte aligned device memory at least as long as the shape says.
void check_buffers(const char* who, std::initializer_list<Buffer> bufs);
// The call's bytes and flags fit the path; `comm_blocks` leave compute SMs.
void check_room(const NetPath& path, const char* who, long long send_needed, long long recv_needed,
                long long flags_needed, int comm_blocks, const char* flags_hint);
// The keys (operator, shape, options) every rank has checked together on this object.
using AgreedKeys = std::set<std::vector<long long>>;

// What agree() returns, held until the call's kernels are enqueued. Destroyed by an exception
// after the agreement (an allocation, a node stage, a launch failing on this rank), it fails the
// path: the peers were told this rank launches the call, and would wait for it until their wait
// timeout (and, were the path kept, this rank's later calls would be numbered one behind theirs).
class [[nodiscard]] AgreedCall {
 public:
  AgreedCall(NetPath& path, std::string call);
  ~AgreedCall();
  AgreedCall(const AgreedCall&) = delete;
  AgreedCall& operator=(const AgreedCall&) = delete;

 private:
  NetPath& path_;
  std::string call_;
  int exceptions_;
};

// The cross-rank check of one call, through the path's calls' mailbox (Proxy::post_call): every
// call is numbered and its plan posted to every peer. A key in `agreed` (and no WEAVE_DEBUG=1) is
// not waited for: the call compares with the peers' posts already there and goes on, and the
// proxies compare the rest as they come (a difference then fails the path on every rank, naming
// both calls, and releases the kernels). A new key waits for every peer's post of the call: a
// differing key (`what` names its fields after the operator), or any rank's `problem` (non-empty:
// this rank's own arguments are wrong), throws on every rank, and peers that had launched are
// released by failing the path; else the key joins `agreed`. At most kPostValues entries. Every
// rank must run with the same WEAVE_DEBUG.
AgreedCall agree(NetPath& path, AgreedKeys& agreed, const std::vector<long long>& key, const std::string& problem,
                 const char* who, const char* what);

// Numbers the next call on the path (`commands` queued by this rank), puts its fields into the
// kernel parameters g (h, call, commands_before, recv_base, flag_base), then `launch()`es. A
// launch that throws fails the path (the peers would wait for this rank's commands) and throws.
template <class G, class Launch>
void launch_numbered(NetPath& path, G& g, long long commands, const char* who, Launch&& launch) {
  const NetPath::Call call = path.begin_call(static_cast<uint64_t>(commands));
  g.h = path.handle();
  g.call = call.index;
  g.commands_before = call.commands_before;
  g.recv_base = call.recv_offset;
  g.flag_base = call.flag_offset;
  try {
    launch();
  } catch (const Error& e) {
    (void)cudaGetLastError();  // the failed call's error must not be the next CUDA check's
    const std::string why = weave::detail::concat(who, ": launch failed on rank ", path.rank(), ": ", e.what());
    path.abort(why);
    throw Error(weave::detail::concat("weave: ", why));
  }
}

// Device counters zeroed before each launch (stream-ordered), grown on demand.
class DeviceCounters {
 public:
  DeviceCounters() = default;
  ~DeviceCounters();
  DeviceCounters(const DeviceCounters&) = delete;
  DeviceCounters& operator=(const DeviceCounters&) = delete;
  unsigned long long* zeroed(int n, cudaStream_t stream);

 private:
  unsigned long long* p_ = nullptr;
  int n_ = 0;
};

}  // namespace weave::net
