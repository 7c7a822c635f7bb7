// weave-run: start N ranks of PROG on this machine, one GPU each (rank r uses device r). If one
// rank fails, stop the others and exit non-zero naming it. See usage() for the options.
//
// --nodes K splits the ranks into K simulated nodes of N / K ranks each, in contiguous blocks
// (rank r on node r / (N / K)), as a multi-node launcher would place them: each rank gets its
// node's local rank and size (WEAVE_LOCAL_*), a node name (WEAVE_HOSTNAME = <host>/node<k>,
// which the network path's bootstrap groups ranks by), the job's rendezvous address
// (WEAVE_BOOTSTRAP, a free loopback port unless set) and its node's GPUs (CUDA_VISIBLE_DEVICES:
// rank r on GPU r % GPUs, the node's block first, so a node sees only its own GPUs).
#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/common/gpus.hpp"
#include "weave/runtime/env.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxRanks = 64;
constexpr auto kGrace = std::chrono::seconds(3);  // SIGTERM to SIGKILL
// After a rank fails, the others get this long to exit on their own before SIGTERM: a failure
// usually fails its peers too (a closed bootstrap socket), and the one that failed first may
// still be tearing down its CUDA context, so the launcher would otherwise report whichever rank
// it happened to reap first and kill the one that holds the actual diagnostic.
constexpr auto kSettle = std::chrono::seconds(1);

int usage(const char* why) {
  if (why) std::fprintf(stderr, "weave-run: %s\n", why);
  std::fprintf(stderr,
               "usage: weave-run [-n N] [--nodes K] [--no-gpu] [--skip-missing-gpus] [--share-gpus] [--count-gpus] "
               "[--timeout SECONDS] [--] PROG [ARGS...]\n"
               "  -n N                 ranks to start, 1..%d (default: the number of visible GPUs)\n"
               "  --nodes K            K simulated nodes of N/K ranks each (contiguous blocks; K must divide N):\n"
               "                       per-node WEAVE_LOCAL_*, WEAVE_HOSTNAME, CUDA_VISIBLE_DEVICES, and a\n"
               "                       loopback WEAVE_BOOTSTRAP for the network path\n"
               "  --no-gpu             do not check that N GPUs are visible (CPU-only programs)\n"
               "  --skip-missing-gpus  with fewer than N GPUs, print 'skipped' and exit 77\n"
               "  --share-gpus         more ranks than GPUs: rank r uses GPU r %% GPUs (correctness runs only;\n"
               "                       ranks on one GPU time-slice)\n"
               "  --count-gpus         print the number of visible GPUs and exit\n"
               "  --timeout SECONDS    stop all ranks after this wall time and exit 124\n",
               kMaxRanks);
  return why ? 2 : 0;
}

// The visible GPUs; 0 on a machine without any. Where the NVIDIA driver is loaded but CUDA fails,
// the launcher stops with the error: skipping there would turn a broken GPU into a green run.
int visible_gpus() {
  const weave::GpuCount g = weave::count_gpus();
  if (g.error) {
    std::fprintf(stderr, "weave-run: the NVIDIA driver is loaded but CUDA cannot count the GPUs: %s\n", g.why.c_str());
    std::exit(1);
  }
  return g.count;
}

bool parse_int(const char* s, int& out) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  if (errno || end == s || *end || v < -1000000 || v > 1000000) return false;
  out = static_cast<int>(v);
  return true;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string make_job_id() {
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  unsigned long long rnd = 0;
  if (getrandom(&rnd, sizeof rnd, 0) != sizeof rnd)
    rnd = static_cast<unsigned long long>(Clock::now().time_since_epoch().count());
  char buf[400];
  std::snprintf(buf, sizeof buf, "%s-%d-%016llx", host, static_cast<int>(getpid()), rnd);
  return buf;
}

struct Rank {
  pid_t pid = -1;
  bool alive = false;
};

// A free TCP port on loopback for the network path's rendezvous: bound, read, closed (a job that
// takes it in between makes the bootstrap fail with "port in use", never join the wrong job:
// the job tag differs).
int free_loopback_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t c = s.find(',', start);
    out.push_back(s.substr(start, c == std::string::npos ? std::string::npos : c - start));
    if (c == std::string::npos) break;
    start = c + 1;
  }
  return out;
}

