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

#include "bootstrap_star.hpp"
#include "weave/common/error.hpp"

namespace weave::runtime {
namespace {

using namespace bootio;

constexpr uint32_t kVersion = 1;
constexpr int kMaxFds = 253;  // SCM_MAX_FD: the most fds one message can carry

struct Hello {
  uint32_t magic, version;
  int32_t rank, world;
};

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

// peers, the sequence number and the collectives: bootio::Star.
struct Bootstrap::Impl : Star {
  LaunchInfo info;

  void connect_root(Clock::time_point deadline, std::chrono::milliseconds timeout);
  void connect_leaf(Clock::time_point deadline, std::chrono::milliseconds timeout);
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
      fail_all(concat("weave: bootstrap of job '", info.job_id, "' timed out after ", timeout.count(),
                      " ms: rank(s) ", missing_ranks(), " of ", info.world, " never connected to rank 0"));
    }
    Fd c = accept_next(lis.get());
    if (c.get() < 0) continue;
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
  impl_->rank = info.rank;
  impl_->world = info.world;
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

std::function<std::string()> Bootstrap::set_interrupt(std::function<std::string()> why) {
  return std::exchange(impl_->interrupt, std::move(why));
}

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
