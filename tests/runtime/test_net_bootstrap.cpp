// NetBootstrap across real processes on loopback: the test forks one child per rank, the child
// sets WEAVE_BOOTSTRAP=127.0.0.1:<port> and writes "ok" or its error text into a slot of a shared
// mapping; the parent reaps the children and kills any still alive at the deadline (a hang).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "check/free_port.hpp"
#include "weave/common/error.hpp"
#include "weave/runtime/net_bootstrap.hpp"

using namespace std::chrono_literals;
using weave::check::free_port;
using weave::runtime::LaunchInfo;
using weave::runtime::NetBootstrap;
using weave::runtime::NetBootstrapOptions;
using weave::runtime::NodePlace;
using weave::runtime::node_of_ranks;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kSlot = 2048;  // bytes of report per process

struct Rank {
  int rank, world;
  std::string tag = "job-a";
  std::chrono::milliseconds timeout = 5s;
};
using Body = std::function<void(const Rank&, NetBootstrapOptions)>;

struct Result {
  std::vector<std::string> msg;  // "ok", the exception text, or "hung" / "crashed"
  double seconds = 0;            // until the last process ended
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

Result run_once(const std::vector<Rank>& ranks, const Body& body, int port, std::chrono::seconds limit) {
  const size_t n = ranks.size();
  auto* shm = static_cast<char*>(mmap(nullptr, n * kSlot, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  require(shm != MAP_FAILED, "mmap");
  std::memset(shm, 0, n * kSlot);
  const auto t0 = Clock::now();
  std::vector<pid_t> pids;
  for (size_t i = 0; i < n; ++i) {
    pid_t pid = fork();
    if (pid != 0) {
      pids.push_back(pid);
      continue;
    }
    std::string out = "ok";
    try {
      setenv("WEAVE_BOOTSTRAP", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
      NetBootstrapOptions o;
      o.timeout = ranks[i].timeout;
      o.tag = ranks[i].tag;
      body(ranks[i], o);
    } catch (const std::exception& e) {
      out = e.what();
    }
    std::strncpy(shm + i * kSlot, out.c_str(), kSlot - 1);
    _exit(0);
  }
  Result res;
  res.msg.assign(n, "");
  for (size_t left = n; left > 0;) {
    bool late = Clock::now() - t0 > limit;
    for (size_t i = 0; i < n; ++i) {
      int st = 0;
      if (pids[i] < 0) continue;
      if (late) kill(pids[i], SIGKILL);
      if (waitpid(pids[i], &st, late ? 0 : WNOHANG) != pids[i]) continue;
      res.msg[i] = late && !shm[i * kSlot] ? "hung (killed at the test deadline)" : std::string(shm + i * kSlot);
      if (res.msg[i].empty()) res.msg[i] = "crashed";
      pids[i] = -1;
      --left;
    }
    std::this_thread::sleep_for(5ms);
  }
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  munmap(shm, n * kSlot);
  return res;
}

// Another program may take the port between free_port() and rank 0's bind: then try another.
Result run(const std::vector<Rank>& ranks, const Body& body, std::chrono::seconds limit = 15s) {
  for (int attempt = 0;; ++attempt) {
    Result r = run_once(ranks, body, free_port(), limit);
    bool collided = false;
    for (auto& m : r.msg) collided |= contains(m, "already in use");
    if (!collided || attempt == 4) return r;
  }
}

std::vector<Rank> job(int world, std::chrono::milliseconds timeout = 5s) {
  std::vector<Rank> v;
  for (int r = 0; r < world; ++r) v.push_back({r, world, "job-a", timeout});
  return v;
}

LaunchInfo launch(const Rank& r) { return {r.rank, r.world, 0, 1, "unused-" + r.tag, "test"}; }

#define EXPECT_ALL_OK(res)                   \
  for (size_t i_ = 0; i_ < (res).msg.size(); ++i_) \
  EXPECT_EQ((res).msg[i_], "ok") << "process " << i_

void exercise(const Rank& me, NetBootstrapOptions o) {
  o.hostname = "fake-node-" + std::to_string(me.rank / 2);  // two ranks per simulated node
  NetBootstrap b(launch(me), o);
  const int w = b.world(), r0 = b.rank();
  require(r0 == me.rank && w == me.world, "rank/world");
  for (size_t bytes : {size_t{1}, size_t{8}, size_t{13}, size_t{300 * 1024}}) {  // the last > a socket buffer
    std::vector<unsigned char> in(bytes), out(bytes * w);
    for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<unsigned char>(i * 31 + r0 * 7 + bytes);
    b.all_gather(in.data(), out.data(), bytes);
    for (int r = 0; r < w; ++r)
      for (size_t i = 0; i < bytes; i += 1 + bytes / 1000)
        require(out[r * bytes + i] == static_cast<unsigned char>(i * 31 + r * 7 + bytes),
                "all_gather of " + std::to_string(bytes) + " bytes, entry of rank " + std::to_string(r));
  }
  for (int i = 0; i < 3; ++i) b.barrier();
  // Hostnames: as rank 0 collected them, and through an all_gather of fixed-size names.
  char name[64] = {};
  std::strncpy(name, o.hostname.c_str(), sizeof name - 1);
  std::vector<char> names(sizeof name * w);
  b.all_gather(name, names.data(), sizeof name);
  std::vector<std::string> gathered;
  for (int r = 0; r < w; ++r) gathered.emplace_back(&names[r * sizeof name]);
  require(gathered == b.hostnames(), "hostnames() differs from the gathered names");
  auto places = node_of_ranks(gathered);
  for (int r = 0; r < w; ++r)
    require(places[r] == NodePlace{r / 2, r % 2}, "node_of_ranks for rank " + std::to_string(r));
}

TEST(NetBootstrap, CollectivesAcrossProcesses) {
  for (int w : {1, 2, 5}) {
    SCOPED_TRACE("world " + std::to_string(w));
    auto res = run(job(w), exercise);
    EXPECT_ALL_OK(res);
  }
}

TEST(NetBootstrap, NodeOfRanks) {
  auto p = node_of_ranks({"b", "a", "b", "c", "a", "b"});
  std::vector<NodePlace> want{{0, 0}, {1, 0}, {0, 1}, {2, 0}, {1, 1}, {0, 2}};
  EXPECT_EQ(p, want);
  EXPECT_TRUE(node_of_ranks({}).empty());
}

TEST(NetBootstrap, RendezvousAddress) {
  using weave::runtime::rendezvous_address;
  for (const char* v : {"WEAVE_BOOTSTRAP", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
  LaunchInfo torch{0, 4, 0, 2, "j", "torchrun"}, mpi{0, 4, 0, 2, "j", "mpirun"};
  setenv("MASTER_ADDR", "node7", 1);
  setenv("MASTER_PORT", "29500", 1);
  EXPECT_EQ(rendezvous_address(torch), "node7:" + std::to_string(29500 + weave::runtime::kTorchPortOffset));
  setenv("WEAVE_BOOTSTRAP", "10.0.0.1:4000", 1);
  EXPECT_EQ(rendezvous_address(torch), "10.0.0.1:4000");  // the explicit address wins
  for (const char* v : {"WEAVE_BOOTSTRAP", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
  try {
    rendezvous_address(mpi);
    FAIL() << "an OpenMPI job without WEAVE_BOOTSTRAP got an address";
  } catch (const weave::Error& e) {
    EXPECT_TRUE(contains(e.what(), "OpenMPI") && contains(e.what(), "WEAVE_BOOTSTRAP")) << e.what();
    EXPECT_FALSE(contains(e.what(), "on this host")) << e.what();
  }
  try {  // every rank on this host by OpenMPI's count: says that one node needs no network path
    rendezvous_address(LaunchInfo{0, 2, 0, 2, "j", "mpirun"});
    FAIL() << "an OpenMPI job without WEAVE_BOOTSTRAP got an address";
  } catch (const weave::Error& e) {
    EXPECT_TRUE(contains(e.what(), "all 2 ranks are on this host") && contains(e.what(), "needs no network path") &&
                contains(e.what(), "WEAVE_BOOTSTRAP=127.0.0.1:"))
        << e.what();
  }
  NetBootstrapOptions o;
  o.address = "no-port-here";
  try {
    NetBootstrap b(LaunchInfo{1, 2, 0, 1, "j", "test"}, o);
    FAIL() << "a malformed address was accepted";
  } catch (const weave::Error& e) {
    EXPECT_TRUE(contains(e.what(), "is not host:port")) << e.what();
  }
}

TEST(NetBootstrap, MismatchedTagIsTurnedAway) {
  auto ranks = job(3, 4s);
  ranks[0].timeout = 1500ms;  // rank 0 gives up first, so rank 1 hears its verdict
  ranks[2].tag = "job-b";
  auto res = run(ranks, [](const Rank& me, NetBootstrapOptions o) { NetBootstrap b(launch(me), o); });
  EXPECT_TRUE(contains(res.msg[2], "job tag is 'job-b'") && contains(res.msg[2], "two jobs on one rendezvous port"))
      << res.msg[2];
  EXPECT_TRUE(contains(res.msg[0], "rank(s) 2 of 3 never connected") &&
              contains(res.msg[0], "turned away rank 2 of host") && contains(res.msg[0], "job tag 'job-b'"))
      << res.msg[0];
  EXPECT_TRUE(contains(res.msg[1], "rank 0 says") && contains(res.msg[1], "rank(s) 2 of 3")) << res.msg[1];
}

TEST(NetBootstrap, TimeoutNamesMissingRanks) {
  auto all = job(4), ranks = std::vector<Rank>{all[0], all[2]};
  ranks[0].timeout = 500ms;
  auto res = run(ranks, [](const Rank& me, NetBootstrapOptions o) { NetBootstrap b(launch(me), o); });
  EXPECT_TRUE(contains(res.msg[0], "timed out after 500 ms: rank(s) 1, 3 of 4 never connected")) << res.msg[0];
  EXPECT_TRUE(contains(res.msg[1], "rank 0 says") && contains(res.msg[1], "1, 3")) << res.msg[1];
  EXPECT_LT(res.seconds, 3.0);
}

TEST(NetBootstrap, NoRankZero) {
  auto res = run({job(2, 300ms)[1]}, [](const Rank& me, NetBootstrapOptions o) { NetBootstrap b(launch(me), o); });
  EXPECT_TRUE(contains(res.msg[0], "rank 1 could not reach rank 0 within 300 ms")) << res.msg[0];
}

TEST(NetBootstrap, SizeMismatchIsAnError) {
  auto res = run(job(3), [](const Rank& me, NetBootstrapOptions o) {
    NetBootstrap b(launch(me), o);
    long long x[2] = {}, all[6];
    b.all_gather(x, all, me.rank == 1 ? 16 : 8);
  });
  EXPECT_TRUE(contains(res.msg[0], "size mismatch: rank 1 sent 16 bytes, rank 0 8")) << res.msg[0];
  for (auto& m : res.msg) EXPECT_NE(m, "ok");
}

// Ranks that die in an all_gather: rank 3 as it enters (the others are in it already), rank 3
// while it waits inside (a thread ends the process; rank 4 comes late, so the all_gather is still
// open), rank 0 as it enters. Every other rank throws, long before the test's deadline.
TEST(NetBootstrap, PeerDeathIsAnErrorNotAHang) {
  struct Case {
    int dying;
    bool inside;
  };
  for (Case c : {Case{3, false}, Case{3, true}, Case{0, false}}) {
    SCOPED_TRACE("rank " + std::to_string(c.dying) + (c.inside ? " exits inside" : " exits on entry"));
    auto res = run(job(5), [c](const Rank& me, NetBootstrapOptions o) {
      NetBootstrap b(launch(me), o);
      b.barrier();
      std::vector<char> in(1 << 20, 'x'), out(5 << 20);
      if (me.rank == c.dying && !c.inside) _exit(0);
      if (me.rank == c.dying) std::thread([] { std::this_thread::sleep_for(300ms), _exit(0); }).detach();
      if (c.inside && me.rank == 4) std::this_thread::sleep_for(1s);
      b.all_gather(in.data(), out.data(), in.size());
      b.barrier();  // who got its answer before rank 0 found the dead peer fails here
    }, 10s);
    EXPECT_LT(res.seconds, 5.0);
    for (int r = 0; r < 5; ++r) {
      if (r == c.dying) continue;
      const std::string who = r == 0 ? "rank " + std::to_string(c.dying) : "rank 0";
      EXPECT_TRUE(contains(res.msg[r], who + " closed the connection") ||
                  contains(res.msg[r], "sending to " + who + " (did it exit?)"))
          << "rank " << r << ": " << res.msg[r];
    }
  }
}

}  // namespace