// The per-rank variables of --nodes (see the header). `gpus` = 0: no GPU placement (--no-gpu).
std::vector<std::vector<std::string>> node_env(int n, int nodes, int gpus) {
  const int g = n / nodes;
  char host[256] = "host";
  gethostname(host, sizeof host - 1);
  std::string rendezvous;
  if (auto b = weave::env::raw("WEAVE_BOOTSTRAP"); b && !b->empty()) {
    rendezvous = *b;
  } else {
    const int port = free_loopback_port();
    if (port <= 0) throw weave::Error("weave-run: --nodes: cannot find a free loopback port for the rendezvous");
    rendezvous = "127.0.0.1:" + std::to_string(port);
  }
  std::vector<std::string> devices;
  if (gpus > 0) {
    const auto cvd = weave::env::raw("CUDA_VISIBLE_DEVICES");
    if (cvd && !cvd->empty()) devices = split_commas(*cvd);
    else
      for (int i = 0; i < gpus; ++i) devices.push_back(std::to_string(i));
    if (static_cast<int>(devices.size()) > gpus) devices.resize(gpus);  // CUDA stops at the first invalid entry
  }
  std::vector<std::vector<std::string>> env(n);
  for (int r = 0; r < n; ++r) {
    const int node = r / g;
    env[r] = {"WEAVE_LOCAL_RANK=" + std::to_string(r % g), "WEAVE_LOCAL_WORLD_SIZE=" + std::to_string(g),
              "WEAVE_HOSTNAME=" + std::string(host) + "/node" + std::to_string(node), "WEAVE_BOOTSTRAP=" + rendezvous};
    if (!devices.empty()) {
      const int d = static_cast<int>(devices.size());
      std::string list;
      for (int i = 0; i < std::min(g, d); ++i) list += (i ? "," : "") + devices[(node * g + i) % d];
      env[r].push_back("CUDA_VISIBLE_DEVICES=" + list);
    }
  }
  return env;
}

class Job {
 public:
  // `rank_env`: variables per rank that replace the inherited ones (--nodes), empty otherwise.
  Job(int n, std::vector<char*> argv, double timeout_s, std::vector<std::vector<std::string>> rank_env = {})
      : ranks_(n), argv_(std::move(argv)), timeout_s_(timeout_s), rank_env_(std::move(rank_env)) {}

  int run() {
    sigset_t wanted;
    sigemptyset(&wanted);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&wanted, s);
    sigprocmask(SIG_BLOCK, &wanted, &old_mask_);
    signal(SIGCHLD, SIG_DFL);  // an inherited SIG_IGN would auto-reap the ranks

