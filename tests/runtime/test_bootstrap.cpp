// Bootstrap across real processes: the test forks one child per rank (no CUDA call happens in
// this binary) and each child reports "ok" or its error text through a pipe.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/runtime/bootstrap.hpp"

using namespace std::chrono_literals;
using weave::runtime::Bootstrap;
using weave::runtime::LaunchInfo;

namespace {

struct Outcome {
  int status;       // exit code, or -1 when killed at the test's deadline
  std::string msg;  // "ok" or the exception text
};

std::string new_job_id() {
  static int counter = 0;
  return "test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

LaunchInfo info(int rank, int world, const std::string& job) { return {rank, world, rank, world, job, "test"}; }

void require(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

struct Procs {
  std::vector<pid_t> pids;
  std::vector<int> pipes;
};

Procs start(const std::vector<LaunchInfo>& infos, const std::function<void(const LaunchInfo&)>& fn) {
  Procs p;
  for (const LaunchInfo& li : infos) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      std::string out = "ok";
      int code = 0;
      try {
        fn(li);
      } catch (const std::exception& e) {
        out = e.what();
        code = 1;
      }
      (void)!write(fds[1], out.data(), out.size());
      _exit(code);
    }
    close(fds[1]);
    p.pids.push_back(pid);
    p.pipes.push_back(fds[0]);
  }
  return p;
}

std::vector<Outcome> finish(Procs& p, std::chrono::seconds limit = 20s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<Outcome> out(p.pids.size(), Outcome{0, ""});
  std::vector<bool> open(p.pids.size(), true);
  for (;;) {
    std::vector<pollfd> pf;
    std::vector<size_t> idx;
    for (size_t i = 0; i < p.pipes.size(); ++i)
      if (open[i]) {
        pf.push_back({p.pipes[i], POLLIN, 0});
        idx.push_back(i);
      }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (pf.empty() || left.count() <= 0) break;
    if (poll(pf.data(), pf.size(), static_cast<int>(left.count())) <= 0) continue;
    for (size_t k = 0; k < pf.size(); ++k) {
      if (!pf[k].revents) continue;
      char buf[4096];
      ssize_t r = read(pf[k].fd, buf, sizeof buf);
      if (r > 0) out[idx[k]].msg.append(buf, static_cast<size_t>(r));
      else open[idx[k]] = false;
    }
  }
  for (size_t i = 0; i < p.pids.size(); ++i) {
    if (open[i]) kill(p.pids[i], SIGKILL);  // hung: exactly what these tests must catch
    int st = 0;
    waitpid(p.pids[i], &st, 0);
    close(p.pipes[i]);
    out[i].status = open[i] ? -1 : (WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    if (open[i]) out[i].msg = "hung (killed at the test deadline): " + out[i].msg;
  }
  return out;
}

std::vector<Outcome> run(const std::vector<LaunchInfo>& infos, const std::function<void(const LaunchInfo&)>& fn,
                         std::chrono::seconds limit = 20s) {
  Procs p = start(infos, fn);
  return finish(p, limit);
}

std::vector<LaunchInfo> job(int world, const std::string& id = new_job_id()) {
  std::vector<LaunchInfo> v;
  for (int r = 0; r < world; ++r) v.push_back(info(r, world, id));
  return v;
}

#define EXPECT_ALL_OK(outcomes)                                                      \
  for (size_t i_ = 0; i_ < (outcomes).size(); ++i_)                                  \
    EXPECT_TRUE((outcomes)[i_].status == 0 && (outcomes)[i_].msg == "ok")            \
        << "process " << i_ << ": status " << (outcomes)[i_].status << ": " << (outcomes)[i_].msg

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

std::string read_fd_at(int fd, size_t n) {
  std::string s(n, '\0');
  ssize_t r = pread(fd, s.data(), n, 0);
  require(r == static_cast<ssize_t>(n), "pread of a received memfd");
  return s;
}

void exercise(const LaunchInfo& li) {
  Bootstrap b(li, 10s);
  const int w = b.world(), me = b.rank();
  require(me == li.rank && w == li.world, "rank/world");

  struct Entry {
    int rank;
    char tag[12];
    unsigned long long x;
  };
  Entry mine{me, "bootstrap", 1000ull * me + 7};
  std::vector<Entry> all(w);
  b.all_gather(&mine, all.data(), sizeof mine);
  for (int r = 0; r < w; ++r)
    require(all[r].rank == r && all[r].x == 1000ull * r + 7 && !std::strcmp(all[r].tag, "bootstrap"), "small all_gather");

  // Larger than a socket buffer: partial reads and writes happen.
  const size_t big = 300 * 1024;
  std::vector<unsigned char> in(big), out(big * w);
  for (size_t i = 0; i < big; ++i) in[i] = static_cast<unsigned char>(i * 31 + me);
  b.all_gather(in.data(), out.data(), big);
  for (int r = 0; r < w; ++r)
    for (size_t i = 0; i < big; i += 997) require(out[r * big + i] == static_cast<unsigned char>(i * 31 + r), "big all_gather");

  for (int i = 0; i < 3; ++i) b.barrier();

  // memfd: every rank reads every other rank's data through the received fd.
  int mfd = memfd_create("weave-test", MFD_CLOEXEC);
  require(mfd >= 0, "memfd_create");
  std::string text = "data of rank " + std::to_string(me);
  require(write(mfd, text.data(), text.size()) == static_cast<ssize_t>(text.size()), "write memfd");
  std::vector<int> fds = b.all_gather_fd(mfd);
  require(static_cast<int>(fds.size()) == w, "fd count");
  for (int r = 0; r < w; ++r) {
    std::string expect = "data of rank " + std::to_string(r);
    require(fds[r] >= 0 && fds[r] != mfd, "own entry must be a new fd");
    require(read_fd_at(fds[r], expect.size()) == expect, "memfd contents of rank " + std::to_string(r));
    close(fds[r]);
  }
  close(mfd);

  // pipe: each rank writes into the next rank's pipe through the received write end.
  int p[2];
  require(pipe2(p, O_CLOEXEC) == 0, "pipe");
  fds = b.all_gather_fd(p[1]);
  std::string msg = "from " + std::to_string(me);
  int next = (me + 1) % w, prev = (me + w - 1) % w;
  require(write(fds[next], msg.data(), msg.size()) == static_cast<ssize_t>(msg.size()), "write pipe");
  b.barrier();
  std::string want = "from " + std::to_string(prev), got(want.size(), '\0');
  require(read(p[0], got.data(), got.size()) == static_cast<ssize_t>(got.size()) && got == want, "pipe contents");
  for (int f : fds) close(f);
  close(p[0]);
  close(p[1]);
}

TEST(Bootstrap, CollectivesAcrossProcesses) {
  for (int w : {1, 2, 3, 5, 8}) {
    SCOPED_TRACE("world " + std::to_string(w));
    auto out = run(job(w), exercise);
    EXPECT_ALL_OK(out);
  }
}

TEST(Bootstrap, LongJobIdIsHashed) {
  auto out = run(job(2, new_job_id() + std::string(300, 'x')), exercise);
  EXPECT_ALL_OK(out);
}

TEST(Bootstrap, ConcurrentJobsDoNotCollide) {
  // Same world, same ranks, started together: only the job id tells them apart.
  const std::string a = new_job_id(), b = new_job_id();
  auto check = [](const LaunchInfo& li) {
    Bootstrap bs(li, 10s);
    char tag[64] = {};
    std::snprintf(tag, sizeof tag, "%s/%d", li.job_id.c_str(), li.rank);
    std::vector<char> all(sizeof tag * li.world);
    for (int round = 0; round < 20; ++round) {
      bs.all_gather(tag, all.data(), sizeof tag);
      for (int r = 0; r < li.world; ++r)
        require(std::string(&all[r * sizeof tag]) == li.job_id + "/" + std::to_string(r), "entry from another job");
    }
  };
  auto ja = job(4, a), jb = job(4, b);
  std::vector<LaunchInfo> both;
  for (int r = 0; r < 4; ++r) {
    both.push_back(ja[r]);
    both.push_back(jb[r]);
  }
  auto out = run(both, check);
  EXPECT_ALL_OK(out);
}

TEST(Bootstrap, NoFdLeaks) {
  auto loop = [](const LaunchInfo& li) {
    const size_t before = open_fds();
    for (int i = 0; i < 100; ++i) {
      LaunchInfo it = li;
      it.job_id += "-" + std::to_string(i);
      Bootstrap b(it, 10s);
      int p[2];
      require(pipe2(p, O_CLOEXEC) == 0, "pipe");
      for (int f : b.all_gather_fd(p[0])) close(f);
      close(p[0]);
      close(p[1]);
      b.barrier();
    }
    const size_t after = open_fds();
    require(after == before, "open fds grew from " + std::to_string(before) + " to " + std::to_string(after));
  };
  auto out = run(job(3), loop);
  EXPECT_ALL_OK(out);
}

TEST(Bootstrap, TimeoutNamesMissingRanks) {
  const std::string id = new_job_id();
  // Rank 2 waits longer than rank 0, so it hears rank 0's verdict rather than timing out itself.
  auto out = run({info(0, 4, id), info(2, 4, id)}, [](const LaunchInfo& li) { Bootstrap b(li, li.rank == 0 ? 500ms : 5s); });
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].status, 1) << out[0].msg;
  EXPECT_TRUE(contains(out[0].msg, "rank(s) 1, 3 of 4 never connected")) << out[0].msg;
  EXPECT_EQ(out[1].status, 1) << out[1].msg;
  EXPECT_TRUE(contains(out[1].msg, "rank 0 says") && contains(out[1].msg, "1, 3")) << out[1].msg;
}

