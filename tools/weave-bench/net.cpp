// weave-bench net: the network path's own figures between two nodes: the host proxy's command
// latency and rate, and the transfer rate of one message through the path, each beside the raw
// libfabric figure of the same provider, which is the floor the path stands on, on host memory (no
// GPU needed); and the transfer from device memory to device memory beside NCCL's network
// transport (a GPU per rank) (issue 22, "Benchmarks").
//
//   weave-run -n 2 --nodes 2 [--no-gpu | --share-gpus] -- weave-bench net
//       [--parts proxy,proxy_gpu,transfer,device,nccl,calls]
//       [--notify ordered,unordered] [--batches 8,1] [--latency-commands 2000] [--rate-commands 100000]
//       [--gpu-producers 8] [--sizes 4K,16K,64K,256K,1M,4M,16M,64M,256M] [--chunks 1M] [--budget 256M]
//       [--repeats 3] [--provider tcp] [--domain lo] [--idle-us 20] [--json FILE]
//
// The pair: rank 0 (node 0) sends to the first rank of node 1; other ranks only join the paths.
// The proxy, transfer and calls rows run in the network path's CPU mode (NetPathOptions::gpu =
// false: ordinary host memory, host threads as producers, no CUDA call), so a GPU is neither
// needed nor touched; the device, nccl and proxy_gpu rows (last) need one per rank and are
// skipped, saying why, without.
//
// proxy rows (kernel "proxy"), per notification mode and batch limit (ProxyOptions::batch):
// - impl "weave": a host thread is the producer on the command ring (queue.cuh's producer is
//   __host__ __device__, the same code a kernel's send block runs). Latency: one 64-byte command
//   at a time; the clock starts just before the producer claims its ticket and stops in the
//   proxy's on_taken (the command left the ring) and on_posted (its last fi_write returned)
//   callbacks: p50 / p99 of each. Rate: `--rate-commands` 64-byte commands pushed as fast as the
//   ring takes them, until the proxy reports all complete.
// - impl "libfabric": the same provider without ring or proxy, from one thread: the cost of one
//   fi_write call (p50 / p99), of one empty fi_cq_read (the proxy's poll), and the rate of
//   64-byte fi_writes posted in batches of `batch` (FI_MORE on all but the last) while reaping.
//   The proxy cannot beat these: they bound its latency and rate.
// - impl "weave-gpu", producer "gpu" (--parts proxy_gpu, last; every rank needs a GPU, two ranks
//   may share one: only the sender's kernels run): the same commands pushed from a kernel through
//   the path's GPU mode with device.cuh's push, the kernels' own (net_proxy_gpu.hpp has the
//   kernels). Latency: one GPU thread pushes one command at a time and polls two words in mapped
//   host memory that the sender's proxy's on_taken / on_posted hooks set to the ticket + 1; its
//   stamps (start, push returned, taken seen, posted seen) are %globaltimer where the timer moves
//   in steps of <= 100 ns (measured first: some GPUs step it only every microsecond), else
//   %clock64 converted by the SM clock calibrated against %globaltimer over the whole kernel
//   (milliseconds); the row's `clock` says which. The next command goes after the previous one
//   completed; 32 untimed first. The GPU-seen time includes the ack's way back (host store ->
//   GPU poll across PCIe), so a null loop of the same shape runs first: the thread writes a mapped
//   word with the push's release pattern (fence.acq_rel.sys, st.relaxed.sys), a spinning host
//   thread echoes it into a second word, the thread polls that; proxy_p50/p99 = posted - null
//   (percentiles subtracted): the proxy's own GPU write -> posted, the target's figure. Rate:
//   --rate-commands pushed back to back by --gpu-producers blocks of one thread (each its own
//   Producer, as a send block), on the GPU's %globaltimer from the first push until block 0 saw
//   the proxy's `completed` reach them all; credit_reads_per_command says whether the ring stayed
//   full (about 1: the proxy was the bottleneck) or not (about producers / 1024: the GPU was).
//   Correct: the receiver's flags and payload (as the host rows; unordered: its proxy counted one
//   arrival per command; ordered: a flag shows only the last command naming it, so there exactly
//   once is the sender's count), the sender's ticket counter, its proxy's taken / posted / completed
//   counts all equal to the commands pushed, and each ticket posted exactly once (on_posted).
// transfer rows (kernel "transfer"), per message size and chunk size:
// - impl "weave": the message cut into chunks of --chunks bytes, one command per chunk with its
//   own arrival flag (kNotify), through the NetPath's ring and proxy from the sender's registered
//   send buffer into the receiver's receive buffer; the receiver waits for every chunk's flag
//   (ordered: the proxy's flag write after the data; unordered: write with immediate data, the
//   receiving proxy raises the flag), then answers with an empty notification (the ack); the
//   sender's clock runs from its first push to the ack. Messages do not overlap (a message is
//   acknowledged before the next one starts): each row is one message, end to end.
// - impl "libfabric": the same chunks as fi_writedata straight through a Transport (no ring, no
//   proxy, both sides polling their completion queue in the calling thread), the same ack.
// - impl "weave", memory "device" (--parts device; every rank needs a GPU, two ranks may share
//   one: then the times time-slice, shared_gpu says so): the same message and chunks from device
//   memory on the sender to device memory on the receiver, through the path's GPU mode as the
//   inter-node kernels use it (net_device_transfer.hpp): per message one call on the path and one
//   kernel per rank; the sender's blocks (4) pass the call's send gate, copy the chunks into the
//   mapped send buffer and push one command each from the GPU, then block 0 waits for the ack;
//   the receiver's blocks (8) poll the chunks' flags, copy them into device memory and consume the
//   flags, and the last one pushes the ack. So it adds to the host row both PCIe crossings and
//   the GPU's polls across PCIe: the row NCCL's (device to device) compares with. The sender's
//   clock runs around `iters` messages launched back to back and the stream's end.
// - impl "nccl" (the baseline; only with a GPU of its own for each of the pair, else
//   skipped with a message): NCCL restricted to its network transport (NCCL_P2P_DISABLE=1,
//   NCCL_SHM_DISABLE=1, NCCL_NET=Socket, NCCL_SOCKET_IFNAME=lo on simulated nodes; each set where
//   unset, the values used go into the rows), device memory to device memory: the message as one
//   ncclSend / ncclRecv and an 8-byte ack back on one stream; the first and last timed message
//   checked byte for byte. The device rows carry ratio_vs_nccl (NCCL's time / weave's); the host
//   rows do not (they leave out what NCCL's row pays for device memory). Neither the nccl nor
//   the device rows have run on a GPU yet (no GPU on the machine they were written on).
// time_us: the median over --repeats of the mean time of `iters` messages (iters from --budget
// bytes per repeat, 2 to 100); gbs = bytes / time_us / 1000.
//
// Threads: a weave row keeps 4 threads of the pair busy (each rank's proxy and its calling thread,
// which produces or waits), a libfabric row 2, a weave-gpu row 2 or 3 (the pair's proxies, and
// the sender's echo thread during the null loop; the calling threads nap while the GPU works).
// The proxy rows' sender proxy spins (the latency target assumes a proxy with a core of its own)
// and the receiver's naps 20 us once idle; the
// transfer rows' proxies idle as --idle-us says (ProxyOptions::idle_sleep_us: default the
// library's 20 us naps, -1 spins, 0 yields). Every waiting thread spins, then yields its core.
// On a machine with fewer cores than busy threads the figures include the scheduler's share.
//
// Checks: the sender writes a pattern (a function of the row's seed) once per row and stamps
// each chunk's first 8 bytes with (message, chunk) before each message; the receiver checks
// every chunk's stamp of every message as it arrives (a chunk that did not arrive fresh fails),
// and every byte of the first (untimed) message and of the last timed one (the receive buffer is
// poisoned before each). The device rows do the same on the GPU: the sender's kernel stamps its
// device source, the receiver's checks each chunk's stamp in device memory (the first wrong one
// is reported after the row), and the destination in device memory is poisoned, copied back and
// checked byte for byte for the first and the last message. A wrong row is written correct:
// false and the command exits 1.
//
// calls rows (kernel "calls"; --parts calls; every rank measures, the slowest rank's figure is
// the row's): the cross-rank agreement every inter-node operator's call starts with
// (net_common/call.hpp's agree over the path's calls' mailbox), host time per call:
// - impl "weave", what "agreed": --agree-calls calls alternating between two keys every rank
//   agreed before (a post, no wait: the steady state of a training step); what "new key":
//   --agree-calls / 10 calls of keys never seen (each waits for every rank's post and a handshake).
// - impl "bootstrap": one all-gather of the same key over the bootstrap per call, the host
//   rendezvous per call the agreement had for any key but the last one.
// correct: no rank's call raised and the path stayed healthy.
//
// --test-corrupt OFFSET (for the CPU test): the receiver flips that byte of every message before
// checking it (device rows: of the byte-for-byte checked ones), so every transfer row must come
// out wrong and the command exit 1.
//
// Fewer than 2 ranks, no rendezvous address (not under weave-run --nodes, torchrun or an explicit
// WEAVE_BOOTSTRAP) or a single node: a message and exit 0 (nothing to measure).
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../bench/nccl_comm.hpp"
#include "bench.hpp"
#include "net_common/call.hpp"
#include "net_device_transfer.hpp"
#include "net_proxy_gpu.hpp"
#include "net_start.hpp"
#include "shared_gpu.hpp"
#include "weave/net/net_path.hpp"
#include "weave/net/queue.cuh"
#include "weave/net/transport.hpp"
#include "weave/runtime/env.hpp"
#include "weave/runtime/launch.hpp"
#include "weave/runtime/net_bootstrap.hpp"

