// A rank program for the launcher tests (not a test itself): joins the job's NetPath in CPU mode
// from its launcher's environment (weave-run --nodes, torchrun, mpirun), passes one chunk around
// the ring of ranks through the proxy, checks it byte by byte, shuts down, and prints what it saw.
// Exits 1 with the error on stderr.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "weave/net/net_path.hpp"
#include "weave/net/queue.cuh"
#include "weave/runtime/launch.hpp"

namespace {
// Differs per sender and per byte, so a chunk from the wrong rank or at a shifted offset fails.
char pattern(int sender, int i) { return static_cast<char>(sender * 37 + i); }
}  // namespace

int main() {
  namespace net = weave::net;
  // A launcher killed on a test's timeout may leave this rank behind (torchrun starts ranks in
  // their own sessions, out of reach of a kill of the launcher's group): end by itself.
  alarm(120);
  try {
    const weave::runtime::LaunchInfo info = weave::runtime::detect_launch();
    net::NetPathOptions o;
    o.gpu = false;
    o.transport = {"tcp", "lo", net::Notify::automatic, false};
    o.send_bytes = 4096;
    o.recv_bytes = 8192;
    o.proxy.flags = 64;
    o.proxy.timeout_s = 10;
    o.boot.timeout = std::chrono::seconds(30);
    net::NetPath path(info, o);
    const int r = path.rank(), w = path.world(), n = 100;
    const net::NetPath::Call call = path.begin_call(1);
    for (int i = 0; i < n; ++i) path.send_buffer()[i] = pattern(r, i);
    net::Producer prod{path.host_queue()};
    if (!prod.push(net::Command{0, call.recv_offset, static_cast<uint64_t>(n), 1, call.flag_offset,
                                static_cast<uint16_t>((r + 1) % w), net::kNotify, 0}))
      path.check();
    path.proxy().wait_arrival(call.flag_offset, 1);
    const int from = (r + w - 1) % w;
    int good = 0;
    for (int i = 0; i < n; ++i) good += path.recv_buffer()[call.recv_offset + i] == pattern(from, i);
    path.shutdown();
    // The node name the bootstrap grouped by: WEAVE_HOSTNAME, else the host's.
    const std::string host = path.bootstrap().hostnames()[r];
    std::printf("rank=%d world=%d local=%d/%d nodes=%d gpus=%d host=%s received=%d launcher=%s\n", r, w,
                info.local_rank, info.local_world, path.topo().nodes, path.topo().gpus, host.c_str(), good,
                info.launcher.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "net_path_rank: %s\n", e.what());
    return 1;
  }
}
