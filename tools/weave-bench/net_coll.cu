// weave-bench net_coll: the inter-node collectives (kernels/net_collectives: NetCollectives
// all_reduce, all_gather, reduce_scatter) between nodes of one rank each, against NCCL restricted to
// its network transport (issue 22: "inter-node collectives >= 1.0x NCCL (network transport) at
// every size from 1 MiB").
//
//   weave-run -n N --nodes N [--share-gpus] -- weave-bench net_coll [--json FILE]
//       [--sizes 1M,4M,16M,64M] [--kernels all_reduce,all_gather,reduce_scatter] [--impls weave,nccl]
//       [--chunk 256K] [--send-blocks 4] [--recv-blocks 8] [--iters 20] [--warmup 5] [--provider tcp]
//       [--domain lo] [--notify ordered|unordered] [--max-bounce 4G]
//
// Problems, per size of --sizes (bytes, a multiple of 16) and collective: one bf16 buffer of
// size / 2 elements on every rank, in place, sharded over the N ranks as NetCollectives shards it
// (near-equal in 16-byte units, NetCollectives::shard). `bytes` is the whole buffer: all_reduce's
// input and output, all_gather's gathered output, reduce_scatter's whole input (NCCL's tests
// name the same sizes).
//   net_all_reduce      the sum over ranks, everywhere.
//   net_all_gather      rank q's shard is its input; every rank gets every shard.
//   net_reduce_scatter  the whole buffer is every rank's input; rank q's shard gets the sum.
// Implementations (rows "impl"):
//   weave  NetCollectives (--chunk, --send-blocks, --recv-blocks: NetCollOptions; their defaults).
//   nccl   ncclAllReduce / ncclAllGather / ncclReduceScatter in place, NCCL restricted to its
//          network transport (net_bench.hpp: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket,
//          NCCL_SOCKET_IFNAME=lo on simulated nodes; each set where unset). Only with a GPU of its
//          own per rank (NCCL refuses two ranks on one GPU); all_gather and reduce_scatter only where
//          the shards are equal (NCCL's blocks are), i.e. the 16-byte units divide by N; otherwise
//          skipped with the reason.
// There is no weave-unfused row: these are the transfers the fused kernels' unfused rows use.
//
// Timing as weave-bench net_tp (net_bench.hpp): --warmup calls, then --iters calls each alone, the
// ranks released together by a barrier, CUDA events around the call; the slowest rank's time per
// iteration, the median over iterations. algbw_gbs = bytes / time; busbw_gbs as NCCL's
// PERFORMANCE.md: all_reduce algbw x 2(N-1)/N, all_gather and reduce_scatter algbw x (N-1)/N. weave
// rows carry ratio_vs_nccl (NCCL's time over weave's) where the nccl row ran.
//
// Checks (every row): inputs are f(set, rank, index), small integers (-8..8, bench/nccl_ref.cuh's
// Values::integers), so every sum over up to 8 ranks is exact in bf16 in any order and the output
// is compared exactly, element by element, on the device (ref::Checker against the inputs
// recomputed from the job seed): all_gather's whole buffer (every shard its owner's input),
// reduce_scatter's own shard (the sum), all_reduce's whole buffer (the sum). The warm-up and timed
// calls run on input set 0; the last timed call on set 1, written into a buffer poisoned (NaN)
// just before it: for all_gather every other shard is NaN until the call fills it; reduce_scatter
// and all_reduce are in place, so set 1's inputs overwrite the poison and an element the call
// leaves alone holds this rank's set-1 input, not the sum. A row is correct only if it is on every
// rank; any incorrect row makes the command exit 1. (The timed calls on set 0 reduce in place
// again and again: their values grow, which changes nothing in the time of a sum.)
//
// The network path is made once, its bounce buffers sized for the largest problem; a problem that
// would take more than --max-bounce of pinned memory per rank is skipped with a message. Fewer than
// 2 ranks, no rendezvous address or a single node: a message and exit 0. More than one rank per
// node (the hierarchical form is not benchmarked): exit 2. A rank without a GPU: exit 1. With
// --share-gpus the times are not meaningful (the ranks time-slice one GPU); the checks are.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "../../bench/nccl_ref.cuh"
#include "bench.hpp"
#include "check/device_buffer.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "net_bench.hpp"
#include "net_collectives/layout.hpp"
#include "net_collectives/net_collectives.hpp"
#include "weave/net/net_path.hpp"

