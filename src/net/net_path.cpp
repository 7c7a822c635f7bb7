#include "weave/net/net_path.hpp"

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <vector>

#include "host_buffer.hpp"
#include "weave/common/error.hpp"
#include "weave/runtime/env.hpp"

namespace weave::net {

using detail::concat;

namespace {

// The device address of mapped pinned host memory (the same as the host address under UVA, but
// the runtime is asked rather than assumed). Asked for an allocation's start only; addresses
// inside it keep their offset (at()).
template <class T>
T* device_address(T* host) {
  void* d = nullptr;
  WEAVE_CUDA_CHECK(cudaHostGetDevicePointer(&d, const_cast<void*>(static_cast<const void*>(host)), 0));
  return static_cast<T*>(d);
}
template <class T, class B>
T* at(T* host, const B* host_base, B* dev_base) {
  const auto off = reinterpret_cast<const char*>(host) - reinterpret_cast<const char*>(host_base);
  return reinterpret_cast<T*>(reinterpret_cast<char*>(dev_base) + off);
}

// Nodes as contiguous blocks of equal size (hierarchy.hpp's rank = node * G + local); anything
// else is refused with the rank that breaks it.
NetTopo topo_of(const std::vector<std::string>& hosts) {
  const std::vector<runtime::NodePlace> place = runtime::node_of_ranks(hosts);
  const int world = static_cast<int>(hosts.size());
  int nodes = 0;
  for (const runtime::NodePlace& p : place) nodes = std::max(nodes, p.node + 1);
  WEAVE_CHECK(world % nodes == 0, "weave::net: ", world, " ranks on ", nodes,
              " nodes: the network path needs the same number of ranks on every node");
  const int g = world / nodes;
  for (int r = 0; r < world; ++r)
    WEAVE_CHECK(place[r].node == r / g && place[r].local_rank == r % g, "weave::net: rank ", r, " (host '", hosts[r],
                "') is rank ", place[r].local_rank, " of node ", place[r].node,
                "; the network path needs each node's ranks to be a contiguous block (rank = node x ", g,
                " + local); place ranks by node (weave-run --nodes does)");
  return {nodes, g};
}

// The kernels' handle of a path (below).
NetHandle make_handle(const NetPath& path, const Proxy& proxy, const NetPathOptions& opt, uint64_t* words, void* send,
                      void* recv, DeviceFault* fault);

}  // namespace

struct NetPath::Impl {
  runtime::LaunchInfo info;
  NetPathOptions opt;
  int device = -1;
  NetTopo topo;
  std::unique_ptr<runtime::NetBootstrap> boot;
  // Members in destruction order reversed: the proxy goes first (its thread uses the rest), then
  // the transport (its registrations cover the buffers), then the buffers.
  HostBuffer send, recv, fault_mem;
  uint64_t* words = nullptr;  // device memory (GPU mode)
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Proxy> proxy;
  uint64_t calls = 0, commands = 0;
  bool shut = false;
  NetHandle handle{};  // GPU mode: made once at set-up (device addresses do not change)

  ~Impl() {
    if (proxy && !shut) {
      // A kernel still waiting on this path must not wait for a proxy that is gone.
      if (!proxy->failed()) proxy->abort("the network path was destroyed without shutdown() (an error on this rank?)");
      // Released kernels still read the ring and buffers on their way out: let them end before
      // the memory goes (the error, if any, was reported by finish() or is moot now).
      if (opt.gpu) (void)cudaDeviceSynchronize();
    }
    proxy.reset();
    transport.reset();
    if (words) cudaFree(words);
  }

  DeviceFault* fault() const { return reinterpret_cast<DeviceFault*>(fault_mem.get()); }

