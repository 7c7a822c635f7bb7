// Runs a program and collects what it printed and how it ended, for the tests that drive
// weave-run end to end (test_net_nodes, test_net_bench), or several at once under a time limit
// (test_net_launchers: torchrun agents, mpirun).
#pragma once
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace weave::test {

struct Result {
  int status = -1;         // exit status, or 128 + signal
  std::string out;         // stdout and stderr together
  bool timed_out = false;  // killed by run_commands' time limit
};

// args[0] is the program's path, the rest its arguments.
inline Result run_command(const std::vector<std::string>& args) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  Result r;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) r.out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

struct Command {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH
  std::vector<std::string> set;   // "NAME=value" on top of this process's environment
};

// Starts every command at once, each in its own process group, with this process's environment
// less the variables named in `unset` (a trailing '*' matches a prefix) plus the command's own.
// A command still running after `limit` gets SIGTERM on its group (launchers forward it to ranks
// in other sessions, as torchrun's are), SIGKILL 5 s later. Output is read until every command
// ended, then at most 2 s more (an orphaned rank may hold the pipe open).
inline std::vector<Result> run_commands(const std::vector<Command>& cmds, std::chrono::milliseconds limit,
                                        const std::vector<std::string>& unset = {}) {
  using Clock = std::chrono::steady_clock;
  auto dropped = [&](const char* kv) {
    for (const std::string& u : unset) {
      const bool prefix = !u.empty() && u.back() == '*';
      const size_t n = prefix ? u.size() - 1 : u.size();
      if (std::strncmp(kv, u.c_str(), n) == 0 && (prefix || kv[n] == '=')) return true;
    }
    return false;
  };
  const size_t n = cmds.size();
  std::vector<Result> res(n);
  std::vector<pid_t> pid(n, -1);
  std::vector<int> fd(n, -1);
  for (size_t i = 0; i < n; ++i) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (!dropped(*e)) env.emplace_back(*e);
    env.insert(env.end(), cmds[i].set.begin(), cmds[i].set.end());
    std::vector<char*> argv, envp;
    for (const std::string& a : cmds[i].argv) argv.push_back(const_cast<char*>(a.c_str()));
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    int fds[2];
    if (pipe(fds) != 0) break;
    pid[i] = fork();
    if (pid[i] == 0) {
      setpgid(0, 0);
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      close(fds[1]);
      execvpe(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    if (pid[i] > 0) setpgid(pid[i], pid[i]);  // also here: a kill before the child ran setpgid must reach it
    close(fds[1]);
    fd[i] = fds[0];
  }
  const auto start = Clock::now();
  auto term_at = start + limit, kill_at = Clock::time_point::max(), drain_until = Clock::time_point::max();
  for (;;) {
    size_t running = 0;
    for (size_t i = 0; i < n; ++i) {
      int st = 0;
      if (pid[i] > 0 && waitpid(pid[i], &st, WNOHANG) == pid[i]) {
        res[i].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pid[i] = -pid[i];  // ended; its group may live on
      }
      running += pid[i] > 0;
    }
    const auto now = Clock::now();
    if (running == 0 && drain_until == Clock::time_point::max()) drain_until = now + std::chrono::seconds(2);
    if (now >= term_at) {
      for (size_t i = 0; i < n; ++i)
        if (pid[i] > 0) {
          res[i].timed_out = true;
          kill(-pid[i], SIGTERM);
        }
      term_at = Clock::time_point::max();
      kill_at = now + std::chrono::seconds(5);
    }
    if (now >= kill_at) {
      for (size_t i = 0; i < n; ++i)
        if (pid[i] != -1) kill(-(pid[i] > 0 ? pid[i] : -pid[i]), SIGKILL);
      kill_at = Clock::time_point::max();
    }
    std::vector<pollfd> p;
    for (size_t i = 0; i < n; ++i)
      if (fd[i] >= 0) p.push_back({fd[i], POLLIN, 0});
    if (p.empty() && running == 0) break;
    if (now >= drain_until) break;
    if (p.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    poll(p.data(), p.size(), 20);
    for (const pollfd& q : p) {
      if (!(q.revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const size_t i = static_cast<size_t>(std::find(fd.begin(), fd.end(), q.fd) - fd.begin());
      char buf[4096];
      const ssize_t got = read(q.fd, buf, sizeof buf);
      if (got > 0) {
        res[i].out.append(buf, static_cast<size_t>(got));
      } else {
        close(fd[i]);
        fd[i] = -1;
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (fd[i] >= 0) close(fd[i]);
    if (pid[i] > 0) {  // SIGKILLed above but not reaped yet
      int st = 0;
      waitpid(pid[i], &st, 0);
      res[i].status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
  }
  return res;
}

}  // namespace weave::test
