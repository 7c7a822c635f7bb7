// A rank program for the weave-run tests: `weave_test_rank_helper MODE [ARGS]`.
//   exit R CODE      rank R exits with CODE, the others sleep
//   kill R           rank R dies of SIGKILL, the others sleep
//   stubborn R CODE  like exit, but every rank ignores SIGTERM
//   sleep            every rank sleeps
//   env              print this rank's launch environment on one line
//   bootstrap        connect all ranks through Bootstrap and check the exchanged data
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "weave/runtime/bootstrap.hpp"
#include "weave/runtime/launch.hpp"

namespace {

void sleep_long() {
  // Sleeps in pieces: a handled-and-ignored signal must not end the wait early.
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

int check_bootstrap(const weave::runtime::LaunchInfo& li) {
  weave::runtime::Bootstrap b(li, std::chrono::seconds(10));
  std::vector<int> all(b.world());
  int mine = 100 + b.rank();
  b.all_gather(&mine, all.data(), sizeof mine);
  for (int r = 0; r < b.world(); ++r)
    if (all[r] != 100 + r) return std::fprintf(stderr, "rank %d: bad all_gather entry %d\n", b.rank(), r), 1;
  int fd = memfd_create("helper", MFD_CLOEXEC);
  if (fd < 0 || write(fd, &mine, sizeof mine) != sizeof mine) return 1;
  std::vector<int> fds = b.all_gather_fd(fd);
  for (int r = 0; r < b.world(); ++r) {
    int v = -1;
    if (pread(fds[r], &v, sizeof v, 0) != sizeof v || v != 100 + r)
      return std::fprintf(stderr, "rank %d: bad fd from rank %d\n", b.rank(), r), 1;
    close(fds[r]);
  }
  close(fd);
  b.barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) return 2;
    const std::string mode = argv[1];
    const auto li = weave::runtime::detect_launch();
    const int target = argc > 2 ? std::atoi(argv[2]) : -1;
    const int code = argc > 3 ? std::atoi(argv[3]) : 1;
    if (mode == "env") {
      std::string line = "rank=" + std::to_string(li.rank) + " world=" + std::to_string(li.world) +
                         " local_rank=" + std::to_string(li.local_rank) + " local_world=" + std::to_string(li.local_world) +
                         " launcher=" + li.launcher + " job=" + li.job_id +
                         " cvd=" + env_or("CUDA_VISIBLE_DEVICES", "<unset>") +
                         " nvls=" + env_or("NCCL_NVLS_ENABLE", "<unset>") + "\n";
      (void)!write(STDOUT_FILENO, line.data(), line.size());  // one write: lines of ranks do not interleave
      return 0;
    }
    if (mode == "bootstrap") return check_bootstrap(li);
    if (mode == "cascade") {
      // The target fails first but takes a while to exit (a CUDA context teardown); the others
      // notice at once (a closed bootstrap socket) and exit before it with status 9.
      std::this_thread::sleep_for(std::chrono::milliseconds(li.rank == target ? 600 : 200));
      return li.rank == target ? code : 9;
    }
    if (mode == "stubborn") signal(SIGTERM, SIG_IGN);
    if (li.rank == target) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (mode == "kill") raise(SIGKILL);
      return code;
    }
    if (mode == "exit" || mode == "kill" || mode == "stubborn" || mode == "sleep") {
      sleep_long();
      return 0;
    }
    std::fprintf(stderr, "rank helper: unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank helper: %s\n", e.what());
    return 1;
  }
}
