// Star through local rank 0: it listens on an abstract Unix socket (no file on disk, gone when
// the last fd closes) named by uid and job id; every collective is "send to rank 0, rank 0
// answers everyone with everything". Fine for the few start-up exchanges it serves.
#include "weave/runtime/bootstrap.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "weave/common/error.hpp"

namespace weave::runtime {
namespace {

using detail::concat;
using Clock = std::chrono::steady_clock;
using Deadline = std::optional<Clock::time_point>;  // nullopt: wait forever

constexpr uint32_t kMagic = 0x57454156;  // "WEAV"
constexpr uint32_t kVersion = 1;
constexpr int kMaxFds = 253;  // SCM_MAX_FD: the most fds one message can carry

struct Hello {
  uint32_t magic, version;
  int32_t rank, world;
};
struct Verdict {  // rank 0's answer to a Hello, followed by `text_len` bytes of reason
  uint32_t magic;
  int32_t ok;
  uint32_t text_len;
};
enum Op : uint32_t { kGather = 1, kBarrier = 2, kFd = 3 };
struct Header {
  uint32_t op, nfds;
  uint64_t seq, bytes;
};

const char* op_name(uint32_t op) {
  switch (op) {
    case kGather: return "all_gather";
    case kBarrier: return "barrier";
    case kFd: return "all_gather_fd";
  }
  return "unknown";
}

[[noreturn]] void sys_fail(const std::string& what) {
  int e = errno;
  throw Error(concat("weave: bootstrap: ", what, ": ", std::strerror(e)));
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);  // close(2) may fail with EINTR; retrying could close a reused fd
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Returns false when the deadline passes first.
bool wait_readable(int fd, const Deadline& deadline) {
  for (;;) {
    int ms = -1;
    if (deadline) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return false;
      ms = static_cast<int>(std::min<long long>(left, 1 << 30));
    }
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) sys_fail("poll");
  }
}

void send_all(int fd, const void* data, size_t n, const std::string& peer) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);  // a dead peer must be an error, not SIGPIPE
    if (w < 0) {
      if (errno == EINTR) continue;
      sys_fail(concat("sending to ", peer, " (did it exit?)"));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Sends `n` >= 1 bytes with `fds` attached to the first byte.
void send_with_fds(int fd, const void* data, size_t n, const std::vector<int>& fds, const std::string& peer) {
  if (fds.empty()) return send_all(fd, data, n, peer);
  std::vector<char> ctl(CMSG_SPACE(fds.size() * sizeof(int)));
  iovec iov{const_cast<void*>(data), n};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl.data();
  m.msg_controllen = ctl.size();
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  ssize_t w;
  do w = ::sendmsg(fd, &m, MSG_NOSIGNAL);
  while (w < 0 && errno == EINTR);
  if (w < 0) sys_fail(concat("sending file descriptors to ", peer, " (did it exit?)"));
  send_all(fd, static_cast<const char*>(data) + w, n - static_cast<size_t>(w), peer);
}

// Receives exactly `n` bytes; file descriptors that arrive with them are appended to `fds` (at
// most `max_fds`; more is an error).
void recv_all(int fd, void* data, size_t n, const std::string& peer, const Deadline& deadline = {},
              std::vector<Fd>* fds = nullptr, size_t max_fds = 0) {
  auto* p = static_cast<char*>(data);
  std::vector<char> ctl(CMSG_SPACE(std::max<size_t>(max_fds, 1) * sizeof(int)));
  while (n > 0) {
    if (deadline && !wait_readable(fd, deadline))
      throw Error(concat("weave: bootstrap: timed out waiting for ", peer));
    iovec iov{p, n};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.data();
    m.msg_controllen = ctl.size();
    ssize_t r = ::recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      sys_fail(concat("receiving from ", peer));
    }
    if (r == 0) throw Error(concat("weave: bootstrap: ", peer, " closed the connection (it exited or failed)"));
    size_t dropped = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; ++i) {
        int f;
        std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        Fd owned(f);
        if (fds && fds->size() < max_fds) fds->push_back(std::move(owned));
        else ++dropped;
      }
    }
    if ((m.msg_flags & MSG_CTRUNC) || dropped > 0)
      throw Error(concat("weave: bootstrap: unexpected file descriptors from ", peer));
    p += r;
    n -= static_cast<size_t>(r);
  }
}