    const std::string job_id = make_job_id();
    for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
      if (!start(r, job_id)) {
        stop(1, SIGTERM);
        break;
      }
    }
    const auto started = Clock::now();
    while (alive() > 0) {
      auto now = Clock::now();
      if (timeout_s_ > 0 && !stopping_ && now - started >= std::chrono::duration<double>(timeout_s_)) {
        std::fprintf(stderr, "weave-run: timeout: ranks still running after --timeout %g s; stopping them\n", timeout_s_);
        stop(124, SIGTERM);
      }
      if (stopping_ && !termed_ && now >= term_at_) {
        for (auto& rk : ranks_)
          if (rk.alive) killpg(rk.pid, term_sig_);
        termed_ = true;
        kill_at_ = hurry_ ? now : now + kGrace;
      }
      if (stopping_ && termed_ && !killed_ && now >= kill_at_) {
        for (size_t r = 0; r < ranks_.size(); ++r)
          if (ranks_[r].alive) {
            std::fprintf(stderr, "weave-run: rank %zu (pid %d) still running %lld s after SIGTERM; sending SIGKILL\n", r,
                         ranks_[r].pid, static_cast<long long>(kGrace.count()));
            killpg(ranks_[r].pid, SIGKILL);
          }
        killed_ = true;
      }
      siginfo_t info;
      timespec wait = next_wake(started);
      int sig = sigtimedwait(&wanted, &info, &wait);
      if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
        if (!stopping_) {
          std::fprintf(stderr, "weave-run: received %s; forwarding it to the ranks\n", signal_name(sig).c_str());
          stop(128 + sig, sig);
        } else {
          hurry_ = true;  // a second request: do not wait for the settle or grace periods
          term_at_ = kill_at_ = Clock::now();
        }
      }
      reap();
    }
    return exit_code_;
  }

 private:
  bool start(int r, const std::string& job_id) {
    // Everything the child needs is prepared before fork: the child only calls async-signal-safe
    // functions (the CUDA runtime may have started threads in this process).
    std::vector<std::string> env_own = {
        "WEAVE_RANK=" + std::to_string(r),
        "WEAVE_WORLD_SIZE=" + std::to_string(ranks_.size()),
        "WEAVE_LOCAL_RANK=" + std::to_string(r),
        "WEAVE_LOCAL_WORLD_SIZE=" + std::to_string(ranks_.size()),
        "WEAVE_JOB_ID=" + job_id,
    };
    // --nodes: the node's view replaces the single-node one.
    if (!rank_env_.empty())
      for (const std::string& v : rank_env_[r]) {
        bool replaced = false;
        for (auto& o : env_own)
          if (o.compare(0, o.find('=') + 1, v, 0, v.find('=') + 1) == 0) o = v, replaced = true;
        if (!replaced) env_own.push_back(v);
      }
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e) {
      bool ours = false;
      for (auto& o : env_own) ours |= std::strncmp(*e, o.c_str(), o.find('=') + 1) == 0;
      if (!ours) envp.push_back(*e);
    }
    for (auto& o : env_own) envp.push_back(o.data());
    envp.push_back(nullptr);
    std::string fail_msg = "weave-run: rank " + std::to_string(r) + ": cannot execute '" + argv_[0] + "': ";
    const bool tty_stdin = isatty(STDIN_FILENO);
    const pid_t parent = getpid();

    pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "weave-run: fork for rank %d failed: %s\n", r, std::strerror(errno));
      return false;
    }
    if (pid == 0) {
      setpgid(0, 0);  // own group: stopping a rank also stops what it started
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // weave-run killed outright must not leave ranks behind
      if (getppid() != parent) _exit(1);
      // Ranks are not in the terminal's foreground group: a read from the tty would stop them.
      if (tty_stdin) {
        int null_fd = open("/dev/null", O_RDONLY);
        if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
      }
      sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
      execvpe(argv_[0], argv_.data(), envp.data());
      int e = errno;
      const char* why = strerror(e);
      (void)!write(STDERR_FILENO, fail_msg.data(), fail_msg.size());
      (void)!write(STDERR_FILENO, why, std::strlen(why));
      (void)!write(STDERR_FILENO, "\n", 1);
      _exit(127);
    }
    setpgid(pid, pid);  // also here, so the group exists before we might signal it
    ranks_[r] = {pid, true};
    return true;
  }

  int alive() const {
    int n = 0;
    for (auto& r : ranks_) n += r.alive;
    return n;
  }

  // `settle`: give the other ranks kSettle to exit on their own (a rank failed) before `sig`.
  void stop(int code, int sig, bool settle = false) {
    stopping_ = true;
    exit_code_ = code;
    term_sig_ = sig;
    term_at_ = Clock::now() + (settle ? std::chrono::duration_cast<Clock::duration>(kSettle) : Clock::duration(0));
    if (settle) return;
    for (auto& r : ranks_)
      if (r.alive) killpg(r.pid, sig);
    termed_ = true;
    kill_at_ = Clock::now() + kGrace;
  }

  void reap() {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (size_t r = 0; r < ranks_.size(); ++r) {
        if (ranks_[r].pid != pid || !ranks_[r].alive) continue;
        ranks_[r].alive = false;
        bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
        // Ranks that fail on their own while the others settle are reported too; those ended
        // by the launcher's own signal are not.
        if (!failed || (stopping_ && termed_)) break;
        const bool first = !stopping_;
        int code;
        if (WIFSIGNALED(status)) {
          std::fprintf(stderr, "weave-run: rank %zu (pid %d) killed by signal %s\n", r, pid,
                       signal_name(WTERMSIG(status)).c_str());
          code = 128 + WTERMSIG(status);
        } else {
          std::fprintf(stderr, "weave-run: rank %zu (pid %d) exited with status %d\n", r, pid, WEXITSTATUS(status));
          code = WEXITSTATUS(status);
        }
        if (!first) break;
        if (alive() > 0)
          std::fprintf(stderr, "weave-run: stopping the other %d rank(s) (SIGTERM unless they exit within %lld s)\n",
                       alive(), static_cast<long long>(kSettle.count()));
        stop(code, SIGTERM, true);
      }
    }
  }

  timespec next_wake(Clock::time_point started) const {
    auto wake = Clock::now() + std::chrono::seconds(1);
    if (stopping_ && !termed_) wake = std::min(wake, term_at_);
    if (stopping_ && termed_ && !killed_) wake = std::min(wake, kill_at_);
    if (timeout_s_ > 0 && !stopping_)
      wake = std::min(wake, started + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_)));
    auto ns = std::max<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(wake - Clock::now()).count(), 0);
    return {static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  }

  std::vector<Rank> ranks_;
  std::vector<char*> argv_;
  double timeout_s_;
  std::vector<std::vector<std::string>> rank_env_;
  sigset_t old_mask_{};
  bool stopping_ = false, termed_ = false, killed_ = false, hurry_ = false;
  int term_sig_ = SIGTERM;
  Clock::time_point term_at_{};
  int exit_code_ = 0;
  Clock::time_point kill_at_{};
};

}  // namespace

