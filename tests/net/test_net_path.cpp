// NetPath in its CPU mode (host memory, no CUDA call) between forked processes joined over
// NetBootstrap at a loopback rendezvous, with injected host names to simulate nodes: the host
// producers' path through ring, proxy and transport in both notification modes, the node split,
// the call bookkeeping, a peer that exits, a rank's abort reaching every peer, and the agreement
// of calls' arguments that the inter-node operators start with (net_common/call.hpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check/free_port.hpp"
#include "net_common/call.hpp"
#include "check/seed.hpp"
#include "ranks.hpp"
#include "weave/common/error.hpp"
#include "weave/net/net_path.hpp"
#include "weave/net/queue.cuh"

namespace net = weave::net;
using net::Command;
using net::test::describe;
using net::test::run_processes;
using weave::check::free_port;

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }


// Rank r of `world`, on host hosts[r], CPU mode over tcp on loopback.
struct Job {
  int world;
  std::vector<std::string> hosts;
  std::string address = "127.0.0.1:" + std::to_string(free_port());
  std::string id = "netpath-test-" + std::to_string(getpid()) + "-" + std::to_string(free_port());

  net::NetPathOptions options(int r, net::Notify mode = net::Notify::automatic) const {
    net::NetPathOptions o;
    o.gpu = false;
    o.transport = {"tcp", "lo", mode, false};
    o.send_bytes = 1 << 20;
    o.recv_bytes = 2 << 20;
    o.proxy.flags = 1024;
    o.proxy.timeout_s = 5;
    o.boot.address = address;
    o.boot.hostname = hosts[r];
    o.boot.timeout = std::chrono::seconds(10);
    return o;
  }
  weave::runtime::LaunchInfo info(int r) const {
    int local = 0, local_world = 0;
    for (int q = 0; q < world; ++q) {
      local_world += hosts[q] == hosts[r];
      local += q < r && hosts[q] == hosts[r];
    }
    return {r, world, local, local_world, id, "test"};
  }
};

uint8_t pattern(uint64_t seed, int rank, uint64_t call, size_t pos) {
  uint64_t x = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t(rank) + 1)) ^ (0xbf58476d1ce4e5b9ull * (call + 1)) ^ (pos * 0x94d049bb133111ebull);
  x ^= x >> 29;
  x *= 0xff51afd7ed558ccdull;
  return static_cast<uint8_t>(x >> 56);
}

// Every rank sends `pieces` pieces of ragged size to every other rank per call, `calls` calls, in
// the slots begin_call hands out: as the collectives do, every rank hears from every peer in every
// call (the path's rule for reusing a slot two calls later). The receiver checks every byte once
// the flag is up and consumes the flag (as the kernels do); the sender reuses its send buffer only
// once its earlier commands completed (the kernels' send gate).
constexpr size_t kRegion = 64 << 10;  // per sender in a receive slot

std::string all_to_all_calls(net::NetPath& path, uint64_t seed, int calls, int pieces) {
  const int r = path.rank(), w = path.world();
  net::Producer prod{path.host_queue()};
  const auto sizes = [&](int k, int sender) {
    std::mt19937_64 rng(seed + k * 64 + sender);
    std::vector<size_t> s(pieces);
    for (auto& x : s) x = rng() % 9000;  // ragged, some 0
    return s;
  };
  for (int k = 0; k < calls; ++k) {
    const net::NetPath::Call call = path.begin_call(uint64_t(pieces) * (w - 1));
    require(call.index == uint64_t(k) && call.slot == k % 2, "call numbering");
    require(prod.wait_completed(call.commands_before), path.proxy().error());
    const std::vector<size_t> mine = sizes(k, r);
    size_t off = 0;
    for (int p = 0; p < pieces; ++p) {
      for (size_t i = 0; i < mine[p]; ++i) path.send_buffer()[off + i] = static_cast<char>(pattern(seed, r, k, off + i));
      for (int q = 0; q < w; ++q)
        if (q != r)
          require(prod.push(Command{off, call.recv_offset + r * kRegion + off, mine[p], 1,
                                    call.flag_offset + uint32_t(r * pieces + p), uint16_t(q), net::kNotify, 0}),
                  path.proxy().error());
      off += mine[p];
    }
    for (int q = 0; q < w; ++q) {
      if (q == r) continue;
      const std::vector<size_t> theirs = sizes(k, q);
      off = 0;
      for (int p = 0; p < pieces; ++p) {
        const uint32_t flag = call.flag_offset + uint32_t(q * pieces + p);
        path.proxy().wait_arrival(flag, 1, 10);
        for (size_t i = 0; i < theirs[p]; ++i)
          if (static_cast<uint8_t>(path.recv_buffer()[call.recv_offset + q * kRegion + off + i]) != pattern(seed, q, k, off + i))
            throw std::runtime_error("call " + std::to_string(k) + " from rank " + std::to_string(q) + " piece " +
                                     std::to_string(p) + ": byte " + std::to_string(i) + " wrong");
        net::queue_detail::store_release(&path.flags()[flag], 0);  // consume
        off += theirs[p];
      }
    }
  }
  path.check();
  path.shutdown();
  return path.transport().describe();
}

