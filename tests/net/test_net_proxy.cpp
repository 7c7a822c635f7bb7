// The host proxy between two processes over libfabric's tcp provider on loopback, host memory:
// exactly-once delivery with the right bytes in both notification modes, backpressure on a full
// queue, partial and closed batches, the bounce-buffer path, and peers that die, hang or fail
// (a diagnostic on every surviving rank within a bounded time, never a hang).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstddef>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "check/seed.hpp"
#include "ranks.hpp"
#include "weave/net/proxy.hpp"
#include "weave/net/queue.cuh"
#include "weave/runtime/bootstrap.hpp"

namespace net = weave::net;
using net::Command;
using net::test::describe;
using net::test::run_ranks;
using weave::runtime::Bootstrap;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kSendBytes = 4 << 20;

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Byte `pos` of rank `rank`'s send region.
uint8_t pattern(uint64_t seed, int rank, size_t pos) {
  uint64_t x = seed + 0x9e3779b97f4a7c15ull * (uint64_t(rank) + 1) + 0xbf58476d1ce4e5b9ull * pos;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  return static_cast<uint8_t>(x >> 56);
}

// What `from` sends `to`: random sizes (0, under 8, odd, up to 64 KiB + 7) from random source
// offsets, packed in shuffled order into the receiver's region; chunk k for command k.
struct Plan {
  std::vector<Command> cmds;
  size_t recv_bytes = 0;
};

Plan make_plan(uint64_t seed, int from, int to, uint32_t n) {
  std::mt19937_64 rng(weave::check::derive(seed, uint64_t(from), uint64_t(to)));
  Plan p;
  p.cmds.resize(n);
  for (uint32_t k = 0; k < n; ++k) {
    const uint64_t r = rng() % 100;
    const uint64_t bytes = r < 5 ? 0 : r < 15 ? rng() % 8 : r < 75 ? rng() % 4100 : rng() % (65536 + 8);
    p.cmds[k] = Command{rng() % (kSendBytes - bytes + 1), 0, bytes, 1, k, uint16_t(to), net::kNotify, 0};
  }
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), rng);
  for (uint32_t k : order) {
    p.cmds[k].dst_offset = p.recv_bytes;
    p.recv_bytes += p.cmds[k].bytes;
  }
  return p;
}

// One rank: its transport, its regions, its proxy (destroyed before the transport).
struct Rank {
  Rank(Bootstrap& boot, net::Notify mode, uint64_t seed, size_t recv_bytes, const net::ProxyOptions& opt,
       net::MemKind send_kind = net::MemKind::host)
      : transport({"tcp", "lo", mode, false}), send(kSendBytes), recv(std::max<size_t>(recv_bytes, 1), 0) {
    for (size_t i = 0; i < send.size(); ++i) send[i] = pattern(seed, boot.rank(), i);
    proxy = std::make_unique<net::Proxy>(transport, boot, send.data(), send.size(), send_kind, recv.data(), recv.size(), opt);
  }
  net::Transport transport;
  std::vector<uint8_t> send, recv;
  std::unique_ptr<net::Proxy> proxy;
};

// Waits for each chunk `from` sends this rank and checks its bytes at once: a flag published
// before its data would show here, while later chunks are still on the way.
void receive_all(const Rank& me, uint64_t seed, const Plan& in, int from) {
  for (const Command& c : in.cmds) {
    me.proxy->wait_arrival(c.chunk, 1, 20);
    for (uint64_t j = 0; j < c.bytes; ++j)
      if (me.recv[c.dst_offset + j] != pattern(seed, from, c.src_offset + j))
        throw std::runtime_error("chunk " + std::to_string(c.chunk) + ": byte " + std::to_string(j) + " of " +
                                 std::to_string(c.bytes) + " is wrong once its flag is set");
  }
}

// After shutdown: every flag counts exactly one arrival (a duplicate would make it 2 in the
// unordered mode; the ordered mode's duplicates show in the sender's Tally).
void require_flags_once(const Rank& me, const Plan& in) {
  for (const Command& c : in.cmds)
    require(me.proxy->flags()[c.chunk] == 1, "chunk " + std::to_string(c.chunk) + ": flag " +
                                                 std::to_string(me.proxy->flags()[c.chunk]) + " after one arrival");
}

// Counts the proxy's calls per ticket (the hooks run on the proxy thread; read after shutdown).
struct Tally {
  explicit Tally(size_t n) : posted(n), completed(n) {}
  std::vector<uint16_t> posted, completed;
  std::atomic<int64_t> in_flight{0}, max_in_flight{0};
  void hook(net::ProxyOptions& opt) {
    opt.on_posted = [this](uint64_t t) {
      posted.at(t)++;
      const int64_t f = ++in_flight;
      if (f > max_in_flight) max_in_flight = f;
    };
    opt.on_completed = [this](uint64_t t) {
      completed.at(t)++;
      --in_flight;
    };
  }
  void require_once(size_t n) const {
    for (size_t t = 0; t < n; ++t)
      require(posted[t] == 1 && completed[t] == 1, "command " + std::to_string(t) + " posted " +
                                                       std::to_string(posted[t]) + " times, completed " +
                                                       std::to_string(completed[t]) + " times");
  }
};

