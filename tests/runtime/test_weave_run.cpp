// weave-run end to end, CPU only (--no-gpu): environment of the ranks, failure propagation,
// timeouts, signal forwarding and option validation.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Result {
  int status = -1;  // exit code; 128 + signal if weave-run itself was killed; -1 if it hung
  std::string out;  // stdout and stderr together
  double seconds = 0;
};

// Runs weave-run with `args`; `helper` in args is replaced by the rank helper's path. With
// `sig`, sends it to weave-run after `sig_after_ms`.
Result weave_run(std::vector<std::string> args, int sig = 0, int sig_after_ms = 0) {
  std::vector<char*> argv{const_cast<char*>(WEAVE_RUN_BIN)};
  for (auto& a : args) {
    if (a == "helper") a = RANK_HELPER_BIN;
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  int p[2];
  if (pipe(p) != 0) return {};
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    close(p[0]);
    close(p[1]);
    execv(argv[0], argv.data());
    _exit(126);
  }
  close(p[1]);
  Result r;
  bool signalled = false, hung = false;
  // EOF on the pipe comes only once weave-run and every rank (they inherit it) are gone.
  for (;;) {
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (t > 30) {
      hung = true;
      kill(pid, SIGKILL);
      break;
    }
    if (sig && !signalled && t * 1000 >= sig_after_ms) {
      kill(pid, sig);
      signalled = true;
    }
    pollfd pf{p[0], POLLIN, 0};
    if (poll(&pf, 1, 50) <= 0) continue;
    char buf[4096];
    ssize_t n = read(p[0], buf, sizeof buf);
    if (n <= 0) break;
    r.out.append(buf, static_cast<size_t>(n));
  }
  close(p[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = hung ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(WeaveRun, RanksBootstrapTogether) {
  Result r = weave_run({"--no-gpu", "-n", "4", "--", "helper", "bootstrap"});
  EXPECT_EQ(r.status, 0) << r.out;
}

TEST(WeaveRun, RankEnvironment) {
  setenv("CUDA_VISIBLE_DEVICES", "3,5", 1);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  setenv("WEAVE_RANK", "9", 1);  // stale value from an outer job: must be replaced
  Result a = weave_run({"--no-gpu", "-n", "3", "helper", "env"});
  Result b = weave_run({"--no-gpu", "-n", "3", "helper", "env"});
  unsetenv("CUDA_VISIBLE_DEVICES");
  unsetenv("NCCL_NVLS_ENABLE");
  unsetenv("WEAVE_RANK");
  ASSERT_EQ(a.status, 0) << a.out;
  ASSERT_EQ(b.status, 0) << b.out;
  std::regex line_re(R"(rank=(\d+) world=3 local_rank=(\d+) local_world=3 launcher=weave-run job=(\S+) cvd=3,5 nvls=0)");
  auto parse = [&](const std::string& out, std::set<std::string>& jobs) {
    std::set<int> ranks;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      EXPECT_TRUE(std::regex_match(line, m, line_re)) << "unexpected line: " << line;
      if (m.empty()) continue;
      EXPECT_EQ(m[1], m[2]);
      ranks.insert(std::stoi(m[1]));
      jobs.insert(m[3]);
    }
    EXPECT_EQ(ranks, (std::set<int>{0, 1, 2})) << out;
  };
  std::set<std::string> ja, jb;
  parse(a.out, ja);
  parse(b.out, jb);
  ASSERT_EQ(ja.size(), 1u) << "ranks of one job disagree on the job id";
  ASSERT_EQ(jb.size(), 1u);
  EXPECT_NE(*ja.begin(), *jb.begin()) << "two jobs got the same job id";
}

TEST(WeaveRun, FailingRankStopsTheOthers) {
  Result r = weave_run({"--no-gpu", "-n", "3", "helper", "exit", "1", "5"});
  EXPECT_EQ(r.status, 5) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(weave-run: rank 1 \(pid \d+\) exited with status 5)"))) << r.out;
  EXPECT_LT(r.seconds, 5) << "the sleeping ranks were not stopped promptly";
}

TEST(WeaveRun, RanksFailingWhileOthersSettleAreReported) {
  // The rank reaped first is not the one with the diagnostic; it must not be killed before it
  // exits with its own status, and both exits are reported.
  Result r = weave_run({"--no-gpu", "-n", "3", "helper", "cascade", "0", "3"});
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(weave-run: rank 0 \(pid \d+\) exited with status 3)"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(weave-run: rank [12] \(pid \d+\) exited with status 9)"))) << r.out;
  EXPECT_FALSE(contains(r.out, "killed by signal")) << r.out;
  EXPECT_LT(r.seconds, 5) << r.out;
}