  // The device-side fault in words, without the rank ("" when there was none).
  std::string fault_text() const {
    const DeviceFault f = *fault();
    if (f.kind == kFaultNone) return "";
    const std::string what =
        f.chunk == ~0u ? concat("waiting for the send gate or completions (", f.seen, " of ", f.expected, ")")
                       : concat("waiting for chunk ", f.chunk, " (flag ", f.seen, ", waiting for ", f.expected, ")");
    if (f.kind == kFaultTimeout)
      return concat("a kernel gave up after ", f.waited_ns * 1e-9, " s ", what,
                    " with the proxy healthy (device wait timeout: WEAVE_WAIT_TIMEOUT_S, NetPathOptions::wait_timeout_s)");
    return concat("a kernel stopped ", what, " because the path failed");
  }
};

NetPath::NetPath(NetPathOptions opts) : NetPath(runtime::detect_launch(), std::move(opts)) {}

NetPath::NetPath(const runtime::LaunchInfo& info, NetPathOptions opts) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.info = info;
  m.opt = std::move(opts);
  // Each path of a process gets its own job tag (every rank makes its paths in the same order),
  // so a straggler of an earlier path's rendezvous never joins this one. Taken first: a rank
  // whose checks below fail must not make its next path's tag differ from its peers'.
  static std::atomic<int> instances{0};
  const int instance = instances.fetch_add(1);
  WEAVE_CHECK(m.opt.send_bytes >= 16 && m.opt.recv_bytes >= 32, "weave::net: send_bytes (", m.opt.send_bytes,
              ") and recv_bytes (", m.opt.recv_bytes, ") are too small");
  WEAVE_CHECK(m.opt.proxy.flags >= 2, "weave::net: the path needs at least 2 flags (two slots)");
  if (m.opt.gpu) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
    WEAVE_CHECK(ndev > 0, "weave::net: no GPU visible for the network path's GPU mode");
    m.device = m.opt.device >= 0 ? m.opt.device : info.local_rank % ndev;
    WEAVE_CHECK(m.device < ndev, "weave::net: device ", m.device, " but ", ndev, " GPU(s) are visible");
    WEAVE_CUDA_CHECK(cudaSetDevice(m.device));
  }
  if (m.opt.boot.tag.empty()) m.opt.boot.tag = concat(info.job_id, "-net", instance);
  m.boot = std::make_unique<runtime::NetBootstrap>(info, m.opt.boot);
  m.topo = topo_of(m.boot->hostnames());
  {  // A call's chunks land in a peer at offsets this rank computes from its own slot sizes
     // (begin_call): every rank's must be the same. The gathered table is, so every rank refuses alike.
    using ull = unsigned long long;
    const ull mine[4] = {m.opt.send_bytes, m.opt.recv_bytes, static_cast<ull>(info.local_rank),
                         static_cast<ull>(info.local_world)};
    std::vector<ull> all(4 * static_cast<size_t>(info.world));
    m.boot->all_gather(mine, all.data(), sizeof mine);
    for (int r = 1; r < info.world; ++r)
      WEAVE_CHECK(all[4 * r] == all[0] && all[4 * r + 1] == all[1], "weave::net: rank 0's path has send_bytes ",
                  all[0], " and recv_bytes ", all[1], ", rank ", r, "'s ", all[4 * r], " and ", all[4 * r + 1],
                  ": NetPathOptions must be the same on every rank");
    // Nodes of several ranks: the launcher's node (its local rank and size pick the GPU and make
    // node_launch_info's communicator) must be the path's (ranks by host name), else two ranks
    // take one GPU and the node communicators never meet (e.g. two torchrun agents on one host).
    // One rank per node needs no node communicator, and the launcher's local rank is the right GPU
    // choice on a host that WEAVE_HOSTNAME splits.
    const auto g = static_cast<ull>(m.topo.gpus);
    const std::vector<std::string>& hosts = m.boot->hostnames();
    for (int r = 0; g > 1 && r < info.world; ++r)
      WEAVE_CHECK(all[4 * r + 2] == r % g && all[4 * r + 3] == g, "weave::net: rank ", r, " (host '", hosts[r],
                  "') is local rank ", r % g, " of a node of ", g, " ranks by host name, but its launcher (",
                  info.launcher, ") says local rank ", all[4 * r + 2], " of ", all[4 * r + 3],
                  ": the network path's nodes must be the launcher's (one launcher agent per host, or "
                  "WEAVE_HOSTNAME set per launcher node)");
  }

  m.send = HostBuffer(m.opt.send_bytes, m.opt.gpu);
  m.recv = HostBuffer(m.opt.recv_bytes, m.opt.gpu);
  m.fault_mem = HostBuffer(sizeof(DeviceFault), m.opt.gpu);
  if (m.opt.gpu) {
    WEAVE_CUDA_CHECK(cudaMalloc(&m.words, kDeviceWords * sizeof(uint64_t)));
    WEAVE_CUDA_CHECK(cudaMemset(m.words, 0, kDeviceWords * sizeof(uint64_t)));
  }
  m.transport = std::make_unique<Transport>(m.opt.transport);
  ProxyOptions po = m.opt.proxy;
  po.mapped_ring = m.opt.gpu;
  // Sources are the mapped send buffer (host memory): registered as such, never staged.
  m.proxy = std::make_unique<Proxy>(*m.transport, *m.boot, m.send.get(), m.opt.send_bytes, MemKind::host, m.recv.get(),
                                    m.opt.recv_bytes, po);
  if (m.opt.gpu) m.handle = make_handle(*this, *m.proxy, m.opt, m.words, m.send.get(), m.recv.get(), m.fault());
}

NetPath::~NetPath() = default;