int main(int argc, char** argv) {
  int n = -1, nodes = 0;
  bool no_gpu = false, skip_missing = false, count_gpus = false, share_gpus = false;
  double timeout_s = 0;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") return usage(nullptr);
    if (a == "-n" || a == "--timeout" || a == "--nodes") {
      if (i + 1 >= argc) return usage((a + " needs a value").c_str());
      const char* v = argv[++i];
      if (a == "--nodes") {
        if (!parse_int(v, nodes) || nodes < 1 || nodes > kMaxRanks)
          return usage(("--nodes needs an integer from 1 to " + std::to_string(kMaxRanks) + ", got '" + v + "'").c_str());
      } else if (a == "-n") {
        if (!parse_int(v, n) || n < 1 || n > kMaxRanks)
          return usage(("-n needs an integer from 1 to " + std::to_string(kMaxRanks) + ", got '" + v + "'").c_str());
      } else {
        char* end = nullptr;
        timeout_s = std::strtod(v, &end);
        if (end == v || *end || !(timeout_s > 0)) return usage(("--timeout needs seconds > 0, got '" + std::string(v) + "'").c_str());
      }
    } else if (a == "--no-gpu") {
      no_gpu = true;
    } else if (a == "--skip-missing-gpus") {
      skip_missing = true;
    } else if (a == "--share-gpus") {
      share_gpus = true;
    } else if (a == "--count-gpus") {
      count_gpus = true;
    } else if (a.size() > 1 && a[0] == '-') {
      return usage(("unknown option '" + a + "'").c_str());
    } else {
      break;
    }
  }
  if (count_gpus) {
    std::printf("%d\n", visible_gpus());
    return 0;
  }
  if (i >= argc) return usage("missing PROG");

  const int gpus = (no_gpu && n > 0) ? 0 : visible_gpus();
  if (n < 0) {
    n = gpus;
    if (n < 1 && skip_missing) {
      std::printf("weave-run: skipped: no GPUs visible\n");
      return 77;
    }
    if (n < 1) return usage("no GPUs visible: pass -n N (with --no-gpu for CPU-only programs)");
  }
  // The same switch from the environment, so CTest's gpu2 entries can run on one GPU unchanged.
  try {
    if (weave::env::get_bool("WEAVE_SHARE_GPUS")) share_gpus = true;
  } catch (const weave::Error& e) {
    std::fprintf(stderr, "weave-run: %s\n", e.what());
    return 2;
  }
  if (share_gpus && !no_gpu && gpus >= 1 && n > gpus) {
    std::printf("weave-run: %d ranks share %d GPU(s) (correctness only: kernels of different ranks time-slice)\n", n,
                gpus);
    setenv("WEAVE_SHARE_GPUS", "1", 1);
  } else if (!no_gpu && n > gpus) {
    if (skip_missing) {
      std::printf("weave-run: skipped: %d ranks need %d GPUs, %d visible\n", n, n, gpus);
      return 77;
    }
    std::fprintf(stderr, "weave-run: %d ranks need %d GPUs, only %d visible\n", n, n, gpus);
    return 2;
  }

  std::vector<std::vector<std::string>> rank_env;
  if (nodes > 0) {
    if (n % nodes != 0)
      return usage(("--nodes " + std::to_string(nodes) + " must divide the " + std::to_string(n) +
                    " ranks (every simulated node gets the same number)").c_str());
    try {
      rank_env = node_env(n, nodes, no_gpu ? 0 : gpus);
    } catch (const weave::Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 2;
    }
  }

  std::vector<char*> prog(argv + i, argv + argc);
  prog.push_back(nullptr);
  std::fflush(stdout);  // the children must not inherit unflushed output
  return Job(n, std::move(prog), timeout_s, std::move(rank_env)).run();
}
