// Bootstrap across hosts: ranks on different hosts find each other over TCP at a rendezvous
// address and exchange small host data (fabric addresses, hostnames). A star through rank 0, as
// the node-local Bootstrap, without file descriptor passing.
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "weave/runtime/launch.hpp"

namespace weave::runtime {

// Where rank 0 listens ("host:port", "[v6]:port"): `WEAVE_BOOTSTRAP` if set; else under torchrun
// MASTER_ADDR and MASTER_PORT + kTorchPortOffset (torch's TCPStore owns MASTER_PORT itself, and
// MASTER_PORT + 1 is what other libraries commonly take, so weave skips a few more); else an
// error saying to set WEAVE_BOOTSTRAP (OpenMPI gives no address to rendezvous at).
inline constexpr int kTorchPortOffset = 1 + 16;
std::string rendezvous_address(const LaunchInfo& info);

struct NetBootstrapOptions {
  std::chrono::milliseconds timeout = std::chrono::seconds(60);  // for every rank to join
  std::string address;   // empty: rendezvous_address(info)
  std::string hostname;  // empty: $WEAVE_HOSTNAME (weave-run --nodes), else gethostname(); tests inject fake ones
  std::string tag;       // names the job, equal on every rank; empty: info.job_id
};

class NetBootstrap {
 public:
  // Rank 0 listens at the address (on every interface, at its port), the others connect and
  // introduce themselves (rank, world, hostname, tag). Throws weave::Error when ranks are
  // missing after `timeout` (naming them), a rank is claimed twice or the world sizes differ.
  // A peer whose tag differs (another job on the same port) is turned away with an error and
  // does not disturb the job. Connections use TCP keepalive, so a peer host that vanishes
  // without closing its sockets is detected in about half a minute.
  explicit NetBootstrap(const LaunchInfo& info, NetBootstrapOptions opts = {});
  ~NetBootstrap();
  NetBootstrap(const NetBootstrap&) = delete;
  NetBootstrap& operator=(const NetBootstrap&) = delete;

  int rank() const;
  int world() const;
  // Every rank's hostname (the option, else gethostname()), indexed by rank.
  const std::vector<std::string>& hostnames() const;
  // As Bootstrap's: same calls in the same order on every rank, sizes checked; a peer that exits
  // makes them throw on every rank; after an error every later call throws.
  void all_gather(const void* mine, void* all, size_t bytes);
  void barrier();
  // As Bootstrap's: asked while a collective waits; a non-empty answer ends the wait with it.
  std::function<std::string()> set_interrupt(std::function<std::string()> why);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct NodePlace {
  int node;        // index of the rank's host, hosts numbered by their lowest rank
  int local_rank;  // the rank's position among the ranks of its host, in rank order
  bool operator==(const NodePlace& o) const { return node == o.node && local_rank == o.local_rank; }
};
// Ranks with the same hostname form a node.
std::vector<NodePlace> node_of_ranks(const std::vector<std::string>& hostnames);

}  // namespace weave::runtime
