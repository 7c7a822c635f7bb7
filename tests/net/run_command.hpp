// Runs a program and collects what it printed and how it ended, for the tests that drive
// weave-run end to end (test_net_nodes, test_net_bench).
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace weave::test {

struct Result {
  int status = -1;  // exit status, or 128 + signal
  std::string out;  // stdout and stderr together
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

}  // namespace weave::test