TEST(NetPath, HostProducersBetweenSimulatedNodesInBothModes) {
  const uint64_t seed = weave::check::test_seed();
  for (net::Notify mode : {net::Notify::ordered, net::Notify::unordered}) {
    SCOPED_TRACE(std::string(net::notify_name(mode)));
    const Job job{2, {"simnode/0", "simnode/1"}};
    const auto out = run_processes(2, [&](int r) {
      net::NetPath path(job.info(r), job.options(r, mode));
      require(path.topo().nodes == 2 && path.topo().gpus == 1, "topology");
      require(path.transport().notify() == mode, "notification mode");
      require(path.device() == -1 && !path.gpu(), "CPU mode");
      return all_to_all_calls(path, seed, 40, 5);
    });
    for (const auto& o : out) EXPECT_TRUE(o.returned) << describe(out);
    std::printf("%s\n", out[0].text.c_str());
  }
}

TEST(NetPath, FourRanksOnTwoNodes) {
  const uint64_t seed = weave::check::test_seed();
  const Job job{4, {"a", "a", "b", "b"}};
  const auto out = run_processes(4, [&](int r) {
    net::NetPath path(job.info(r), job.options(r));
    require(path.topo().nodes == 2 && path.topo().gpus == 2, "topology");
    return all_to_all_calls(path, seed, 10, 3);
  });
  for (const auto& o : out) EXPECT_TRUE(o.returned) << describe(out);
}

// Nodes whose ranks are not contiguous blocks (a, b, a, b) are refused on every rank, by name.
TEST(NetPath, RefusesInterleavedNodes) {
  const Job job{4, {"a", "b", "a", "b"}};
  const auto out = run_processes(4, [&](int r) {
    net::NetPath path(job.info(r), job.options(r));
    return std::string("accepted");
  });
  for (const auto& o : out)
    EXPECT_TRUE(!o.returned && has(o.text, "contiguous block") && has(o.text, "rank 1")) << describe(out);
}

// The launcher's local rank and size against the nodes by host name. Two torchrun agents of one
// rank each on one host (LOCAL_WORLD_SIZE=1, one host name): a node of 2 ranks the launcher does
// not know, refused on every rank, naming the way out. One host split by WEAVE_HOSTNAME into nodes
// of one rank (mpirun's local size 2 there): accepted, nodes of one rank need no node communicator.
TEST(NetPath, LauncherNodesMustBeTheHostNodes) {
  const Job same_host{2, {"h", "h"}};
  auto out = run_processes(2, [&](int r) {
    weave::runtime::LaunchInfo i = same_host.info(r);
    i.local_rank = 0;
    i.local_world = 1;
    net::NetPath path(i, same_host.options(r));
    return std::string("accepted");
  });
  for (const auto& o : out)
    EXPECT_TRUE(!o.returned && has(o.text, "rank 0 (host 'h') is local rank 0 of a node of 2 ranks by host name") &&
                has(o.text, "says local rank 0 of 1") && has(o.text, "WEAVE_HOSTNAME"))
        << describe(out);
  const Job split{2, {"h/a", "h/b"}};
  out = run_processes(2, [&](int r) {
    weave::runtime::LaunchInfo i = split.info(r);
    i.local_rank = r;
    i.local_world = 2;
    net::NetPath path(i, split.options(r));
    path.shutdown();
    return std::to_string(path.topo().nodes) + "x" + std::to_string(path.topo().gpus);
  });
  for (const auto& o : out) EXPECT_TRUE(o.returned && o.text == "2x1") << describe(out);
}