int NetPath::rank() const { return impl_->info.rank; }
int NetPath::world() const { return impl_->info.world; }
NetTopo NetPath::topo() const { return impl_->topo; }
int NetPath::device() const { return impl_->device; }
double NetPath::wait_timeout_s() const {
  const double t = impl_->opt.wait_timeout_s;
  return t >= 0 ? t : env::get_seconds("WEAVE_WAIT_TIMEOUT_S");
}
bool NetPath::gpu() const { return impl_->opt.gpu; }
Transport& NetPath::transport() { return *impl_->transport; }
Proxy& NetPath::proxy() { return *impl_->proxy; }
runtime::NetBootstrap& NetPath::bootstrap() { return *impl_->boot; }
char* NetPath::send_buffer() const { return impl_->send.get(); }
char* NetPath::recv_buffer() const { return impl_->recv.get(); }
size_t NetPath::send_bytes() const { return impl_->opt.send_bytes; }
size_t NetPath::recv_bytes() const { return impl_->opt.recv_bytes; }
uint64_t* NetPath::flags() const { return const_cast<uint64_t*>(impl_->proxy->flags()); }
uint32_t NetPath::nflags() const { return impl_->opt.proxy.flags; }
size_t NetPath::slot_recv_bytes() const { return impl_->opt.recv_bytes / 2 / 16 * 16; }
uint32_t NetPath::slot_flags() const { return impl_->opt.proxy.flags / 2; }

NetHandle NetPath::handle() const {
  WEAVE_CHECK(impl_->opt.gpu, "weave::net: handle() needs the GPU mode (NetPathOptions::gpu)");
  return impl_->handle;
}

namespace {

NetHandle make_handle(const NetPath& path, const Proxy& proxy, const NetPathOptions& opt, uint64_t* words, void* send,
                      void* recv, DeviceFault* fault) {
  const QueueView q = proxy.queue();
  NetHandle h{};
  // The ring's allocation starts with its RingControl, whose first word is `head`.
  static_assert(offsetof(RingControl, head) == 0);
  uint64_t* ring = device_address(const_cast<uint64_t*>(q.head));
  h.queue.slots = at(q.slots, q.head, ring);
  h.queue.claim = words + kWordClaim;
  h.queue.head = ring;
  h.queue.completed = at(q.completed, q.head, ring);
  h.queue.abort = at(q.abort, q.head, ring);
  h.queue.capacity = q.capacity;
  h.send = device_address(static_cast<char*>(send));
  h.recv = device_address(static_cast<char*>(recv));
  h.flags = device_address(const_cast<uint64_t*>(proxy.flags()));
  h.words = words;
  h.fault = device_address(fault);
  h.send_bytes = opt.send_bytes;
  h.recv_bytes = opt.recv_bytes;
  h.nflags = opt.proxy.flags;
  h.rank = path.rank();
  h.world = path.world();
  h.timeout_ns = static_cast<unsigned long long>(path.wait_timeout_s() * 1e9);
  return h;
}

}  // namespace

QueueView NetPath::host_queue() const {
  WEAVE_CHECK(!impl_->opt.gpu, "weave::net: host_queue() is the CPU mode's; in the GPU mode kernels produce");
  return impl_->proxy->queue();
}

NetPath::Call NetPath::begin_call(uint64_t commands) {
  Impl& m = *impl_;
  WEAVE_CHECK(!m.shut, "weave::net: a call on a network path after its shutdown()");
  check();
  Call c{m.calls, static_cast<int>(m.calls % 2), 0, 0, m.commands};
  c.recv_offset = static_cast<uint64_t>(c.slot) * slot_recv_bytes();
  c.flag_offset = static_cast<uint32_t>(c.slot) * slot_flags();
  ++m.calls;
  m.commands += commands;
  return c;
}

void NetPath::check() const {
  const Impl& m = *impl_;
  const uint32_t kind = m.fault()->kind;
  if (m.proxy->failed()) {
    // A kernel released by the failure says where it was; a timeout is the failure's own text.
    if (kind == kFaultAbort) throw Error(concat(m.proxy->error(), " [", m.fault_text(), "]"));
    throw Error(m.proxy->error());
  }
  if (kind != kFaultNone) throw Error(concat("weave::net rank ", m.info.rank, ": ", m.fault_text()));
}

void NetPath::finish(cudaStream_t stream) {
  Impl& m = *impl_;
  if (m.opt.gpu) {
    const cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
      // A kernel fault on this rank: the peers' kernels must not wait for what it will not send.
      const std::string why = concat("CUDA error on rank ", m.info.rank, ": ", cudaGetErrorString(e));
      m.proxy->abort(why);
      throw Error(concat("weave::net: ", why));
    }
  }
  // A kernel of this rank gave up on its own (timeout): the peers learn it from here.
  if (m.fault()->kind == kFaultTimeout && !m.proxy->failed()) m.proxy->abort(m.fault_text());
  check();
}

void NetPath::abort(const std::string& why) { impl_->proxy->abort(why); }

void NetPath::shutdown() {
  Impl& m = *impl_;
  if (m.shut) return;
  check();
  m.proxy->shutdown();
  m.shut = true;
}

}  // namespace weave::net