namespace {

namespace net = weave::net;
using weave::Error;
using weave::detail::concat;
using weave::runtime::NetBootstrap;
using Clock = std::chrono::steady_clock;

using weave::bench::netdev::mix64;  // the pattern and the stamps, the same as the device rows' kernels'

constexpr double kTargetP50Us = 2.0, kTargetRate = 5e6;  // issue 22's proxy targets
constexpr size_t kLatencyPayload = weave::bench::netproxy::kPayload;
// The GPU-producer proxy rows: untimed commands (and null-loop round trips) before the samples.
constexpr uint32_t kGpuWarmup = 32;
// Their stamps' clock: %globaltimer where it moves in steps this fine, else %clock64 (ns).
constexpr double kFineTimerStepNs = 100;
// The device rows' blocks per kernel: the network collectives' defaults (NetCollOptions).
constexpr int kDeviceSendBlocks = 4, kDeviceRecvBlocks = 8;

uint64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// ---- options ------------------------------------------------------------------------------


struct Config {
  bool proxy = true, transfer = true, device = true, nccl = true, calls = true, proxy_gpu = true;
  std::vector<int> gpu_producers{8};  // the proxy_gpu rows' rate run: producer blocks
  int agree_calls = 2000;
  std::vector<net::Notify> notify{net::Notify::ordered, net::Notify::unordered};
  std::vector<uint32_t> batches{net::kMaxBatch, 1};
  uint32_t latency_commands = 2000, rate_commands = 100000;
  std::vector<size_t> sizes;
  std::vector<size_t> chunks{1u << 20};
  size_t budget = 256u << 20;
  int repeats = 3;
  std::string provider, domain;
  double idle_us = 20;        // the transfer rows' proxies: ProxyOptions::idle_sleep_us
  long long corrupt_at = -1;  // --test-corrupt: the receiver flips this byte of every message (tests)
};

Config parse(const weave::bench::Args& a) {
  static const std::set<std::string> known{"json",          "parts",  "notify",  "batches",     "latency-commands",
                                           "rate-commands", "sizes",  "chunks",  "budget",      "repeats",
                                           "provider",      "domain", "idle-us", "test-corrupt", "agree-calls",
                                           "gpu-producers"};
  for (const auto& [k, v] : a.kv)
    if (!known.count(k)) throw Error(concat("weave-bench net: unknown option --", k, " (see weave-bench net --help)"));
  Config c;
  if (a.has("parts")) {
    c.proxy = c.transfer = c.device = c.nccl = c.calls = c.proxy_gpu = false;
    for (const std::string& p : a.names("parts", "")) {
      if (p == "proxy")
        c.proxy = true;
      else if (p == "calls")
        c.calls = true;
      else if (p == "transfer")
        c.transfer = true;
      else if (p == "device")
        c.device = true;
      else if (p == "nccl")
        c.nccl = true;
      else if (p == "proxy_gpu")
        c.proxy_gpu = true;
      else
        throw Error(
            concat("weave-bench net: --parts: '", p, "' is not proxy, proxy_gpu, transfer, device, nccl or calls"));
    }
  }
  if (a.has("gpu-producers")) {
    c.gpu_producers.clear();
    for (const std::string& p : a.names("gpu-producers", "")) {
      const int n = static_cast<int>(weave::bench::parse_count("weave-bench net", "gpu-producers", p, 1, 64));
      if (n & (n - 1)) throw Error(concat("weave-bench net: --gpu-producers: ", n, " is not a power of two (1 to 64)"));
      c.gpu_producers.push_back(n);
    }
  }
  if (a.has("agree-calls"))
    c.agree_calls = static_cast<int>(weave::bench::parse_count("weave-bench net", "agree-calls", a.get("agree-calls"), 10, 10000000));
  if (a.has("notify")) {
    c.notify.clear();
    for (const std::string& n : a.names("notify", "")) {
      const net::Notify m = net::parse_notify(n);
      if (m == net::Notify::automatic) throw Error("weave-bench net: --notify takes ordered and/or unordered");
      c.notify.push_back(m);
    }
  }
  if (a.has("batches")) {
    c.batches.clear();
    for (const std::string& b : a.names("batches", ""))
      c.batches.push_back(static_cast<uint32_t>(weave::bench::parse_count("weave-bench net", "batches", b, 1, net::kMaxBatch)));
  }
  if (a.has("latency-commands"))
    c.latency_commands =
        static_cast<uint32_t>(weave::bench::parse_count("weave-bench net", "latency-commands", a.get("latency-commands"), 10, 10000000));
  if (a.has("rate-commands"))
    c.rate_commands = static_cast<uint32_t>(weave::bench::parse_count("weave-bench net", "rate-commands", a.get("rate-commands"), 10, 100000000));
  for (const std::string& s : a.names("sizes", "4K,16K,64K,256K,1M,4M,16M,64M,256M")) {
    const size_t b = weave::bench::parse_bytes("weave-bench net", "sizes", s);
    if (b % 8) throw Error(concat("weave-bench net: --sizes: ", s, " is not a multiple of 8 bytes"));
    c.sizes.push_back(b);
  }
  if (a.has("chunks")) {
    c.chunks.clear();
    for (const std::string& s : a.names("chunks", "")) c.chunks.push_back(weave::bench::parse_bytes("weave-bench net", "chunks", s));
  }
  for (size_t ch : c.chunks)
    if (ch < 64 || ch % 16) throw Error(concat("weave-bench net: --chunks: ", ch, " is not a multiple of 16 >= 64"));
  if (a.has("budget")) c.budget = weave::bench::parse_bytes("weave-bench net", "budget", a.get("budget"));
  if (a.has("repeats")) c.repeats = static_cast<int>(weave::bench::parse_count("weave-bench net", "repeats", a.get("repeats"), 1, 1000));
  if (a.has("idle-us")) {
    const std::string s = a.get("idle-us");
    char* end = nullptr;
    c.idle_us = std::strtod(s.c_str(), &end);
    if (s.empty() || *end || !std::isfinite(c.idle_us))
      throw Error(
          concat("weave-bench net: --idle-us: '", s, "' is not a number of microseconds (< 0: spin, 0: yield)"));
  }
  if (a.has("test-corrupt")) c.corrupt_at = weave::bench::parse_count("weave-bench net", "test-corrupt", a.get("test-corrupt"), 0, 1ll << 40);
  // tcp unless asked otherwise: libfabric's own first choice on one host may be shm, which would
  // bypass the network path's socket transport that --nodes simulates.
  c.provider = a.get("provider", weave::env::get_string("WEAVE_NET_PROVIDER"));
  if (c.provider.empty()) c.provider = "tcp";
  // Simulated nodes (weave-run --nodes names them) all live on this host: loopback. Real nodes:
  // libfabric picks the interface unless --domain names one.
  c.domain = a.get("domain", weave::env::get_string("WEAVE_HOSTNAME").empty() ? "" : "lo");
  return c;
}

// ---- the control plane: results and verdicts between ranks, outside every timed region -----

struct Ctl {
  NetBootstrap& boot;
  int rank, world, src, dst;  // src -> dst is the measured pair
  bool lead() const { return rank == src; }
  bool sender() const { return rank == src; }
  bool receiver() const { return rank == dst; }
  // The receiver's first error message ("" if none), on every rank.
  std::string first_error(const std::string& mine) {
    char buf[256] = {};
    std::snprintf(buf, sizeof buf, "%s", mine.c_str());
    std::vector<char> all(sizeof buf * static_cast<size_t>(world));
    boot.all_gather(buf, all.data(), sizeof buf);
    for (int r = 0; r < world; ++r)
      if (all[sizeof buf * r]) return concat("rank ", r, ": ", std::string(&all[sizeof buf * r]));
    return "";
  }
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

std::string size_str(size_t b) {
  char s[32];
  if (b >= (1u << 20) && b % (1u << 20) == 0)
    std::snprintf(s, sizeof s, "%zuM", b >> 20);
  else if (b >= 1024 && b % 1024 == 0)
    std::snprintf(s, sizeof s, "%zuK", b >> 10);
  else
    std::snprintf(s, sizeof s, "%zu", b);
  return s;
}

net::NetPathOptions path_options(const Config& c, net::Notify mode, uint32_t batch, size_t send, size_t recv,
                                 uint32_t flags, double idle_us) {
  net::NetPathOptions o;
  o.gpu = false;  // host memory, no CUDA call: the path's CPU mode
  o.transport = {c.provider, c.domain, mode, false};
  o.send_bytes = send;
  o.recv_bytes = recv;
  o.proxy.flags = flags;
  o.proxy.batch = batch;
  o.proxy.idle_sleep_us = idle_us;
  return o;
}

// The same in the path's GPU mode, as the inter-node kernels use it (the device transfer rows and
// the GPU-producer proxy rows): ring, flags and bounce buffers pinned and mapped into the GPU, the
// ticket counter in device memory, kernels as the producers (NetPath::handle()).
net::NetPathOptions gpu_path_options(const Config& c, net::Notify mode, uint32_t batch, size_t send, size_t recv,
                                     uint32_t flags, double idle_us) {
  net::NetPathOptions o = path_options(c, mode, batch, send, recv, flags, idle_us);
  o.gpu = true;
  return o;
}

// ---- the raw transport: the provider without ring or proxy ---------------------------------

// A Transport joined to every rank (peer index = rank), with a send and a receive region.
struct Raw {
  std::unique_ptr<net::Transport> tr;
  std::vector<char> send_mem, recv_mem;
  char scratch[64] = {};
  const net::Region *send = nullptr, *recv = nullptr, *scr = nullptr;
  std::vector<net::RemoteRegion> peer_recv;

  Raw(const Config& c, Ctl& ctl, size_t send_bytes, size_t recv_bytes) {
    // unordered: the raw rows signal with immediate data (any provider that has it).
    tr = std::make_unique<net::Transport>(net::TransportOptions{c.provider, c.domain, net::Notify::unordered, false});
    send_mem.assign(send_bytes, 0);
    recv_mem.assign(recv_bytes, 0);
    send = &tr->register_memory(send_mem.data(), send_mem.size());
    recv = &tr->register_memory(recv_mem.data(), recv_mem.size());
    scr = &tr->register_memory(scratch, sizeof scratch);
    struct Info {
      uint8_t addr[240];
      uint64_t len;
      net::RemoteRegion recv;
    } mine{};
    const std::vector<uint8_t> addr = tr->address();
    WEAVE_CHECK(addr.size() <= sizeof mine.addr, "weave-bench net: fabric address too long");
    std::memcpy(mine.addr, addr.data(), addr.size());
    mine.len = addr.size();
    mine.recv = recv->remote;
    std::vector<Info> all(static_cast<size_t>(ctl.world));
    ctl.boot.all_gather(&mine, all.data(), sizeof(Info));
    for (const Info& i : all) {
      tr->add_peer(i.addr, i.len);
      peer_recv.push_back(i.recv);
    }
  }
};

// ---- message pattern and checks ------------------------------------------------------------

struct Msg {
  size_t bytes, chunk;
  uint64_t seed;
  size_t chunks() const { return (bytes + chunk - 1) / chunk; }
  size_t len(size_t j) const { return std::min(chunk, bytes - j * chunk); }
  uint64_t stamp(uint64_t message, size_t j) const { return weave::bench::netdev::chunk_stamp(seed, message, j); }
  uint64_t word(size_t w) const { return mix64(seed + w); }
};

void fill(const Msg& m, char* p) {
  auto* w = reinterpret_cast<uint64_t*>(p);
  for (size_t i = 0; i < m.bytes / 8; ++i) w[i] = m.word(i);
}
void stamp(const Msg& m, char* p, uint64_t message) {
  for (size_t j = 0; j < m.chunks(); ++j) {
    const uint64_t s = m.stamp(message, j);
    std::memcpy(p + j * m.chunk, &s, 8);
  }
}
// "" when every chunk of `message` carries its stamp.
std::string check_stamps(const Msg& m, const char* p, uint64_t message) {
  for (size_t j = 0; j < m.chunks(); ++j) {
    uint64_t s;
    std::memcpy(&s, p + j * m.chunk, 8);
    if (s != m.stamp(message, j))
      return concat(size_str(m.bytes), " message ", message, ": chunk ", j, " did not arrive (stale or wrong stamp)");
  }
  return "";
}
// "" when every byte is what `message` carried.
std::string check_all(const Msg& m, const char* p, uint64_t message) {
  if (std::string e = check_stamps(m, p, message); !e.empty()) return e;
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  const size_t per_chunk = m.chunk / 8;
  for (size_t i = 0; i < m.bytes / 8; ++i) {
    if (i % per_chunk == 0) continue;  // the stamp
    if (w[i] != m.word(i))
      return concat(size_str(m.bytes), " message ", message, ": byte ", i * 8, " (chunk ", i / per_chunk,
                    ") differs: 0x", std::hex, w[i], " instead of 0x", m.word(i));
  }
  return "";
}

// ---- one transfer row: the protocol both implementations share ------------------------------

struct Endpoint {
  // sender: stamp already done; sends message's chunks and returns once the ack arrived.
  std::function<void(uint64_t message)> send;
  // receiver: returns once every chunk's arrival is known; then acks.
  std::function<void(uint64_t message)> receive, ack;
  char* send_buf;
  char* recv_buf;
};

struct RowResult {
  double time_us = NAN;
  int iters = 0;
  bool ok = false;
  std::string error;
};

// A row's verdict on every rank (the receiver's first error) and its time (the sender's median
// per message over the repeats), once every rank is past the timed region.
void settle(Ctl& ctl, RowResult& r, const std::string& err, const std::vector<double>& t) {
  ctl.boot.barrier();
  r.error = ctl.first_error(err);
  r.ok = r.error.empty();
  std::vector<double> all(static_cast<size_t>(ctl.world));
  const double mine = ctl.sender() ? weave::median(t) : 0.0;
  ctl.boot.all_gather(&mine, all.data(), sizeof mine);
  r.time_us = all[static_cast<size_t>(ctl.src)];
}

RowResult transfer_row(Ctl& ctl, const Config& c, const Msg& m, Endpoint& e) {
  RowResult r;
  r.iters = static_cast<int>(std::clamp<size_t>(c.budget / m.bytes, 2, 100));
  std::string err;
  uint64_t message = 0;
  // First message, untimed, checked byte for byte on a poisoned buffer.
  if (ctl.sender()) fill(m, e.send_buf);
  if (ctl.receiver()) std::memset(e.recv_buf, 0xA5, m.bytes);
  ctl.boot.barrier();
  auto one = [&](bool full_check) {
    if (ctl.sender()) {
      stamp(m, e.send_buf, message);
      e.send(message);
    } else if (ctl.receiver()) {
      e.receive(message);
      // The checker's own test: a byte changed after arrival must make the row wrong.
      if (c.corrupt_at >= 0 && static_cast<size_t>(c.corrupt_at) < m.bytes) e.recv_buf[c.corrupt_at] ^= 0x01;
      if (err.empty()) err = full_check ? check_all(m, e.recv_buf, message) : check_stamps(m, e.recv_buf, message);
      e.ack(message);
    }
    ++message;
  };
  one(true);
  ctl.boot.barrier();
  if (ctl.receiver()) std::memset(e.recv_buf, 0x5A, m.bytes);
  ctl.boot.barrier();
  std::vector<double> t;
  for (int rep = 0; rep < c.repeats; ++rep) {
    const auto t0 = Clock::now();
    for (int i = 0; i < r.iters; ++i) one(false);
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / r.iters);
  }
  if (ctl.receiver() && err.empty()) err = check_all(m, e.recv_buf, message - 1);
  settle(ctl, r, err, t);
  return r;
}

// The raw transport's side of the protocol: every chunk an fi_writedata carrying its index,
// posted in submissions of up to 8 (FI_MORE), the ack an empty fi_writedata carrying kAck.
struct RawProto {
  static constexpr uint64_t kAck = 0xFFFFFFFFull;
  Raw& raw;
  int peer;
  std::vector<net::OpContext> ops;
  std::vector<uint32_t> free_ops;  // indices into ops whose operation completed (or never ran)
  net::OpContext ack_op;
  bool ack_busy = false;
  size_t local_done = 0, arrivals = 0, acks = 0;
  double timeout_s;

