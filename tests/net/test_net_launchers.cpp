// The network path's bootstrap across hosts under the real launchers, on the CPU: torchrun agents
// and OpenMPI's mpirun start the ranks of net_path_rank.cpp (NetPath in CPU mode, one chunk around
// the ring, checked byte by byte) on loopback, each launcher node given its own WEAVE_HOSTNAME so
// that one machine holds two nodes; and what a user meets on one host without that (one node, or
// a clear refusal). A launcher that is missing makes its suite skip (exit 77); every launch is
// bounded (run_commands kills its process group) and a failure prints its output.
// CTest runs each suite as its own entry (test_net_launch_torchrun, test_net_launch_mpirun).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "check/free_port.hpp"
#include "run_command.hpp"
#include "weave/runtime/net_bootstrap.hpp"

namespace {

using weave::test::Command;
using weave::test::Result;
using namespace std::chrono_literals;

// What the test's own environment may hold (ctest under a launcher, a user's shell) and would
// otherwise leak into the ranks and override their launcher's.
const std::vector<std::string> kScrub = {
    "WEAVE_RANK",  "WEAVE_WORLD_SIZE", "WEAVE_LOCAL_*", "WEAVE_JOB_ID",   "WEAVE_BOOTSTRAP", "WEAVE_HOSTNAME",
    "RANK",        "WORLD_SIZE",       "LOCAL_RANK",    "LOCAL_WORLD_SIZE", "GROUP_*",       "MASTER_ADDR",
    "MASTER_PORT", "TORCHELASTIC_*",   "OMPI_*",        "PMIX_*"};

std::vector<Result> launch(const std::vector<Command>& cmds) { return weave::test::run_commands(cmds, 60s, kScrub); }

// Every command line and its output, for failure messages.
std::string dump(const std::vector<Command>& cmds, const std::vector<Result>& rs) {
  std::string s;
  for (size_t i = 0; i < cmds.size(); ++i) {
    s += "\n=== $";
    for (const std::string& e : cmds[i].set) s += " " + e;
    for (const std::string& a : cmds[i].argv) s += " " + a;
    s += "\n--- exit " + std::to_string(rs[i].status) + (rs[i].timed_out ? " (killed: timed out)" : "") + "\n";
    s += rs[i].out;
  }
  return s;
}

// A loopback port free now; with `also` > 0, port + also is free too (torchrun's MASTER_PORT and
// weave's rendezvous at MASTER_PORT + kTorchPortOffset). Racy by nature, but the kernel hands out
// ephemeral ports round-robin, so one just released is rarely taken again at once.
int free_port(int also = 0) {
  auto bindable = [](int port) {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = s >= 0 && bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (s >= 0) close(s);
    return ok;
  };
  for (int tries = 0; tries < 100; ++tries) {
    const int p = weave::check::free_port();
    if (also == 0 || (p + also <= 65535 && bindable(p + also))) return p;
  }
  ADD_FAILURE() << "no free loopback port pair";
  return 0;
}

// What every rank must have printed: the job's shape, its node, its launcher's local rank and
// size, and 100 bytes received intact from its ring predecessor.
struct Want {
  int world, nodes, gpus;
  std::string launcher;
  std::function<std::string(int)> host;          // the node name of rank r
  std::function<std::pair<int, int>(int)> local;  // the launcher's local rank and size of rank r
};

void expect_ranks(const std::vector<Command>& cmds, const std::vector<Result>& rs, const Want& w) {
  const std::string all = dump(cmds, rs);
  for (const Result& r : rs) ASSERT_TRUE(r.status == 0 && !r.timed_out) << all;
  const std::regex line(R"(rank=(\d+) world=(\d+) local=(\d+)/(\d+) nodes=(\d+) gpus=(\d+) host=(\S+))"
                        R"( received=(\d+) launcher=(\S+))");
  std::map<int, std::smatch> seen;
  for (const Result& r : rs) {
    std::istringstream in(r.out);
    for (std::string l; std::getline(in, l);) {
      std::smatch m;
      if (l.rfind("rank=", 0) != 0) continue;  // the launchers' own chatter
      ASSERT_TRUE(std::regex_match(l, m, line)) << "unexpected line: " << l << all;
      const int rank = std::stoi(m[1]);
      ASSERT_TRUE(seen.emplace(rank, m).second) << "rank " << rank << " reported twice" << all;
      SCOPED_TRACE("rank " + std::to_string(rank));
      EXPECT_EQ(std::stoi(m[2]), w.world) << all;
      EXPECT_EQ(std::pair(std::stoi(m[3]), std::stoi(m[4])), w.local(rank)) << all;
      EXPECT_EQ(std::stoi(m[5]), w.nodes) << all;
      EXPECT_EQ(std::stoi(m[6]), w.gpus) << all;
      EXPECT_EQ(m[7].str(), w.host(rank)) << all;
      EXPECT_EQ(std::stoi(m[8]), 100) << "bytes intact from rank " << (rank + w.world - 1) % w.world << all;
      EXPECT_EQ(m[9].str(), w.launcher) << all;
    }
  }
  EXPECT_EQ(seen.size(), size_t(w.world)) << all;
}

std::string hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// ---- torchrun --------------------------------------------------------------------------------

// python3 -m torch.distributed.run is torchrun without depending on its script being on PATH.
const std::vector<std::string> kTorchrun = {"python3", "-m", "torch.distributed.run"};

class Torchrun : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const Result r = weave::test::run_commands({{{"python3", "-c", "import torch.distributed.run"}, {}}}, 120s)[0];
    if (r.status != 0)
      missing_ = "python3 cannot import torch.distributed.run (torchrun; exit " + std::to_string(r.status) +
                 "): " + r.out;
  }
  void SetUp() override {
    if (!missing_.empty()) GTEST_SKIP() << missing_;
  }
  // Two agents on this machine, each starting `per_node` ranks; `rdzv` the agents' rendezvous
  // options (static: also --node_rank). Named: agent k's node is "launch-node<k>" (WEAVE_HOSTNAME).
  static std::vector<Command> two_agents(int per_node, const std::vector<std::string>& rdzv, bool static_rdzv,
                                         bool named = true) {
    std::vector<Command> cmds;
    for (int k = 0; k < 2; ++k) {
      Command c{kTorchrun, {}};
      if (named) c.set.push_back("WEAVE_HOSTNAME=launch-node" + std::to_string(k));
      c.argv.insert(c.argv.end(), {"--nnodes", "2", "--nproc_per_node", std::to_string(per_node)});
      if (static_rdzv) c.argv.insert(c.argv.end(), {"--node_rank", std::to_string(k)});
      c.argv.insert(c.argv.end(), rdzv.begin(), rdzv.end());
      c.argv.insert(c.argv.end(), {"--no-python", RANK_BIN});
      cmds.push_back(c);
    }
    return cmds;
  }
  static void expect_two_nodes(int per_node, const std::vector<Command>& cmds) {
    const std::vector<Result> rs = launch(cmds);
    // c10d numbers the agents in the order they join: a node's ranks are a contiguous block, so
    // rank r's node is r / per_node, named by whichever agent that was.
    std::string names[2];
    for (int k = 0; k < 2; ++k)
      for (int j = 0; j < 2; ++j)
        if (rs[k].out.find("rank=" + std::to_string(j * per_node) + " ") != std::string::npos)
          names[j] = "launch-node" + std::to_string(k);
    expect_ranks(cmds, rs,
                 {2 * per_node, 2, per_node, "torchrun", [&](int r) { return names[r / per_node]; },
                  [&](int r) { return std::pair(r % per_node, per_node); }});
  }
  static inline std::string missing_;
};

