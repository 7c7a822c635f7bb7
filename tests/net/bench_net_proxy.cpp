// The host proxy's figures on the CPU, between two processes over libfabric's tcp provider on
// loopback: a producer thread stands in for the GPU's send blocks. Per notification mode, batched
// (8 commands per submission) and unbatched (1):
// - latency, one command at a time (p50, p99 over 2000), from just before the command is written
//   into the queue: "taken", until the proxy took it out of the ring (the ring's and the proxy's
//   own cost); "posted", until its last fi_write returned (adds the provider's post: on tcp a
//   sendmsg system call);
// - commands/s: 64-byte commands pushed as fast as the queue takes them, until all completed.
// Printed, not asserted: the machine running CI is shared.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ranks.hpp"
#include "weave/net/proxy.hpp"
#include "weave/net/queue.cuh"

namespace net = weave::net;
using weave::runtime::Bootstrap;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint32_t kLatencyCommands = 2000, kRateCommands = 100000, kFlags = 4096;

uint64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

net::Command command(uint64_t i) {
  return {(i * 64) % (1 << 20), (i * 64) % (1 << 20), 64, i / kFlags + 1, uint32_t(i % kFlags), 1, net::kNotify, 0};
}

std::string measure(Bootstrap& boot, net::Notify mode, uint32_t batch) {
  std::vector<uint8_t> send(1 << 20, 7), recv(1 << 20);
  std::vector<uint64_t> taken_ns(kLatencyCommands + kRateCommands), posted_ns(kLatencyCommands + kRateCommands);
  net::ProxyOptions opt;
  opt.batch = batch;
  opt.flags = kFlags;
  opt.timeout_s = 30;
  // The sender's proxy spins (the latency of a busy proxy); the receiver's naps when idle, and
  // the producer sleeps between latency samples, leaving the sender's proxy a core of the two.
  opt.idle_sleep_us = boot.rank() == 0 ? -1 : 20;
  opt.on_taken = [&](uint64_t t) { taken_ns[t] = now_ns(); };
  opt.on_posted = [&](uint64_t t) { posted_ns[t] = now_ns(); };
  net::Transport transport({"tcp", "lo", mode, false});
  net::Proxy proxy(transport, boot, send.data(), send.size(), net::MemKind::host, recv.data(), recv.size(), opt);
  char line[256] = {};
  if (boot.rank() == 0) {
    net::Producer prod{proxy.queue()};
    std::vector<double> lat(kLatencyCommands), taken(kLatencyCommands);
    for (uint32_t i = 0; i < kLatencyCommands; ++i) {
      const uint64_t t = now_ns();
      if (!prod.push(command(i))) proxy.check();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (!prod.wait_completed(i + 1)) proxy.check();
      taken[i] = (taken_ns[i] - t) * 1e-3;
      lat[i] = (posted_ns[i] - t) * 1e-3;
    }
    std::sort(lat.begin(), lat.end());
    std::sort(taken.begin(), taken.end());
    const net::ProxyStats before = proxy.stats();
    const auto t0 = Clock::now();
    for (uint32_t i = kLatencyCommands; i < kLatencyCommands + kRateCommands; ++i)
      if (!prod.push(command(i))) proxy.check();
    if (!prod.wait_completed(kLatencyCommands + kRateCommands)) proxy.check();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    const net::ProxyStats after = proxy.stats();
    std::snprintf(line, sizeof line, "%-10s %5u %8.2f %8.2f %8.2f %8.2f %12.0f %14.2f\n",
                  std::string(net::notify_name(mode)).c_str(), batch, taken[taken.size() / 2],
                  taken[taken.size() * 99 / 100], lat[lat.size() / 2], lat[lat.size() * 99 / 100], kRateCommands / s,
                  double(after.posted - before.posted) / double(after.submissions - before.submissions));
  }
  proxy.shutdown();
  return line;
}

}  // namespace

int main() {
  const auto out = net::test::run_ranks(2, [](Bootstrap& b) {
    std::string table =
        "                 taken (us)        posted (us)\n"
        "mode       batch   p50      p99      p50      p99   commands/s  cmds/submission\n";
    for (net::Notify mode : {net::Notify::ordered, net::Notify::unordered})
      for (uint32_t batch : {net::kMaxBatch, 1u}) table += measure(b, mode, batch);
    return table;
  }, std::chrono::seconds(100));
  std::printf("proxy over tcp on loopback: latency from the queue write, one command at a time; rate of %u "
              "64-byte commands\n%s", kRateCommands, out[0].text.c_str());
  for (const auto& o : out)
    if (!o.returned) {
      std::printf("failed:\n%s", net::test::describe(out).c_str());
      return 1;
    }
  return 0;
}