TEST(Bootstrap, NoRankZero) {
  auto out = run({info(1, 2, new_job_id())}, [](const LaunchInfo& li) { Bootstrap b(li, 300ms); });
  EXPECT_EQ(out[0].status, 1);
  EXPECT_TRUE(contains(out[0].msg, "rank 1 could not reach rank 0")) << out[0].msg;
}

TEST(Bootstrap, WorldMismatchRejected) {
  const std::string id = new_job_id();
  auto out = run({info(0, 2, id), info(1, 3, id)}, [](const LaunchInfo& li) { Bootstrap b(li, 5s); });
  for (auto& o : out) {
    EXPECT_EQ(o.status, 1) << o.msg;
    EXPECT_TRUE(contains(o.msg, "rank 1 has world size 3 but rank 0 has 2")) << o.msg;
  }
}

TEST(Bootstrap, DuplicateRankRejected) {
  const std::string id = new_job_id();
  auto out = run({info(0, 3, id), info(1, 3, id), info(1, 3, id)}, [](const LaunchInfo& li) { Bootstrap b(li, 5s); });
  EXPECT_EQ(out[0].status, 1);
  EXPECT_TRUE(contains(out[0].msg, "two processes claim rank 1")) << out[0].msg;
  for (auto& o : out) EXPECT_EQ(o.status, 1) << o.msg;
}