// Static rendezvous at --master_addr/--master_port: weave meets at MASTER_PORT + kTorchPortOffset.
TEST_F(Torchrun, TwoAgentsAreTwoNodes) {
  const int port = free_port(weave::runtime::kTorchPortOffset);
  expect_two_nodes(2, two_agents(2, {"--master_addr", "127.0.0.1", "--master_port", std::to_string(port)}, true));
}

// c10d rendezvous: the agents pick MASTER_ADDR (the host's name) and MASTER_PORT themselves.
TEST_F(Torchrun, C10dRendezvous) {
  const std::string at = "127.0.0.1:" + std::to_string(free_port());
  expect_two_nodes(1,
                   two_agents(1, {"--rdzv_backend", "c10d", "--rdzv_endpoint", at, "--rdzv_id", "weave-test"}, false));
}

// Two agents on one host without their own node names: one host name, so one node of 2 ranks by
// host name, but each agent's LOCAL_WORLD_SIZE is 1 (two ranks would take GPU 0, and the node
// communicators never meet). Refused at once on both ranks, saying what to do.
TEST_F(Torchrun, TwoAgentsOnOneHostWithoutNamesAreRefused) {
  const int port = free_port(weave::runtime::kTorchPortOffset);
  const std::vector<Command> cmds =
      two_agents(1, {"--master_addr", "127.0.0.1", "--master_port", std::to_string(port)}, true, false);
  const std::vector<Result> rs = launch(cmds);
  const std::string all = dump(cmds, rs);
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(rs[k].status != 0 && !rs[k].timed_out) << all;
    EXPECT_NE(rs[k].out.find("by host name, but its launcher (torchrun) says local rank 0 of 1"), std::string::npos)
        << all;
  }
}

