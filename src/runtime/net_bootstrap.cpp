// TCP star through rank 0. Rank 0 binds the rendezvous port on every interface; each other rank
// connects (retrying until rank 0 listens), sends a NetHello followed by its hostname and job tag,
// and waits for rank 0's Verdict: when every rank has joined, an ok Verdict whose text is all
// hostnames joined by '\n'; otherwise a refusal with the reason. A peer with another tag is
// refused alone (the job goes on); a peer of this job that breaks the rules ends the job on every
// rank. Then the collectives of bootstrap_star.hpp run over these connections.
#include "weave/runtime/net_bootstrap.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap_star.hpp"
#include "weave/common/error.hpp"
#include "weave/runtime/env.hpp"

namespace weave::runtime {
namespace {

using namespace bootio;
using std::chrono::milliseconds;

constexpr uint32_t kNetVersion = 1;
constexpr uint32_t kMaxHost = 255, kMaxTag = 4096;

struct NetHello {  // followed by host_len bytes of hostname and tag_len bytes of job tag
  uint32_t magic, version;
  int32_t rank, world;
  uint32_t host_len, tag_len;
};

struct HostPort {
  std::string host, port;
};

HostPort split_address(const std::string& addr) {
  size_t colon = addr.rfind(':');
  HostPort hp;
  if (colon != std::string::npos) {
    hp.host = addr.substr(0, colon);
    hp.port = addr.substr(colon + 1);
  }
  if (hp.host.size() >= 2 && hp.host.front() == '[' && hp.host.back() == ']') hp.host = hp.host.substr(1, hp.host.size() - 2);
  bool digits = !hp.port.empty() && hp.port.size() <= 5 && hp.port.find_first_not_of("0123456789") == std::string::npos;
  if (hp.host.empty() || !digits || std::stoi(hp.port) < 1 || std::stoi(hp.port) > 65535)
    throw Error(concat("weave: net bootstrap: rendezvous address '", addr,
                       "' is not host:port (port 1..65535; IPv6 as [addr]:port)"));
  return hp;
}

// getaddrinfo's answers; nullptr on a transient failure (retry), weave::Error on a lasting one.
struct AddrList {
  addrinfo* head = nullptr;
  ~AddrList() {
    if (head) ::freeaddrinfo(head);
  }
};
bool resolve(const char* host, const std::string& port, int flags, int family, AddrList& out, const std::string& addr) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  int e = ::getaddrinfo(host, port.c_str(), &hints, &out.head);
  if (e == 0) return true;
  if (e == EAI_AGAIN) return false;
  throw Error(concat("weave: net bootstrap: cannot resolve the rendezvous address '", addr, "': ", ::gai_strerror(e)));
}

// No Nagle delay for the small messages; keepalive so that a host that vanishes without closing
// its sockets ends the collectives (~10 s idle + 3 probes 5 s apart) instead of hanging them.
void tune(int fd) {
  int one = 1, idle = 10, intvl = 5, cnt = 3;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

// Connects within `limit`; false when refused or unreachable for now (rank 0 not listening yet).
bool try_connect(Fd& s, const addrinfo* ai, Clock::time_point limit) {
  s.reset(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (s.get() < 0) sys_fail("socket");
  if (::connect(s.get(), ai->ai_addr, ai->ai_addrlen) < 0) {
    if (errno != EINPROGRESS) return false;
    for (;;) {
      auto left = std::chrono::ceil<milliseconds>(limit - Clock::now()).count();
      pollfd p{s.get(), POLLOUT, 0};
      int r = left > 0 ? ::poll(&p, 1, static_cast<int>(left)) : 0;
      if (r > 0) break;
      if (r == 0 || errno != EINTR) return false;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err != 0) return false;
  }
  int flags = ::fcntl(s.get(), F_GETFL);
  if (flags < 0 || ::fcntl(s.get(), F_SETFL, flags & ~O_NONBLOCK) < 0) sys_fail("fcntl");
  tune(s.get());
  return true;
}

std::string own_hostname() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) < 0) sys_fail("gethostname");
  return buf;
}

}  // namespace