TEST(WeaveRun, KilledRankStopsTheOthers) {
  Result r = weave_run({"--no-gpu", "-n", "3", "helper", "kill", "2"});
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(weave-run: rank 2 \(pid \d+\) killed by signal SIGKILL)"))) << r.out;
  EXPECT_LT(r.seconds, 5) << r.out;
}

TEST(WeaveRun, RanksIgnoringSigtermAreKilled) {
  Result r = weave_run({"--no-gpu", "-n", "3", "helper", "stubborn", "0", "3"});
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_TRUE(contains(r.out, "sending SIGKILL")) << r.out;
  EXPECT_GT(r.seconds, 2.5) << r.out;
  EXPECT_LT(r.seconds, 8) << r.out;
}

TEST(WeaveRun, Timeout) {
  Result r = weave_run({"--no-gpu", "-n", "2", "--timeout", "1", "helper", "sleep"});
  EXPECT_EQ(r.status, 124) << r.out;
  EXPECT_TRUE(contains(r.out, "--timeout 1 s")) << r.out;
  EXPECT_GT(r.seconds, 0.9);
  EXPECT_LT(r.seconds, 5) << r.out;
}

TEST(WeaveRun, ForwardsSigterm) {
  Result r = weave_run({"--no-gpu", "-n", "2", "helper", "sleep"}, SIGTERM, 500);
  EXPECT_EQ(r.status, 128 + SIGTERM) << r.out;
  EXPECT_TRUE(contains(r.out, "received SIGTERM")) << r.out;
  EXPECT_LT(r.seconds, 5) << r.out;
}

TEST(WeaveRun, OptionValidation) {
  for (std::vector<std::string> args : {std::vector<std::string>{"--no-gpu", "-n", "0", "helper", "env"},
                                        {"--no-gpu", "-n", "65", "helper", "env"},
                                        {"--no-gpu", "-n", "abc", "helper", "env"},
                                        {"--no-gpu", "-n", "2x", "helper", "env"},
                                        {"--no-gpu", "-n"},
                                        {"--no-gpu", "--bogus", "helper", "env"},
                                        {"--no-gpu", "--timeout", "0", "helper", "env"},
                                        {"--no-gpu", "-n", "2"},
                                        {"--no-gpu", "-n", "2", "--"}}) {
    Result r = weave_run(args);
    std::string joined;
    for (auto& a : args) joined += a + " ";
    EXPECT_EQ(r.status, 2) << joined << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "usage: weave-run")) << joined << "\n" << r.out;
  }
  Result missing = weave_run({"--no-gpu", "-n", "2", "/nonexistent/program"});
  EXPECT_EQ(missing.status, 127) << missing.out;
  EXPECT_TRUE(contains(missing.out, "cannot execute '/nonexistent/program'")) << missing.out;
  EXPECT_TRUE(contains(missing.out, "exited with status 127")) << missing.out;
}

TEST(WeaveRun, GpuCount) {
  // The refusal is what is tested: with WEAVE_SHARE_GPUS=1 inherited (device scripts set it for a
  // whole suite on one GPU) weave-run would start the 64 sleeping ranks on the shared GPU instead.
  unsetenv("WEAVE_SHARE_GPUS");
  Result count = weave_run({"--count-gpus"});
  ASSERT_EQ(count.status, 0) << count.out;
  ASSERT_TRUE(std::regex_match(count.out, std::regex(R"(\d+\n)"))) << count.out;
  const int k = std::stoi(count.out);
  const std::string ks = std::to_string(k);
  Result need = weave_run({"-n", "64", "helper", "sleep"});
  EXPECT_EQ(need.status, 2) << need.out;
  EXPECT_TRUE(contains(need.out, "weave-run: 64 ranks need 64 GPUs, only " + ks + " visible")) << need.out;
  Result skip = weave_run({"-n", "64", "--skip-missing-gpus", "helper", "sleep"});
  EXPECT_EQ(skip.status, 77) << skip.out;
  EXPECT_TRUE(contains(skip.out, "weave-run: skipped: 64 ranks need 64 GPUs, " + ks + " visible")) << skip.out;
}

}  // namespace
