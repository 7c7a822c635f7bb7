// One process: the command queue's producer side (queue.cuh, host build) against a consumer that
// follows the proxy's protocol, and the transport writing to itself over tcp on loopback.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "check/seed.hpp"
#include "weave/common/error.hpp"
#include "weave/net/queue.cuh"
#include "weave/net/transport.hpp"

namespace net = weave::net;
using net::Command;
using net::queue_detail::load_acquire;
using net::queue_detail::store_release;

namespace {

struct Ring {
  explicit Ring(uint32_t capacity) : slots(capacity) {}
  net::RingControl ctl{};
  std::vector<Command> slots;
  net::QueueView view() {
    return {slots.data(), &ctl.claim, &ctl.head, &ctl.completed, &ctl.abort, static_cast<uint32_t>(slots.size())};
  }
};

// Several producers, one consumer taking commands as the proxy does (acquire the header, copy the
// body, release the credits): every command arrives exactly once, each producer's in order.
TEST(NetQueue, ProducersToConsumerExactlyOnce) {
  constexpr int kProducers = 3, kPerProducer = 20000;
  Ring ring(16);  // small: producers wait for credits all the time
  std::vector<std::vector<uint32_t>> seen(kProducers);
  std::thread consumer([&] {
    uint64_t next = 0;
    while (next < uint64_t(kProducers) * kPerProducer) {
      Command& s = ring.slots[next & 15];
      if (load_acquire(&s.seq) != next + 1) {
        std::this_thread::yield();
        continue;
      }
      const Command c = s;
      ASSERT_EQ(c.bytes, c.src_offset * 3 + 1) << "a body seen before its header was committed";
      seen[c.peer].push_back(c.chunk);
      store_release(&ring.ctl.head, ++next);
    }
  });
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p)
    producers.emplace_back([&, p] {
      net::Producer prod{ring.view()};
      for (uint32_t i = 0; i < kPerProducer; ++i) {
        const uint64_t x = (uint64_t(p) << 32) | i;
        ASSERT_TRUE(prod.push(Command{x, 0, x * 3 + 1, 0, i, uint16_t(p), net::kNotify, 0}));
      }
    });
  for (auto& t : producers) t.join();
  consumer.join();
  for (int p = 0; p < kProducers; ++p) {
    ASSERT_EQ(seen[p].size(), size_t(kPerProducer)) << "producer " << p;
    for (uint32_t i = 0; i < kPerProducer; ++i) ASSERT_EQ(seen[p][i], i) << "producer " << p;
  }
}

// A full ring with a failed consumer: the waiting producer gives up instead of hanging.
TEST(NetQueue, AbortReleasesAWaitingProducer) {
  Ring ring(4);
  net::Producer prod{ring.view()};
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(prod.push(Command{}));
  std::atomic<bool> returned{false}, result{true};
  std::thread t([&] {
    result = prod.push(Command{});
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load()) << "a push into a full ring must wait for a credit";
  store_release(&ring.ctl.abort, 1);
  t.join();
  EXPECT_FALSE(result.load());
  EXPECT_FALSE(prod.wait_completed(1));
}

net::TransportOptions loopback(net::Notify n) { return {"tcp", "lo", n, false}; }

// Reaps until `pred` holds, at most 5 s.
template <class Pred>
void reap_until(net::Transport& t, std::vector<net::Completion>& got, Pred pred) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  net::Completion c[16];
  while (!pred()) {
    ASSERT_LT(std::chrono::steady_clock::now(), end) << "no completion within 5 s";
    const size_t n = t.poll(c, 16);
    got.insert(got.end(), c, c + n);
  }
}