namespace {

namespace net = weave::net;
namespace netb = weave::bench::netb;
namespace check = weave::check;
namespace ref = weave::ref;
using bf16 = __nv_bfloat16;
using weave::Error;
using weave::detail::concat;
using netb::kImplNccl;
using netb::kImplUnfused;
using netb::kImplWeave;
using netb::Room;

constexpr const char* kWho = "weave-bench net_coll";
constexpr long long kUnit = 16;  // NetCollectives' shard unit, bytes

// ---- options ------------------------------------------------------------------------------

struct Config : netb::NetOptions {
  std::vector<long long> sizes;  // bytes of the whole buffer
  std::vector<net::Coll> kernels;
};

const char* coll_name(net::Coll k) {
  return k == net::Coll::all_reduce ? "all_reduce" : k == net::Coll::all_gather ? "all_gather" : "reduce_scatter";
}
std::string row_kernel(net::Coll k) { return concat("net_", coll_name(k)); }

Config parse(const weave::bench::Args& a) {
  static const std::set<std::string> known{"json",  "sizes",  "kernels",  "impls",  "chunk",  "send-blocks",
                                           "recv-blocks", "iters", "warmup", "provider", "domain", "notify",
                                           "max-bounce"};
  for (const auto& [k, v] : a.kv)
    if (!known.count(k)) throw Error(concat(kWho, ": unknown option --", k, " (see weave-bench net_coll --help)"));
  Config c;
  for (const std::string& s : a.names("sizes", "1M,4M,16M,64M")) {
    const long long b = static_cast<long long>(weave::bench::parse_bytes(kWho, "sizes", s));
    if (b % kUnit) throw Error(concat(kWho, ": --sizes: ", s, " is not a multiple of ", kUnit, " bytes"));
    c.sizes.push_back(b);
  }
  if (c.sizes.empty()) throw Error(concat(kWho, ": --sizes names no size"));
  for (const std::string& k : a.names("kernels", "all_reduce,all_gather,reduce_scatter")) {
    if (k == "all_reduce") c.kernels.push_back(net::Coll::all_reduce);
    else if (k == "all_gather") c.kernels.push_back(net::Coll::all_gather);
    else if (k == "reduce_scatter") c.kernels.push_back(net::Coll::reduce_scatter);
    else throw Error(concat(kWho, ": --kernels: '", k, "' is not all_reduce, all_gather or reduce_scatter"));
  }
  // The shared options, with this suite's defaults: NetCollOptions' chunk and blocks, and no
  // unfused row (a collective has nothing to fuse).
  weave::bench::Args b = a;
  if (!b.has("impls")) b.kv["impls"] = concat(kImplWeave, ",", kImplNccl);
  for (const std::string& i : b.names("impls", ""))
    if (i != kImplWeave && i != kImplNccl)
      throw Error(concat(kWho, ": --impls: '", i, "' is not ", kImplWeave, " or ", kImplNccl, " (a collective has no ",
                         kImplUnfused, " row)"));
  const net::NetCollOptions d;
  c.chunk = d.chunk_bytes;
  c.send_blocks = d.send_blocks;
  c.recv_blocks = d.recv_blocks;
  netb::parse_net_options(kWho, b, c);
  return c;
}

// ---- problems -----------------------------------------------------------------------------

// The run's fields (path, stream, rank, seed, nccl, ...: net_bench.hpp) with this suite's options,
// the collectives and the device checker.
struct Job : netb::JobBase {
  const Config& c;
  net::NetCollectives& coll;
  ref::Checker& checker;
  Job(netb::Run& r, weave::bench::JsonSink& s, const Config& cfg, net::NetCollectives& co, ref::Checker& ck)
      : JobBase(r, s), c(cfg), coll(co), checker(ck) {}
};

// One collective on one buffer size. The checks view the buffer as `units` rows of 16 bytes (8
// bf16 elements), sharded by rows: nccl_ref's maps then shard it exactly as NetCollectives does
// (checked for every rank in the constructor).
struct Problem {
  Job& j;
  net::Coll kind;
  long long bytes, count, units;
  long long first = 0, n = 0;  // this rank's shard, in elements
  check::DeviceBuffer<bf16> buf;
  uint64_t seed[2];  // per input set

