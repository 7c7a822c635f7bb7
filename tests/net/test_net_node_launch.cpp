// A node's view of a multi-node job (runtime::node_launch_info) and the communicator's refusal of
// a job-wide one, on the CPU: both are decided before any CUDA call.
#include <gtest/gtest.h>

#include <string>

#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"

namespace rt = weave::runtime;

namespace {

rt::LaunchInfo job(int rank) {  // 2 nodes of 3 ranks
  rt::LaunchInfo i;
  i.rank = rank;
  i.world = 6;
  i.local_rank = rank % 3;
  i.local_world = 3;
  i.job_id = "job42";
  i.launcher = "weave-run";
  return i;
}

TEST(NodeLaunchInfo, IsTheNodesRanksUnderAJobIdPerNode) {
  const rt::LaunchInfo a = rt::node_launch_info(job(4), "host/node1");
  EXPECT_EQ(a.rank, 1);
  EXPECT_EQ(a.world, 3);
  EXPECT_EQ(a.local_rank, 1);
  EXPECT_EQ(a.local_world, 3);
  EXPECT_EQ(a.launcher, "weave-run");
  // Same job, same node: the same id (they meet); another node: another id (they never do).
  EXPECT_EQ(a.job_id, rt::node_launch_info(job(3), "host/node1").job_id);
  EXPECT_NE(a.job_id, rt::node_launch_info(job(1), "host/node0").job_id);
  EXPECT_NE(a.job_id.find("job42"), std::string::npos);
  EXPECT_THROW(rt::node_launch_info(job(0), ""), weave::Error);
}

TEST(NodeLaunchInfo, AJobWideCommunicatorOnSeveralNodesPointsToIt) {
  try {
    rt::Communicator c(job(0), rt::CommOptions{});
    FAIL() << "a communicator over 2 nodes was made";
  } catch (const weave::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("node_launch_info"), std::string::npos) << m;
    EXPECT_NE(m.find("NetPath"), std::string::npos) << m;
  }
}

}  // namespace