std::string rendezvous_address(const LaunchInfo& info) {
  if (auto v = env::raw("WEAVE_BOOTSTRAP"); v && !v->empty()) return *v;
  auto addr = env::raw("MASTER_ADDR"), port = env::raw("MASTER_PORT");
  if (addr && !addr->empty() && port && !port->empty()) {
    int p = static_cast<int>(std::stol(split_address("x:" + *port).port)) + kTorchPortOffset;
    if (p > 65535)
      throw Error(concat("weave: net bootstrap: MASTER_PORT ", *port, " + ", kTorchPortOffset,
                         " is above 65535; set WEAVE_BOOTSTRAP=host:port"));
    return addr->find(':') != std::string::npos ? concat("[", *addr, "]:", p) : concat(*addr, ":", p);
  }
  // The launcher's own count says when every rank is on this host (a first run on one machine):
  // then the network path is likely not what the user wants.
  const std::string one_host =
      info.world > 1 && info.local_world == info.world
          ? concat(" (all ", info.world, " ranks are on this host, one node: it needs no network path, a "
                   "runtime::Communicator spans it; to run the path anyway, WEAVE_BOOTSTRAP=127.0.0.1:<free port>)")
          : "";
  if (info.launcher == "mpirun")
    throw Error(concat("weave: net bootstrap: OpenMPI gives no rendezvous address for a job across hosts; set "
                       "WEAVE_BOOTSTRAP=host:port to a free port on the host of rank 0 (e.g. mpirun -x "
                       "WEAVE_BOOTSTRAP=...)",
                       one_host));
  throw Error(concat("weave: net bootstrap: no rendezvous address (launcher '", info.launcher,
                     "'): set WEAVE_BOOTSTRAP=host:port to a free port on the host of rank 0", one_host));
}

std::vector<NodePlace> node_of_ranks(const std::vector<std::string>& hostnames) {
  std::vector<std::string> hosts;  // in order of their lowest rank
  std::vector<int> count;
  std::vector<NodePlace> out;
  for (const std::string& h : hostnames) {
    size_t n = std::find(hosts.begin(), hosts.end(), h) - hosts.begin();
    if (n == hosts.size()) {
      hosts.push_back(h);
      count.push_back(0);
    }
    out.push_back({static_cast<int>(n), count[n]++});
  }
  return out;
}

struct NetBootstrap::Impl : Star {
  LaunchInfo info;
  NetBootstrapOptions opt;
  HostPort hp;
  std::vector<std::string> hosts;

  std::string job() const { return concat("net bootstrap of job '", opt.tag, "' at ", opt.address); }
  void connect_root(Clock::time_point deadline);
  void connect_leaf(Clock::time_point deadline);
};