TEST(NetPath, ModeMismatchesAreErrors) {
  const Job job{1, {"solo"}};
  const auto out = run_processes(1, [&](int) {
    net::NetPath path(job.info(0), job.options(0));
    std::string got;
    try {
      path.handle();
    } catch (const weave::Error& e) {
      got += e.what();
    }
    path.shutdown();
    try {
      path.begin_call(1);
    } catch (const weave::Error& e) {
      got += std::string(" | ") + e.what();
    }
    return got;
  });
  ASSERT_TRUE(out[0].returned) << describe(out);
  EXPECT_TRUE(has(out[0].text, "GPU mode") && has(out[0].text, "after its shutdown")) << out[0].text;
}

// Options that must match across ranks (each rank computes where it writes into a peer from its
// own): a different receive size, or a different flag count, is refused on every rank alike.
TEST(NetPath, DifferentPathOptionsAreRefusedOnEveryRank) {
  for (int which = 0; which < 2; ++which) {
    const Job job{2, {"n0", "n1"}};
    const auto out = run_processes(2, [&](int r) {
      net::NetPathOptions o = job.options(r);
      if (r == 1 && which == 0) o.recv_bytes *= 2;
      if (r == 1 && which == 1) o.proxy.flags *= 2;
      net::NetPath path(job.info(r), o);
      return std::string("accepted");
    });
    const char* want = which == 0 ? "recv_bytes" : "arrival flags";
    for (const auto& o : out) EXPECT_TRUE(!o.returned && has(o.text, want)) << which << ": " << describe(out);
  }
}

// A rank that failed (abort) but lives on, not shutting down: its peer's shutdown, waiting for it
// in the bootstrap's barrier, ends with the failure within the proxy's timeout, not when the
// failed rank's process ends (it sleeps past the test's checks).
TEST(NetPath, ShutdownDoesNotWaitForAFailedPeer) {
  const Job job{2, {"n0", "n1"}};
  const auto out = run_processes(2, [&](int r) {
    net::NetPath path(job.info(r), job.options(r));
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(700));
      path.abort("rank 1 failed and stays");
      std::this_thread::sleep_for(std::chrono::seconds(6));
      return std::string("slept");
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::string got = "shutdown returned";
    try {
      path.shutdown();
    } catch (const weave::Error& e) {
      got = e.what();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return got + (s < 4 ? " [in time]" : " [too late]");
  }, std::chrono::seconds(20));
  EXPECT_TRUE(out[0].returned && has(out[0].text, "rank 1 failed and stays") && has(out[0].text, "[in time]"))
      << describe(out);
}

// A peer that exits while the other waits for its chunk: the survivor's wait ends with the
// proxy's diagnostic naming the peer, well within the test's deadline.
TEST(NetPath, PeerThatExitsIsNamed) {
  const Job job{2, {"n0", "n1"}};
  const auto out = run_processes(2, [&](int r) {
    net::NetPath path(job.info(r), job.options(r));
    if (r == 1) _exit(42);
    try {
      path.proxy().wait_arrival(0, 1, 20);
    } catch (const weave::Error& e) {
      path.check();  // must throw as well: the path failed
      return std::string("wait returned but check() did not throw: ") + e.what();
    }
    return std::string("chunk arrived from a dead peer");
  }, std::chrono::seconds(25));
  ASSERT_EQ(out[1].exit_code, 42) << describe(out);
  EXPECT_TRUE(!out[0].returned && has(out[0].text, "weave::net rank 0") && has(out[0].text, "peer 1")) << describe(out);
}

