// NetPath: one rank's network path, made collectively by every rank of the job. It joins the
// ranks over NetBootstrap (TCP at the rendezvous address; weave-run --nodes simulates nodes on
// one machine), opens the libfabric transport, allocates and registers the send and receive
// bounce buffers, starts the proxy over the command ring, and hands kernels a NetHandle
// (handle.hpp) whose device side is device.cuh.
//
// GPU mode (the default): ring, flags and bounce buffers in pinned host memory mapped into the
// GPU's address space, the ring's ticket counter and the kernels' gate in device memory. CPU
// mode (NetPathOptions::gpu = false, the CPU tests): ordinary host memory and no CUDA call at
// all; host threads produce through host_queue().
//
// Calls: a kernel on the path is one *call*; begin_call() numbers it, says which half of the
// receive buffer and of the flags it uses (calls alternate between two slots, so a slot is
// reused only after every peer finished the call that used it last) and how many commands were
// queued before it (its send gate). The reuse rule holds when every call has every rank receive
// at least one chunk from every peer (the collectives send an empty notification for an empty
// shard); a call pattern without that (a ring) must synchronise its ranks otherwise. Calls on one
// path must be ordered (one stream, or the caller orders them) and made in the same order on every
// rank. finish(stream) waits for the stream and throws the proxy's diagnostic, or the device-side
// fault, if anything failed.
//
// Failures: the proxy turns a dead or silent peer, a failed or lost write into a diagnostic on
// every rank and sets the ring's abort word, which releases every kernel waiting on the path
// (device.cuh); finish() then throws it. A host-side error of one rank (abort()) reaches every
// peer's proxy the same way. After a failure the path is unusable: every later call throws.
// Shutdown: shutdown() on every rank after its last finish() (the proxy drains, meets every rank
// twice); the destructor without shutdown() stops the proxy at once and releases any waiting
// kernel first (abort word).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "weave/net/handle.hpp"
#include "weave/net/proxy.hpp"
#include "weave/net/transport.hpp"
#include "weave/runtime/launch.hpp"
#include "weave/runtime/net_bootstrap.hpp"

namespace weave::net {

struct NetPathOptions {
  TransportOptions transport;  // provider "" = $WEAVE_NET_PROVIDER; domain "" = any ("lo": loopback)
  ProxyOptions proxy;          // ring size, outstanding limit, batch, flags (split into two slots), timeouts
  size_t send_bytes = 64u << 20;   // send bounce buffer
  size_t recv_bytes = 128u << 20;  // receive bounce buffer (two slots of half each)
  bool gpu = true;                 // false: host memory only, no CUDA call (CPU tests)
  int device = -1;                 // < 0: LaunchInfo::local_rank % visible GPUs (weave-run --nodes sets
                                   // CUDA_VISIBLE_DEVICES per simulated node)
  double wait_timeout_s = -1;      // device-side waits; < 0: $WEAVE_WAIT_TIMEOUT_S; 0 = never
  runtime::NetBootstrapOptions boot;
};

// The job's shape as the network path sees it: nodes of `gpus` ranks each, rank = node * gpus +
// local (contiguous blocks, as hierarchy.hpp's Topo).
struct NetTopo {
  int nodes = 1, gpus = 1;
};

class NetPath {
 public:
  // Collective over every rank of `info`'s job. Throws weave::Error (naming the cause) when the
  // ranks do not join, the provider is missing, or the nodes are not contiguous equal blocks.
  explicit NetPath(const runtime::LaunchInfo& info, NetPathOptions opts = {});
  explicit NetPath(NetPathOptions opts = {});  // detect_launch()
  ~NetPath();
  NetPath(const NetPath&) = delete;
  NetPath& operator=(const NetPath&) = delete;

  int rank() const;
  int world() const;
  NetTopo topo() const;
  int device() const;  // -1 in CPU mode
  double wait_timeout_s() const;  // the device-side waits' limit (NetPathOptions::wait_timeout_s resolved; 0 = never)
  bool gpu() const;

  Transport& transport();
  Proxy& proxy();
  runtime::NetBootstrap& bootstrap();

  // GPU mode: the kernels' handle. Throws in CPU mode.
  NetHandle handle() const;
  // CPU mode: host producers' view of the ring (its own ticket word). Throws in GPU mode, where
  // the ticket counter is the kernels' (a second counter would hand out the same tickets).
  QueueView host_queue() const;
  // Host addresses of the bounce buffers and flags (tests; the CPU mode's producers).
  char* send_buffer() const;
  char* recv_buffer() const;
  size_t send_bytes() const;
  size_t recv_bytes() const;
  uint64_t* flags() const;
  uint32_t nflags() const;

  struct Call {
    uint64_t index;            // 0, 1, 2, ... on this path
    int slot;                  // index % 2
    uint64_t recv_offset;      // slot * slot_recv_bytes()
    uint32_t flag_offset;      // slot * slot_flags()
    uint64_t commands_before;  // commands queued by the earlier calls
  };
  size_t slot_recv_bytes() const;  // recv_bytes() / 2, rounded down to 16
  uint32_t slot_flags() const;     // nflags() / 2
  // Numbers the next call, which queues `commands` commands. Throws after a failure.
  Call begin_call(uint64_t commands);

  // Waits for `stream` (GPU mode), then throws if the path failed: the proxy's diagnostic, else
  // the device-side fault (which chunk, how long).
  void finish(cudaStream_t stream);
  void check() const;  // the same without waiting
  // Fails the path on this rank and every peer with `why` (a host-side error of this rank).
  void abort(const std::string& why);
  // Orderly end on every rank (see proxy.hpp); throws the failure if there was one.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::net
