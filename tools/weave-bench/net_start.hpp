// The start both network benchmarks (net.cpp, net_tp.cu) share: whether there is anything to
// measure here, and a bootstrap of their own (apart from the NetPaths' rendezvous) with every
// rank's node.
#pragma once
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/runtime/launch.hpp"
#include "weave/runtime/net_bootstrap.hpp"

namespace weave::bench {

struct NetStart {
  std::string skip;  // non-empty: nothing to measure, and why (fewer than 2 ranks, no rendezvous, one node)
  std::unique_ptr<runtime::NetBootstrap> boot;
  std::vector<runtime::NodePlace> place;  // per rank
  int nodes = 0;
};

// Collective over the job's ranks once it has 2 or more and a rendezvous address. `tag` names the
// bootstrap (the job id is prepended).
inline NetStart net_start(const runtime::LaunchInfo& info, const std::string& tag) {
  NetStart s;
  if (info.world < 2) {
    s.skip = weave::detail::concat(info.world, " rank (the network path needs 2 ranks on 2 nodes)");
    return s;
  }
  try {
    (void)runtime::rendezvous_address(info);
  } catch (const Error& e) {
    s.skip = weave::detail::concat("no rendezvous address for the network path (", e.what(), ")");
    return s;
  }
  runtime::NetBootstrapOptions bo;
  bo.tag = info.job_id + "-" + tag;
  s.boot = std::make_unique<runtime::NetBootstrap>(info, bo);
  s.place = runtime::node_of_ranks(s.boot->hostnames());
  for (const auto& p : s.place) s.nodes = std::max(s.nodes, p.node + 1);
  if (s.nodes < 2) s.skip = weave::detail::concat("all ", info.world, " ranks are on one node (not under weave-run --nodes?)");
  return s;
}

}  // namespace weave::bench