std::string stats_line(const net::ProxyStats& s) {
  std::string b;
  for (uint32_t i = 1; i <= net::kMaxBatch; ++i) b += " " + std::to_string(s.batch_sizes[i]);
  return "taken " + std::to_string(s.taken) + ", submissions " + std::to_string(s.submissions) + ", writes " +
         std::to_string(s.writes) + ", arrivals " + std::to_string(s.arrivals) + ", batch sizes 1..8:" + b;
}

// Both ranks send n commands to each other at once and receive the other's.
std::string exchange(Bootstrap& boot, net::Notify mode, uint64_t seed, uint32_t n) {
  const int me = boot.rank(), peer = 1 - me;
  const Plan out = make_plan(seed, me, peer, n), in = make_plan(seed, peer, me, n);
  Tally tally(n);
  net::ProxyOptions opt;
  opt.flags = n;
  opt.timeout_s = 20;
  tally.hook(opt);
  Rank r(boot, mode, seed, in.recv_bytes, opt);
  net::Producer prod{r.proxy->queue()};
  for (const Command& c : out.cmds) require(prod.push(c), r.proxy->error());
  receive_all(r, seed, in, peer);
  require(prod.wait_completed(n), r.proxy->error());
  r.proxy->shutdown();
  require_flags_once(r, in);
  tally.require_once(n);
  const net::ProxyStats s = r.proxy->stats();
  require(s.taken == n && s.posted == n && s.completed == n, stats_line(s));
  require(s.arrivals == (r.transport.notify() == net::Notify::unordered ? n : 0), stats_line(s));
  return stats_line(s);
}

TEST(NetProxy, EveryCommandArrivesOnceWithItsBytesInBothModes) {
  const uint64_t seed = weave::check::test_seed();
  for (net::Notify mode : {net::Notify::ordered, net::Notify::unordered}) {
    SCOPED_TRACE(std::string(net::notify_name(mode)));
    const auto out = run_ranks(2, [&](Bootstrap& b) { return exchange(b, mode, seed, 1500); });
    for (const auto& o : out) EXPECT_TRUE(o.returned) << describe(out);
    std::printf("%s: %s\n", std::string(net::notify_name(mode)).c_str(), out[0].text.c_str());
  }
}

// Rank 0 sends rank 1 a plan of n commands with `send` (whose text is rank 0's report); rank 1
// waits for every chunk, then checks the bytes. `setup` adjusts both ranks' proxy options.
using Setup = std::function<void(net::ProxyOptions&)>;
using Send = std::function<std::string(Rank&, const Plan&)>;

std::vector<net::test::RankOutcome> one_way(uint32_t n, const Setup& setup, const Send& send,
                                            net::Notify mode = net::Notify::automatic,
                                            net::MemKind send_kind = net::MemKind::host) {
  const uint64_t seed = weave::check::test_seed();
  return run_ranks(2, [&](Bootstrap& b) {
    const int me = b.rank();
    const Plan plan = make_plan(seed, 0, 1, n);
    net::ProxyOptions opt;
    opt.flags = n;
    opt.timeout_s = 20;
    setup(opt);
    Rank r(b, mode, seed, me == 1 ? plan.recv_bytes : 0, opt, send_kind);
    std::string report;
    if (me == 0) report = send(r, plan);
    if (me == 1) receive_all(r, seed, plan, 0);
    r.proxy->shutdown();
    if (me == 1) require_flags_once(r, plan);
    return report;
  });
}

// An 8-slot queue and at most 2 commands in flight: the producer waits for credits again and
// again, nothing is lost or sent twice, and the proxy never has more than 2 in flight.
TEST(NetProxy, FullQueueMakesTheProducerWait) {
  constexpr uint32_t n = 600;
  Tally tally(n);  // each rank's copy, after the fork
  const auto out = one_way(
      n,
      [&](net::ProxyOptions& opt) {
        opt.queue_slots = 8;
        opt.max_outstanding = 2;
        tally.hook(opt);
      },
      [&](Rank& r, const Plan& plan) {
        net::Producer prod{r.proxy->queue()};
        const net::QueueView q = r.proxy->queue();
        uint64_t waits = 0;
        for (const Command& c : plan.cmds) {
          waits += net::queue_detail::load_acquire(q.claim) >= net::queue_detail::load_acquire(q.head) + q.capacity;
          require(prod.push(c), r.proxy->error());
        }
        require(prod.wait_completed(n), r.proxy->error());
        tally.require_once(n);
        require(tally.max_in_flight <= 2, "max in flight " + std::to_string(tally.max_in_flight.load()));
        return std::to_string(waits);
      });
  for (const auto& o : out) ASSERT_TRUE(o.returned) << describe(out);
  EXPECT_GT(std::stoull(out[0].text), 0u) << "the producer never found the queue full";
}

