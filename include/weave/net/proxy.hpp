// The host proxy of the network path (mKernel section 3.3): one thread per command queue (one
// per GPU) that drains the queue (command.hpp) into RDMA writes on the transport
// (transport.hpp), reaps completions, returns credits, publishes arrivals, and turns every
// failure into a diagnostic on every rank instead of a hang.
//
// Per loop: reap completions (a command completes when its writes did: `completed` grows; an
// immediate-data arrival adds one to its chunk's flag) -> take every ready command from the ring,
// up to the outstanding-request limit, and return the credits (`head`) -> post, per peer, up to
// `batch` commands as one submission (FI_MORE on all but its last write), without waiting for a
// batch to fill -> send new call posts and compare the peers' (below) -> every millisecond:
// heartbeats, peers' abort notes, timeouts.
//
// Failures, each ending the proxy with a message naming this rank, the peer, the chunk and the
// operation: an error completion (a write the provider failed, a peer whose connection broke);
// a completion that does not come within the timeout (lost completion); a command that cannot be
// posted within it; a peer that stays silent (its heartbeat, written into this rank's memory
// every `heartbeat_s`, stops: the process is gone or stuck; a peer on this host whose process
// has exited is named so at once); a command out of range. The proxy then writes its message
// into every peer's abort note (their proxies fail with it, so every rank says what happened),
// sets the ring's abort word (producers stop waiting) and stops.
//
// Arrival flags: a uint64 per chunk in this rank's control block (host memory, mapped for the
// GPU path), written by the peer's flag write (ordered) or by this proxy (unordered).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "weave/net/command.hpp"
#include "weave/net/rendezvous.hpp"
#include "weave/net/transport.hpp"

namespace weave::runtime {
class Bootstrap;
class NetBootstrap;
}

namespace weave::net {

// Copies `bytes` of device memory at `src` into the host bounce buffer `dst` and returns once
// the copy is done: the staging step for device sources on providers without FI_HMEM.
using StageFn = void (*)(void* dst, const void* src, size_t bytes);

// The GPU path's staging step. NOT WRITTEN YET (no GPU on the machines this was built on): it
// throws weave::Error. What remains: a cudaMemcpyAsync device->bounce on a proxy-owned stream
// and an event per in-flight command, polled by the proxy instead of waiting here.
void stage_device_to_host(void* dst, const void* src, size_t bytes);

struct ProxyOptions {
  uint32_t queue_slots = 1024;      // ring capacity, a power of two
  uint32_t max_outstanding = 128;   // commands taken and not yet complete (clamped to the endpoint)
  uint32_t batch = kMaxBatch;       // commands per submission, 1 (unbatched) to kMaxBatch
  uint32_t flags = 4096;            // arrival flags of this rank (chunk ids below it)
  double timeout_s = -1;            // < 0: $WEAVE_NET_TIMEOUT_S: lost completion, stuck post
  double silence_s = -1;            // < 0: timeout_s: a peer without heartbeat this long fails
  double heartbeat_s = -1;          // < 0: min(0.1 s, silence / 8)
  // Without work the proxy spins 256 polls, then yields its core, then after 4096 polls sleeps
  // this long per poll (0: keeps yielding; < 0: always spins, for a proxy with a core of its own).
  double idle_sleep_us = 20;
  bool mapped_ring = false;         // ring and flags in cudaHostAlloc'ed mapped memory (GPU path)
  size_t bounce_bytes = 256 << 10;  // per outstanding command, where device sources are staged
  StageFn stage = stage_device_to_host;
  // Called on the proxy thread, for benchmarks and tests (ticket = the command's position in the
  // queue): when the command left the ring, after its writes were posted, after they completed.
  std::function<void(uint64_t ticket)> on_taken, on_posted, on_completed;
};

// One call's plan in the calls' mailbox (net_common's agree): each rank numbers its calls on the
// path 1, 2, ... and posts every call's plan; the proxy writes it into every peer's control block
// (a ring of kCallRing posts per peer), where the peer reads it without waiting. The proxy also
// compares its own posts with the peers' as they come (its watchdog, every turn of its loop): two
// posts of one call that differ where either rank launched fail the path on every rank, naming
// both calls. Every call is compared by at least one rank of each pair (post_call's bound).
inline constexpr int kCallRing = 64;
inline constexpr int kPostValues = 16;
struct CallPost {
  uint64_t call = 0;      // 1, 2, ...; 0: no post
  int32_t together = 0;   // the rank waits for every peer's post of this call before launching
  int32_t rejected = 0;   // the rank launches nothing (its arguments, or a peer's post, differ)
  int32_t nvalues = 0;    // values[0 .. nvalues): the plan (operator, shape, options)
  int32_t reserved = 0;
  long long values[kPostValues] = {};
  char text[232] = {};    // the plan as messages name it ("all_gather(count 4096, dtype 1)")
  bool launched() const { return !together && !rejected; }
  bool same_plan(const CallPost& o) const;
};

struct ProxyStats {
  uint64_t taken = 0, posted = 0, completed = 0;  // commands
  uint64_t submissions = 0, writes = 0, arrivals = 0, queue_full = 0;
  uint64_t batch_sizes[kMaxBatch + 1] = {};  // submissions by number of commands
};

class Proxy {
 public:
  // Collective over `boot` (every rank, same order): exchanges fabric addresses and registered
  // regions, connects every rank as a peer (peer index = rank), starts the thread. Commands'
  // source offsets index [send, send + send_bytes) (device memory: registered directly with
  // FI_HMEM, else staged); peers' destination offsets index [recv, recv + recv_bytes) (host).
  // `boot`: the node-local Bootstrap (one host) or NetBootstrap (across hosts or simulated nodes);
  // it must outlive the proxy (shutdown() meets the other ranks through it).
  Proxy(Transport& transport, runtime::Bootstrap& boot, void* send, size_t send_bytes, MemKind send_kind, void* recv,
        size_t recv_bytes, const ProxyOptions& opts = {});
  Proxy(Transport& transport, runtime::NetBootstrap& boot, void* send, size_t send_bytes, MemKind send_kind, void* recv,
        size_t recv_bytes, const ProxyOptions& opts = {});
  // Stops the thread without waiting for peers (after shutdown(), or after a failure).
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  QueueView queue() const;  // the producers' view
  const uint64_t* flags() const;
  int rank() const;
  int world() const;

