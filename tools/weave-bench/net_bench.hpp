// What the benchmarks of the inter-node fused kernels (net_tp.cu, net_ring.cu) share, so that
// their rows are started, sized, measured and judged the same way: the options of the network path
// and of the timing, the bounce-buffer sizing, the run from its start checks to the path's shutdown
// (NCCL restricted to its network transport, each rank's GPU), the timing loop, the cross-rank
// verdict and the JSON fields of the path and the baselines. Host code; each benchmark keeps its
// problems, checks and table.
#pragma once
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../../bench/nccl_comm.hpp"
#include "bench.hpp"
#include "net_collectives/net_collectives.hpp"
#include "net_start.hpp"
#include "shared_gpu.hpp"
#include "weave/config.hpp"
#include "weave/net/net_path.hpp"
#include "weave/runtime/env.hpp"
#include "weave/runtime/launch.hpp"
#include "weave/runtime/net_bootstrap.hpp"

namespace weave::bench::netb {

constexpr const char* kImplWeave = "weave";
constexpr const char* kImplUnfused = "weave-unfused";
constexpr const char* kImplNccl = "nccl";
constexpr size_t kMiB = size_t(1) << 20;

// The options every network benchmark takes (its own ones beside them).
struct NetOptions {
  std::vector<std::string> impls;
  long long chunk = 1 << 20;
  int send_blocks = 2, recv_blocks = 6;
  int iters = 20, warmup = 5;
  std::string provider, domain;
  net::Notify notify = net::Notify::automatic;
  size_t max_bounce = size_t(4) << 30;
  bool has_impl(const char* i) const { return std::find(impls.begin(), impls.end(), i) != impls.end(); }
};

// Parses the shared options into `c` (whose chunk and blocks hold the benchmark's defaults).
// `extra_impl`: a benchmark's own implementation beside the three (nullptr: none), in the default
// list too.
inline void parse_net_options(const char* who, const Args& a, NetOptions& c, const char* extra_impl = nullptr) {
  using weave::detail::concat;
  const std::string extra = extra_impl ? extra_impl : "";
  for (const std::string& i :
       a.names("impls", concat(kImplWeave, ",", kImplUnfused, ",", kImplNccl, extra.empty() ? "" : ",", extra))) {
    if (i != kImplWeave && i != kImplUnfused && i != kImplNccl && (extra.empty() || i != extra))
      throw Error(concat(who, ": --impls: '", i, "' is not weave, weave-unfused", extra.empty() ? " or" : ",", " nccl",
                         extra.empty() ? "" : " or ", extra));
    c.impls.push_back(i);
  }
  if (a.has("chunk")) c.chunk = static_cast<long long>(parse_bytes(who, "chunk", a.get("chunk")));
  if (c.chunk % 16) throw Error(concat(who, ": --chunk ", c.chunk, " is not a multiple of 16 bytes"));
  if (a.has("send-blocks")) c.send_blocks = static_cast<int>(parse_count(who, "send-blocks", a.get("send-blocks"), 1, 32));
  if (a.has("recv-blocks")) c.recv_blocks = static_cast<int>(parse_count(who, "recv-blocks", a.get("recv-blocks"), 1, 32));
  if (a.has("iters")) c.iters = static_cast<int>(parse_count(who, "iters", a.get("iters"), 1, 100000));
  // At least one: a shape's first call agrees on it with every rank over the bootstrap (and plans
  // the kernel), host work that must not land in a timed call.
  if (a.has("warmup")) c.warmup = static_cast<int>(parse_count(who, "warmup", a.get("warmup"), 1, 100000));
  if (a.has("notify")) c.notify = net::parse_notify(a.get("notify"));
  if (a.has("max-bounce")) c.max_bounce = parse_bytes(who, "max-bounce", a.get("max-bounce"));
  // tcp unless asked otherwise: libfabric's own first choice on one host may be shm, which would
  // bypass the socket transport that --nodes simulates (as weave-bench net).
  c.provider = a.get("provider", weave::env::get_string("WEAVE_NET_PROVIDER"));
  if (c.provider.empty()) c.provider = "tcp";
  // Simulated nodes (weave-run --nodes names them) all live on this host: loopback. Real nodes:
  // libfabric picks the interface unless --domain names one.
  c.domain = a.get("domain", weave::env::get_string("WEAVE_HOSTNAME").empty() ? "" : "lo");
}

// ---- the room a call takes on the network path ----------------------------------------------

// What one call takes from the path: send buffer bytes, bytes of one receive slot, flags of one
// call slot (the path holds two receive and two flag slots, so that consecutive calls overlap).
struct Room {
  long long send = 0, recv = 0, flags = 0;
  void widen(const Room& o) {
    send = std::max(send, o.send);
    recv = std::max(recv, o.recv);
    flags = std::max(flags, o.flags);
  }
};

inline long long round_mib(long long b) {
  return std::max<long long>(1, (b + kMiB - 1) / kMiB) * static_cast<long long>(kMiB);
}
// Pinned host bytes of a path sized for `r`: the send buffer and both receive slots.
inline long long bounce_bytes(const Room& r) { return round_mib(r.send) + 2 * round_mib(r.recv); }

// Widens `room` by a problem's `need` unless the path would then take more pinned memory than
// max_bounce; then it says so (naming the problem `what` and the option `fewer` that lists the
// sizes) and returns false.
inline bool widen_within(Room& room, const Room& need, size_t max_bounce, const std::string& what, const char* fewer,
                         bool print) {
  Room with = room;
  with.widen(need);
  if (static_cast<size_t>(bounce_bytes(with)) > max_bounce) {
    if (print)
      std::printf("%s: skipped: it needs a %lld MiB send buffer and 2 receive slots of %lld MiB (pinned host "
                  "memory per rank), %lld MiB in all with the other sizes, above --max-bounce %zu MiB (raise it or "
                  "lower %s)\n",
                  what.c_str(), round_mib(need.send) >> 20, round_mib(need.recv) >> 20, bounce_bytes(with) >> 20,
                  max_bounce >> 20, fewer);
    return false;
  }
  room = with;
  return true;
}

// The path sized for `room`, or null after a message saying what could not be made.
inline std::unique_ptr<net::NetPath> make_path(const runtime::LaunchInfo& info, const NetOptions& c, const Room& room,
                                               const char* who, const char* largest, net::NetPathOptions* used) {
  net::NetPathOptions& po = *used;
  po.transport = {c.provider, c.domain, c.notify, false};
  po.send_bytes = static_cast<size_t>(round_mib(room.send));
  po.recv_bytes = 2 * static_cast<size_t>(round_mib(room.recv));
  po.proxy.flags = static_cast<uint32_t>(std::max<long long>(po.proxy.flags, 2 * room.flags));
  try {
    return std::make_unique<net::NetPath>(info, po);
  } catch (const Error& e) {
    std::fprintf(stderr,
                 "%s: rank %d: the network path with a %zu MiB send buffer, %zu MiB of receive buffer and %u flags "
                 "(sized for the largest problem of %s) could not be made: %s\n",
                 who, info.rank, po.send_bytes >> 20, po.recv_bytes >> 20, po.proxy.flags, largest, e.what());
    return nullptr;
  }
}

// ---- the ranks and their GPUs ---------------------------------------------------------------


// The checks before the path exists (it needs a GPU and one rank per node, and would fail less
// clearly without them), collective over `start`'s bootstrap: -1 to go on (`shared` then names
// the first two ranks on one GPU, or is empty), else the exit status after a message. `kernels`
// names what is built for one rank per node ("the inter-node TP kernels are").
inline int check_ranks(const runtime::LaunchInfo& info, NetStart& start, const char* who, const char* kernels,
                       std::string* shared) {
  using weave::detail::concat;
  const int nodes = start.nodes;
  const bool lead = info.rank == 0;
  if (nodes != info.world || nodes > weave::kMaxWorld) {
    if (lead)
      std::fprintf(stderr,
                   "%s: %d ranks on %d nodes: %s built for one rank per node and at most %d nodes; run weave-run -n N "
                   "--nodes N\n",
                   who, info.world, nodes, kernels, weave::kMaxWorld);
    return 2;
  }
  std::vector<GpuView> gpus(static_cast<size_t>(info.world));
  {
    const GpuView mine = gpu_view(info.local_rank);  // before anything is made (shared_gpu.hpp)
    start.boot->all_gather(&mine, gpus.data(), sizeof mine);
  }
  for (int r = 0; r < info.world; ++r)
    if (gpus[r].count < 1) {
      if (lead)
        std::fprintf(stderr,
                     "%s: rank %d sees no GPU: the kernels run on one GPU per rank (weave-run -n N --nodes N on N "
                     "GPUs, or with --share-gpus on fewer, for correctness only); nothing measured\n",
                     who, r);
      return 1;
    }
  *shared = first_shared(gpus);
  if (!shared->empty()) *shared += " (--share-gpus)";
  return -1;
}

// Rank 0's seed on every rank (only rank 0 draws and prints one).
inline uint64_t job_seed(runtime::NetBootstrap& boot, int nodes, bool lead, uint64_t (*draw)()) {
  const uint64_t mine = lead ? draw() : 0;
  std::vector<uint64_t> all(static_cast<size_t>(nodes));
  boot.all_gather(&mine, all.data(), sizeof mine);
  return all[0];
}

// An NCCL communicator over the job's ranks, made only for the nccl rows. Its destructor aborts
// instead of finalizing while an exception unwinds: finalize waits for every rank, and a rank that
// failed may never get there.
struct Nccl {
  ncclComm_t comm = nullptr;
  std::string env;  // the NCCL_* variables in force (the rows record them)
  Nccl() = default;
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;
  ~Nccl() {
    if (!comm) return;
    if (std::uncaught_exceptions() > 0 || cudaDeviceSynchronize() != cudaSuccess) {
      ncclCommAbort(comm);
    } else {
      ncclCommFinalize(comm);
      ncclCommDestroy(comm);
    }
  }
  // Collective: NCCL on its network transport (nccl_network_environment, loopback between simulated
  // nodes), the unique id through `boot`.
  void init(runtime::NetBootstrap& boot, int nodes, int rank, bool loopback) {
    env = nccl_network_environment(loopback);  // before the communicator: NCCL reads them at init
    ncclUniqueId id{};
    if (rank == 0) WEAVE_NCCL_CHECK(ncclGetUniqueId(&id));
    // Raw bytes: nvcc 13's front end crashes on std::vector of the anonymous ncclUniqueId struct.
    std::vector<char> ids(static_cast<size_t>(nodes) * sizeof id);
    boot.all_gather(&id, ids.data(), sizeof id);
    std::memcpy(&id, ids.data(), sizeof id);  // rank 0's
    WEAVE_NCCL_CHECK(ncclCommInitRank(&comm, nodes, id, rank));
  }
};

// ---- a run from its start to its end ------------------------------------------------------

// What a network benchmark holds from its start to its end (the members are destroyed in reverse:
// the NCCL communicator before the path).
struct Run {
  runtime::LaunchInfo info;
  NetStart start;
  bool lead = false;
  std::string shared;  // the first two ranks on one GPU (--share-gpus), or ""
  net::NetPathOptions po;
  std::unique_ptr<net::NetPath> path;
  cudaStream_t st = nullptr;
  uint64_t seed = 0;  // rank 0's WEAVE_TEST_SEED, on every rank
  std::string provider, notify;
  Nccl nccl_comm;
  Nccl* nccl = nullptr;   // null: no nccl rows (nccl_skip says why)
  std::string nccl_skip;  // why there are no nccl rows at all
  int nodes() const { return start.nodes; }
};

// What every row of a run reads; a suite's Job adds its options and reference.
struct JobBase {
  net::NetPath& path;
  cudaStream_t st;
  JsonSink& sink;
  int rank, nodes;
  bool shared_gpu;        // two ranks on one GPU (--share-gpus): times are not meaningful
  uint64_t seed;          // rank 0's WEAVE_TEST_SEED
  uint64_t problems = 0;  // problems so far (the same on every rank): each draws its own inputs
  std::string provider, notify;
  Nccl* nccl;                      // null: no nccl rows (nccl_skip says why)
  std::string nccl_skip;           // why there are no nccl rows at all
  std::vector<std::string> wrong;  // incorrect rows, the same list on every rank
  JobBase(Run& r, JsonSink& s)
      : path(*r.path), st(r.st), sink(s), rank(r.info.rank), nodes(r.nodes()), shared_gpu(!r.shared.empty()),
        seed(r.seed), provider(r.provider), notify(r.notify), nccl(r.nccl), nccl_skip(r.nccl_skip) {}
  bool lead() const { return rank == 0; }
  runtime::NetBootstrap& boot() { return path.bootstrap(); }
};

// The start, before the problems are chosen: -1 to go on, else the exit status, after a message
// (fewer than 2 ranks or one node: exit 0, nothing to measure). `suite` is the subcommand, `tag`
// the bootstrap's name, `kernels` what is built for one rank per node (check_ranks).
inline int begin_run(Run& r, const char* who, const char* suite, const char* tag, const char* kernels) {
  r.info = runtime::detect_launch();
  r.lead = r.info.rank == 0;
  // A bootstrap of its own for the checks before the path exists (the path needs a GPU and one
  // rank per node, and would fail less clearly without them).
  r.start = net_start(r.info, tag);
  if (!r.start.skip.empty()) {
    if (r.lead)
      std::printf("%s: skipped: %s; run it on nodes of one rank each, e.g. weave-run -n 2 --nodes 2 -- "
                  "weave-bench %s\n",
                  who, r.start.skip.c_str(), suite);
    return 0;
  }
  return check_ranks(r.info, r.start, who, kernels, &r.shared);
}

// The path sized for `room`, the stream, the seed and (for the nccl rows, one GPU per rank) the
// NCCL communicator: -1 to go on, else the exit status. `fewer` names the option of the sizes.
inline int open_run(Run& r, const NetOptions& c, const Room& room, const char* who, const char* fewer,
                    uint64_t (*draw)()) {
  r.path = make_path(r.info, c, room, who, fewer, &r.po);
  if (!r.path) return 1;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&r.st, cudaStreamNonBlocking));
  r.seed = job_seed(r.path->bootstrap(), r.nodes(), r.lead, draw);
  r.provider = r.path->transport().provider();
  r.notify = std::string(net::notify_name(r.path->transport().notify()));
  if (c.has_impl(kImplNccl)) {
    if (!r.shared.empty()) {
      r.nccl_skip = weave::detail::concat(r.shared, "; the nccl rows need one GPU per rank");
    } else {
      r.nccl_comm.init(r.path->bootstrap(), r.nodes(), r.info.rank, c.domain == "lo");
      r.nccl = &r.nccl_comm;
    }
  }
  return -1;
}

