// weave-run --nodes end to end on the CPU (--no-gpu): the ranks of one machine split into
// simulated nodes, each rank's environment (local rank and size, node name, rendezvous), a
// NetPath of every rank joined through it (net_path_rank.cpp), and the launcher's refusals.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "run_command.hpp"

namespace {

using weave::test::Result;

// weave-run with these arguments; "helper" stands for the rank program (net_path_rank.cpp).
Result weave_run(const std::vector<std::string>& args) {
  std::vector<std::string> argv{WEAVE_RUN_BIN};
  for (const std::string& a : args) argv.push_back(a == "helper" ? RANK_BIN : a);
  return weave::test::run_command(argv);
}

TEST(WeaveRunNodes, SplitsRanksIntoSimulatedNodes) {
  unsetenv("WEAVE_BOOTSTRAP");
  for (const auto& [n, nodes] : {std::pair{4, 2}, std::pair{3, 3}, std::pair{2, 1}}) {
    SCOPED_TRACE(std::to_string(n) + " ranks on " + std::to_string(nodes) + " nodes");
    const Result r = weave_run({"--no-gpu", "-n", std::to_string(n), "--nodes", std::to_string(nodes), "--timeout",
                                "60", "helper"});
    ASSERT_EQ(r.status, 0) << r.out;
    const int g = n / nodes;
    const std::regex line(
        R"(rank=(\d+) world=(\d+) local=(\d+)/(\d+) nodes=(\d+) gpus=(\d+) host=(\S+)/node(\d+) received=100)"
        R"( launcher=weave-run)");
    std::set<int> ranks;
    std::istringstream in(r.out);
    for (std::string l; std::getline(in, l);) {
      std::smatch m;
      ASSERT_TRUE(std::regex_match(l, m, line)) << "unexpected line: " << l << "\n" << r.out;
      const int rank = std::stoi(m[1]);
      ranks.insert(rank);
      EXPECT_EQ(std::stoi(m[2]), n);
      EXPECT_EQ(std::stoi(m[3]), rank % g);
      EXPECT_EQ(std::stoi(m[4]), g);
      EXPECT_EQ(std::stoi(m[5]), nodes);
      EXPECT_EQ(std::stoi(m[6]), g);
      EXPECT_EQ(std::stoi(m[8]), rank / g);
    }
    EXPECT_EQ(ranks.size(), size_t(n)) << r.out;
  }
}

TEST(WeaveRunNodes, RefusesBadSplits) {
  Result r = weave_run({"--no-gpu", "-n", "4", "--nodes", "3", "helper"});
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--nodes 3 must divide the 4 ranks"), std::string::npos) << r.out;
  r = weave_run({"--no-gpu", "-n", "4", "--nodes", "0", "helper"});
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--nodes needs an integer"), std::string::npos) << r.out;
}

}  // namespace