  // Host-side receive: waits until flags()[chunk] >= value. Throws weave::Error when the proxy
  // failed (its message) or after timeout_s (< 0: the proxy's timeout) naming the chunk.
  void wait_arrival(uint32_t chunk, uint64_t value, double timeout_s = -1) const;

  // Orderly end, on every rank once its producers are done and its expected arrivals are in:
  // waits until every queued command completed (bounded by the timeout), meets every rank at
  // the bootstrap (this proxy keeps progressing meanwhile: peers' writes still land), stops the
  // heartbeats, meets again, stops the thread. Then the transport may go. Throws the error.
  void shutdown();

  // Ends this proxy as a failure would, from the host side (a rank's own error outside the proxy:
  // a bad call, a kernel that timed out): `why` goes into every peer's abort note, producers and
  // kernels waiting on this ring are released. No effect after an earlier failure.
  void abort(const std::string& why);

  // The calls' mailbox. post_call: `p.call` must be calls_posted() + 1; waits (bounded by a
  // failure and by wait_s, which fails the path; < 0: the proxy's timeout, 0: no limit) until the
  // ring slot's previous post has reached every peer and call p.call - kCallRing was compared with
  // every peer's post of it (so a rank's calls run at most kCallRing ahead of the slowest peer's).
  // read_post: the call number peer's slot for `call` holds (0 when empty or half-written),
  // `out` filled when it is `call`. post_checked / peer_checked: the handshake after a call that
  // waited for every post (its posts may be overwritten once every peer has read them).
  uint64_t calls_posted() const;
  void post_call(const CallPost& p, double wait_s = -1);
  uint64_t read_post(int peer, uint64_t call, CallPost& out) const;
  void post_checked(uint64_t call);
  uint64_t peer_checked(int peer) const;

  bool failed() const;
  std::string error() const;  // "" while healthy
  void check() const;         // throws weave::Error(error()) after a failure
  ProxyStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::net
