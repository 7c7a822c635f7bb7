// Internal to src/runtime: the socket plumbing and the star collectives that the node-local
// bootstrap (Unix sockets, bootstrap.cpp) and the bootstrap across hosts (TCP, net_bootstrap.cpp)
// share. Once every peer is connected, a collective is "send to rank 0, rank 0 answers everyone
// with everything"; only how the connections are made differs.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "weave/common/error.hpp"

namespace weave::runtime::bootio {

using detail::concat;
using Clock = std::chrono::steady_clock;
using Deadline = std::optional<Clock::time_point>;  // nullopt: wait forever

constexpr uint32_t kMagic = 0x57454156;  // "WEAV"

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

inline const char* op_name(uint32_t op) {
  switch (op) {
    case kGather: return "all_gather";
    case kBarrier: return "barrier";
    case kFd: return "all_gather_fd";
  }
  return "unknown";
}

[[noreturn]] inline void sys_fail(const std::string& what) {
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
inline bool wait_readable(int fd, const Deadline& deadline) {
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

// Sends all n bytes. With `waiting`, a send that finds the peer's socket full (a peer that is
// alive but not reading, e.g. not yet in the collective) calls it every `every_ms` until there is
// room; it ends the wait by throwing.
inline void send_all(int fd, const void* data, size_t n, const std::string& peer,
                     const std::function<void()>& waiting = {}, int every_ms = 200) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    // MSG_NOSIGNAL: a dead peer must be an error, not SIGPIPE.
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | (waiting ? MSG_DONTWAIT : 0));
    if (w < 0) {
      if (errno == EINTR) continue;
      if (waiting && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd q{fd, POLLOUT, 0};
        const int r = ::poll(&q, 1, every_ms);
        if (r < 0 && errno != EINTR) sys_fail("poll");
        if (r == 0) waiting();
        continue;
      }
      sys_fail(concat("sending to ", peer, " (did it exit?)"));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Sends `n` >= 1 bytes with `fds` attached to the first byte.
inline void send_with_fds(int fd, const void* data, size_t n, const std::vector<int>& fds, const std::string& peer) {
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
inline void recv_all(int fd, void* data, size_t n, const std::string& peer, const Deadline& deadline = {},
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
    // A TCP peer that exits with data unread resets the connection instead of closing it.
    if (r == 0 || (r < 0 && errno == ECONNRESET))
      throw Error(concat("weave: bootstrap: ", peer, " closed the connection (it exited or failed)"));
    if (r < 0) {
      if (errno == EINTR) continue;
      sys_fail(concat("receiving from ", peer));
    }
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

inline std::string rank_name(int r) { return concat("rank ", r); }

// Best effort, never blocks: a failed Verdict and its reason.
inline void send_refusal(int fd, const std::string& why) {
  Verdict v{kMagic, 0, static_cast<uint32_t>(why.size())};
  (void)::send(fd, &v, sizeof v, MSG_NOSIGNAL | MSG_DONTWAIT);
  (void)::send(fd, why.data(), why.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// The connected star: rank 0 holds peers[r] for r >= 1, every other rank holds peers[0] (rank 0).
struct Star {
  int rank = 0, world = 1;
  std::vector<Fd> peers;
  uint64_t seq = 0;
  std::string broken;  // why the bootstrap became unusable; empty while usable
  // Polled every kInterruptMs while a collective waits for its peers: a non-empty answer ends the
  // wait with that error (and the bootstrap, as any failed collective does). A peer that will
  // never come (it rejected a call its peers had launched, and told them so) then cannot hold a
  // rank in a barrier without a time limit.
  std::function<std::string()> interrupt;
  static constexpr int kInterruptMs = 200;
  void check_interrupt() const {
    if (!interrupt) return;
    if (std::string why = interrupt(); !why.empty()) throw Error(why);
  }
  // For send_all: with an interrupt set, a send that waits for room polls it.
  std::function<void()> sending_wait() const {
    if (!interrupt) return {};
    return [this] { check_interrupt(); };
  }

  // `fd`/`fds`: one fd per rank rides along (Unix sockets only); -1/nullptr otherwise.
  void exchange(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds);
  void exchange_root(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds);
  void exchange_leaf(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds);
  // Rank 0 while ranks join: "1, 3" for the ranks not connected yet.
  std::string missing_ranks() const {
    std::string missing;
    for (int r = 1; r < world; ++r)
      if (peers[r].get() < 0) missing += concat(missing.empty() ? "" : ", ", r);
    return missing;
  }
  // Rank 0 while ranks join: the next connection on listening socket `lis`, or none (-1) for now.
  static Fd accept_next(int lis) {
    Fd c(::accept4(lis, nullptr, nullptr, SOCK_CLOEXEC));
    if (c.get() < 0 && errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) sys_fail("accept");
    return c;
  }
  [[noreturn]] void fail_all(const std::string& why) {
    abort_peers(why);
    throw Error(why);
  }
  // Best effort: tell connected peers why the job failed, then close, so none of them hangs.
  void abort_peers(const std::string& why) {
    for (auto& p : peers) {
      if (p.get() < 0) continue;
      send_refusal(p.get(), why);
      p.reset();
    }
  }
};

inline void Star::exchange(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds) {
  if (!broken.empty()) throw Error(concat("weave: bootstrap is unusable after an earlier error: ", broken));
  ++seq;
  try {
    if (rank == 0) exchange_root(op, mine, all, bytes, fd, fds);
    else exchange_leaf(op, mine, all, bytes, fd, fds);
  } catch (const Error& e) {
    // Close every connection: peers blocked in this collective see EOF instead of hanging.
    broken = e.what();
    for (auto& p : peers) p.reset();
    throw;
  }
}

inline void Star::exchange_root(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds) {
  const int w = world;
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
    const int ready = ::poll(pf.data(), pf.size(), interrupt ? kInterruptMs : -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      sys_fail("poll");
    }
    if (ready == 0) {
      check_interrupt();
      continue;
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
    if (bytes) send_all(peers[r].get(), all, bytes * w, rank_name(r), sending_wait(), kInterruptMs);
  }
}

inline void Star::exchange_leaf(Op op, const void* mine, void* all, size_t bytes, int fd, std::vector<Fd>* fds) {
  const int w = world;
  int s = peers[0].get();
  Header h{op, fds ? 1u : 0u, seq, bytes};
  send_with_fds(s, &h, sizeof h, fds ? std::vector<int>{fd} : std::vector<int>{}, "rank 0");
  if (bytes) send_all(s, mine, bytes, "rank 0", sending_wait(), kInterruptMs);
  std::vector<Fd> got;
  if (interrupt)
    while (!wait_readable(s, Clock::now() + std::chrono::milliseconds(kInterruptMs))) check_interrupt();
  recv_all(s, &h, sizeof h, "rank 0", {}, &got, fds ? w : 0);
  if (h.op != op || h.seq != seq || h.bytes != bytes * w || got.size() != h.nfds ||
      h.nfds != (fds ? static_cast<uint32_t>(w) : 0u))
    throw Error(concat("weave: bootstrap: rank ", rank, " got a mismatched answer from rank 0 in ", op_name(op)));
  if (bytes) recv_all(s, all, bytes * w, "rank 0");
  if (fds) *fds = std::move(got);
}

}  // namespace weave::runtime::bootio