TEST(NetTransport, WritesAndImmediateDataToItself) {
  for (net::Notify mode : {net::Notify::ordered, net::Notify::unordered}) {
    SCOPED_TRACE(std::string(net::notify_name(mode)));
    net::Transport t(loopback(mode));
    EXPECT_EQ(t.notify(), mode);
    EXPECT_TRUE(t.waw_ordered()) << t.describe();  // tcp delivers a connection's writes in order
    EXPECT_FALSE(t.device_memory());
    EXPECT_NE(t.provider().find("tcp"), std::string::npos) << t.describe();
    const std::vector<uint8_t> addr = t.address();
    ASSERT_EQ(t.add_peer(addr.data(), addr.size()), 0);

    std::mt19937_64 rng(weave::check::test_seed());
    std::vector<uint8_t> src(1 << 16), dst(1 << 16, 0);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    const net::Region& s = t.register_memory(src.data(), src.size());
    const net::Region& d = t.register_memory(dst.data(), dst.size());

    net::OpContext op1, op2;
    op1.chunk = 5;
    op2.chunk = 6;
    // 1003 bytes (not a multiple of 8) from an odd offset to an odd offset, then 0 bytes with
    // data. The first post may find the queue busy (rxm connects on first use): poll, retry.
    std::vector<net::Completion> got;
    bool posted = false;
    reap_until(t, got, [&] { return posted = posted || t.write(0, s, src.data() + 17, d.remote, 4001, 1003, &op1, false); });
    posted = false;
    reap_until(t, got, [&] { return posted = posted || t.write_data(0, s, src.data(), d.remote, 0, 0, 0xabcd1234u, &op2, false); });
    auto has = [&](auto match) {
      for (const auto& c : got)
        if (match(c)) return true;
      return false;
    };
    reap_until(t, got, [&] {
      return has([&](const net::Completion& c) { return c.op == &op1; }) &&
             has([&](const net::Completion& c) { return c.op == &op2; }) &&
             has([](const net::Completion& c) { return !c.op && c.data == 0xabcd1234u; });
    });
    EXPECT_EQ(std::memcmp(dst.data() + 4001, src.data() + 17, 1003), 0);
    EXPECT_EQ(dst[4000], 0);
    EXPECT_EQ(dst[5004], 0);
  }
}

// The domain named is the one used: libfabric 1.17's ofi_rxm over tcp lists every interface
// whatever the hint, so the transport picks the named one from that list, and a name nothing
// offers is an error naming it (not the first interface in the list).
TEST(NetTransport, UsesTheNamedDomainOrRefuses) {
  net::Transport t(loopback(net::Notify::automatic));
  EXPECT_NE(t.describe().find("domain lo,"), std::string::npos) << t.describe();
  try {
    net::Transport bad({"tcp", "no-such-interface", net::Notify::automatic, false});
    ADD_FAILURE() << "a domain nothing offers was accepted: " << bad.describe();
  } catch (const weave::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-interface"), std::string::npos) << e.what();
  }
}

TEST(NetTransport, RefusesOutOfRangeWritesNamingTheChunk) {
  net::Transport t(loopback(net::Notify::automatic));
  const std::vector<uint8_t> addr = t.address();
  t.add_peer(addr.data(), addr.size());
  std::vector<uint8_t> buf(4096);
  const net::Region& r = t.register_memory(buf.data(), buf.size());
  net::OpContext op;
  op.chunk = 42;
  try {
    t.write(0, r, buf.data(), r.remote, 4000, 200, &op, false);
    FAIL() << "an out-of-range write was posted";
  } catch (const weave::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("data write of chunk 42 to peer 0"), std::string::npos) << m;
    EXPECT_NE(m.find("outside the peer's region of 4096 bytes"), std::string::npos) << m;
  }
  EXPECT_THROW(t.write(3, r, buf.data(), r.remote, 0, 8, &op, false), weave::Error);  // no such peer
  EXPECT_THROW(t.register_memory(buf.data(), buf.size(), net::MemKind::device), weave::Error);  // no FI_HMEM
}

TEST(NetTransport, NotificationModes) {
  EXPECT_EQ(net::parse_notify("auto"), net::Notify::automatic);
  EXPECT_EQ(net::parse_notify("ordered"), net::Notify::ordered);
  EXPECT_EQ(net::parse_notify("unordered"), net::Notify::unordered);
  EXPECT_THROW(net::parse_notify("fast"), weave::Error);
  EXPECT_EQ(net::Transport(loopback(net::Notify::automatic)).notify(), net::Notify::ordered);  // tcp orders writes
  EXPECT_THROW(net::Transport({"no-such-provider", "", net::Notify::automatic, false}), weave::Error);
}

}  // namespace