void NetBootstrap::Impl::connect_root(Clock::time_point deadline) {
  AddrList target, bind_at;
  while (!resolve(hp.host.c_str(), hp.port, 0, AF_UNSPEC, target, opt.address)) {
    if (Clock::now() > deadline) throw Error(concat("weave: ", job(), ": the host name did not resolve in time"));
    std::this_thread::sleep_for(milliseconds(100));
  }
  // The host name is how the others reach rank 0; rank 0 listens on all interfaces of its family.
  resolve(nullptr, hp.port, AI_PASSIVE, target.head->ai_family, bind_at, opt.address);
  Fd lis(::socket(bind_at.head->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (lis.get() < 0) sys_fail("socket");
  int one = 1;  // a restarted job may bind while the last one's connections linger in TIME_WAIT
  (void)::setsockopt(lis.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(lis.get(), bind_at.head->ai_addr, bind_at.head->ai_addrlen) < 0) {
    if (errno == EADDRINUSE)
      throw Error(concat("weave: ", job(), ": port ", hp.port,
                         " is already in use on the host of rank 0 (another job, or torch's store?); choose another "
                         "with WEAVE_BOOTSTRAP=host:port"));
    sys_fail(concat("bind to port ", hp.port));
  }
  if (::listen(lis.get(), SOMAXCONN) < 0) sys_fail("listen");

  std::string turned_away;  // peers of other jobs, for the timeout message
  int joined = 0;
  while (joined < world - 1) {
    if (!wait_readable(lis.get(), deadline)) {
      fail_all(concat("weave: ", job(), " timed out after ", opt.timeout.count(), " ms: rank(s) ", missing_ranks(),
                      " of ", world, " never connected to rank 0", turned_away));
    }
    Fd c = accept_next(lis.get());
    if (c.get() < 0) continue;
    tune(c.get());
    // Anything may connect to a TCP port: a stranger gets a few seconds to introduce itself.
    Deadline hello_by = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    NetHello h{};
    std::string host, tag;
    try {
      recv_all(c.get(), &h, sizeof h, "a connecting rank", hello_by);
      if (h.magic != kMagic || h.version != kNetVersion || h.host_len > kMaxHost || h.tag_len > kMaxTag) {
        send_refusal(c.get(), "not a weave net bootstrap peer of this version");
        continue;
      }
      host.resize(h.host_len);
      tag.resize(h.tag_len);
      recv_all(c.get(), host.data(), host.size(), "a connecting rank", hello_by);
      recv_all(c.get(), tag.data(), tag.size(), "a connecting rank", hello_by);
    } catch (const Error&) {
      continue;  // a peer that vanished before introducing itself shows up as missing later
    }
    if (tag != opt.tag) {
      std::string why = concat("weave: ", job(), " turned away rank ", h.rank, " of host '", host, "': its job tag is '",
                               tag, "' (two jobs on one rendezvous port?)");
      send_refusal(c.get(), why);
      turned_away += concat("; turned away rank ", h.rank, " of host '", host, "' with job tag '", tag, "'");
      continue;
    }
    std::string reject;
    if (h.world != world)
      reject = concat("rank ", h.rank, " has world size ", h.world, " but rank 0 has ", world);
    else if (h.rank < 1 || h.rank >= world)
      reject = concat("a peer claims rank ", h.rank, ", outside [1, ", world, ")");
    else if (peers[h.rank].get() >= 0)
      reject = concat("two processes claim rank ", h.rank, " (hosts '", hosts[h.rank], "' and '", host, "')");
    if (!reject.empty()) {
      std::string why = concat("weave: ", job(), " rejected a peer: ", reject);
      peers[0] = std::move(c);  // slot 0 is unused on rank 0: lets abort_peers tell the offender too
      abort_peers(why);
      throw Error(why);
    }
    peers[h.rank] = std::move(c);
    hosts[h.rank] = host;
    ++joined;
  }
  std::string all;
  for (int r = 0; r < world; ++r) all += concat(r ? "\n" : "", hosts[r]);
  Verdict ok{kMagic, 1, static_cast<uint32_t>(all.size())};
  for (int r = 1; r < world; ++r) {
    send_all(peers[r].get(), &ok, sizeof ok, rank_name(r));
    send_all(peers[r].get(), all.data(), all.size(), rank_name(r));
  }
}

void NetBootstrap::Impl::connect_leaf(Clock::time_point deadline) {
  auto pause = milliseconds(10);
  Fd s;
  for (bool connected = false; !connected;) {
    AddrList target;
    if (resolve(hp.host.c_str(), hp.port, 0, AF_UNSPEC, target, opt.address))
      for (const addrinfo* ai = target.head; ai && !connected; ai = ai->ai_next)
        connected = try_connect(s, ai, std::min(deadline, Clock::now() + std::chrono::seconds(2)));
    if (connected) break;
    if (Clock::now() + pause > deadline)
      throw Error(concat("weave: ", job(), ": rank ", rank, " could not reach rank 0 within ", opt.timeout.count(),
                         " ms (is rank 0 running, and listening at that address?)"));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(200));
  }
  const std::string& host = hosts[rank];
  NetHello h{kMagic, kNetVersion, rank, world, static_cast<uint32_t>(host.size()), static_cast<uint32_t>(opt.tag.size())};
  send_all(s.get(), &h, sizeof h, "rank 0");
  send_all(s.get(), host.data(), host.size(), "rank 0");
  send_all(s.get(), opt.tag.data(), opt.tag.size(), "rank 0");
  Verdict v{};
  std::string text;
  try {
    recv_all(s.get(), &v, sizeof v, "rank 0", deadline);
    if (v.magic != kMagic) throw Error("weave: net bootstrap: rank 0 answered with a malformed message");
    text.resize(std::min<uint32_t>(v.text_len, (kMaxHost + 1) * static_cast<uint32_t>(world) + kMaxTag + 4096));
    recv_all(s.get(), text.data(), text.size(), "rank 0", deadline);
  } catch (const Error& e) {
    throw Error(concat("weave: ", job(), ": rank ", rank, " reached rank 0 but not all ranks joined within ",
                       opt.timeout.count(), " ms (", e.what(), ")"));
  }
  if (!v.ok) throw Error(concat("weave: net bootstrap: rank ", rank, " failed, rank 0 says: ", text));
  for (int r = 0; r < world; ++r) {
    size_t end = std::min(text.find('\n'), text.size());
    hosts[r] = text.substr(0, end);
    text.erase(0, end + 1);
  }
  peers[0] = std::move(s);
}

NetBootstrap::NetBootstrap(const LaunchInfo& info, NetBootstrapOptions opts) : impl_(std::make_unique<Impl>()) {
  WEAVE_CHECK(info.world >= 1 && info.rank >= 0 && info.rank < info.world, "net bootstrap: rank ", info.rank,
              " outside world ", info.world);
  Impl& m = *impl_;
  m.info = info;
  m.rank = info.rank;
  m.world = info.world;
  m.opt = std::move(opts);
  // weave-run --nodes gives each simulated node its own name here; real hosts use their own.
  if (m.opt.hostname.empty()) m.opt.hostname = env::get_string("WEAVE_HOSTNAME");
  if (m.opt.hostname.empty()) m.opt.hostname = own_hostname();
  if (m.opt.tag.empty()) m.opt.tag = info.job_id;
  WEAVE_CHECK(m.opt.hostname.size() <= kMaxHost && m.opt.hostname.find('\n') == std::string::npos,
              "net bootstrap: hostname '", m.opt.hostname, "' is longer than ", kMaxHost, " bytes or has a newline");
  WEAVE_CHECK(!m.opt.tag.empty() && m.opt.tag.size() <= kMaxTag, "net bootstrap: the job tag must have 1 to ", kMaxTag,
              " bytes");
  m.peers.resize(info.world);
  m.hosts.assign(info.world, "");
  m.hosts[info.rank] = m.opt.hostname;
  if (info.world == 1) return;
  if (m.opt.address.empty()) m.opt.address = rendezvous_address(info);
  m.hp = split_address(m.opt.address);
  auto deadline = Clock::now() + m.opt.timeout;
  if (info.rank == 0) m.connect_root(deadline);
  else m.connect_leaf(deadline);
}

NetBootstrap::~NetBootstrap() = default;

int NetBootstrap::rank() const { return impl_->rank; }
int NetBootstrap::world() const { return impl_->world; }
const std::vector<std::string>& NetBootstrap::hostnames() const { return impl_->hosts; }

void NetBootstrap::all_gather(const void* mine, void* all, size_t bytes) {
  WEAVE_CHECK(bytes == 0 || (mine && all), "net bootstrap: all_gather with a null buffer");
  impl_->exchange(kGather, mine, all, bytes, -1, nullptr);
}

void NetBootstrap::barrier() { impl_->exchange(kBarrier, nullptr, nullptr, 0, -1, nullptr); }

std::function<std::string()> NetBootstrap::set_interrupt(std::function<std::string()> why) {
  return std::exchange(impl_->interrupt, std::move(why));
}

}  // namespace weave::runtime