  Problem(Job& job, net::Coll k, long long b, uint64_t problem_seed)
      : j(job), kind(k), bytes(b), count(b / 2), units(b / kUnit), buf(static_cast<size_t>(b / 2)),
        seed{check::derive(problem_seed, 0), check::derive(problem_seed, 1)} {
    constexpr long long per_unit = kUnit / 2;
    for (int q = 0; q < j.nodes; ++q) {
      long long f = 0, m = 0;
      net::NetCollectives::shard(j.nodes, count, net::NetDtype::bf16, q, &f, &m);
      const weave::coll::Range g = weave::coll::shard(units, j.nodes, q);
      WEAVE_CHECK(f == g.begin * per_unit && m == g.size * per_unit, kWho, ": NetCollectives gives rank ", q,
                  " elements [", f, ", +", m, ") of ", count, ", the check's map [", g.begin * per_unit, ", +",
                  g.size * per_unit, ")");
      if (q == j.rank) first = f, n = m;
    }
  }
  bool gather() const { return kind == net::Coll::all_gather; }
  // Input set `set` in place: all_gather this rank's shard, else the whole buffer.
  void inputs(int set) {
    if (gather())
      ref::fill(buf.p + first, n, weave::DType::bf16, seed[set], j.rank, ref::Values::integers, j.st);
    else
      ref::fill(buf.p, count, weave::DType::bf16, seed[set], j.rank, ref::Values::integers, j.st);
  }
  void poison() { check::poison(buf.p, buf.n, j.st); }
  // Where this rank's output lies and where each of its elements comes from.
  ref::OutMap out_map() const {
    weave::coll::Shape rows;
    rows.ndim = 2, rows.d[0] = units, rows.d[1] = kUnit / 2;
    if (kind == net::Coll::all_reduce) return ref::map_all_reduce(count, j.nodes, j.rank);
    return gather() ? ref::map_all_gather(rows, 0, j.nodes, j.rank) : ref::map_reduce_scatter(rows, 0, j.nodes, j.rank);
  }
  const bf16* output() const { return kind == net::Coll::reduce_scatter ? buf.p + first : buf.p; }
  // The last call's output (input set 1) exactly against the recomputed inputs, on every rank.
  netb::Verdict verify(const std::string& what) {
    j.checker.reset(j.st);
    j.checker.check(output(), nullptr, out_map(), weave::DType::bf16, seed[1], ref::Values::integers,
                    weave::ReduceOp::sum, 0.f, j.st);
    const ref::Checker::Result r = j.checker.result(j.st);
    return netb::settle(j.path, what, r.ok(), r.ok() ? 0.0 : static_cast<double>(INFINITY), r.str());
  }
  // NCCL's blocks are equal: "" where the shards are, else why not (all_reduce has none).
  std::string nccl_skip() const {
    if (kind == net::Coll::all_reduce || units % j.nodes == 0) return "";
    return concat("the ", units, " 16-byte units do not split evenly over ", j.nodes,
                  " ranks (NetCollectives' shards differ in size; NCCL's blocks are equal)");
  }
};

// The path's room for one weave call (the collectives' own plan, which their host entry checks).
Room room_of(net::Coll k, long long bytes, const Config& c, int nodes) {
  const net::coll::Layout L = net::coll::make_layout(k, net::Topo{nodes, 1}, bytes, c.chunk);
  return {net::coll::send_needed(L), net::coll::recv_needed(L), static_cast<long long>(net::coll::flags_needed(L))};
}

// ---- the rows of one problem ------------------------------------------------------------------

struct Row {
  std::string impl;
  double us = NAN;
  netb::Verdict v;
};

struct Impl {
  const char* name;
  std::function<void()> call;
  std::function<void()> finish;
};

std::vector<Row> run_problem(Job& j, Problem& p) {
  const std::string what = concat(row_kernel(p.kind), " ", p.bytes, " B");
  std::vector<Impl> impls;
  if (j.c.has_impl(kImplWeave)) {
    impls.push_back({kImplWeave,
                     [&] {
                       const auto bf = net::NetDtype::bf16;
                       if (p.kind == net::Coll::all_reduce) j.coll.all_reduce(p.buf.p, p.count, bf, j.st);
                       else if (p.gather()) j.coll.all_gather(p.buf.p, p.count, bf, j.st);
                       else j.coll.reduce_scatter(p.buf.p, p.count, bf, j.st);
                     },
                     [&] { j.coll.finish(j.st); }});
  }
  if (j.c.has_impl(kImplNccl) && j.nccl) {
    if (const std::string why = p.nccl_skip(); !why.empty()) {
      if (j.lead()) std::printf("  %s: %s: skipped: %s\n", what.c_str(), kImplNccl, why.c_str());
    } else {
      // In place: rank r's block of count / N elements is its shard (the units divide evenly).
      const size_t blk = static_cast<size_t>(p.count / j.nodes);
      bf16* mine = p.buf.p + size_t(j.rank) * blk;
      impls.push_back({kImplNccl,
                       [&, blk, mine] {
                         ncclComm_t comm = j.nccl->comm;
                         if (p.kind == net::Coll::all_reduce)
                           WEAVE_NCCL_CHECK(
                               ncclAllReduce(p.buf.p, p.buf.p, size_t(p.count), ncclBfloat16, ncclSum, comm, j.st));
                         else if (p.gather())
                           WEAVE_NCCL_CHECK(ncclAllGather(mine, p.buf.p, blk, ncclBfloat16, comm, j.st));
                         else
                           WEAVE_NCCL_CHECK(ncclReduceScatter(p.buf.p, mine, blk, ncclBfloat16, ncclSum, comm, j.st));
                       },
                       [&] { WEAVE_CUDA_CHECK(cudaStreamSynchronize(j.st)); }});
    }
  }
  std::vector<Row> rows;
  for (const Impl& im : impls) {
    Row r;
    r.impl = im.name;
    r.us = netb::time_slowest(j.boot(), j.st, j.nodes, j.c.warmup, j.c.iters,
                              {[&] { p.inputs(0); },
                               [&] {
                                 p.poison();
                                 p.inputs(1);
                               },
                               [&](int) { im.call(); }, im.finish});
    r.v = p.verify(concat(what, " ", im.name));
    rows.push_back(r);
  }
  return rows;
}

// The table lines and JSON lines of one problem's rows (weave's beside NCCL's time).
void emit(Job& j, const Problem& p, const std::vector<Row>& rows) {
  const netb::Baselines base = netb::baselines(rows);
  const int N = j.nodes;
  const double bus = p.kind == net::Coll::all_reduce ? 2.0 * (N - 1) / N : double(N - 1) / N;
  for (const Row& r : rows) {
    const double algbw = p.bytes / r.us * 1e-3, busbw = algbw * bus;
    const bool weave_row = r.impl == kImplWeave, nccl_row = r.impl == kImplNccl;
    if (!r.v.ok) j.wrong.push_back(concat(row_kernel(p.kind), " ", r.impl, " ", p.bytes, " B"));
    if (!j.lead()) continue;
    char ratio[32] = "-";
    if (weave_row && !std::isnan(base.nccl)) std::snprintf(ratio, sizeof ratio, "%.3f", base.nccl / r.us);
    std::printf("| %s | %s | %lld | %.1f | %.3f | %.3f | %s | %s |\n", row_kernel(p.kind).c_str(), r.impl.c_str(),
                p.bytes, r.us, algbw, busbw, ratio, r.v.ok ? "exact" : "WRONG");
    weave::bench::JsonLine jl;
    jl.add("kernel", row_kernel(p.kind)).add("impl", r.impl).add("dtype", "bf16").add("bytes", p.bytes);
    jl.add("count", p.count).add("nodes", N).add("world", N);
    jl.add("time_us", r.us).add("algbw_gbs", algbw).add("busbw_gbs", busbw).add("iters", j.c.iters);
    jl.add("warmup", j.c.warmup);
    netb::add_path_fields(jl, j.c, nccl_row, j.provider, j.notify, j.shared_gpu).add("correct", r.v.ok);
    weave::bench::add_check_worst(jl, r.v.worst).add("check", "last timed call, every element exact");
    jl.add("seed", std::to_string(j.seed));
    netb::write_row(j, jl, r.impl, r.us, base);
  }
  if (j.lead()) std::fflush(stdout);
}

// ---- the command ---------------------------------------------------------------------------

struct Todo {
  net::Coll kind;
  long long bytes;
};

// The problems to run, each widening `room` (the path they need) unless that would take more pinned
// memory than --max-bounce: then it is left out, saying so (rank 0).
std::vector<Todo> plan(const Config& c, int nodes, bool lead, Room& room) {
  std::vector<Todo> todo;
  for (net::Coll k : c.kernels)
    for (long long b : c.sizes) {
      const Room need = c.has_impl(kImplWeave) ? room_of(k, b, c, nodes) : Room{};
      if (netb::widen_within(room, need, c.max_bounce, concat(row_kernel(k), " ", b, " B"), "--sizes", lead))
        todo.push_back({k, b});
    }
  if (todo.empty() && lead) std::fprintf(stderr, "%s: no problem left to run (see above)\n", kWho);
  return todo;
}

int run(const weave::bench::Args& a) {
  const Config c = parse(a);
  netb::Run run;
  const int began = netb::begin_run(run, kWho, "net_coll", "bench-net-coll", "this benchmark of the collectives is");
  if (began >= 0) return began;
  const bool lead = run.lead;
  Room room;
  const std::vector<Todo> todo = plan(c, run.nodes(), lead, room);
  if (todo.empty()) return 1;

  if (const int status = netb::open_run(run, c, room, kWho, "--sizes", check::test_seed); status >= 0) return status;
  weave::bench::JsonSink sink(a);  // every rank checks the file opens; rank 0 writes
  net::NetPath& path = *run.path;
  const net::NetPathOptions& po = run.po;
  net::NetCollectives coll(path, netb::coll_options(c));
  ref::Checker checker;
  Job j(run, sink, c, coll, checker);

  if (lead) {
    cudaDeviceProp prop{};
    WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, path.device()));
    std::printf("%s: %d nodes of one rank, %s; libfabric %s; path: %zu MiB send, 2 x %zu MiB receive, %u flags; "
                "chunk %lld, %d send + %d receive blocks; bf16 in place; %d warm-up + %d timed calls, median of the "
                "slowest rank's; seed %llu\n",
                kWho, run.nodes(), prop.name, path.transport().describe().c_str(), po.send_bytes >> 20,
                po.recv_bytes >> 21, po.proxy.flags, c.chunk, c.send_blocks, c.recv_blocks, c.warmup, c.iters,
                static_cast<unsigned long long>(j.seed));
    netb::print_notes(run, c);
    std::printf("| kernel | impl | bytes | time_us | algbw GB/s | busbw GB/s | nccl/weave | check |\n"
                "|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
  }
  for (const Todo& t : todo) {
    Problem p(j, t.kind, t.bytes, check::derive(j.seed, 0x6e6363, j.problems++));
    emit(j, p, run_problem(j, p));
  }
  netb::end_run(run);
  return weave::bench::exit_status("net_coll", j.wrong, j.seed, lead);
}

}  // namespace

WEAVE_BENCH(net_coll,
            "the inter-node collectives (kernels/net_collectives: rows net_all_reduce, net_all_gather, "
            "net_reduce_scatter) between nodes of one rank each, under weave-run -n N --nodes N (with --share-gpus on "
            "fewer GPUs: checks only, the times time-slice): impl weave (NetCollectives) vs nccl (NCCL on its socket "
            "transport; one GPU per rank); bf16 in place, bytes = the whole buffer, every row checked exactly, exit 1 "
            "if any is wrong [--sizes 1M,4M,16M,64M] [--kernels all_reduce,all_gather,reduce_scatter] "
            "[--impls weave,nccl] [--chunk 256K] [--send-blocks 4] [--recv-blocks 8] [--iters 20] [--warmup 5] "
            "[--provider tcp] [--domain lo] [--notify ordered|unordered] [--max-bounce 4G]",
            run);