  RawProto(Raw& r, int p, size_t max_ops)
      : raw(r), peer(p), ops(max_ops), timeout_s(weave::env::get_seconds("WEAVE_NET_TIMEOUT_S")) {
    for (uint32_t i = static_cast<uint32_t>(max_ops); i-- > 0;) {
      ops[i].owner = i;
      free_ops.push_back(i);
    }
  }
  // A free operation context (reaping until one is): completions may come in any order, and a
  // context must not be reused while the provider holds it.
  net::OpContext* take_op() {
    poll_until([&] { return !free_ops.empty(); }, "a free operation slot");
    net::OpContext* op = &ops[free_ops.back()];
    free_ops.pop_back();
    return op;
  }

  void poll_once() {
    net::Completion c[32];
    const size_t n = raw.tr->poll(c, 32);
    for (size_t i = 0; i < n; ++i) {
      if (!c[i].op) {
        if (c[i].data == kAck)
          ++acks;
        else
          ++arrivals;
      } else if (c[i].op == &ack_op) {
        ack_busy = false;
      } else {
        ++local_done;
        free_ops.push_back(c[i].op->owner);
      }
    }
  }
  template <class Done>
  void poll_until(Done done, const char* what) {
    const auto start = Clock::now();
    for (uint32_t spin = 0; !done(); ++spin) {
      poll_once();
      // Spin, then share the core as Proxy::wait_arrival does (the weave rows wait with it):
      // on a machine with fewer cores than busy threads a pure spin starves the peer process.
      if (spin > 64) sched_yield();
      if ((spin & 1023) == 0 && std::chrono::duration<double>(Clock::now() - start).count() > timeout_s)
        throw Error(concat("weave-bench net: raw libfabric: ", what, " did not happen within ", timeout_s,
                           " s (WEAVE_NET_TIMEOUT_S)"));
    }
  }
  void send(const Msg& m) {
    const size_t n = m.chunks();
    local_done = 0;
    const size_t acks_before = acks;
    for (size_t j = 0; j < n; ++j) {
      const bool more = j + 1 < n && (j + 1) % net::kMaxBatch != 0;
      net::OpContext* op = take_op();
      op->chunk = static_cast<uint32_t>(j);
      while (!raw.tr->write_data(peer, *raw.send, raw.send_mem.data() + j * m.chunk, raw.peer_recv[peer], j * m.chunk,
                                 m.len(j), j, op, more))
        poll_once();  // the endpoint is full: reap, then retry
    }
    poll_until([&] { return local_done == n && acks > acks_before; }, "the message's completions and ack");
  }
  void receive(const Msg& m) {
    const size_t want = arrivals + m.chunks();
    poll_until([&] { return arrivals >= want; }, "the arrival of every chunk");
  }
  void ack() {
    poll_until([&] { return !ack_busy; }, "the previous ack's completion");
    ack_busy = true;
    while (!raw.tr->write_data(peer, *raw.scr, raw.scratch, raw.peer_recv[peer], 0, 0, kAck, &ack_op, false))
      poll_once();
  }
};

// ---- proxy rows ----------------------------------------------------------------------------

struct ProxyRow {
  std::string impl;
  net::Notify notify = net::Notify::automatic;
  uint32_t batch = 0;
  double taken_p50 = NAN, taken_p99 = NAN, post_p50 = NAN, p50 = NAN, p99 = NAN, rate = NAN, per_submission = NAN,
         writes_per_command = NAN, poll_us = NAN;
  std::string error;  // "" when the receiver saw every command arrive (weave rows)
};

// The i-th command of a proxy row: the same for host and GPU producers (net_proxy_gpu.hpp).
net::Command latency_command(uint64_t i, uint32_t flags, int peer) {
  return weave::bench::netproxy::command_of(i, flags, peer);
}

// The receiver's verdict after `total` commands latency_command(0 .. total - 1) ("" when right):
// each arrival flag ends at the number of commands that named it (an ordered flag write carries
// that count, an unordered arrival adds one, so a lost or repeated one shows), and the payload
// (the sender's send buffer, all 7) is there.
std::string check_arrivals(net::NetPath& path, uint64_t total, uint32_t flags) {
  for (uint32_t j = 0; j < std::min<uint64_t>(total, flags); ++j) {
    const uint64_t want = (total - 1 - j) / flags + 1;
    try {
      path.proxy().wait_arrival(j, want, 10);
    } catch (const Error& e) {
      return e.what();
    }
    const uint64_t got = net::queue_detail::load_acquire(path.flags() + j);
    if (got != want) return concat("arrival flag ", j, " is ", got, " after ", want, " commands named it");
  }
  const size_t payload = static_cast<size_t>(std::min<uint64_t>(total * kLatencyPayload, 1u << 20));
  for (size_t b = 0; b < payload; ++b)
    if (path.recv_buffer()[b] != 7) return concat("payload byte ", b, " is ", int(path.recv_buffer()[b]), ", not 7");
  return "";
}

ProxyRow proxy_weave(const Config& c, Ctl& ctl, net::Notify mode, uint32_t batch) {
  const uint32_t flags = 4096, total = c.latency_commands + c.rate_commands;
  std::vector<uint64_t> taken_ns(c.latency_commands, 0), posted_ns(c.latency_commands, 0);
  // The sender's proxy spins, as a proxy with a core of its own would (the latency
  // target assumes one; the producer sleeps between samples, so it has a core here too); the
  // receiver's naps 20 us per poll once idle, the library's default.
  net::NetPathOptions o = path_options(c, mode, batch, 1u << 20, 1u << 20, flags, ctl.sender() ? -1.0 : 20.0);
  if (ctl.sender()) {
    // On the proxy thread: a store per latency command into preallocated memory; the rate
    // commands read no clock, so the rate is the proxy's loop alone.
    o.proxy.on_taken = [&](uint64_t t) {
      if (t < c.latency_commands) taken_ns[t] = now_ns();
    };
    o.proxy.on_posted = [&](uint64_t t) {
      if (t < c.latency_commands) posted_ns[t] = now_ns();
    };
  }
  net::NetPath path(o);
  ProxyRow row;
  row.impl = "weave", row.notify = path.transport().notify(), row.batch = batch;
  if (ctl.sender()) {
    std::memset(path.send_buffer(), 7, path.send_bytes());
    net::Producer prod{path.host_queue()};
    std::vector<double> taken(c.latency_commands), posted(c.latency_commands), post(c.latency_commands);
    for (uint32_t i = 0; i < c.latency_commands; ++i) {
      const uint64_t t = now_ns();
      if (!prod.push(latency_command(i, flags, ctl.dst))) path.check();
      // Leaves the proxy the core while it takes and posts (this machine may have only 2).
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (!prod.wait_completed(i + 1)) path.check();
      taken[i] = (taken_ns[i] - t) * 1e-3;
      posted[i] = (posted_ns[i] - t) * 1e-3;
      post[i] = (posted_ns[i] - taken_ns[i]) * 1e-3;  // the proxy's fi_write call(s) for it
    }
    row.post_p50 = percentile(post, 0.5);
    row.taken_p50 = percentile(taken, 0.5), row.taken_p99 = percentile(taken, 0.99);
    row.p50 = percentile(posted, 0.5), row.p99 = percentile(posted, 0.99);
    const net::ProxyStats before = path.proxy().stats();
    const auto t0 = Clock::now();
    for (uint32_t i = c.latency_commands; i < total; ++i)
      if (!prod.push(latency_command(i, flags, ctl.dst))) path.check();
    if (!prod.wait_completed(total)) path.check();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const net::ProxyStats after = path.proxy().stats();
    row.rate = c.rate_commands / s;
    row.per_submission =
        double(after.posted - before.posted) / double(std::max<uint64_t>(1, after.submissions - before.submissions));
    row.writes_per_command = double(after.writes - before.writes) / double(after.posted - before.posted);
  }
  // Every command arrived (check_arrivals). Checked after a barrier, so that the receiver takes
  // no core from the timed loops.
  ctl.boot.barrier();
  std::string err;
  if (ctl.receiver()) err = check_arrivals(path, total, flags);
  row.error = ctl.first_error(err);
  path.shutdown();
  return row;
}

ProxyRow proxy_raw(const Config& c, Ctl& ctl, uint32_t batch) {
  Raw raw(c, ctl, 1u << 20, 1u << 20);
  ProxyRow row;
  row.impl = "libfabric", row.notify = net::Notify::unordered, row.batch = batch;
  // As many writes in flight as the proxy allows by default (ProxyOptions::max_outstanding).
  RawProto p(raw, ctl.sender() ? ctl.dst : ctl.src, net::ProxyOptions{}.max_outstanding);
  ctl.boot.barrier();
  if (ctl.sender()) {
    std::memset(raw.send_mem.data(), 7, raw.send_mem.size());
    const net::RemoteRegion& dst = raw.peer_recv[ctl.dst];
    // One fi_write at a time: the call's own cost, then its completion.
    std::vector<double> call(c.latency_commands);
    for (uint32_t i = 0; i < c.latency_commands; ++i) {
      const size_t done = p.local_done;
      net::OpContext* op = p.take_op();
      const uint64_t t = now_ns();
      while (!raw.tr->write(ctl.dst, *raw.send, raw.send_mem.data(), dst, (i * kLatencyPayload) % (1u << 20),
                            kLatencyPayload, op, false))
        p.poll_once();
      call[i] = (now_ns() - t) * 1e-3;
      p.poll_until([&] { return p.local_done > done; }, "a write's completion");
    }
    row.p50 = percentile(call, 0.5), row.p99 = percentile(call, 0.99);
    // An empty completion queue's poll: the proxy's loop pays one per turn.
    const int polls = 20000;
    const uint64_t t0 = now_ns();
    for (int i = 0; i < polls; ++i) p.poll_once();
    row.poll_us = (now_ns() - t0) * 1e-3 / polls;
    // Rate: submissions of `batch` writes (FI_MORE inside), reaping as they complete, with as
    // many in flight as the op contexts allow.
    p.local_done = 0;
    const auto r0 = Clock::now();
    for (uint32_t i = 0; i < c.rate_commands; ++i) {
      const bool more = (i + 1) % batch != 0 && i + 1 < c.rate_commands;
      net::OpContext* op = p.take_op();
      while (!raw.tr->write(ctl.dst, *raw.send, raw.send_mem.data(), dst, (i * kLatencyPayload) % (1u << 20),
                            kLatencyPayload, op, more))
        p.poll_once();
    }
    p.poll_until([&] { return p.local_done == c.rate_commands; }, "the rate loop's completions");
    row.rate = c.rate_commands / std::chrono::duration<double>(Clock::now() - r0).count();
    row.per_submission = batch;
    row.writes_per_command = 1;
    p.ack();  // tells the receiver to stop progressing
    p.poll_until([&] { return !p.ack_busy; }, "the stop note's completion");
  } else if (ctl.receiver()) {
    // Progress for the sender's writes until its stop note.
    p.poll_until([&] { return p.acks > 0; }, "the sender's stop note");
  }
  ctl.boot.barrier();
  return row;
}

// ---- transfer rows -------------------------------------------------------------------------

struct TransferRow {
  std::string impl;
  net::Notify notify;
  size_t bytes, chunk;
  RowResult r;
  bool device = false;  // device memory at both ends (the nccl rows, and weave's device rows)
};

std::vector<TransferRow> transfer_weave(const Config& c, Ctl& ctl, net::Notify mode, size_t chunk, uint64_t seed) {
  const size_t max_bytes = *std::max_element(c.sizes.begin(), c.sizes.end());
  size_t max_chunks = 0;
  for (size_t s : c.sizes) max_chunks = std::max(max_chunks, (s + chunk - 1) / chunk);
  const uint32_t flags = static_cast<uint32_t>(max_chunks + 1);  // the last one: the ack's
  const uint32_t ack_flag = flags - 1;
  const size_t buf = std::max<size_t>(max_bytes, 4096);
  // Both proxies idle as --idle-us says (default: the library's 20 us naps). A spinning proxy
  // needs a core of its own: with the producer and the waiting thread of each rank, the pair
  // runs 4 busy threads, which a 2-core machine cannot give (transfers then wait for the
  // scheduler's tick, milliseconds, not for the network).
  net::NetPath path(path_options(c, mode, net::kMaxBatch, buf, buf, std::max<uint32_t>(flags, 2), c.idle_us));
  std::vector<uint64_t> count(flags, 0);  // arrivals per flag so far: the epoch both sides agree on
  uint64_t queued = 0;                    // commands this rank pushed
  net::Producer prod{path.host_queue()};
  net::Proxy& proxy = path.proxy();
  Msg m{0, chunk, 0};
  Endpoint e;
  e.send_buf = path.send_buffer();
  e.recv_buf = path.recv_buffer();
  e.send = [&](uint64_t) {
    const size_t n = m.chunks();
    for (size_t j = 0; j < n; ++j) {
      const uint16_t fl = net::kNotify | (j + 1 == n ? net::kLastOfBatch : 0);
      if (!prod.push(net::Command{j * m.chunk, j * m.chunk, m.len(j), ++count[j], static_cast<uint32_t>(j),
                                  static_cast<uint16_t>(ctl.dst), fl, 0}))
        path.check();
    }
    queued += n;
    proxy.wait_arrival(ack_flag, ++count[ack_flag]);
    // The ack means the data landed; the source may be restamped once the writes completed too.
    if (!prod.wait_completed(queued)) path.check();
  };
  e.receive = [&](uint64_t) {
    for (size_t j = 0; j < m.chunks(); ++j) proxy.wait_arrival(static_cast<uint32_t>(j), ++count[j]);
  };
  e.ack = [&](uint64_t) {
    if (!prod.push(net::Command{0, 0, 0, ++count[ack_flag], ack_flag, static_cast<uint16_t>(ctl.src), net::kNotify, 0}))
      path.check();
  };
  std::vector<TransferRow> rows;
  for (size_t s : c.sizes) {
    m = Msg{s, std::min(chunk, s), mix64(seed ^ s)};
    if (ctl.lead()) {
      std::printf("  weave %-9s chunk %-5s %6s ...", std::string(net::notify_name(path.transport().notify())).c_str(),
                  size_str(chunk).c_str(), size_str(s).c_str());
      std::fflush(stdout);
    }
    TransferRow row{"weave", path.transport().notify(), s, chunk, transfer_row(ctl, c, m, e)};
    if (ctl.lead()) {
      std::printf(" %.1f us, %.3f GB/s%s\n", row.r.time_us, s / row.r.time_us * 1e-3, row.r.ok ? "" : ", WRONG");
      std::fflush(stdout);
    }
    rows.push_back(row);
  }
  path.shutdown();
  return rows;
}

std::vector<TransferRow> transfer_raw(const Config& c, Ctl& ctl, size_t chunk, uint64_t seed) {
  const size_t max_bytes = *std::max_element(c.sizes.begin(), c.sizes.end());
  size_t max_chunks = 0;
  for (size_t s : c.sizes) max_chunks = std::max(max_chunks, (s + chunk - 1) / chunk);
  Raw raw(c, ctl, std::max<size_t>(max_bytes, 4096), std::max<size_t>(max_bytes, 4096));
  RawProto p(raw, ctl.sender() ? ctl.dst : ctl.src, max_chunks);
  Msg m{0, chunk, 0};
  Endpoint e;
  e.send_buf = raw.send_mem.data();
  e.recv_buf = raw.recv_mem.data();
  e.send = [&](uint64_t) { p.send(m); };
  e.receive = [&](uint64_t) { p.receive(m); };
  e.ack = [&](uint64_t) { p.ack(); };
  std::vector<TransferRow> rows;
  for (size_t s : c.sizes) {
    m = Msg{s, std::min(chunk, s), mix64(seed ^ s)};
    if (ctl.lead()) {
      std::printf("  libfabric           chunk %-5s %6s ...", size_str(chunk).c_str(), size_str(s).c_str());
      std::fflush(stdout);
    }
    TransferRow row{"libfabric", net::Notify::unordered, s, chunk, transfer_row(ctl, c, m, e)};
    if (ctl.lead()) {
      std::printf(" %.1f us, %.3f GB/s%s\n", row.r.time_us, s / row.r.time_us * 1e-3, row.r.ok ? "" : ", WRONG");
      std::fflush(stdout);
    }
    rows.push_back(row);
  }
  // The last ack's completion, before the endpoint goes.
  if (ctl.receiver()) p.poll_until([&] { return !p.ack_busy; }, "the last ack's completion");
  ctl.boot.barrier();
  return rows;
}

// ---- the ranks' GPUs: the device rows need one per rank, the NCCL rows one of its own each ----

using weave::bench::GpuView;

// Every rank's GPU (collective); `device`: this rank's (-1 without: not an error here, a reason to skip).
std::vector<GpuView> gpu_views(Ctl& ctl, int local_rank, int& device) {
  const GpuView mine = weave::bench::gpu_view(local_rank);
  std::vector<GpuView> all(static_cast<size_t>(ctl.world));
  ctl.boot.all_gather(&mine, all.data(), sizeof(GpuView));
  device = mine.device;
  return all;
}

bool pair_shares_gpu(const Ctl& ctl, const std::vector<GpuView>& all) {
  return weave::bench::same_gpu(all[ctl.src], all[ctl.dst]);
}

// "" when every rank has a GPU (the path's GPU mode is made on every rank), else why not.
std::string device_unusable(const Ctl& ctl, const std::vector<GpuView>& all) {
  for (int r = 0; r < ctl.world; ++r)
    if (all[r].count < 1) return concat("rank ", r, " sees no GPU");
  return "";
}

// "" when src and dst each have a GPU of their own, else why not.
std::string nccl_unusable(const Ctl& ctl, const std::vector<GpuView>& all) {
  for (int r : {ctl.src, ctl.dst})
    if (all[r].count < 1) return concat("rank ", r, " sees no GPU");
  if (pair_shares_gpu(ctl, all))
    return concat("ranks ", ctl.src, " and ", ctl.dst,
                  " would share one GPU (run without --no-gpu and --share-gpus, "
                  "with a GPU per rank, so that weave-run gives each node its own)");
  return "";
}

// ---- device memory to device memory through the path's GPU mode --------------------------------

// One row of the device protocol (net_device_transfer.hpp), as transfer_row runs the host ones:
// the first message untimed and checked byte for byte on a poisoned destination, then --repeats
// times `iters` messages launched back to back on the sender's host clock, then the stamps of
// every message and the last message's bytes.
RowResult device_row(const Config& c, Ctl& ctl, const Msg& m, net::NetPath& path, cudaStream_t st, char* mem,
                     unsigned long long* words, std::vector<char>& host, uint32_t ack_flag,
                     unsigned long long& done_target) {
  RowResult r;
  r.iters = static_cast<int>(std::clamp<size_t>(c.budget / m.bytes, 2, 100));
  const bool pair = ctl.sender() || ctl.receiver();
  const net::NetHandle h = path.handle();
  std::string err;
  uint64_t message = 0;
  if (ctl.sender()) {
    fill(m, host.data());
    WEAVE_CUDA_CHECK(cudaMemcpy(mem, host.data(), m.bytes, cudaMemcpyHostToDevice));
  }
  if (ctl.receiver()) {
    WEAVE_CUDA_CHECK(cudaMemset(mem, 0xA5, m.bytes));
    WEAVE_CUDA_CHECK(cudaMemset(words + 1, 0, sizeof *words));  // the first wrong stamp
  }
  if (pair) WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  ctl.boot.barrier();
  auto one = [&] {
    if (!pair) return;
    // One call per message on both ranks (the data, the ack), so their slots agree.
    const net::NetPath::Call call = path.begin_call(ctl.sender() ? m.chunks() : 1);
    weave::bench::netdev::Message x{};
    x.bytes = m.bytes, x.chunk = m.chunk, x.seed = m.seed, x.index = message++;
    x.call = call.index, x.commands_before = call.commands_before, x.recv_offset = call.recv_offset;
    x.flag_offset = call.flag_offset, x.ack_flag = ack_flag, x.peer = ctl.sender() ? ctl.dst : ctl.src;
    if (ctl.sender()) {
      weave::bench::netdev::launch_send(h, x, mem, kDeviceSendBlocks, st);
    } else {
      done_target += static_cast<unsigned long long>(weave::bench::netdev::grid(x, kDeviceRecvBlocks));
      weave::bench::netdev::launch_receive(h, x, mem, words, done_target, words + 1, kDeviceRecvBlocks, st);
    }
  };
  auto bytes_of_last = [&] {
    WEAVE_CUDA_CHECK(cudaMemcpy(host.data(), mem, m.bytes, cudaMemcpyDeviceToHost));
    if (c.corrupt_at >= 0 && static_cast<size_t>(c.corrupt_at) < m.bytes) host[c.corrupt_at] ^= 0x01;
    return check_all(m, host.data(), message - 1);
  };
  one();
  if (pair) path.finish(st);
  if (ctl.receiver()) err = bytes_of_last();
  ctl.boot.barrier();
  if (ctl.receiver()) {
    WEAVE_CUDA_CHECK(cudaMemset(mem, 0x5A, m.bytes));
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  ctl.boot.barrier();
  std::vector<double> t;
  for (int rep = 0; rep < c.repeats; ++rep) {
    const auto t0 = Clock::now();
    for (int i = 0; i < r.iters; ++i) one();
    if (pair) path.finish(st);
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / r.iters);
  }
  if (ctl.receiver()) {
    unsigned long long bad = 0;
    WEAVE_CUDA_CHECK(cudaMemcpy(&bad, words + 1, sizeof bad, cudaMemcpyDeviceToHost));
    if (err.empty() && bad)
      err = concat(size_str(m.bytes), " message ", (bad - 1) >> 32, ": chunk ", (bad - 1) & 0xFFFFFFFFull,
                   " did not arrive (stale or wrong stamp in device memory)");
    if (err.empty()) err = bytes_of_last();
  }
  settle(ctl, r, err, t);
  return r;
}

std::vector<TransferRow> transfer_device(const Config& c, Ctl& ctl, net::Notify mode, size_t chunk, uint64_t seed) {
  const size_t max_bytes = *std::max_element(c.sizes.begin(), c.sizes.end());
  size_t max_chunks = 0;
  for (size_t s : c.sizes) max_chunks = std::max(max_chunks, (s + chunk - 1) / chunk);
  const uint32_t ack_flag = static_cast<uint32_t>(max_chunks);  // after a call's data flags
  // Whole 16-byte units per receive slot (NetPath rounds a slot down to them).
  const size_t buf = (std::max<size_t>(max_bytes, 4096) + 15) / 16 * 16;
  // GPU mode: the ring is the kernels', the bounce buffers pinned and mapped; two receive slots
  // and two flag halves, since calls alternate between them.
  net::NetPath path(gpu_path_options(c, mode, net::kMaxBatch, buf, 2 * buf, 2 * (ack_flag + 1), c.idle_us));
  const bool pair = ctl.sender() || ctl.receiver();
  cudaStream_t st = nullptr;
  char* mem = nullptr;                 // the sender's source, the receiver's destination
  unsigned long long* words = nullptr;  // the receiver's: finished blocks, the first wrong stamp
  std::vector<char> host;
  if (pair) {
    WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    WEAVE_CUDA_CHECK(cudaMalloc(&mem, max_bytes));
    WEAVE_CUDA_CHECK(cudaMalloc(&words, 2 * sizeof *words));
    WEAVE_CUDA_CHECK(cudaMemset(words, 0, 2 * sizeof *words));
    host.resize(max_bytes);
  }
  unsigned long long done_target = 0;  // the receiver's block count over its calls
  std::vector<TransferRow> rows;
  for (size_t s : c.sizes) {
    const Msg m{s, std::min(chunk, s), mix64(seed ^ s ^ 0x646576ull)};
    if (ctl.lead()) {
      std::printf("  weave %-9s chunk %-5s %6s device ...",
                  std::string(net::notify_name(path.transport().notify())).c_str(), size_str(chunk).c_str(),
                  size_str(s).c_str());
      std::fflush(stdout);
    }
    TransferRow row{"weave", path.transport().notify(), s, chunk,
                    device_row(c, ctl, m, path, st, mem, words, host, ack_flag, done_target), true};
    if (ctl.lead()) {
      std::printf(" %.1f us, %.3f GB/s%s\n", row.r.time_us, s / row.r.time_us * 1e-3, row.r.ok ? "" : ", WRONG");
      std::fflush(stdout);
    }
    rows.push_back(row);
  }
  if (pair) WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  ctl.boot.barrier();
  path.shutdown();
  if (pair) {
    cudaFree(mem);
    cudaFree(words);
    cudaStreamDestroy(st);
  }
  return rows;
}

// ---- proxy rows with a GPU producer (--parts proxy_gpu; net_proxy_gpu.hpp) -------------------

// Mapped pinned host memory for the words the GPU polls and the host writes (as the path's ring:
// cudaHostAllocMapped, not write-combined), one 128-byte line each: the proxy's `taken` and
// `posted` acks and the null loop's ping and pong.
struct AckWords {
  enum : int { kTaken = 0, kPosted = 1, kPing = 2, kPong = 3, kWords = 4 };
  static constexpr size_t kStride = 16;  // uint64 words: 128 bytes
  uint64_t* host = nullptr;
  unsigned long long* dev = nullptr;
  AckWords() = default;
  AckWords(const AckWords&) = delete;
  void alloc() {  // after the path chose (cudaSetDevice) the rank's GPU
    WEAVE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), kWords * kStride * sizeof(uint64_t),
                                   cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(host, 0, kWords * kStride * sizeof(uint64_t));
    void* d = nullptr;
    WEAVE_CUDA_CHECK(cudaHostGetDevicePointer(&d, host, 0));
    dev = static_cast<unsigned long long*>(d);
  }
  ~AckWords() {
    if (host) cudaFreeHost(host);
  }
  uint64_t* h(int w) const { return host + w * kStride; }
  unsigned long long* d(int w) const { return dev + w * kStride; }
};