TEST(Bootstrap, SameJobIdTwiceIsAnError) {
  const std::string id = new_job_id();
  Procs first = start({info(0, 2, id)}, [](const LaunchInfo& li) { Bootstrap b(li, 1s); });
  usleep(200 * 1000);
  auto second = run({info(0, 2, id)}, [](const LaunchInfo& li) { Bootstrap b(li, 2s); });
  EXPECT_EQ(second[0].status, 1);
  EXPECT_TRUE(contains(second[0].msg, "already in use")) << second[0].msg;
  finish(first);
}

// A rank waiting in a collective for a peer that will not come (it rejected a call the waiting
// rank had launched, and said so in its abort word) ends the wait with the interrupt's reason
// within a poll period, on rank 0 (serving) and on another rank (waiting for rank 0's answer);
// the peer stays alive past the test's checks, so only the interrupt can end the wait.
TEST(Bootstrap, InterruptEndsAWaitForAPeerThatWillNotCome) {
  for (int waiter : {0, 1}) {
    auto out = run(job(2), [waiter](const LaunchInfo& li) {
      Bootstrap b(li, 10s);
      if (li.rank != waiter) {
        std::this_thread::sleep_for(2500ms);
        return;
      }
      const auto t0 = std::chrono::steady_clock::now();
      b.set_interrupt([t0] {
        return std::chrono::steady_clock::now() - t0 > 300ms ? std::string("peer said it will not come") : std::string();
      });
      try {
        b.barrier();
      } catch (const weave::Error& e) {
        const auto waited = std::chrono::steady_clock::now() - t0;
        require(contains(e.what(), "peer said it will not come"), e.what());
        require(waited < 2s, "the interrupt took too long");
        throw;
      }
    });
    EXPECT_EQ(out[waiter].status, 1) << out[waiter].msg;
    EXPECT_TRUE(contains(out[waiter].msg, "peer said it will not come")) << "waiter " << waiter << ": " << out[waiter].msg;
    EXPECT_EQ(out[1 - waiter].status, 0) << out[1 - waiter].msg;
  }
}