// The unfused rows' collectives: the same chunk and blocks as the fused rows, so that they differ
// only in not overlapping.
inline net::NetCollOptions coll_options(const NetOptions& c) {
  net::NetCollOptions co;
  co.chunk_bytes = c.chunk;
  co.send_blocks = c.send_blocks;
  co.recv_blocks = c.recv_blocks;
  return co;
}

// The notes under a run's header line (rank 0): shared GPUs, the nccl rows.
inline void print_notes(const Run& r, const NetOptions& c) {
  if (!r.shared.empty()) std::printf("NOTE: %s: times are not meaningful (the ranks time-slice), checks are\n", r.shared.c_str());
  if (c.has_impl(kImplNccl) && !r.nccl) std::printf("nccl rows skipped: %s\n", r.nccl_skip.c_str());
  if (r.nccl) std::printf("nccl: %s\n", r.nccl->env.c_str());
}

// Every rank done before the path goes down.
inline void end_run(Run& r) {
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(r.st));
  r.path->bootstrap().barrier();
  r.path->shutdown();
  WEAVE_CUDA_CHECK(cudaStreamDestroy(r.st));
  r.st = nullptr;
}

// ---- timing and the verdict ---------------------------------------------------------------

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    WEAVE_CUDA_CHECK(cudaEventCreate(&a));
    WEAVE_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