template <class T>
struct DeviceArray {
  T* p = nullptr;
  explicit DeviceArray(size_t n) {  // zeroed
    WEAVE_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    WEAVE_CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  std::vector<T> get(size_t n) const {
    std::vector<T> v(n);
    WEAVE_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

// Until the stream's work ended, without a core: this thread naps (the default synchronisation
// would spin, beside the spinning proxy and echo threads). path.finish() then reports any failure.
void wait_quietly(cudaStream_t st) {
  while (cudaStreamQuery(st) == cudaErrorNotReady) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

struct GpuProxyRow {
  net::Notify notify = net::Notify::automatic;
  uint32_t batch = 0;
  int producers = 0;
  bool shared_gpu = false;
  std::string clock;  // "globaltimer" or "clock64": the stamps the figures come from
  double timer_step_ns = NAN, sm_ghz = NAN;
  double push_p50 = NAN, taken_p50 = NAN, taken_p99 = NAN, p50 = NAN, p99 = NAN, null_p50 = NAN, null_p99 = NAN,
         post_p50 = NAN, rate = NAN, credit_reads = NAN, per_submission = NAN, writes_per_command = NAN;
  std::string error;
  double proxy_p50() const { return p50 - null_p50; }  // the proxy's own GPU write -> posted (estimate)
  double proxy_p99() const { return p99 - null_p99; }
  bool meets_target() const { return proxy_p50() <= kTargetP50Us && rate >= kTargetRate; }
};

// Microseconds of each sample from `warm` on, on the row's clock: `to` - `from` of the stamps;
// `ns_per_cycle` converts clock64 (calibrated on the kernel's whole span).
template <class From, class To>
std::vector<double> sample_us(const std::vector<weave::bench::netproxy::Stamp>& s, size_t warm, bool globaltimer,
                              double ns_per_cycle, From from, To to) {
  std::vector<double> v;
  for (size_t i = warm; i < s.size(); ++i) {
    const auto [t0, c0] = from(s[i]);
    const auto [t1, c1] = to(s[i]);
    v.push_back(globaltimer ? (t1 - t0) * 1e-3 : (c1 - c0) * ns_per_cycle * 1e-3);
  }
  return v;
}

// One GPU-producer row (net_proxy_gpu.hpp says what the kernels time): a fresh path in GPU mode
// on every rank, the sender's proxy spinning with on_taken / on_posted writing the acks the GPU
// polls; the null loop, the latency (kGpuWarmup + --latency-commands, one at a time) and the rate
// (--rate-commands from `producers` blocks), then the checks: the receiver's arrivals
// (check_arrivals over every command of the row, and in unordered mode its proxy's arrival count),
// the sender's ticket counter, its proxy's taken / posted / completed counts and each ticket posted
// exactly once.
GpuProxyRow proxy_gpu(const Config& c, Ctl& ctl, net::Notify mode, uint32_t batch, int producers, bool shared_gpu) {
  namespace np = weave::bench::netproxy;
  const uint32_t flags = 4096, n = kGpuWarmup + c.latency_commands;
  const uint64_t total = uint64_t{n} + c.rate_commands;
  GpuProxyRow row;
  row.batch = batch, row.producers = producers, row.shared_gpu = shared_gpu;
  // The hooks' state outlives the path (its proxy thread calls them until it stops).
  AckWords words;
  std::atomic<uint64_t*> ack{nullptr};  // words.host once allocated; commands come only after
  std::vector<uint64_t> taken_ns(n, 0), posted_ns(n, 0);  // host clock, the latency commands'
  std::vector<uint32_t> posted_times(total, 0);
  std::atomic<uint64_t> beyond{0};  // tickets past the row's commands (none expected)
  // The sender's proxy spins (a core of its own: the latency target assumes one); the receiver's
  // naps 20 us per poll once idle, the library's default; as the host rows.
  net::NetPathOptions o = gpu_path_options(c, mode, batch, np::kPayloadSpan, np::kPayloadSpan, flags,
                                           ctl.sender() ? -1.0 : 20.0);
  if (ctl.sender()) {
    // On the proxy thread. A latency command's: the ack first (the GPU is waiting for it), then the
    // host stamp; a rate command's: only the count (no clock read in the proxy's loop there).
    o.proxy.on_taken = [&](uint64_t t) {
      if (t >= n) return;
      if (uint64_t* w = ack.load(std::memory_order_acquire))
        net::queue_detail::store_release(w + AckWords::kTaken * AckWords::kStride, t + 1);
      taken_ns[t] = now_ns();
    };
    o.proxy.on_posted = [&](uint64_t t) {
      if (t < n) {
        if (uint64_t* w = ack.load(std::memory_order_acquire))
          net::queue_detail::store_release(w + AckWords::kPosted * AckWords::kStride, t + 1);
        posted_ns[t] = now_ns();
      }
      if (t < total)
        ++posted_times[t];
      else
        beyond.fetch_add(1, std::memory_order_relaxed);
    };
  }
  net::NetPath path(o);
  row.notify = path.transport().notify();
  std::string err;
  if (ctl.sender()) {
    try {
      words.alloc();
      ack.store(words.host, std::memory_order_release);
      std::memset(path.send_buffer(), 7, np::kPayloadSpan);
      const net::NetHandle h = path.handle();
      cudaStream_t st = nullptr;
      WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      struct StreamGuard {
        cudaStream_t s;
        ~StreamGuard() { cudaStreamDestroy(s); }
      } stream_guard{st};
      DeviceArray<np::Stamp> null_stamps(n), stamps(n);
      DeviceArray<unsigned long long> bad(2), probe(1);
      DeviceArray<np::RateTimes> times(1);
      WEAVE_CUDA_CHECK(cudaDeviceSynchronize());  // the arrays' memsets (legacy stream) before st's kernels

      // The globaltimer's step: fine enough, it gives the figures; else clock64 does.
      np::launch_timer_probe(probe.p, st);
      path.finish(st);
      const unsigned long long step = probe.get(1)[0];
      if (step == ~0ull) throw Error("weave-bench net: the GPU's %globaltimer did not move (timer_probe)");
      row.timer_step_ns = static_cast<double>(step);
      const bool globaltimer = row.timer_step_ns <= kFineTimerStepNs;
      row.clock = globaltimer ? "globaltimer" : "clock64";

      // The null loop: a host thread echoes ping into pong, spinning (a core of its own, as the proxy).
      {
        std::atomic<bool> stop{false};
        std::thread echo([&] {
          uint64_t last = 0;
          while (!stop.load(std::memory_order_relaxed)) {
            const uint64_t v = net::queue_detail::load_acquire(words.h(AckWords::kPing));
            if (v != last) net::queue_detail::store_release(words.h(AckWords::kPong), last = v);
          }
        });
        struct Join {
          std::atomic<bool>& stop;
          std::thread& t;
          ~Join() {
            stop.store(true);
            t.join();
          }
        } join{stop, echo};
        np::launch_null_loop(h, n, words.d(AckWords::kPing), words.d(AckWords::kPong), null_stamps.p, bad.p, st);
        wait_quietly(st);
      }
      // A GPU wait of this bench that gives up reports as the path's own "send gate or completions"
      // wait (net_proxy_gpu.cu uses the path's timeout): say which ack it was.
      auto finish = [&](const char* what) {
        try {
          path.finish(st);
        } catch (const Error& e) {
          throw Error(concat("weave-bench net proxy_gpu, ", what, ": ", e.what()));
        }
      };
      finish("the null loop (the GPU waited for the host thread's echo)");
      // The proxy: one command at a time, then the rate run.
      np::launch_latency(h, 0, n, flags, ctl.dst, words.d(AckWords::kTaken), words.d(AckWords::kPosted), stamps.p,
                         bad.p + 1, st);
      wait_quietly(st);
      finish("the latency run (the GPU waited for the proxy's taken / posted acks)");
      const net::ProxyStats before = path.proxy().stats();
      const np::RateTimes init{~0ull, 0, 0, 0};
      WEAVE_CUDA_CHECK(cudaMemcpyAsync(times.p, &init, sizeof init, cudaMemcpyHostToDevice, st));
      np::launch_rate(h, n, total, flags, ctl.dst, producers, times.p, st);
      wait_quietly(st);
      finish("the rate run (the GPU waited for ring credits or the proxy's completions)");
      // Acquires the proxy thread's writes before its last completion (the hooks' stamps and counts).
      const uint64_t completed = net::queue_detail::load_acquire(path.proxy().queue().completed);
      const net::ProxyStats after = path.proxy().stats();

      const std::vector<unsigned long long> b = bad.get(2);
      const np::RateTimes rt = times.get(1)[0];
      if (b[0]) err = concat("null loop round trip ", b[0] - 1, " did not come back");
      if (err.empty() && b[1]) err = concat("latency command ", b[1] - 1, " was not seen taken and posted");
      if (err.empty() && rt.bad) err = concat("rate run: command ", rt.bad - 1, " could not be pushed");
      if (err.empty() && !rt.done) err = "rate run: block 0 did not see every command complete";
      // Exactly once, at the sender: the tickets handed out, and the proxy's counts.
      unsigned long long claimed = 0;
      WEAVE_CUDA_CHECK(cudaMemcpy(&claimed, h.words + net::kWordClaim, sizeof claimed, cudaMemcpyDeviceToHost));
      if (err.empty() && (claimed != total || completed != total || after.taken != total || after.posted != total ||
                          after.completed != total))
        err = concat("the sender's counts differ from the row's ", total, " commands: tickets ", claimed, ", taken ",
                     after.taken, ", posted ", after.posted, ", completed ", after.completed, " (ring word ",
                     completed, ")");
      for (uint64_t t = 0; t < total && err.empty(); ++t)
        if (posted_times[t] != 1) err = concat("command ", t, " was posted ", posted_times[t], " times");
      if (err.empty() && beyond.load()) err = concat(beyond.load(), " commands posted beyond the row's ", total);
      if (err.empty()) {
        const std::vector<np::Stamp> ns = null_stamps.get(n), ls = stamps.get(n);
        // clock64 -> ns on each kernel's whole span (milliseconds: the globaltimer's step is noise there).
        auto ns_per_cycle = [](const std::vector<np::Stamp>& s) {
          return double(s.back().t_posted - s.front().t_start) / double(s.back().c_posted - s.front().c_start);
        };
        const double lat_npc = ns_per_cycle(ls), null_npc = ns_per_cycle(ns);
        row.sm_ghz = 1.0 / lat_npc;
        using S = np::Stamp;
        auto start = [](const S& s) { return std::pair{s.t_start, s.c_start}; };
        auto pushed = [](const S& s) { return std::pair{s.t_pushed, s.c_pushed}; };
        auto taken = [](const S& s) { return std::pair{s.t_taken, s.c_taken}; };
        auto posted = [](const S& s) { return std::pair{s.t_posted, s.c_posted}; };
        const std::vector<double> push_us = sample_us(ls, kGpuWarmup, globaltimer, lat_npc, start, pushed);
        const std::vector<double> taken_us = sample_us(ls, kGpuWarmup, globaltimer, lat_npc, start, taken);
        const std::vector<double> posted_us = sample_us(ls, kGpuWarmup, globaltimer, lat_npc, start, posted);
        const std::vector<double> null_us = sample_us(ns, kGpuWarmup, globaltimer, null_npc, start, posted);
        row.push_p50 = percentile(push_us, 0.5);
        row.taken_p50 = percentile(taken_us, 0.5), row.taken_p99 = percentile(taken_us, 0.99);
        row.p50 = percentile(posted_us, 0.5), row.p99 = percentile(posted_us, 0.99);
        row.null_p50 = percentile(null_us, 0.5), row.null_p99 = percentile(null_us, 0.99);
        std::vector<double> post;  // the proxy's fi_write call(s) per command, on the host clock
        for (uint32_t i = kGpuWarmup; i < n; ++i) post.push_back((posted_ns[i] - taken_ns[i]) * 1e-3);
        row.post_p50 = percentile(post, 0.5);
        row.rate = c.rate_commands / ((rt.done - rt.start) * 1e-9);
        row.credit_reads = double(rt.credit_reads) / c.rate_commands;
        row.per_submission =
            double(after.posted - before.posted) / double(std::max<uint64_t>(1, after.submissions - before.submissions));
        row.writes_per_command = double(after.writes - before.writes) / double(after.posted - before.posted);
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  // The receiver checks once the sender's kernels ended (it took no core from them).
  ctl.boot.barrier();
  if (ctl.receiver()) {
    err = check_arrivals(path, total, flags);
    const uint64_t arrivals = path.proxy().stats().arrivals;
    if (err.empty() && row.notify == net::Notify::unordered && arrivals != total)
      err = concat("the receiver's proxy counted ", arrivals, " arrivals of the row's ", total, " commands");
  }
  row.error = ctl.first_error(err);
  // After a failure the path is not shut down (every rank knows of it): its destructor aborts it.
  if (row.error.empty()) path.shutdown();
  return row;
}

// ---- the NCCL baseline: its network transport only, one GPU per rank -------------------------

// The same protocol as the other transfer rows, from device memory to device memory: the message
// as one ncclSend / ncclRecv, then an 8-byte ack back, all on one stream (the sender's next send
// waits for the ack in stream order, so messages do not overlap). Time: the sender's host clock
// around `iters` messages and the stream's end. Checked byte for byte: the first (untimed) message
// and the last timed one, each on a poisoned buffer.
std::vector<TransferRow> transfer_nccl(const Config& c, Ctl& ctl, int device, uint64_t seed, const std::string& env) {
  // A communicator of the pair only (src = NCCL rank 0, dst = 1): the other ranks need no GPU.
  const bool pair = ctl.sender() || ctl.receiver();
  const int peer = ctl.sender() ? 1 : 0;
  const size_t max_bytes = *std::max_element(c.sizes.begin(), c.sizes.end());
  ncclUniqueId id{};
  if (ctl.sender()) WEAVE_NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<char> ids(static_cast<size_t>(ctl.world) * sizeof id);
  ctl.boot.all_gather(&id, ids.data(), sizeof id);
  std::memcpy(&id, ids.data() + static_cast<size_t>(ctl.src) * sizeof id, sizeof id);  // the sender's
  ncclComm_t comm = nullptr;
  cudaStream_t st = nullptr;
  char *data = nullptr, *ack = nullptr;
  std::vector<char> host;
  if (pair) {
    WEAVE_CUDA_CHECK(cudaSetDevice(device));
    WEAVE_NCCL_CHECK(ncclCommInitRank(&comm, 2, id, ctl.sender() ? 0 : 1));
    WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    WEAVE_CUDA_CHECK(cudaMalloc(&data, max_bytes));
    WEAVE_CUDA_CHECK(cudaMalloc(&ack, 8));
    host.resize(max_bytes);
  }
  auto message = [&](size_t bytes) {
    if (ctl.sender()) {
      WEAVE_NCCL_CHECK(ncclSend(data, bytes, ncclChar, peer, comm, st));
      WEAVE_NCCL_CHECK(ncclRecv(ack, 8, ncclChar, peer, comm, st));
    } else if (ctl.receiver()) {
      WEAVE_NCCL_CHECK(ncclRecv(data, bytes, ncclChar, peer, comm, st));
      WEAVE_NCCL_CHECK(ncclSend(ack, 8, ncclChar, peer, comm, st));
    }
  };
  auto sync = [&] {
    if (pair) WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  };
  auto check = [&](const Msg& m) {
    sync();
    WEAVE_CUDA_CHECK(cudaMemcpy(host.data(), data, m.bytes, cudaMemcpyDeviceToHost));
    return check_all(m, host.data(), 0);
  };
  std::vector<TransferRow> rows;
  for (size_t s : c.sizes) {
    const Msg m{s, s, mix64(seed ^ s ^ 0x6e63636cull)};  // one chunk: one stamp, the message's first word
    if (ctl.lead()) {
      std::printf("  nccl (%s)            %6s ...", env.c_str(), size_str(s).c_str());
      std::fflush(stdout);
    }
    RowResult r;
    r.iters = static_cast<int>(std::clamp<size_t>(c.budget / s, 2, 100));
    std::string err;
    if (ctl.sender()) {
      fill(m, host.data());
      stamp(m, host.data(), 0);
      WEAVE_CUDA_CHECK(cudaMemcpy(data, host.data(), s, cudaMemcpyHostToDevice));
    }
    if (ctl.receiver()) WEAVE_CUDA_CHECK(cudaMemset(data, 0xA5, s));
    if (pair) WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    ctl.boot.barrier();
    message(s);
    if (ctl.receiver()) err = check(m);
    sync();
    if (ctl.receiver()) WEAVE_CUDA_CHECK(cudaMemset(data, 0x5A, s));
    if (pair) WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    ctl.boot.barrier();
    std::vector<double> t;
    for (int rep = 0; rep < c.repeats; ++rep) {
      const auto t0 = Clock::now();
      for (int i = 0; i < r.iters; ++i) message(s);
      sync();
      t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / r.iters);
    }
    if (ctl.receiver() && err.empty()) err = check(m);
    settle(ctl, r, err, t);
    if (ctl.lead()) {
      std::printf(" %.1f us, %.3f GB/s%s\n", r.time_us, s / r.time_us * 1e-3, r.ok ? "" : ", WRONG");
      std::fflush(stdout);
    }
    rows.push_back(TransferRow{"nccl", net::Notify::automatic, s, 0, r, true});
  }
  if (pair) {
    sync();
    WEAVE_NCCL_CHECK(ncclCommFinalize(comm));
    WEAVE_NCCL_CHECK(ncclCommDestroy(comm));
    cudaFree(data);
    cudaFree(ack);
    cudaStreamDestroy(st);
  }
  return rows;
}

// ---- the command ---------------------------------------------------------------------------

// ---- calls: the cross-rank agreement's host time per call -----------------------------------

struct CallsRow {
  std::string impl, what;
  int calls = 0;
  double us_per_call = NAN;  // the slowest rank's
  std::string error;
};

// Per-call microseconds of `calls` runs of one(i), the slowest rank's; an error on any rank fails the row.
template <class One>
CallsRow time_calls(Ctl& ctl, const char* impl, const char* what, int calls, One&& one) {
  CallsRow r{impl, what, calls};
  std::string mine;
  double us = 0;
  ctl.boot.barrier();
  try {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) one(i);
    us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
  } catch (const std::exception& e) {
    mine = e.what();
  }
  r.error = ctl.first_error(mine);
  std::vector<double> all(static_cast<size_t>(ctl.world));
  ctl.boot.all_gather(&us, all.data(), sizeof us);
  r.us_per_call = *std::max_element(all.begin(), all.end());
  return r;
}

std::vector<CallsRow> calls_rows(const Config& c, Ctl& ctl) {
  std::vector<CallsRow> rows;
  const char* what = "count, dtype";
  const std::vector<long long> A{net::kOpAllGather, 100, 1}, B{net::kOpReduceScatter, 400, 1};
  {
    net::NetPath path(path_options(c, net::Notify::automatic, net::kMaxBatch, 4096, 8192, 64, 20));
    net::AgreedKeys agreed;
    for (const auto& k : {A, B}) (void)net::agree(path, agreed, k, "", "weave-bench net", what);
    rows.push_back(time_calls(ctl, "weave", "agreed", c.agree_calls, [&](int i) {
      (void)net::agree(path, agreed, i % 2 ? B : A, "", "weave-bench net", what);
    }));
    rows.push_back(time_calls(ctl, "weave", "new key", std::max(1, c.agree_calls / 10), [&](int i) {
      (void)net::agree(path, agreed, {net::kOpAllReduce, 1000 + i, 2}, "", "weave-bench net", what);
    }));
    std::string mine;
    try {
      path.check();
      path.shutdown();
    } catch (const std::exception& e) {
      mine = e.what();
    }
    if (const std::string e = ctl.first_error(mine); !e.empty())
      for (CallsRow& r : rows)
        if (r.error.empty()) r.error = e;
  }
  rows.push_back(time_calls(ctl, "bootstrap", "agreed", c.agree_calls, [&](int i) {
    std::vector<long long> key = i % 2 ? B : A;
    key.resize(net::kPostValues + 1);
    std::vector<long long> all(key.size() * static_cast<size_t>(ctl.world));
    ctl.boot.all_gather(key.data(), all.data(), key.size() * sizeof(long long));
  }));
  return rows;
}

int run(const weave::bench::Args& a) {
  const Config c = parse(a);
  const weave::runtime::LaunchInfo info = weave::runtime::detect_launch();
  auto skip = [&](const std::string& why) {
    if (info.rank == 0)
      std::printf(
          "weave-bench net: skipped: %s; run it on 2 nodes, e.g. weave-run -n 2 --nodes 2 --no-gpu -- "
          "weave-bench net\n",
          why.c_str());
    return 0;
  };
  weave::bench::NetStart start = weave::bench::net_start(info, "bench-net");
  if (!start.skip.empty()) return skip(start.skip);
  NetBootstrap& boot = *start.boot;
  const std::vector<weave::runtime::NodePlace>& place = start.place;
  const int nodes = start.nodes;
  int dst = -1;
  for (int r = 0; r < info.world && dst < 0; ++r)
    if (place[r].node == 1 && place[r].local_rank == 0) dst = r;
  Ctl ctl{boot, info.rank, info.world, 0, dst};
  const bool lead = ctl.lead();
  weave::bench::JsonSink sink(a);  // every rank checks the file opens; rank 0 writes
  uint64_t seed = mix64(static_cast<uint64_t>(now_ns()));
  {  // one seed for the job: rank 0's
    std::vector<uint64_t> all(static_cast<size_t>(info.world));
    boot.all_gather(&seed, all.data(), sizeof seed);
    seed = all[0];
  }

  std::string provider;
  {
    // The provider as libfabric names it, and what it offers (one line), before anything runs.
    net::Transport probe({c.provider, c.domain, net::Notify::automatic, false});
    provider = probe.provider();
    if (lead)
      std::printf("net: rank %d (node 0) -> rank %d (node 1), %d ranks on %d nodes; libfabric %s\n",
                  ctl.src, ctl.dst, info.world, nodes, probe.describe().c_str());
  }
  auto base = [&](const char* kernel, const std::string& impl, const char* memory = "host") {
    weave::bench::JsonLine j;
    j.add("kernel", kernel)
        .add("impl", impl)
        .add("nodes", nodes)
        .add("world", info.world)
        .add("transport", impl == "nccl" ? "nccl-socket" : "libfabric")
        .add("provider", impl == "nccl" ? "Socket" : provider)
        .add("memory", memory);
    return j;
  };
  bool all_ok = true;

  if (c.proxy) {
    if (lead) {
      std::printf(
          "\nproxy: latency of one %zu-byte command at a time (%u), from the producer's queue write until the "
          "proxy took it / posted its last fi_write; rate of %u commands pushed back to back\n",
          kLatencyPayload, c.latency_commands, c.rate_commands);
      std::fflush(stdout);
    }
    std::vector<ProxyRow> rows;
    for (uint32_t b : c.batches) {
      if (lead) std::printf("  libfabric batch %u ...\n", b), std::fflush(stdout);
      rows.push_back(proxy_raw(c, ctl, b));
    }
    for (net::Notify mode : c.notify)
      for (uint32_t b : c.batches) {
        if (lead)
          std::printf("  weave %s batch %u ...\n", std::string(net::notify_name(mode)).c_str(), b), std::fflush(stdout);
        rows.push_back(proxy_weave(c, ctl, mode, b));
      }
    for (const ProxyRow& r : rows) all_ok = all_ok && r.error.empty();
    if (lead) {
      // taken: until the proxy took the command out of the ring; post: from then until its last
      // fi_write returned (that command's own writes); posted = the latency the issue names.
      std::printf("%-10s %-9s %5s %9s %9s %8s %10s %10s %12s %8s %6s %8s\n", "impl", "notify", "batch", "taken_p50",
                  "taken_p99", "post_p50", "posted_p50", "posted_p99", "commands/s", "cmds/sub", "wr/cmd", "cq_poll");
      auto f = [](double v, int digits = 2) {
        if (std::isnan(v)) return std::string("-");
        char b[32];
        std::snprintf(b, sizeof b, "%.*f", digits, v);
        return std::string(b);
      };
      for (const ProxyRow& r : rows) {
        const bool raw = r.impl == "libfabric";
        std::printf("%-10s %-9s %5u %9s %9s %8s %10.2f %10.2f %12.0f %8.2f %6.0f %8s\n", r.impl.c_str(),
                    raw ? "-" : std::string(net::notify_name(r.notify)).c_str(), r.batch, f(r.taken_p50).c_str(),
                    f(r.taken_p99).c_str(), f(r.post_p50).c_str(), r.p50, r.p99, r.rate, r.per_submission,
                    r.writes_per_command, f(r.poll_us, 3).c_str());
        if (!r.error.empty()) std::printf("  WRONG: %s\n", r.error.c_str());
        weave::bench::JsonLine j = base("proxy", r.impl);
        j.add("batch", static_cast<int>(r.batch))
            .add("bytes", kLatencyPayload)
            .add("p50_us", r.p50)
            .add("p99_us", r.p99)
            .add("commands_per_s", r.rate)
            .add("cmds_per_submission", r.per_submission)
            .add("writes_per_command", r.writes_per_command)
            .add("latency_commands", static_cast<int>(c.latency_commands))
            .add("rate_commands", static_cast<int>(c.rate_commands))
            .add("correct", r.error.empty());
        if (!r.error.empty()) j.add("error", r.error);
        if (raw) {
          j.add("notify", "none").add("cq_poll_us", r.poll_us).add("what", "p50/p99: one fi_write call");
        } else {
          j.add("notify", std::string(net::notify_name(r.notify)))
              .add("producer", "host")
              .add("taken_p50_us", r.taken_p50)
              .add("taken_p99_us", r.taken_p99)
              .add("post_p50_us", r.post_p50)
              .add("target_p50_us", kTargetP50Us)
              .add("target_commands_per_s", kTargetRate)
              .add("meets_target", r.p50 <= kTargetP50Us && r.rate >= kTargetRate)
              .add("send_idle_sleep_us", -1.0)
              .add("recv_idle_sleep_us", 20.0);
        }
        sink.write(j);
      }
      // The targets, and what stops them: the raw provider's figures are a floor under the proxy.
      double best_p50 = INFINITY, best_rate = 0, raw_call = INFINITY, raw_rate = 0, poll = NAN;
      for (const ProxyRow& r : rows) {
        if (r.impl == "weave")
          best_p50 = std::min(best_p50, r.p50), best_rate = std::max(best_rate, r.rate);
        else
          raw_call = std::min(raw_call, r.p50), raw_rate = std::max(raw_rate, r.rate), poll = r.poll_us;
      }
      if (best_rate > 0)
        std::printf(
            "targets: posted p50 <= %.0f us: %s (best %.2f us); >= %.0fM commands/s: %s (best %.2fM)\n"
            "floor (libfabric rows, no ring or proxy): one fi_write call p50 %.2f us, one empty fi_cq_read "
            "(a turn of the proxy's loop) %.3f us, fi_write rate %.2fM/s (ordered mode posts 2 writes per "
            "command)\n",
            kTargetP50Us, best_p50 <= kTargetP50Us ? "met" : "NOT met", best_p50, kTargetRate * 1e-6,
            best_rate >= kTargetRate ? "met" : "NOT met", best_rate * 1e-6, raw_call, poll, raw_rate * 1e-6);
      std::fflush(stdout);
    }
  }

  if (c.calls) {
    if (lead) {
      std::printf("\ncalls: host time of the cross-rank agreement per call (net_common's agree over the calls' "
                  "mailbox; bootstrap: one all-gather of the key per call), the slowest rank's\n");
      std::fflush(stdout);
    }
    const std::vector<CallsRow> rows = calls_rows(c, ctl);
    for (const CallsRow& r : rows) all_ok = all_ok && r.error.empty();
    if (lead) {
      std::printf("%-10s %-8s %7s %12s\n", "impl", "what", "calls", "us/call");
      for (const CallsRow& r : rows) {
        std::printf("%-10s %-8s %7d %12.2f\n", r.impl.c_str(), r.what.c_str(), r.calls, r.us_per_call);
        if (!r.error.empty()) std::printf("  WRONG: %s\n", r.error.c_str());
        weave::bench::JsonLine j = base("calls", r.impl);
        j.add("what", r.what)
            .add("calls", r.calls)
            .add("time_us", r.us_per_call)
            .add("notify", "none")
            .add("bytes", static_cast<long long>((net::kPostValues + 1) * sizeof(long long)))
            .add("correct", r.error.empty());
        if (!r.error.empty()) j.add("error", r.error);
        sink.write(j);
      }
      std::fflush(stdout);
    }
  }

  // The ranks' GPUs (collective): the device, nccl and proxy_gpu rows need them.
  int device = -1;
  std::vector<GpuView> gpus;
  if (c.device || c.nccl || c.proxy_gpu) gpus = gpu_views(ctl, info.local_rank, device);
  const bool shared_gpu = !gpus.empty() && gpus[ctl.src].count > 0 && pair_shares_gpu(ctl, gpus);

  if (c.transfer || c.device || c.nccl) {
    if (lead) {
      std::printf(
          "\ntransfer: one message rank %d -> rank %d at a time, chunked, end to end (until the receiver's "
          "ack); every chunk's arrival and the first and last message's bytes checked at the receiver\n",
          ctl.src, ctl.dst);
      std::fflush(stdout);
    }
    std::vector<TransferRow> rows;
    if (c.transfer)
      for (size_t ch : c.chunks) {
        const std::vector<TransferRow> raw = transfer_raw(c, ctl, ch, seed);
        rows.insert(rows.end(), raw.begin(), raw.end());
        for (net::Notify mode : c.notify) {
          const std::vector<TransferRow> w = transfer_weave(c, ctl, mode, ch, seed);
          rows.insert(rows.end(), w.begin(), w.end());
        }
      }
    // Last: they need a GPU per rank, and their failure should not cost the rows above their run.
    std::string nccl_env;
    if (c.device) {
      const std::string why = device_unusable(ctl, gpus);
      if (!why.empty()) {
        if (lead)
          std::printf("  weave device-memory rows skipped: %s; they need a GPU per rank (weave-run without --no-gpu)\n",
                      why.c_str());
      } else {
        if (lead && shared_gpu)
          std::printf("  NOTE: ranks %d and %d share one GPU: the device rows' times time-slice it, their checks hold\n",
                      ctl.src, ctl.dst);
        for (size_t ch : c.chunks)
          for (net::Notify mode : c.notify) {
            const std::vector<TransferRow> d = transfer_device(c, ctl, mode, ch, seed);
            rows.insert(rows.end(), d.begin(), d.end());
          }
      }
    }
    if (c.nccl) {
      const std::string why = nccl_unusable(ctl, gpus);
      if (!why.empty()) {
        if (lead) std::printf("  nccl rows skipped: %s; they need one GPU per rank\n", why.c_str());
      } else {
        nccl_env = weave::bench::nccl_network_environment(c.domain == "lo");
        const std::vector<TransferRow> n = transfer_nccl(c, ctl, device, seed, nccl_env);
        rows.insert(rows.end(), n.begin(), n.end());
      }
    }
    if (lead && !rows.empty())
      std::printf("%-10s %-9s %-6s %6s %6s %12s %9s %8s %8s %s\n", "impl", "notify", "memory", "chunk", "bytes",
                  "time_us", "GB/s", "vs_raw", "vs_nccl", "check");
    auto time_of = [&](const char* impl, size_t bytes, size_t chunk) {
      for (const TransferRow& q : rows)
        if (q.impl == impl && q.bytes == bytes && q.chunk == chunk) return q.r.time_us;
      return static_cast<double>(NAN);
    };
    auto ratio = [](double base_us, double us) {
      return std::isnan(base_us) ? std::string("-") : concat(std::round(base_us / us * 1000) / 1000);
    };
    for (const TransferRow& r : rows) {
      all_ok = all_ok && r.r.ok;
      const bool weave_row = r.impl == "weave", nccl_row = r.impl == "nccl";
      const double raw_us = weave_row ? time_of("libfabric", r.bytes, r.chunk) : NAN;
      // Only like for like: NCCL's rows move device memory, so only weave's device rows get its ratio.
      const double nccl_us = weave_row && r.device ? time_of("nccl", r.bytes, 0) : NAN;
      const double gbs = r.bytes / r.r.time_us * 1e-3;
      if (!lead) continue;
      const std::string notify = weave_row ? std::string(net::notify_name(r.notify)) : nccl_row ? "nccl" : "immediate";
      const char* memory = r.device ? "device" : "host";
      std::printf("%-10s %-9s %-6s %6s %6s %12.1f %9.3f %8s %8s %s%s\n", r.impl.c_str(), notify.c_str(), memory,
                  nccl_row ? "-" : size_str(r.chunk).c_str(), size_str(r.bytes).c_str(), r.r.time_us, gbs,
                  ratio(raw_us, r.r.time_us).c_str(), ratio(nccl_us, r.r.time_us).c_str(), r.r.ok ? "ok" : "WRONG",
                  r.r.error.empty() ? "" : (": " + r.r.error).c_str());
      weave::bench::JsonLine j = base("transfer", r.impl, memory);
      j.add("notify", notify).add("bytes", r.bytes);
      if (!nccl_row) j.add("chunk_bytes", r.chunk).add("chunks", (r.bytes + r.chunk - 1) / r.chunk);
      j.add("time_us", r.r.time_us)
          .add("gbs", gbs)
          .add("iters", r.r.iters)
          .add("repeats", c.repeats)
          .add("correct", r.r.ok);
      if (weave_row) {
        // The raw rows are host memory: for a device row, the floor under its network part.
        if (!std::isnan(raw_us)) j.add("ratio_vs_libfabric", raw_us / r.r.time_us);
        j.add("send_idle_sleep_us", c.idle_us).add("recv_idle_sleep_us", c.idle_us);
        if (!std::isnan(nccl_us)) j.add("ratio_vs_nccl", nccl_us / r.r.time_us);
        if (r.device)
          j.add("send_blocks", kDeviceSendBlocks).add("recv_blocks", kDeviceRecvBlocks).add("shared_gpu", shared_gpu);
      }
      if (nccl_row) j.add("nccl_env", nccl_env);
      if (!r.r.error.empty()) j.add("error", r.r.error);
      sink.write(j);
    }
    if (lead && !rows.empty())
      std::printf("%s\n", all_ok ? "every message's chunks arrived, first and last messages exact"
                                 : "WRONG bytes at the receiver: see the rows above");
  }

  // Last too: a GPU per rank (two ranks may share one: only the sender's produces).
  if (c.proxy_gpu) {
    const std::string why = device_unusable(ctl, gpus);
    if (!why.empty()) {
      if (lead)
        std::printf("\nproxy_gpu: skipped: %s; the GPU-producer proxy rows need a GPU per rank (weave-run without "
                    "--no-gpu; two ranks may share one: --share-gpus)\n",
                    why.c_str());
    } else {
      if (lead) {
        std::printf(
            "\nproxy_gpu: one GPU thread pushes one %zu-byte command at a time (%u after %u untimed) and polls the "
            "proxy's acks in mapped host memory (on_taken / on_posted write them); null loop: the same thread's "
            "write echoed by a spinning host thread; rate: %u commands from GPU producer blocks\n",
            kLatencyPayload, c.latency_commands, kGpuWarmup, c.rate_commands);
        if (shared_gpu)
          std::printf("  NOTE: ranks %d and %d share one GPU; only rank %d's kernels run, so the figures hold\n",
                      ctl.src, ctl.dst, ctl.src);
        std::fflush(stdout);
      }
      std::vector<GpuProxyRow> rows;
      for (net::Notify mode : c.notify)
        for (uint32_t b : c.batches)
          for (int p : c.gpu_producers) {
            if (lead)
              std::printf("  weave-gpu %s batch %u producers %d ...\n", std::string(net::notify_name(mode)).c_str(), b,
                          p),
                  std::fflush(stdout);
            rows.push_back(proxy_gpu(c, ctl, mode, b, p, shared_gpu));
          }
      for (const GpuProxyRow& r : rows) all_ok = all_ok && r.error.empty();
      if (lead) {
        // push: the GPU's push call; taken / posted: until the GPU saw the proxy's ack (its way back
        // across PCIe included); null: the same round trip without the proxy; proxy = posted - null.
        std::printf("%-10s %-9s %5s %4s %8s %9s %9s %10s %10s %8s %8s %9s %9s %8s %12s %10s %8s %6s\n", "impl",
                    "notify", "batch", "prod", "push_p50", "taken_p50", "taken_p99", "posted_p50", "posted_p99",
                    "null_p50", "null_p99", "proxy_p50", "proxy_p99", "post_p50", "commands/s", "credit/cmd",
                    "cmds/sub", "wr/cmd");
        for (const GpuProxyRow& r : rows) {
          const bool ok = r.error.empty();
          if (ok)
            std::printf(
                "%-10s %-9s %5u %4d %8.2f %9.2f %9.2f %10.2f %10.2f %8.2f %8.2f %9.2f %9.2f %8.2f %12.0f %10.3f %8.2f "
                "%6.0f\n",
                "weave-gpu", std::string(net::notify_name(r.notify)).c_str(), r.batch, r.producers, r.push_p50,
                r.taken_p50, r.taken_p99, r.p50, r.p99, r.null_p50, r.null_p99, r.proxy_p50(), r.proxy_p99(),
                r.post_p50, r.rate, r.credit_reads, r.per_submission, r.writes_per_command);
          else
            std::printf("%-10s %-9s %5u %4d  WRONG: %s\n", "weave-gpu", std::string(net::notify_name(r.notify)).c_str(),
                        r.batch, r.producers, r.error.c_str());
          weave::bench::JsonLine j = base("proxy", "weave-gpu");
          j.add("producer", "gpu")
              .add("notify", std::string(net::notify_name(r.notify)))
              .add("batch", static_cast<int>(r.batch))
              .add("producers", r.producers)
              .add("bytes", kLatencyPayload)
              .add("latency_commands", static_cast<int>(c.latency_commands))
              .add("warmup_commands", static_cast<int>(kGpuWarmup))
              .add("rate_commands", static_cast<int>(c.rate_commands))
              .add("send_idle_sleep_us", -1.0)
              .add("recv_idle_sleep_us", 20.0)
              .add("shared_gpu", r.shared_gpu)
              .add("target_p50_us", kTargetP50Us)
              .add("target_commands_per_s", kTargetRate)
              .add("correct", ok);
          if (ok) {
            j.add("clock", r.clock)
                .add("globaltimer_step_ns", r.timer_step_ns)
                .add("sm_clock_ghz", r.sm_ghz)
                .add("p50_us", r.p50)
                .add("p99_us", r.p99)
                .add("taken_p50_us", r.taken_p50)
                .add("taken_p99_us", r.taken_p99)
                .add("push_p50_us", r.push_p50)
                .add("post_p50_us", r.post_p50)
                .add("null_p50_us", r.null_p50)
                .add("null_p99_us", r.null_p99)
                .add("proxy_p50_us", r.proxy_p50())
                .add("proxy_p99_us", r.proxy_p99())
                .add("commands_per_s", r.rate)
                .add("credit_reads_per_command", r.credit_reads)
                .add("cmds_per_submission", r.per_submission)
                .add("writes_per_command", r.writes_per_command)
                .add("meets_target", r.meets_target());
          } else {
            j.add("error", r.error).add("meets_target", false);
          }
          sink.write(j);
        }
        double best_p50 = INFINITY, best_raw = INFINITY, best_rate = 0;
        for (const GpuProxyRow& r : rows)
          if (r.error.empty())
            best_p50 = std::min(best_p50, r.proxy_p50()), best_raw = std::min(best_raw, r.p50),
            best_rate = std::max(best_rate, r.rate);
        if (best_rate > 0)
          std::printf(
              "targets (GPU producer): the proxy's own GPU write -> posted (posted - null) p50 <= %.0f us: %s (best "
              "%.2f us; %.2f us as the GPU sees it, the ack's way back included); >= %.0fM commands/s: %s (best "
              "%.2fM)\n",
              kTargetP50Us, best_p50 <= kTargetP50Us ? "met" : "NOT met", best_p50, best_raw, kTargetRate * 1e-6,
              best_rate >= kTargetRate ? "met" : "NOT met", best_rate * 1e-6);
        std::fflush(stdout);
      }
    }
  }
  boot.barrier();
  return all_ok ? 0 : 1;
}

WEAVE_BENCH(net,
            "the network path between 2 nodes (weave-run -n 2 --nodes 2 [--no-gpu]): proxy command latency and rate, "
            "transfer rate through the path on host memory, raw libfabric floors, device memory to device memory "
            "through the path's GPU mode beside NCCL's network transport (a GPU per rank), the calls' cross-rank "
            "agreement, the proxy with a GPU producer (a GPU per rank) [--parts proxy,proxy_gpu,transfer,device,nccl,calls] "
            "[--notify ordered,unordered] [--batches 8,1] [--sizes 4K,...,256M] [--chunks 1M] [--budget 256M] "
            "[--repeats 3] [--latency-commands 2000] [--rate-commands 100000] [--provider tcp] [--domain lo] "
            "[--idle-us 20] [--agree-calls 2000] [--gpu-producers 8]",
            run);

}  // namespace