// The same for a rank whose payload does not fit the socket's buffer: its send to a rank 0 that is
// alive but not in the collective waits for room, and the interrupt ends that wait too.
TEST(Bootstrap, InterruptEndsASendToAPeerThatIsNotReading) {
  auto out = run(job(2), [](const LaunchInfo& li) {
    Bootstrap b(li, 10s);
    if (li.rank == 0) {
      std::this_thread::sleep_for(2500ms);
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    b.set_interrupt([t0] {
      return std::chrono::steady_clock::now() - t0 > 300ms ? std::string("peer said it will not come") : std::string();
    });
    const size_t bytes = size_t(64) << 20;  // far more than a socket buffer
    std::vector<char> mine(bytes, 1), all(2 * bytes);
    try {
      b.all_gather(mine.data(), all.data(), bytes);
    } catch (const weave::Error& e) {
      require(contains(e.what(), "peer said it will not come"), e.what());
      require(std::chrono::steady_clock::now() - t0 < 2s, "the interrupt took too long");
      throw;
    }
  });
  EXPECT_EQ(out[1].status, 1) << out[1].msg;
  EXPECT_TRUE(contains(out[1].msg, "peer said it will not come")) << out[1].msg;
  EXPECT_EQ(out[0].status, 0) << out[0].msg;
}

TEST(Bootstrap, PeerDeathIsAnErrorNotAHang) {
  auto out = run(job(4), [](const LaunchInfo& li) {
    Bootstrap b(li, 10s);
    b.barrier();
    if (li.rank == 3) _exit(0);  // dies without a word, between collectives
    int x = li.rank, all[4];
    try {
      b.all_gather(&x, all, sizeof x);
    } catch (const weave::Error&) {
      bool unusable = false;
      try {
        b.barrier();
      } catch (const weave::Error& again) {
        unusable = contains(again.what(), "unusable");
      }
      require(unusable, "a call after the error did not report the bootstrap unusable");
      throw;  // report the first error
    }
  });
  EXPECT_EQ(out[3].status, 0);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r].status, 1) << "rank " << r << ": " << out[r].msg;
  EXPECT_TRUE(contains(out[0].msg, "rank 3 closed the connection")) << out[0].msg;
  EXPECT_TRUE(contains(out[1].msg, "rank 0")) << out[1].msg;  // EOF, or EPIPE if rank 0 closed first
}

TEST(Bootstrap, MismatchedCollectivesAreErrors) {
  auto order = run(job(3), [](const LaunchInfo& li) {
    Bootstrap b(li, 10s);
    int x = 0, all[3];
    if (li.rank == 2) b.barrier();
    else b.all_gather(&x, all, sizeof x);
  });
  for (auto& o : order) EXPECT_EQ(o.status, 1) << o.msg;
  EXPECT_TRUE(contains(order[0].msg, "different orders")) << order[0].msg;

  auto size = run(job(3), [](const LaunchInfo& li) {
    Bootstrap b(li, 10s);
    long long x[2] = {}, all[6];
    b.all_gather(x, all, li.rank == 1 ? 16 : 8);
  });
  for (auto& o : size) EXPECT_EQ(o.status, 1) << o.msg;
  EXPECT_TRUE(contains(size[0].msg, "size mismatch: rank 1 sent 16 bytes, rank 0 8")) << size[0].msg;
}

TEST(Bootstrap, MultiNodeNeedsMpi) {
  LaunchInfo li{0, 4, 0, 2, new_job_id(), "test"};
  try {
    Bootstrap b(li, 1s);
    FAIL() << "a multi-node bootstrap was accepted";
  } catch (const weave::Error& e) {
    EXPECT_TRUE(contains(e.what(), "multi-node") && contains(e.what(), "MPI")) << e.what();
  }
}

}  // namespace