// How one implementation is timed: call(set) enqueues one call on input set `set`; finish() waits
// for the stream and throws a transfer failure; before_last() prepares the checked call (poisons
// the outputs, puts set 1 in place) and inputs0() puts set 0 in place before the warm-up.
struct Timed {
  std::function<void()> inputs0, before_last;
  std::function<void(int set)> call;
  std::function<void()> finish;
};

// --warmup calls (one batch, then finish), then --iters calls, each alone: the stream drained,
// the ranks released together by a barrier on `boot`, CUDA events around the one call. A rank's
// event time includes any wait for a late peer, so each iteration's time is the slowest rank's;
// the result is the median over iterations, in µs. The last iteration is the checked call.
inline double time_slowest(runtime::NetBootstrap& boot, cudaStream_t st, int nodes, int warmup, int iters,
                           const Timed& t) {
  t.inputs0();
  for (int i = 0; i < warmup; ++i) t.call(0);
  t.finish();  // the warm-up batch: a failed transfer throws here, before anything is timed
  Events ev;
  std::vector<double> mine(static_cast<size_t>(iters));
  for (int it = 0; it < iters; ++it) {
    const bool last = it + 1 == iters;
    if (last) t.before_last();
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    boot.barrier();  // the ranks start together: a rank's time then includes waiting for a late peer
    WEAVE_CUDA_CHECK(cudaEventRecord(ev.a, st));
    t.call(last ? 1 : 0);
    WEAVE_CUDA_CHECK(cudaEventRecord(ev.b, st));
    t.finish();
    float ms = 0;
    WEAVE_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.a, ev.b));
    mine[it] = 1e3 * ms;
  }
  std::vector<double> all(mine.size() * static_cast<size_t>(nodes));
  boot.all_gather(mine.data(), all.data(), mine.size() * sizeof(double));
  std::vector<double> slowest(mine.size(), 0.0);
  for (int q = 0; q < nodes; ++q)
    for (size_t it = 0; it < mine.size(); ++it) slowest[it] = std::max(slowest[it], all[q * mine.size() + it]);
  return weave::median(slowest);
}