// A host-side error of one rank (abort) ends the peer's wait with that rank's reason.
TEST(NetPath, AbortReachesEveryPeer) {
  const Job job{3, {"n0", "n1", "n2"}};
  const auto out = run_processes(3, [&](int r) {
    net::NetPath path(job.info(r), job.options(r));
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      path.abort("the test's rank 2 gives up");
      path.check();
      return std::string("check() after abort did not throw");
    }
    path.proxy().wait_arrival(0, 1, 20);
    return std::string("chunk arrived");
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(!out[r].returned && has(out[r].text, "the test's rank 2 gives up")) << describe(out);
  EXPECT_TRUE(has(out[0].text, "rank 2 failed")) << describe(out);
}

// The agreement (net_common/call.hpp's agree), as the inter-node operators call it: a key agreed
// once is not agreed again (rank 0 calls twice, rank 1 once: a second rendezvous would wait for
// rank 1 until the bootstrap's timeout); different operators with equal arguments throw on every
// rank, naming both; one rank's problem throws its own error there and the verdict on the other;
// a problem on the key agreed last fails the path (the peer, already launched, learns it).
// One rank of the agreement tests: its path, with WEAVE_DEBUG=0 (the once-per-key path; agree reads
// it at its first call), and three keys.
struct Agreeing {
  net::NetPath path;
  net::AgreedKeys agreed;
  const std::vector<long long> A{net::kOpAllGather, 100, 1}, C{net::kOpReduceScatter, 400, 1},
      D{net::kOpAllReduce, 64, 3};
  Agreeing(const Job& job, int r, const net::NetPathOptions& o)
      : path((setenv("WEAVE_DEBUG", "0", 1), job.info(r)), o) {}
  Agreeing(const Job& job, int r) : Agreeing(job, r, job.options(r)) {}
  net::AgreedCall agree(const std::vector<long long>& key, const std::string& problem = "") {
    return net::agree(path, agreed, key, problem, "test", "count, dtype");
  }
  // Waits until `peer`'s post of this rank's next call is here (up to 20 s), so that the call sees it.
  void await_post(int peer) {
    net::CallPost p;
    const uint64_t n = path.proxy().calls_posted() + 1;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (path.proxy().read_post(peer, n, p) != n && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // As a launched kernel would: wait for a chunk the peers never send, until the path fails.
  std::string wait_like_a_kernel() {
    try {
      path.proxy().wait_arrival(0, 1, 20);
    } catch (const weave::Error& e) {
      return e.what();
    }
    return "no failure";
  }
};

// The calls' mailbox (net_common/call.hpp): a new key waits for every rank and fails on every rank
// alike; an agreed key goes on without waiting (a peer asleep does not hold it up, up to a ring of
// calls ahead), however the keys alternate; a problem of one rank on an agreed key fails the path
// on both, as a launched kernel would see it.
TEST(NetPath, CallAgreement) {
  const Job job{2, {"n0", "n1"}};
  const auto out = run_processes(2, [&](int r) {
    Agreeing x(job, r);
    (void)x.agree(x.A);
    (void)x.agree(x.A);
    std::string report;
    try {
      (void)x.agree({r == 0 ? net::kOpAllGather : net::kOpAllReduce, 200, 1});
      report += "different operators agreed; ";
    } catch (const weave::Error& e) {
      report += has(e.what(), "(operator, count, dtype)") && has(e.what(), "all_gather(count 200, dtype 1)") &&
                        has(e.what(), "all_reduce(count 200, dtype 1)")
                    ? "mismatch ok; "
                    : std::string("mismatch message: ") + e.what() + "; ";
    }
    try {
      (void)x.agree({net::kOpReduceScatter, 300, 1}, r == 1 ? "rank 1's buffer is short" : "");
      report += "a rank's problem agreed; ";
    } catch (const weave::Error& e) {
      const bool ok = r == 1 ? has(e.what(), "rank 1's buffer is short") : has(e.what(), "rank 1 rejected its arguments");
      report += ok ? "problem ok; " : std::string("problem message: ") + e.what() + "; ";
    }
    try {  // a rank's problem that also changes its key (a buffer outside the heap has no place)
      (void)x.agree({net::kOpReduceScatter, 400, r == 1 ? 7 : 1}, r == 1 ? "rank 1's buffer is outside the heap" : "");
      report += "a rank's problem with its own key agreed; ";
    } catch (const weave::Error& e) {
      const bool ok = r == 1 ? has(e.what(), "outside the heap") : has(e.what(), "rank 1 rejected its arguments");
      report += ok ? "problem key ok; " : std::string("problem key message: ") + e.what() + "; ";
    }
    (void)x.agree(x.C);  // usable after both: no rank launched
    // Steady state, keys alternating: rank 1 sleeps first; rank 0's agreed calls, fewer than the
    // ring holds, must not wait for it. Then three rings more on both (rank 0 waits where it would
    // run a ring ahead of rank 1's posts, and both finish).
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < net::kCallRing - 2; ++i) (void)x.agree(i % 2 ? x.C : x.A);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0 && s > 1.0) report += "agreed calls waited for the peer (" + std::to_string(s) + " s); ";
    for (int i = 0; i < 3 * net::kCallRing; ++i) (void)x.agree(i % 2 ? x.A : x.C);
    (void)x.agree({net::kOpAllReduce, 500, 2});  // meet again
    std::string msg;
    if (r == 0) {
      x.await_post(1);  // rank 1 launched first (had it seen rank 0's post, it would have joined it)
      try {
        (void)x.agree(x.C, "rank 0's pointer is bad");
        msg = "an agreed key's problem passed";
      } catch (const weave::Error& e) {
        msg = e.what();
      }
    } else {
      (void)x.agree(x.C);
      msg = x.wait_like_a_kernel();  // rank 0 fails the path instead of launching
    }
    report += has(msg, "rank 0's pointer is bad") ? "agreed-key problem ok; " : "agreed-key message: " + msg + "; ";
    return report;
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(out[r].returned && out[r].text == "mismatch ok; problem ok; problem key ok; agreed-key problem ok; ")
        << describe(out);
}

// A rank with a problem on an agreed key posts that it waits for a joint verdict; a peer that finds
// that post before deciding joins it instead of launching, so both reject the call and the path
// stays usable (a peer that launched first would find the path failed: CallAgreement's last case).
TEST(NetPath, AgreedKeyJoinsAPeerWaitingForAVerdict) {
  const Job job{2, {"n0", "n1"}};
  const auto out = run_processes(2, [&](int r) {
    Agreeing x(job, r);
    (void)x.agree(x.A);
    (void)x.agree(x.C);
    std::string report;
    for (int round = 0; round < 3; ++round) {  // the peer with the problem alternates, twice rank 1
      const int bad = round % 2 == 0 ? 1 : 0;
      const std::vector<long long>& key = round == 1 ? x.C : x.A;
      if (r != bad) x.await_post(bad);  // the call must see the peer's post
      try {
        (void)x.agree(key, r == bad ? "rank " + std::to_string(bad) + "'s buffer is short" : "");
        report += "launched; ";
      } catch (const weave::Error& e) {
        const bool ok = r == bad ? has(e.what(), "buffer is short")
                                 : has(e.what(), "rank " + std::to_string(bad) + " rejected its arguments");
        report += ok ? "rejected; " : std::string("message: ") + e.what() + "; ";
      }
    }
    try {
      x.path.check();
      (void)x.agree(x.A);  // the path is usable, and the key still agreed
      report += "usable";
    } catch (const weave::Error& e) {
      report += std::string("path failed: ") + e.what();
    }
    x.path.bootstrap().barrier();  // no rank tears its path down while a peer is still in a call
    return report;
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_TRUE(out[r].returned && out[r].text == "rejected; rejected; rejected; usable") << describe(out);
}

// A rank that fails between the agreement and its launch (an allocation, a node stage) fails the
// path, so the peer that launched is released instead of waiting for the wait timeout.
TEST(NetPath, FailureAfterAgreementFailsThePath) {
  const Job job{2, {"n0", "n1"}};
  const auto out = run_processes(2, [&](int r) {
    Agreeing x(job, r);
    std::string msg;
    try {
      const net::AgreedCall call = x.agree(x.A);
      if (r == 0) throw weave::Error("rank 0: out of memory (simulated)");
      msg = x.wait_like_a_kernel();  // rank 1 launched: its kernel waits for rank 0
    } catch (const weave::Error& e) {
      msg = e.what();
    }
    x.path.bootstrap().barrier();
    if (r == 0) {
      if (!has(msg, "out of memory")) return "rank 0's own error lost: " + msg;
      try {
        x.path.check();
        return std::string("path usable after rank 0's failure");
      } catch (const weave::Error& e) {
        msg = e.what();
      }
    }
    return has(msg, "failed after every rank agreed on the call") ? std::string("ok") : "message: " + msg;
  });
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(out[r].returned && out[r].text == "ok") << describe(out);
}

// A new key's agreement waits for a peer's post up to the path's wait timeout, then fails the
// path, so that the peer, when it comes, fails too instead of waiting for this rank's check.
TEST(NetPath, AgreementWaitEndsAtThePathsTimeoutOnEveryRank) {
  const Job job{2, {"n0", "n1"}};
  const auto out = run_processes(2, [&](int r) {
    net::NetPathOptions o = job.options(r);
    o.wait_timeout_s = 1;
    Agreeing x(job, r, o);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    try {
      (void)x.agree(x.A);
    } catch (const weave::Error& e) {
      return std::string(e.what()) + (x.path.proxy().failed() ? " [path failed]" : " [path healthy]");
    }
    return std::string("agreed");
  }, std::chrono::seconds(20));
  EXPECT_TRUE(out[0].returned && has(out[0].text, "did not post") && has(out[0].text, "within 1 s") &&
              has(out[0].text, "[path failed]"))
      << describe(out);
  EXPECT_TRUE(out[1].returned && has(out[1].text, "[path failed]")) << describe(out);
}

// Ranks whose calls differ while neither waits for the other: each within seconds an error on both
// ranks naming both calls, not a wait timeout. (1) The proxies' comparison alone: posts made
// directly, so neither rank's call compares before launching. (2) Inside a burst of agreed calls,
// the third differing, with the ranks in step and with the last a second behind, at 2 and 3
// ranks. (3) Agreed keys that differ at one call (caught by whichever rank reads the other's post
// first, or the proxies). (4)
// An agreed key on one rank against a new key on the other: the waiting rank finds the launched
// post and fails the path.
TEST(NetPath, CallWatchdog) {
  const auto run = [](const char* what, auto&& body, int world = 2) {
    Job job{world, {}};
    for (int r = 0; r < world; ++r) job.hosts.push_back("n" + std::to_string(r));
    const auto out = run_processes(world, [&](int r) {
      Agreeing x(job, r);
      const auto t0 = std::chrono::steady_clock::now();
      const std::string msg = body(x, r);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      x.path.bootstrap().barrier();  // a rank that threw first must not end its path (a note of its own) early
      return s < 5 ? msg : "took " + std::to_string(s) + " s: " + msg;
    });
    for (int r = 0; r < world; ++r)
      EXPECT_TRUE(out[r].returned && out[r].text == "ok") << what << " (" << world << " ranks): " << describe(out);
  };
  const auto names = [](const std::string& msg, const char* a, const char* b) {
    return has(msg, a) && has(msg, b) ? std::string("ok") : "message: " + msg;
  };
  const char* kA = "all_gather(count 100, dtype 1)";
  const char* kC = "reduce_scatter(count 400, dtype 1)";
  run("watchdog alone", [&](Agreeing& x, int r) {
    net::CallPost p;
    p.call = x.path.proxy().calls_posted() + 1;
    p.nvalues = 2;
    p.values[0] = net::kOpAllGather;
    p.values[1] = 100 + r;
    std::snprintf(p.text, sizeof(p.text), "plan of rank %d", r);
    x.path.proxy().post_call(p);
    const std::string msg = x.wait_like_a_kernel();
    return has(msg, "proxy after") ? names(msg, "plan of rank 0", "plan of rank 1") : "message: " + msg;
  });
  for (const int world : {2, 3})
    for (const int lag_ms : {0, 1000})
      run(lag_ms ? "burst, the last rank a second behind" : "burst", [&](Agreeing& x, int r) {
        try {  // a rank still in the first calls may be stopped there (its peers ran on to the third)
          (void)x.agree(x.A);
          (void)x.agree(x.C);
          if (r == x.path.world() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(lag_ms));
          for (int i = 0; i < 40; ++i) (void)x.agree(i == 2 && r == 0 ? x.C : x.A);
          return names(x.wait_like_a_kernel(), kA, kC);
        } catch (const weave::Error& e) {
          return names(e.what(), kA, kC);
        }
      }, world);
  for (const bool new_key : {false, true})
    run(new_key ? "agreed key against a new key" : "agreed keys", [&](Agreeing& x, int r) {
      (void)x.agree(x.A);
      (void)x.agree(x.C);
      const char* theirs = new_key ? "all_reduce(count 64, dtype 3)" : kC;
      try {
        (void)x.agree(r == 0 ? x.A : (new_key ? x.D : x.C));
        return names(x.wait_like_a_kernel(), kA, theirs);
      } catch (const weave::Error& e) {
        return names(e.what(), kA, theirs);
      }
    });
}

}  // namespace