std::string rank_name(int r) { return concat("rank ", r); }

// Abstract names are limited to 107 bytes; a longer job id is replaced by its hash.
sockaddr_un socket_address(const std::string& job_id, socklen_t& len) {
  std::string name = concat("weave-", ::getuid(), "-", job_id);
  sockaddr_un a{};
  if (name.size() + 1 > sizeof(a.sun_path)) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char ch : job_id) h = (h ^ ch) * 1099511628211ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    name = concat("weave-", ::getuid(), "-#", hex);
  }
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract namespace
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

}  // namespace

struct Bootstrap::Impl {
  LaunchInfo info;
  std::vector<Fd> peers;  // rank 0: peers[r] for r >= 1; other ranks: peers[0] is rank 0
  uint64_t seq = 0;
  std::string broken;  // why the bootstrap became unusable; empty while usable

  void connect_root(Clock::time_point deadline, std::chrono::milliseconds timeout);
  void connect_leaf(Clock::time_point deadline, std::chrono::milliseconds timeout);
  void exchange(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds);
  void exchange_root(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds);
  void exchange_leaf(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds);
  // Best effort: tell connected peers why the job failed, then close, so none of them hangs.
  void abort_peers(const std::string& why) {
    Verdict v{kMagic, 0, static_cast<uint32_t>(why.size())};
    for (auto& p : peers) {
      if (p.get() < 0) continue;
      (void)::send(p.get(), &v, sizeof v, MSG_NOSIGNAL | MSG_DONTWAIT);
      (void)::send(p.get(), why.data(), why.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      p.reset();
    }
  }
};

void Bootstrap::Impl::connect_root(Clock::time_point deadline, std::chrono::milliseconds timeout) {
  socklen_t len;
  sockaddr_un addr = socket_address(info.job_id, len);
  Fd lis(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (lis.get() < 0) sys_fail("socket");
  if (::bind(lis.get(), reinterpret_cast<sockaddr*>(&addr), len) < 0) {
    if (errno == EADDRINUSE)
      throw Error(concat("weave: bootstrap: job id '", info.job_id,
                         "' is already in use on this node by another rank 0 (job ids must be unique per job)"));
    sys_fail(concat("bind to the socket of job '", info.job_id, "'"));
  }
  if (::listen(lis.get(), SOMAXCONN) < 0) sys_fail("listen");

  int joined = 0;
  while (joined < info.world - 1) {
    if (!wait_readable(lis.get(), deadline)) {
      std::string missing;
      for (int r = 1; r < info.world; ++r)
        if (peers[r].get() < 0) missing += concat(missing.empty() ? "" : ", ", r);
      std::string why = concat("weave: bootstrap of job '", info.job_id, "' timed out after ", timeout.count(),
                               " ms: rank(s) ", missing, " of ", info.world, " never connected to rank 0");
      abort_peers(why);
      throw Error(why);
    }
    Fd c(::accept4(lis.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (c.get() < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      sys_fail("accept");
    }
    // Abstract sockets have no file permissions: only accept our own user's processes.
    ucred cred{};
    socklen_t cl = sizeof cred;
    if (::getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) sys_fail("getsockopt(SO_PEERCRED)");
    if (cred.uid != ::getuid()) continue;
    Hello h{};
    try {
      recv_all(c.get(), &h, sizeof h, "a connecting rank", deadline);
    } catch (const Error&) {
      continue;  // a peer that vanished before introducing itself shows up as missing later
    }
    std::string reject;
    if (h.magic != kMagic || h.version != kVersion)
      reject = "a process that is not a weave bootstrap peer of this version connected to rank 0";
    else if (h.world != info.world)
      reject = concat("rank ", h.rank, " has world size ", h.world, " but rank 0 has ", info.world);
    else if (h.rank < 1 || h.rank >= info.world)
      reject = concat("a peer claims rank ", h.rank, ", outside [1, ", info.world, ")");
    else if (peers[h.rank].get() >= 0)
      reject = concat("two processes claim rank ", h.rank);
    if (!reject.empty()) {
      std::string why = concat("weave: bootstrap of job '", info.job_id, "' rejected a peer: ", reject);
      peers[0] = std::move(c);  // slot 0 is unused on rank 0: lets abort_peers tell the offender too
      abort_peers(why);
      throw Error(why);
    }
    peers[h.rank] = std::move(c);
    ++joined;
  }
  Verdict ok{kMagic, 1, 0};
  for (int r = 1; r < info.world; ++r) send_all(peers[r].get(), &ok, sizeof ok, rank_name(r));
}

void Bootstrap::Impl::connect_leaf(Clock::time_point deadline, std::chrono::milliseconds timeout) {
  socklen_t len;
  sockaddr_un addr = socket_address(info.job_id, len);
  auto pause = std::chrono::milliseconds(1);
  Fd s;
  for (;;) {
    s.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s.get() < 0) sys_fail("socket");
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0) break;
    // Refused: rank 0 is not listening yet. A socket whose connect was interrupted is not reused.
    if (errno != ECONNREFUSED && errno != ENOENT && errno != EAGAIN && errno != EINTR)
      sys_fail(concat("rank ", info.rank, " connecting to rank 0 of job '", info.job_id, "'"));
    if (Clock::now() + pause > deadline)
      throw Error(concat("weave: bootstrap: rank ", info.rank, " could not reach rank 0 of job '", info.job_id,
                         "' within ", timeout.count(), " ms (is rank 0 running with the same job id?)"));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  Hello h{kMagic, kVersion, info.rank, info.world};
  send_all(s.get(), &h, sizeof h, "rank 0");
  Verdict v{};
  try {
    recv_all(s.get(), &v, sizeof v, "rank 0", deadline);
  } catch (const Error& e) {
    throw Error(concat("weave: bootstrap: rank ", info.rank, " reached rank 0 of job '", info.job_id,
                       "' but not all ranks joined within ", timeout.count(), " ms (", e.what(), ")"));
  }
  if (v.magic != kMagic) throw Error("weave: bootstrap: rank 0 answered with a malformed message");
  if (!v.ok) {
    std::string why(std::min<uint32_t>(v.text_len, 4096), '\0');
    try {
      recv_all(s.get(), why.data(), why.size(), "rank 0", deadline);
    } catch (const Error&) {
      why = "(no reason received)";
    }
    throw Error(concat("weave: bootstrap: rank ", info.rank, " failed, rank 0 says: ", why));
  }
  peers[0] = std::move(s);
}

void Bootstrap::Impl::exchange(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds) {
  if (!broken.empty()) throw Error(concat("weave: bootstrap is unusable after an earlier error: ", broken));
  ++seq;
  try {
    if (info.rank == 0) exchange_root(op, mine, all, bytes, fd, fds);
    else exchange_leaf(op, mine, all, bytes, fd, fds);
  } catch (const Error& e) {
    // Close every connection: peers blocked in this collective see EOF instead of hanging.
    broken = e.what();
    for (auto& p : peers) p.reset();
    throw;
  }
}

void Bootstrap::Impl::exchange_root(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds) {
  const int w = info.world;
  if (bytes) std::memcpy(all, mine, bytes);
  if (fds) {
    fds->clear();
    fds->emplace_back(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    if (fds->back().get() < 0) sys_fail("dup of the fd for all_gather_fd");
    fds->resize(w);
  }
  // Serve whichever peer is ready first, so a peer that died is noticed at once.
  std::vector<int> pending;
  for (int r = 1; r < w; ++r) pending.push_back(r);
  while (!pending.empty()) {
    std::vector<pollfd> pf;
    for (int r : pending) pf.push_back({peers[r].get(), POLLIN, 0});
    if (::poll(pf.data(), pf.size(), -1) < 0) {
      if (errno == EINTR) continue;
      sys_fail("poll");
    }
    for (size_t i = pf.size(); i-- > 0;) {
      if (!pf[i].revents) continue;
      int r = pending[i];
      std::string who = rank_name(r);
      std::vector<Fd> got;
      Header h{};
      recv_all(peers[r].get(), &h, sizeof h, who, {}, &got, 1);
      if (h.seq != seq || h.op != op)
        throw Error(concat("weave: bootstrap: rank ", r, " is in collective #", h.seq, " (", op_name(h.op),
                           ") while rank 0 is in #", seq, " (", op_name(op), "): ranks called collectives in different orders"));
      if (h.bytes != bytes)
        throw Error(concat("weave: bootstrap: ", op_name(op), " size mismatch: rank ", r, " sent ", h.bytes,
                           " bytes, rank 0 ", bytes));
      if (h.nfds != (fds ? 1u : 0u) || got.size() != h.nfds)
        throw Error(concat("weave: bootstrap: rank ", r, " sent ", got.size(), " fds in ", op_name(op)));
      if (bytes) recv_all(peers[r].get(), static_cast<char*>(all) + r * bytes, bytes, who);
      if (fds) (*fds)[r] = std::move(got[0]);
      pending.erase(pending.begin() + static_cast<long>(i));
    }
  }
  Header h{op, fds ? static_cast<uint32_t>(w) : 0u, seq, bytes * w};
  std::vector<int> raw;
  if (fds)
    for (auto& f : *fds) raw.push_back(f.get());
  for (int r = 1; r < w; ++r) {
    send_with_fds(peers[r].get(), &h, sizeof h, raw, rank_name(r));
    if (bytes) send_all(peers[r].get(), all, bytes * w, rank_name(r));
  }
}

void Bootstrap::Impl::exchange_leaf(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds) {
  const int w = info.world;
  int s = peers[0].get();
  Header h{op, fds ? 1u : 0u, seq, bytes};
  send_with_fds(s, &h, sizeof h, fds ? std::vector<int>{fd} : std::vector<int>{}, "rank 0");
  if (bytes) send_all(s, mine, bytes, "rank 0");
  std::vector<Fd> got;
  recv_all(s, &h, sizeof h, "rank 0", {}, &got, fds ? w : 0);
  if (h.op != op || h.seq != seq || h.bytes != bytes * w || got.size() != h.nfds ||
      h.nfds != (fds ? static_cast<uint32_t>(w) : 0u))
    throw Error(concat("weave: bootstrap: rank ", info.rank, " got a mismatched answer from rank 0 in ", op_name(op)));
  if (bytes) recv_all(s, all, bytes * w, "rank 0");
  if (fds) *fds = std::move(got);
}

Bootstrap::Bootstrap(const LaunchInfo& info, std::chrono::milliseconds timeout) : impl_(std::make_unique<Impl>()) {
  WEAVE_CHECK(info.world >= 1 && info.rank >= 0 && info.rank < info.world, "bootstrap: rank ", info.rank,
              " outside world ", info.world);
  WEAVE_CHECK(info.local_world != info.world || info.local_rank == info.rank, "bootstrap: single-node job with rank ",
              info.rank, " but local rank ", info.local_rank);
  if (info.local_world != info.world)
    throw Error(concat("weave: bootstrap: multi-node jobs (world ", info.world, ", ", info.local_world,
                       " ranks on this node) need the MPI bootstrap, which is not built yet"));
  WEAVE_CHECK(!info.job_id.empty(), "bootstrap: empty job id");
  impl_->info = info;
  impl_->peers.resize(info.world);
  if (info.world == 1) return;
  auto deadline = Clock::now() + timeout;
  if (info.rank == 0) impl_->connect_root(deadline, timeout);
  else impl_->connect_leaf(deadline, timeout);
}

Bootstrap::~Bootstrap() = default;

int Bootstrap::rank() const { return impl_->info.rank; }
int Bootstrap::world() const { return impl_->info.world; }

void Bootstrap::all_gather(const void* mine, void* all, size_t bytes) {
  WEAVE_CHECK(bytes == 0 || (mine && all), "bootstrap: all_gather with a null buffer");
  impl_->exchange(kGather, mine, all, bytes, -1, nullptr);
}

void Bootstrap::barrier() { impl_->exchange(kBarrier, nullptr, nullptr, 0, -1, nullptr); }

std::vector<int> Bootstrap::all_gather_fd(int fd) {
  WEAVE_CHECK(fd >= 0 && ::fcntl(fd, F_GETFD) >= 0, "bootstrap: all_gather_fd got an invalid fd ", fd);
  WEAVE_CHECK(world() <= kMaxFds, "bootstrap: all_gather_fd supports at most ", kMaxFds, " ranks per node");
  std::vector<Fd> got;
  impl_->exchange(kFd, nullptr, nullptr, 0, fd, &got);
  std::vector<int> out;
  for (auto& f : got) out.push_back(f.release());
  return out;
}

}  // namespace weave::runtime
