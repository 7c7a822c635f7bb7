// Two (or more) ranks of the network path in forked processes on this machine: run_ranks joins
// them by weave's node-local bootstrap under a fresh job id, run_processes leaves the joining to
// the function (NetPath's tests join over NetBootstrap). A rank's function returns a report (text for the parent to
// check) or throws; a rank may also end itself (_exit, a signal) to play a dead peer. The parent
// collects every rank's outcome through shared memory and kills what still runs at the deadline,
// so a hang is a failure, never a stuck test.
#pragma once
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "weave/runtime/bootstrap.hpp"

namespace weave::net::test {

struct RankOutcome {
  bool returned = false;  // the function returned (its report is `text`)
  bool killed = false;    // still running at the deadline (a hang)
  int exit_code = -1;     // -1: ended by a signal
  int signal = 0;
  std::string text;       // the report, or the exception's message
};

using RankFn = std::function<std::string(runtime::Bootstrap&)>;
using ProcessFn = std::function<std::string(int rank)>;

// Forks `world` processes running fn(rank) and collects their outcomes (see above).
inline std::vector<RankOutcome> run_processes(int world, const ProcessFn& fn,
                                              std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
  constexpr size_t kBox = 16384;  // per rank: a status byte, then the text
  void* shared = mmap(nullptr, kBox * world, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) throw std::runtime_error("mmap");
  char* box = static_cast<char*>(shared);
  std::memset(box, 0, kBox * world);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork");
    if (pid == 0) {
      char* mine = box + kBox * r;
      std::string text;
      char status = 'E';
      try {
        text = fn(r);
        status = 'R';
      } catch (const std::exception& e) {
        text = e.what();
      }
      std::memcpy(mine + 1, text.data(), std::min(text.size(), kBox - 2));
      mine[0] = status;
      _exit(status == 'R' ? 0 : 1);
    }
    pids.push_back(pid);
  }
  std::vector<RankOutcome> out(static_cast<size_t>(world));
  std::vector<bool> done(static_cast<size_t>(world), false);
  const auto end = std::chrono::steady_clock::now() + deadline;
  for (int left = world; left > 0;) {
    for (int r = 0; r < world; ++r) {
      int st = 0;
      if (done[r] || waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
      done[r] = true;
      --left;
      out[r].exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      out[r].signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    }
    if (left > 0 && std::chrono::steady_clock::now() > end) {
      for (int r = 0; r < world; ++r)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          out[r].killed = true;
          done[r] = true;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int r = 0; r < world; ++r) {
    const char* mine = box + kBox * r;
    out[r].returned = mine[0] == 'R';
    out[r].text = std::string(mine + 1, strnlen(mine + 1, kBox - 2));
  }
  munmap(shared, kBox * world);
  return out;
}

// Ranks joined by the node-local bootstrap under a fresh job id.
inline std::vector<RankOutcome> run_ranks(int world, const RankFn& fn,
                                          std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
  static int jobs = 0;
  const std::string job = "net-test-" + std::to_string(getpid()) + "-" + std::to_string(jobs++);
  return run_processes(
      world,
      [&](int r) {
        runtime::Bootstrap boot({r, world, r, world, job, "test"}, std::chrono::seconds(10));
        return fn(boot);
      },
      deadline);
}

// "rank r: returned 'text'" and the like, for assertion messages.
inline std::string describe(const std::vector<RankOutcome>& out) {
  std::string s;
  for (size_t r = 0; r < out.size(); ++r) {
    const RankOutcome& o = out[r];
    s += "rank " + std::to_string(r) + ": ";
    s += o.killed ? "hung (killed at the deadline)"
         : o.returned ? "returned"
         : o.signal  ? "killed by signal " + std::to_string(o.signal)
                     : "exit " + std::to_string(o.exit_code);
    s += ": " + o.text + "\n";
  }
  return s;
}

}  // namespace weave::net::test