// Commits `cmds` so that they become ready together: every body and header but the first, then
// the first header (the proxy takes a queue in ticket order).
void commit_together(const net::QueueView& q, std::vector<Command> cmds) {
  std::vector<uint64_t> t(cmds.size());
  for (size_t i = 0; i < cmds.size(); ++i) {
    t[i] = net::queue_detail::next_ticket(q.claim);
    require(t[i] < net::queue_detail::load_acquire(q.head) + q.capacity, "the test's queue is too small");
    std::memcpy(&q.slots[t[i] & (q.capacity - 1)], &cmds[i], offsetof(Command, seq));  // the body only
  }
  for (size_t i = cmds.size(); i-- > 0;) net::queue_detail::store_release(&q.slots[t[i] & (q.capacity - 1)].seq, t[i] + 1);
}

// A lone command goes out without waiting for company (it also opens the connection, whose
// set-up may refuse posts for a while); then 8 ready commands go out as one submission, 12 as
// 8 + 4, a burst closed by kLastOfBatch after its third as 3 + 5, and a last lone command.
TEST(NetProxy, BatchesWhatIsReadyWithoutWaitingToFill) {
  const auto out = one_way(1 + 8 + 12 + 8 + 1, [](net::ProxyOptions&) {}, [](Rank& r, const Plan& plan) {
    const net::QueueView q = r.proxy->queue();
    net::Producer prod{q};
    std::vector<Command> c = plan.cmds;
    c[8 + 12 + 2].flags |= net::kLastOfBatch;
    require(prod.push(c[28]) && prod.wait_completed(1), r.proxy->error());
    using V = std::vector<uint64_t>;
    const net::ProxyStats base = r.proxy->stats();
    const auto sizes = [&] {  // submissions by size since the lone command
      const net::ProxyStats s = r.proxy->stats();
      V v(net::kMaxBatch);
      for (uint32_t i = 0; i < net::kMaxBatch; ++i) v[i] = s.batch_sizes[i + 1] - base.batch_sizes[i + 1];
      return v;
    };
    commit_together(q, {c.begin(), c.begin() + 8});
    require(prod.wait_completed(9), r.proxy->error());
    require(sizes() == V{0, 0, 0, 0, 0, 0, 0, 1}, "8 ready: " + stats_line(r.proxy->stats()));
    commit_together(q, {c.begin() + 8, c.begin() + 20});
    require(prod.wait_completed(21), r.proxy->error());
    require(sizes() == V{0, 0, 0, 1, 0, 0, 0, 2}, "12 ready: " + stats_line(r.proxy->stats()));
    commit_together(q, {c.begin() + 20, c.begin() + 28});
    require(prod.wait_completed(29), r.proxy->error());
    require(sizes() == V{0, 0, 1, 1, 1, 0, 0, 2}, "3 + 5: " + stats_line(r.proxy->stats()));
    const auto t0 = Clock::now();
    require(prod.push(c[29]) && prod.wait_completed(30), r.proxy->error());
    return std::to_string(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  });
  for (const auto& o : out) ASSERT_TRUE(o.returned) << describe(out);
  std::printf("a lone command completed %s us after its push\n", out[0].text.c_str());
}

// Device memory without FI_HMEM goes through the proxy's bounce buffers; here host memory stands
// in for it and memcpy for the device copy, so the staging path is exercised end to end.
void host_stage(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

TEST(NetProxy, StagedSourcesArriveIntact) {
  constexpr uint32_t n = 400;
  const auto out = one_way(
      n,
      [](net::ProxyOptions& opt) {
        opt.max_outstanding = 16;
        opt.bounce_bytes = 65536 + 8;
        opt.stage = host_stage;
      },
      [](Rank& r, const Plan& plan) {
        net::Producer prod{r.proxy->queue()};
        for (const Command& c : plan.cmds) require(prod.push(c), r.proxy->error());
        require(prod.wait_completed(n), r.proxy->error());
        return std::string();
      },
      net::Notify::unordered, net::MemKind::device);
  for (const auto& o : out) EXPECT_TRUE(o.returned) << describe(out);
}

// ---- failures: every surviving rank names what went wrong within a bounded time --------------

constexpr double kTimeoutS = 2;

// Rank 0 streams large commands to rank 1; `victim` does `act` after `after` commands (sent or
// received); each survivor reports the proxy's diagnostic and how long it took to come.
enum class Act { exit, stop, bad_command };

std::vector<net::test::RankOutcome> fail_mid_transfer(int victim, Act act, uint32_t after,
                                                      double silence_s = kTimeoutS) {
  const uint64_t seed = weave::check::test_seed();
  constexpr uint32_t n = 4000;
  return run_ranks(2, [&](Bootstrap& b) {
    const int me = b.rank();
    int pids[2] = {0, 0};
    const int mine = getpid();
    b.all_gather(&mine, pids, sizeof(int));
    net::ProxyOptions opt;
    opt.flags = n;
    opt.timeout_s = kTimeoutS;
    opt.silence_s = silence_s;
    Rank r(b, net::Notify::automatic, seed, 64 << 20, opt);
    const auto act_now = [&] {
      if (act == Act::exit) _exit(42);
      if (act == Act::stop) raise(SIGSTOP);
    };
    Clock::time_point t0 = Clock::now();
    try {
      if (me == 0) {
        net::Producer prod{r.proxy->queue()};
        for (uint32_t k = 0; k < n; ++k) {
          if (k == after && victim == 0) {
            if (act != Act::bad_command) {
              prod.wait_completed(after / 2);  // some arrived, the rest on the way
              act_now();
            }
            require(prod.push(Command{0, 0, 8, 1, 999999, 1, net::kNotify, 0}), r.proxy->error());
          }
          if (!prod.push(Command{(k * 4096ull) % (kSendBytes - 65536), (k * 16384ull) % (64 << 20), 16384, 1, k, 1,
                                 net::kNotify, 0}))
            break;
        }
        prod.wait_completed(n);
        r.proxy->check();
      } else {
        for (uint32_t k = 0; k < n; ++k) {
          if (k == after && victim == 1) act_now();
          if (k == after) t0 = Clock::now();
          r.proxy->wait_arrival(k, 1, 30);
        }
      }
    } catch (const std::exception& e) {
      // The survivor of a stopped peer ends it: the test need not wait for the deadline.
      if (act == Act::stop) kill(pids[1 - me], SIGKILL);
      return std::string(e.what()) + " [after " +
             std::to_string(std::chrono::duration<double>(Clock::now() - t0).count()) + " s]";
    }
    if (act == Act::stop) kill(pids[1 - me], SIGKILL);
    return std::string("no failure seen");
  }, std::chrono::seconds(25));
}

// The receiver (rank 1), then the sender (rank 0) exits mid-transfer: the survivor names it.
TEST(NetProxyFailure, PeerExitsMidTransfer) {
  for (int victim : {1, 0}) {
    const int survivor = 1 - victim;
    const auto out = fail_mid_transfer(victim, Act::exit, 200);
    ASSERT_EQ(out[victim].exit_code, 42) << describe(out);
    ASSERT_TRUE(out[survivor].returned) << describe(out);
    EXPECT_TRUE(has(out[survivor].text, "weave::net rank " + std::to_string(survivor) + ": ") &&
                has(out[survivor].text, "peer " + std::to_string(victim)))
        << describe(out);
    std::printf("survivor: %s\n", out[survivor].text.c_str());
  }
}

// A stopped (not dead) receiver: the sender's proxy reports it within about the timeout, naming
// the peer and saying that its process is still there: first as silent (no heartbeat; a silence
// limit of half the completion timeout, since with equal limits either report may come first, and
// under load the lost completion did), then, with a longer silence limit, through the sender's lost
// completions.
TEST(NetProxyFailure, StuckReceiverIsReportedWithinTheTimeout) {
  for (const auto& [silence_s, says] :
       {std::pair{kTimeoutS / 2, "is silent"}, std::pair{30.0, "lost completion"}}) {
    const auto out = fail_mid_transfer(1, Act::stop, 200, silence_s);
    ASSERT_TRUE(out[0].returned) << describe(out);
    EXPECT_TRUE(has(out[0].text, "peer 1") && has(out[0].text, says) && has(out[0].text, "is alive")) << describe(out);
    std::printf("survivor: %s\n", out[0].text.c_str());
  }
}

// A bad command on rank 0 (a chunk beyond the peer's flags): rank 0 names it, and rank 1, waiting
// for data that will not come, reports rank 0's diagnostic instead of waiting out its timeout.
TEST(NetProxyFailure, EveryRankReportsAPeersFailure) {
  const auto out = fail_mid_transfer(0, Act::bad_command, 100);
  ASSERT_TRUE(out[0].returned && out[1].returned) << describe(out);
  EXPECT_TRUE(has(out[0].text, "chunk 999999 to peer 1") && has(out[0].text, "arrival flags")) << describe(out);
  EXPECT_TRUE(has(out[1].text, "stopped because rank 0 failed") && has(out[1].text, "chunk 999999")) << describe(out);
}

}  // namespace
