// A rank program for the weave-run --nodes test (not a test itself): joins the job's NetPath in
// CPU mode from weave-run's environment (WEAVE_BOOTSTRAP, WEAVE_HOSTNAME, WEAVE_LOCAL_*), passes
// one chunk around the ring of ranks through the proxy, shuts down, and prints what it saw.
// Exits 1 with the error on stderr.
#include <cstdio>
#include <cstring>
#include <string>

#include "weave/net/net_path.hpp"
#include "weave/net/queue.cuh"
#include "weave/runtime/env.hpp"
#include "weave/runtime/launch.hpp"

int main() {
  namespace net = weave::net;
  try {
    const weave::runtime::LaunchInfo info = weave::runtime::detect_launch();
    net::NetPathOptions o;
    o.gpu = false;
    o.transport = {"tcp", "lo", net::Notify::automatic, false};
    o.send_bytes = 4096;
    o.recv_bytes = 8192;
    o.proxy.flags = 64;
    o.proxy.timeout_s = 10;
    net::NetPath path(info, o);
    const int r = path.rank(), w = path.world();
    const net::NetPath::Call call = path.begin_call(1);
    std::memset(path.send_buffer(), 'a' + r, 100);
    net::Producer prod{path.host_queue()};
    if (!prod.push(net::Command{0, call.recv_offset, 100, 1, call.flag_offset, static_cast<uint16_t>((r + 1) % w),
                                net::kNotify, 0}))
      path.check();
    path.proxy().wait_arrival(call.flag_offset, 1);
    const char want = static_cast<char>('a' + (r + w - 1) % w);
    int good = 0;
    for (int i = 0; i < 100; ++i) good += path.recv_buffer()[call.recv_offset + i] == want;
    path.shutdown();
    const std::string host = weave::env::get_string("WEAVE_HOSTNAME");
    std::printf("rank=%d world=%d local=%d/%d nodes=%d gpus=%d host=%s received=%d\n", r, w, info.local_rank,
                info.local_world, path.topo().nodes, path.topo().gpus, host.c_str(), good);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "net_path_rank: %s\n", e.what());
    return 1;
  }
}