struct Verdict {
  bool ok = false;
  double worst = NAN;  // the checker's worst |x - r| / bound over ranks (> 1: wrong)
};

// The same verdict on every rank (wrong on one rank: wrong everywhere) from this rank's `ok` and
// `worst`; the rank that saw a problem prints `detail`, since only it has the details.
inline Verdict settle(net::NetPath& path, const std::string& what, bool ok, double worst, const std::string& detail) {
  if (!ok) std::printf("    rank %d: %s: %s\n", path.rank(), what.c_str(), detail.c_str());
  std::fflush(stdout);
  Verdict v;
  v.ok = all_ranks_ok(path, ok);
  v.worst = worst_over_ranks(path, worst);
  return v;
}

// The JSON fields of the path a row ran on; the nccl rows have no chunk or blocks of weave's (0),
// NCCL's socket transport has its own.
inline JsonLine& add_path_fields(JsonLine& jl, const NetOptions& c, bool nccl_row, const std::string& provider,
                                 const std::string& notify, bool shared_gpu) {
  jl.add("chunk", nccl_row ? 0LL : c.chunk)
      .add("send_blocks", nccl_row ? 0 : c.send_blocks)
      .add("recv_blocks", nccl_row ? 0 : c.recv_blocks)
      .add("transport", nccl_row ? "nccl-socket" : "libfabric")
      .add("provider", nccl_row ? std::string("Socket") : provider)
      .add("notify", nccl_row ? std::string("nccl") : notify)
      .add("shared_gpu", shared_gpu);
  return jl;
}

// The times of one problem's unfused and nccl rows (NaN where absent): the weave rows' baselines.
struct Baselines {
  double unfused = NAN, nccl = NAN;
};
template <class Row>
Baselines baselines(const std::vector<Row>& rows) {
  Baselines b;
  for (const Row& r : rows) {
    if (r.impl == kImplUnfused) b.unfused = r.us;
    if (r.impl == kImplNccl) b.nccl = r.us;
  }
  return b;
}
// The weave row's ratios (the baseline's time over weave's) or the nccl row's environment, then
// the line to the JSON file.
inline void write_row(JobBase& j, JsonLine& jl, const std::string& impl, double us, const Baselines& b) {
  if (impl == kImplWeave && !std::isnan(b.unfused)) jl.add("ratio_vs_unfused", b.unfused / us);
  if (impl == kImplWeave && !std::isnan(b.nccl)) jl.add("ratio_vs_nccl", b.nccl / us);
  if (impl == kImplNccl) jl.add("nccl_env", j.nccl->env);
  j.sink.write(jl);
}

}  // namespace weave::bench::netb
