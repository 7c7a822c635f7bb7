// The network path's transport: one libfabric reliable-datagram endpoint (FI_EP_RDM) with RMA,
// its address vector, one completion queue and the memory registrations. The same code serves
// `verbs` (InfiniBand/RoCE), `efa` and `tcp`; libfabric's headers stay in transport.cpp.
//
// Provider: TransportOptions::provider, else $WEAVE_NET_PROVIDER, else fi_getinfo's first choice
// for RDM + RMA. libfabric applies its own FI_PROVIDER filter before (a provider it hides is not
// found); FI_TCP_IFACE (tcp) and FI_SOCKETS_IFACE (sockets) pick the interface, or
// TransportOptions::domain names it ("lo": loopback, as the CPU tests do). "tcp" selects the
// layered "tcp;ofi_rxm" (RDM over tcp's connections).
//
// Memory registration follows whatever FI_MR_* mode the provider asks for: FI_MR_LOCAL (local
// buffers carry a descriptor: every source is registered), FI_MR_VIRT_ADDR (remote addresses are
// virtual addresses, else offsets from the region's start: RemoteRegion::base says which),
// FI_MR_PROV_KEY (the provider's key, else one chosen here), FI_MR_ALLOCATED (only allocated
// memory is registered: always so here), FI_MR_ENDPOINT (bound to the endpoint and enabled),
// FI_MR_HMEM (device memory registered as such). FI_MR_RAW keys are not supported.
//
// Arrival notification (mKernel section 3.3): `ordered` where the provider delivers RMA writes
// in order (FI_ORDER_WAW), so a data write then a flag write publishes the data; otherwise
// `unordered`, write with immediate data whose receive-side completion the receiving proxy turns
// into the flag. TransportOptions::notify, else $WEAVE_NET_NOTIFY forces either; `ordered` on a
// provider without write-after-write order is refused.
//
// GPU memory: with TransportOptions::device_memory the transport asks for FI_HMEM and registers
// device memory directly (GPUDirect RDMA) where the provider grants it; where it does not (tcp),
// device_memory() is false and the proxy stages sources through registered host bounce buffers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "weave/common/error.hpp"

namespace weave::net {

enum class Notify { automatic, ordered, unordered };
std::string_view notify_name(Notify n);
// "auto", "ordered" or "unordered" ($WEAVE_NET_NOTIFY's forms); weave::Error otherwise.
Notify parse_notify(std::string_view text);

enum class MemKind { host, device };

struct TransportOptions {
  std::string provider;               // "" = $WEAVE_NET_PROVIDER, "" there too = libfabric's choice
  std::string domain;                 // "" = any; an interface name ("lo", "eth0") for tcp
  Notify notify = Notify::automatic;  // automatic = $WEAVE_NET_NOTIFY
  bool device_memory = false;         // ask for FI_HMEM (falls back to host memory only)
};

// What a peer needs to write into a registered region: plain data, exchanged at set-up.
struct RemoteRegion {
  uint64_t base;   // the region's address as the provider names it (virtual address or 0)
  uint64_t key;
  uint64_t bytes;
};

// A registered local region; the transport owns it until the transport is destroyed.
struct Region {
  void* ptr;
  size_t bytes;
  MemKind kind;
  void* desc;  // fi_mr_desc: passed with every local buffer
  RemoteRegion remote;
  void* mr;    // struct fid_mr*
};

enum class OpKind : uint8_t { data_write, flag_write, data_write_imm, heartbeat, abort_note, call_post, call_checked };
std::string_view op_name(OpKind k);

// One posted operation, alive until its completion is reaped. Its first bytes are the
// provider's per-operation context (struct fi_context2); the rest names it in diagnostics.
struct OpContext {
  alignas(16) unsigned char provider_context[64];
  OpKind kind = OpKind::data_write;
  int peer = -1;
  uint32_t chunk = 0;
  uint32_t owner = 0;  // the caller's index (the proxy's in-flight slot)
};

// What poll() throws for an error completion: the message, and the failed operation (nullptr
// where the provider gave none) so that the caller can release what it holds.
struct OpError : Error {
  OpError(const std::string& what, OpContext* failed) : Error(what), op(failed) {}
  OpContext* op;
};

// A reaped completion: a local operation finished (op), or a peer's write with immediate data
// landed here (op == nullptr, data = its immediate data).
struct Completion {
  OpContext* op;
  uint64_t data;
};

class Transport {
 public:
  explicit Transport(const TransportOptions& opts = {});
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  const std::string& provider() const;  // libfabric's name, e.g. "tcp;ofi_rxm"
  std::string describe() const;         // one line: provider, domain, order, MR mode, notification
  Notify notify() const;                // ordered or unordered (never automatic)
  bool waw_ordered() const;             // the provider delivers writes in order (FI_ORDER_WAW)
  bool device_memory() const;           // FI_HMEM granted: device memory registers directly
  size_t tx_depth() const;              // operations the endpoint may have outstanding
  size_t cq_data_bytes() const;         // bytes of immediate data a write may carry

  std::vector<uint8_t> address() const;  // this endpoint's fabric address (fi_getname)
  // Inserts a peer's address; returns its index (0, 1, ... in insertion order).
  int add_peer(const void* address, size_t len);
  int peers() const;

  // Registers [ptr, ptr + bytes) as a source of local writes and a target of remote ones.
  // Device memory only where device_memory() (weave::Error otherwise).
  const Region& register_memory(void* ptr, size_t bytes, MemKind kind = MemKind::host);

  // Posts an RDMA write of [src, src + bytes) (inside `local`) to peer's `dst` at `offset`;
  // with write_data, the peer's completion queue reports `imm`. `more`: another post follows at
  // once (FI_MORE: the provider may defer the doorbell to the last of a batch). Returns false
  // when the endpoint's queue is full (FI_EAGAIN: poll, then retry); weave::Error for anything
  // else, naming the operation, its chunk and the peer. `op` must live until its completion.
  bool write(int peer, const Region& local, const void* src, const RemoteRegion& dst, uint64_t offset,
             size_t bytes, OpContext* op, bool more);
  bool write_data(int peer, const Region& local, const void* src, const RemoteRegion& dst, uint64_t offset,
                  size_t bytes, uint64_t imm, OpContext* op, bool more);

  // Drives progress and reaps up to `max` completions. An error entry throws weave::Error naming
  // the failed operation, its chunk, the peer and libfabric's reason (OpError).
  size_t poll(Completion* out, size_t max);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::net