// ---- mpirun (OpenMPI) ------------------------------------------------------------------------

class Mpirun : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const Result r = weave::test::run_commands({{{"mpirun", "--version"}, {}}}, 60s)[0];
    if (r.status != 0 || r.out.find("Open MPI") == std::string::npos)
      missing_ = "no OpenMPI mpirun on PATH (apt-get install openmpi-bin; exit " + std::to_string(r.status) +
                 "): " + r.out;
  }
  void SetUp() override {
    if (!missing_.empty()) GTEST_SKIP() << missing_;
  }
  // mpirun with these options and app contexts; ranks may run as root here (containers, CI), and
  // a CI machine may have a single core.
  static Command mpirun(const std::vector<std::string>& args) {
    Command c{{"mpirun", "--oversubscribe", "--bind-to", "none"},
              {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"}};
    c.argv.insert(c.argv.end(), args.begin(), args.end());
    return c;
  }
  static inline std::string missing_;
};

// The MPMD form gives each rank its node name, as two hosts would; mpirun gives no rendezvous
// address, so WEAVE_BOOTSTRAP names one. OpenMPI's -x applies to its own app context only (each
// context names it). OpenMPI's local rank and size describe the real host.
TEST_F(Mpirun, TwoRanksAsTwoNodes) {
  const std::string at = "WEAVE_BOOTSTRAP=127.0.0.1:" + std::to_string(free_port());
  const std::vector<Command> cmds = {mpirun({"-np", "1", "-x", at, "-x", "WEAVE_HOSTNAME=launch-node0", RANK_BIN, ":",
                                             "-np", "1", "-x", at, "-x", "WEAVE_HOSTNAME=launch-node1", RANK_BIN})};
  expect_ranks(cmds, launch(cmds),
               {2, 2, 1, "mpirun", [](int r) { return "launch-node" + std::to_string(r); },
                [](int r) { return std::pair(r, 2); }});
}

// Both ranks on one host without WEAVE_HOSTNAME are one node of 2 ranks: the path still joins
// them (through the loopback fabric) and delivers.
TEST_F(Mpirun, OneHostIsOneNode) {
  const std::string at = "WEAVE_BOOTSTRAP=127.0.0.1:" + std::to_string(free_port());
  const std::vector<Command> cmds = {mpirun({"-x", at, "-np", "2", RANK_BIN})};
  const std::string host = hostname();
  expect_ranks(cmds, launch(cmds),
               {2, 1, 2, "mpirun", [&](int) { return host; }, [](int r) { return std::pair(r, 2); }});
}

// What a user hits first: every rank on one host and no WEAVE_BOOTSTRAP. Refused at once, saying
// what to set and that one node needs no network path. (mpirun stops the other rank when one
// fails, so only the first rank's message is sure to be there.)
TEST_F(Mpirun, WithoutRendezvousSaysToSetIt) {
  const std::vector<Command> cmds = {mpirun({"-np", "2", RANK_BIN})};
  const std::vector<Result> rs = launch(cmds);
  const std::string all = dump(cmds, rs);
  EXPECT_TRUE(rs[0].status != 0 && !rs[0].timed_out) << all;
  for (const char* says : {"net_path_rank: weave: net bootstrap: OpenMPI gives no rendezvous address",
                           "set WEAVE_BOOTSTRAP=host:port",
                           "all 2 ranks are on this host, one node: it needs no network path"})
    EXPECT_NE(rs[0].out.find(says), std::string::npos) << says << all;
}

}  // namespace
