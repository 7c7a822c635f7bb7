#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>

#include "weave/common/error.hpp"
#include "weave/runtime/launch.hpp"

using weave::runtime::detect_launch;
using weave::runtime::LaunchInfo;

namespace {

const char* kAllVars[] = {"WEAVE_RANK", "WEAVE_WORLD_SIZE", "WEAVE_LOCAL_RANK", "WEAVE_LOCAL_WORLD_SIZE", "WEAVE_JOB_ID",
                          "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR",
                          "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri",
                          "OMPI_MCA_ess_base_jobid"};

// Each test starts from an environment without any launcher variable (this binary may itself run
// under weave-run or torchrun).
class Launch : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kAllVars) unsetenv(v);
  }
  void TearDown() override { SetUp(); }
  static void set(const std::map<std::string, std::string>& vars) {
    for (auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  static std::string error_of() {
    try {
      detect_launch();
    } catch (const weave::Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(Launch, SingleWithoutLauncher) {
  LaunchInfo li = detect_launch();
  EXPECT_EQ(li.launcher, "single");
  EXPECT_EQ(li.rank, 0);
  EXPECT_EQ(li.world, 1);
  EXPECT_EQ(li.local_rank, 0);
  EXPECT_EQ(li.local_world, 1);
  EXPECT_EQ(li.job_id, "single-" + std::to_string(getpid()));
  set({{"WEAVE_JOB_ID", "mine"}});
  EXPECT_EQ(detect_launch().job_id, "mine");
}

TEST_F(Launch, WeaveRun) {
  set({{"WEAVE_RANK", "3"}, {"WEAVE_WORLD_SIZE", "4"}, {"WEAVE_LOCAL_RANK", "3"}, {"WEAVE_LOCAL_WORLD_SIZE", "4"},
       {"WEAVE_JOB_ID", "host-12-ab"}});
  LaunchInfo li = detect_launch();
  EXPECT_EQ(li.launcher, "weave-run");
  EXPECT_EQ(li.rank, 3);
  EXPECT_EQ(li.world, 4);
  EXPECT_EQ(li.local_rank, 3);
  EXPECT_EQ(li.local_world, 4);
  EXPECT_EQ(li.job_id, "host-12-ab");
}

TEST_F(Launch, WeaveRunWinsOverOtherLaunchers) {
  set({{"WEAVE_RANK", "1"}, {"WEAVE_WORLD_SIZE", "2"}, {"WEAVE_LOCAL_RANK", "1"}, {"WEAVE_LOCAL_WORLD_SIZE", "2"},
       {"WEAVE_JOB_ID", "j"}, {"RANK", "0"}, {"WORLD_SIZE", "8"}});
  EXPECT_EQ(detect_launch().launcher, "weave-run");
}

TEST_F(Launch, WeaveRunMissingJobId) {
  set({{"WEAVE_RANK", "0"}, {"WEAVE_WORLD_SIZE", "2"}, {"WEAVE_LOCAL_RANK", "0"}, {"WEAVE_LOCAL_WORLD_SIZE", "2"}});
  EXPECT_NE(error_of().find("WEAVE_JOB_ID is not set"), std::string::npos) << error_of();
}

TEST_F(Launch, Torchrun) {
  set({{"RANK", "5"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "5"}, {"LOCAL_WORLD_SIZE", "8"},
       {"TORCHELASTIC_RUN_ID", "none"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  LaunchInfo li = detect_launch();
  EXPECT_EQ(li.launcher, "torchrun");
  EXPECT_EQ(li.rank, 5);
  EXPECT_EQ(li.world, 16);
  EXPECT_EQ(li.local_rank, 5);
  EXPECT_EQ(li.local_world, 8);
  EXPECT_EQ(li.job_id, "torchrun-none-10.0.0.1-29500");
  set({{"WEAVE_JOB_ID", "override"}});
  EXPECT_EQ(detect_launch().job_id, "override");
}

TEST_F(Launch, TorchrunWithoutJobId) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_NE(error_of().find("WEAVE_JOB_ID"), std::string::npos) << error_of();
}

TEST_F(Launch, OpenMpi) {
  set({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"OMPI_MCA_ess_base_jobid", "777"}});
  LaunchInfo li = detect_launch();
  EXPECT_EQ(li.launcher, "mpirun");
  EXPECT_EQ(li.rank, 2);
  EXPECT_EQ(li.world, 4);
  EXPECT_EQ(li.local_rank, 0);
  EXPECT_EQ(li.local_world, 2);
  EXPECT_EQ(li.job_id, "mpirun-777");
  set({{"PMIX_NAMESPACE", "prterun-host-1234@1"}});  // preferred over the older variables
  EXPECT_EQ(detect_launch().job_id, "mpirun-prterun-host-1234@1");
}

TEST_F(Launch, OpenMpiWithoutJobId) {
  set({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  EXPECT_NE(error_of().find("PMIX_NAMESPACE"), std::string::npos) << error_of();
}

TEST_F(Launch, MalformedValuesRejected) {
  const std::map<std::string, std::string> good = {{"WEAVE_RANK", "1"},
                                                   {"WEAVE_WORLD_SIZE", "4"},
                                                   {"WEAVE_LOCAL_RANK", "1"},
                                                   {"WEAVE_LOCAL_WORLD_SIZE", "4"},
                                                   {"WEAVE_JOB_ID", "j"}};
  struct Case {
    std::string var, value, expect;
  };
  const Case cases[] = {
      {"WEAVE_RANK", "abc", "WEAVE_RANK='abc' is not an integer"},
      {"WEAVE_RANK", "", "WEAVE_RANK='' is not an integer"},
      {"WEAVE_RANK", "1x", "is not an integer"},
      {"WEAVE_RANK", " 1", "is not an integer"},
      {"WEAVE_RANK", "99999999999999", "is not an integer"},
      {"WEAVE_RANK", "4", "WEAVE_RANK=4 is outside [0, WEAVE_WORLD_SIZE=4)"},
      {"WEAVE_RANK", "-1", "WEAVE_RANK=-1 is outside"},
      {"WEAVE_WORLD_SIZE", "0", "WEAVE_WORLD_SIZE=0 must be >= 1"},
      {"WEAVE_LOCAL_RANK", "4", "WEAVE_LOCAL_RANK=4 is outside [0, WEAVE_LOCAL_WORLD_SIZE=4)"},
      {"WEAVE_LOCAL_WORLD_SIZE", "0", "WEAVE_LOCAL_WORLD_SIZE=0 must be >= 1"},
      {"WEAVE_LOCAL_WORLD_SIZE", "8", "WEAVE_LOCAL_WORLD_SIZE=8 exceeds WEAVE_WORLD_SIZE=4"},
      {"WEAVE_JOB_ID", "", "WEAVE_JOB_ID is set but empty"},
  };
  for (const Case& c : cases) {
    set(good);
    set({{c.var, c.value}});
    std::string err = error_of();
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.var << "='" << c.value << "' gave: '" << err << "'";
  }
  set(good);
  unsetenv("WEAVE_LOCAL_RANK");
  EXPECT_NE(error_of().find("WEAVE_LOCAL_RANK is not set"), std::string::npos) << error_of();
}

TEST_F(Launch, TorchrunIncompleteOrMalformed) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}});
  EXPECT_NE(error_of().find("torchrun environment is incomplete: LOCAL_RANK is not set"), std::string::npos)
      << error_of();
  set({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "two"}});
  EXPECT_NE(error_of().find("LOCAL_WORLD_SIZE='two' is not an integer"), std::string::npos) << error_of();
}

}  // namespace
