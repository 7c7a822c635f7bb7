// weave-bench net_tp: the inter-node fused TP kernels (kernels/net_tp: NetAgGemm, NetGemmRs,
// NetGemmAr) between nodes of one rank each, against the same transfers and GEMM without overlap, and
// against cuBLAS + NCCL restricted to its network transport (issue 22's baseline).
//
//   weave-run -n N --nodes N [--share-gpus] -- weave-bench net_tp [--json FILE]
//       [--sizes 2048,4096,8192] [--n N] [--k K] [--kernels ag_gemm,gemm_rs,gemm_ar]
//       [--impls weave,weave-unfused,nccl,weave-adaptive] [--chunk 1M] [--send-blocks 2]
//       [--recv-blocks 6] [--sweep 1+1,2+6,...] [--iters 20] [--warmup 5] [--provider tcp]
//       [--domain lo] [--notify ordered|unordered] [--max-bounce 4G] [--nccl-gemm cublas|weave]
//
// Problems, per size S of --sizes: M = S rows, N = --n and K = --k columns (default S each), bf16,
// B stored N x K (an nn.Linear weight, NetTpOptions::b = NK).
//   net_ag_gemm  A (M x K) sharded by rows over the nodes (rank q: rows tp::shard(M, nodes, q)),
//                gathered in place into an M x K buffer; C = A_gathered · Bᵀ with this rank's B.
//   net_gemm_rs  each rank's A (M x K) and B (its K slice): rank q gets rows tp::shard(M, nodes, q)
//                of the sum over ranks of A_r · B_rᵀ.
//   net_gemm_ar  the same sum, all M rows on every rank.
// Implementations (rows "impl"):
//   weave          the fused kernel (NetAgGemm::run / NetGemmRs::run / NetGemmAr::run) with --chunk,
//                  --send-blocks and --recv-blocks (NetTpOptions).
//   weave-adaptive the fused kernel with the adaptive SM split (NetTpOptions::adaptive: no fixed
//                  send and receive blocks; net_tp/net_gemm_rs_adaptive.cuh, net_ag_adaptive_kernel.cuh);
//                  its rows also carry the split's statistics per call (communication tasks handed
//                  out while tiles were left, the most blocks communicating then).
//   weave-fixed    with --sweep S+R,...: the fused gemm_rs / gemm_ar kernel at each fixed split of
//                  S send and R receive blocks, then a line (impl "adaptive-vs-fixed") with the
//                  adaptive row's time over the best fixed one's (issue 22's target: within 5 %).
//   weave-unfused  the same network path without overlap: NetCollectives::all_gather in place,
//                  then weave's GEMM (ag); weave's GEMM into M x N, then
//                  NetCollectives::reduce_scatter (rs) or NetCollectives::all_reduce (ar) in place.
//                  Same chunk and blocks. The collectives shard the buffer in 16-byte units, which
//                  are the row shards only when every shard is whole rows; where they are not, the
//                  ag and rs rows are skipped (ar reduces the whole buffer: never skipped).
//   nccl           the issue's baseline: cuBLASLt's GEMM (check/gemm_baseline.cuh's CublasLt, as
//                  weave-bench gemm and tp time it: bf16 in, fp32 accumulation, bf16 out, the same
//                  row-major A, B as N x K and C as weave's call) + ncclAllGather /
//                  ncclReduceScatter / ncclAllReduce in place, NCCL restricted to its network
//                  transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket,
//                  NCCL_SOCKET_IFNAME=lo on simulated nodes; each set where unset). With
//                  --nccl-gemm weave the GEMM is weave's instead, so that the row differs from
//                  weave-unfused only in the transfer. The row's "gemm" says which (every row
//                  carries it). Only with a GPU of its own per rank (NCCL refuses two ranks on one
//                  GPU), and for ag and rs M a multiple of the nodes (NCCL's blocks are equal);
//                  otherwise skipped with the reason.
//
// Timing: --warmup calls (one batch, then finish), then --iters calls, each alone: the stream
// drained, the ranks released together by a barrier on the path's bootstrap, CUDA events around
// the one call. A rank's event time includes any wait for a late peer, so each iteration's time
// is the slowest rank's; time_us is the median over iterations. Calls never overlap, so each time
// is one call end to end; since the stream is idle when the first event is recorded, it also
// counts the host's time to issue the call (checks, launches), as a caller would see it.
//
// Checks (every row): the last timed call runs on a second input set (every earlier call on the
// first), into outputs poisoned just before it, so a kernel that leaves anything of an earlier
// call in place, or skips a store, fails. Every rank regenerates every rank's inputs from the job
// seed (rank 0's WEAVE_TEST_SEED) and checks its own output per element and per 128 x 128 tile
// against a float32 cuBLASLt reference (check/gemm_ref.hpp): ag with check::gemm_bound() (one
// rounding) and the gathered A bit for bit, rs (its rows) and ar (all M rows) with
// check::partial_sum_bound(nodes), which also covers the unfused ring's rounding per hop. A row is
// correct only if it is on every rank; any incorrect row makes the command exit 1.
//
// The network path is made once, its bounce buffers (pinned host memory) sized for the largest
// problem requested; a problem that would take more than --max-bounce bytes of them (send +
// both receive slots, per rank) is skipped with a message saying what it needs.
//
// Fewer than 2 ranks, no rendezvous address or a single node: a message and exit 0 (nothing to
// measure). More than one rank per node (only the one-rank-per-node form is built): exit 2. A rank
// without a GPU: exit 1. With --share-gpus the times are not meaningful (the ranks' kernels
// time-slice one GPU); the checks are.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bench.hpp"
#include "bitwise.cuh"
#include "net_bench.hpp"
#include "net_start.hpp"
#include "check/device_buffer.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "check/gemm_baseline.cuh"
#include "net_collectives/layout.hpp"
#include "net_collectives/net_collectives.hpp"
#include "net_tp/layout.hpp"
#include "net_tp/net_tp.hpp"
#include "tp_common/host.hpp"
#include "tp_common/schedule.hpp"
#include "weave/config.hpp"
#include "weave/net/net_path.hpp"
#include "weave/runtime/env.hpp"
#include "weave/runtime/launch.hpp"
#include "weave/runtime/net_bootstrap.hpp"

namespace {

namespace net = weave::net;
namespace check = weave::check;
namespace gref = weave::gemm::ref;
namespace wtp = weave::tp;
using bf16 = __nv_bfloat16;
using weave::Error;
using weave::detail::concat;
using Dev = check::DeviceBuffer<bf16>;
using DevF = check::DeviceBuffer<float>;
using weave::bench::netb::kImplNccl;
using weave::bench::netb::kImplUnfused;
using weave::bench::netb::kImplWeave;
using weave::bench::netb::Room;
using weave::bench::netb::Verdict;

constexpr const char* kWho = "weave-bench net_tp";

// ---- options ------------------------------------------------------------------------------


// The path's and the timing's options (impls, chunk, blocks, iters, ...) are net_bench.hpp's.
constexpr const char* kImplAdaptive = "weave-adaptive";
constexpr const char* kImplFixed = "weave-fixed";

struct Config : weave::bench::netb::NetOptions {
  std::vector<int> sizes;
  int n = 0, k = 0;  // 0: S
  std::vector<std::string> kernels;
  std::vector<std::pair<int, int>> sweep;  // --sweep: (send, receive) blocks of the weave-fixed rows
  bool nccl_weave_gemm = false;            // --nccl-gemm weave: the nccl rows compute with weave's GEMM
};

Config parse(const weave::bench::Args& a) {
  static const std::set<std::string> known{"json",   "sizes",   "n",      "k",      "kernels",     "impls",
                                           "chunk",  "send-blocks", "recv-blocks", "iters", "warmup", "provider",
                                           "domain", "notify",  "max-bounce", "sweep",   "nccl-gemm"};
  for (const auto& [k, v] : a.kv)
    if (!known.count(k)) throw Error(concat(kWho, ": unknown option --", k, " (see weave-bench net_tp --help)"));
  Config c;
  for (const std::string& s : a.names("sizes", "2048,4096,8192"))
    c.sizes.push_back(static_cast<int>(weave::bench::parse_count(kWho, "sizes", s, 1, 1 << 20)));
  if (c.sizes.empty()) throw Error(concat(kWho, ": --sizes names no size"));
  // The GEMM's TMA rows need K and N in multiples of 8 elements (16 bytes).
  for (const char* d : {"n", "k"})
    if (a.has(d)) {
      const long long v = weave::bench::parse_count(kWho, d, a.get(d), 8, 1 << 20);
      if (v % 8) throw Error(concat(kWho, ": --", d, " ", v, " is not a multiple of 8"));
      (d[0] == 'n' ? c.n : c.k) = static_cast<int>(v);
    }
  for (const std::string& k : a.names("kernels", "ag_gemm,gemm_rs,gemm_ar")) {
    if (k != "ag_gemm" && k != "gemm_rs" && k != "gemm_ar")
      throw Error(concat(kWho, ": --kernels: '", k, "' is not ag_gemm, gemm_rs or gemm_ar"));
    c.kernels.push_back(k);
  }
  c.chunk = net::NetTpOptions{}.chunk_bytes;
  c.send_blocks = net::NetTpOptions{}.send_blocks;
  c.recv_blocks = net::NetTpOptions{}.recv_blocks;
  weave::bench::netb::parse_net_options(kWho, a, c, kImplAdaptive);
  for (const std::string& x : a.names("sweep", "")) {
    const size_t plus = x.find('+');
    if (plus == std::string::npos) throw Error(concat(kWho, ": --sweep: '", x, "' is not S+R (send + receive blocks)"));
    const int sb = static_cast<int>(weave::bench::parse_count(kWho, "sweep", x.substr(0, plus), 1, 32));
    const int rb = static_cast<int>(weave::bench::parse_count(kWho, "sweep", x.substr(plus + 1), 1, 32));
    c.sweep.emplace_back(sb, rb);
  }
  const std::string g = a.get("nccl-gemm", "cublas");
  if (g != "cublas" && g != "weave") throw Error(concat(kWho, ": --nccl-gemm: '", g, "' is not cublas or weave"));
  c.nccl_weave_gemm = g == "weave";
  return c;
}

// ---- problems and the room they take on the network path ------------------------------------

struct Shape {
  int S, M, N, K;
  std::string str() const { return concat(M, "x", N, "x", K); }
};
Shape shape_of(const Config& c, int S) { return {S, S, c.n ? c.n : S, c.k ? c.k : S}; }

const char* row_kernel(const std::string& kernel) {
  return kernel == "ag_gemm" ? "net_ag_gemm" : kernel == "gemm_rs" ? "net_gemm_rs" : "net_gemm_ar";
}

// The kernels' and the collectives' own plans (the functions their host entries check with), so
// that the path is exactly as large as the largest call needs.
Room room_of(const std::string& kernel, const std::string& impl, const Shape& s, const Config& c, int nodes) {
  const bool ag = kernel == "ag_gemm", ar = kernel == "gemm_ar";
  if (impl == kImplWeave || impl == kImplAdaptive || impl == kImplFixed) {
    namespace tn = net::tp_net;
    const tn::UnitPlan U = ag ? tn::ag_plan(s.M, s.N, s.K, 2, nodes, wtp::default_group_m(s.K), c.chunk)
                              : tn::rs_plan(s.M, s.N, nodes, wtp::default_group_m(s.K), c.chunk);
    if (ar) return {tn::ar_send_needed(U), tn::ar_recv_needed(U), tn::ar_flags_needed(U)};
    return {ag ? tn::ag_send_needed(U) : tn::rs_send_needed(U), tn::recv_needed(U), tn::flags_needed(U)};
  }
  if (impl == kImplUnfused) {
    const long long bytes = 2LL * s.M * (ag ? s.K : s.N);
    const net::Coll coll = ag ? net::Coll::all_gather : ar ? net::Coll::all_reduce : net::Coll::reduce_scatter;
    const net::coll::Layout L = net::coll::make_layout(coll, net::Topo{nodes, 1}, bytes, c.chunk);
    return {net::coll::send_needed(L), net::coll::recv_needed(L), static_cast<long long>(net::coll::flags_needed(L))};
  }
  return {};  // nccl: its own buffers
}

// "" when NetCollectives' element shards of an M x cols buffer are the row shards of every rank
// (the unfused rows gather and scatter rows through it), else why not.
std::string element_shards_differ(int M, int cols, int nodes) {
  for (int q = 0; q < nodes; ++q) {
    long long first = 0, n = 0;
    net::NetCollectives::shard(nodes, static_cast<long long>(M) * cols, net::NetDtype::bf16, q, &first, &n);
    const wtp::Range r = wtp::shard(M, nodes, q);
    if (first != static_cast<long long>(r.begin) * cols || n != static_cast<long long>(r.size) * cols)
      return concat("NetCollectives gives rank ", q, " elements [", first, ", +", n, ") of the ", M, " x ", cols,
                    " buffer, not its rows ", r.begin, "..", r.begin + r.size - 1, " (shards are near-equal in 16-byte "
                    "units, so whole rows only when they happen to fall on row ends)");
  }
  return "";
}

// ---- the job ------------------------------------------------------------------------------


// The run's fields (path, stream, rank, seed, nccl, ...: net_bench.hpp) with this suite's options
// and reference.
struct Job : weave::bench::netb::JobBase {
  const Config& c;
  check::GemmRef& ref;
  gref::CublasLt* blas;  // the nccl rows' GEMM; null: weave's (--nccl-gemm weave, or no nccl rows)
  Job(weave::bench::netb::Run& r, weave::bench::JsonSink& s, const Config& cfg, check::GemmRef& g, gref::CublasLt* b)
      : JobBase(r, s), c(cfg), ref(g), blas(b) {}
  const char* nccl_gemm() const { return blas ? "cublaslt" : "weave"; }
};

// The nccl rows' GEMM, on the same operands and layout as weave's call (B as N x K).
void baseline_gemm(Job& j, const bf16* A, const bf16* B, bf16* C, const Shape& sh) {
  if (j.blas)
    j.blas->run(A, B, C, sh.M, sh.N, sh.K, weave::gemm::BLayout::NK, false, j.st);
  else
    weave::gemm::gemm(A, B, C, sh.M, sh.N, sh.K, weave::gemm::BLayout::NK, {}, j.st);
}

// ---- timing and checking, shared by every row ---------------------------------------------

// A problem's inputs and outputs as the timing loop prepares them: inputs(set) enqueues what set
// `set` needs in place (the own rows of an in-place gathered A), poison() the NaN in every output.
class Problem {
 public:
  virtual ~Problem() = default;
  virtual void inputs(int set) = 0;
  virtual void poison() = 0;
};

// One implementation of a problem: call(set) enqueues one call on input set `set`; finish() waits
// for the stream and throws a transfer failure (the object's finish, or a plain synchronize);
// check() compares the outputs of the last call with the reference of set 1 on this rank
// (report, plus a non-empty `extra` for a finding outside it).
struct Finding {
  check::Report rep;
  std::string extra;
};
struct Impl {
  const char* name;
  std::function<void(int set)> call;
  std::function<void()> finish;
  std::function<Finding()> check;
};

// The median over iterations of the slowest rank's time of each (net_bench.hpp's loop), in µs.
// The last iteration is the checked call: set 1 into poisoned outputs.
double time_impl(Job& j, Problem& p, const Impl& im) {
  return weave::bench::netb::time_slowest(j.boot(), j.st, j.nodes, j.c.warmup, j.c.iters,
                                          {[&] { p.inputs(0); },
                                           [&] {
                                             p.poison();
                                             p.inputs(1);
                                           },
                                           im.call, im.finish});
}

// The same verdict on every rank (wrong on one rank: wrong everywhere).
Verdict settle(Job& j, const std::string& what, const Finding& f) {
  const bool ok = f.rep.ok && f.extra.empty();
  return weave::bench::netb::settle(j.path, what, ok, f.extra.empty() ? f.rep.worst : INFINITY, f.rep.str() + f.extra);
}

// Bitwise equality of the gathered A with the regenerated one (it is a copy, so nothing less).
unsigned long long mismatches(const bf16* a, const bf16* b, size_t n, cudaStream_t st) {
  return weave::bench::mismatches_bits(reinterpret_cast<const uint16_t*>(a), reinterpret_cast<const uint16_t*>(b), n, st);
}

struct Row {
  std::string kernel, impl;
  Shape sh{};
  double us = NAN;
  Verdict v;
  int send = -1, recv = -1;  // the row's send and receive blocks (-1: the options'; 0: adaptive)
  double early = 0;          // adaptive: communication tasks per call handed out while tiles were left
  unsigned long long peak = 0;  // adaptive: the most blocks communicating then, over its object's calls so far
};

// Times and checks one implementation; a row for it.
Row measure(Job& j, const std::string& kernel, const Shape& sh, Problem& p, const Impl& im) {
  Row r;
  r.kernel = row_kernel(kernel);
  r.impl = im.name;
  r.sh = sh;
  r.us = time_impl(j, p, im);
  r.v = settle(j, concat(r.kernel, " ", r.impl, " ", sh.str()), im.check());
  return r;
}

// ---- the problems ---------------------------------------------------------------------------

enum What : uint64_t { kA = 1, kB = 2 };

// Inputs of (problem, set, rank q, operand): the same on every rank, so each can rebuild its peers'.
struct Seeds {
  uint64_t problem;
  uint64_t of(int set, int q, What w) const { return check::derive(problem, uint64_t(set) * 64 + uint64_t(q), w); }
};

// AllGather + GEMM. The gathered A is in place (the own shard at its rows of the M x K buffer)
// for every implementation, as NetCollectives' all_gather and NCCL's in-place form need it; so
// each set's own shard is copied into place before its calls.
struct AgProblem : Problem {
  Job& j;
  Shape sh;
  wtp::Range mine;
  Dev G;                   // the gathered A (M x K)
  Dev shard[2], B[2];      // per input set: this rank's shard of A, its B (N x K)
  Dev C;                   // M x N
  Dev full;                // set 1's gathered A, regenerated from every rank's seed
  DevF r, s;               // its reference and per-element scale

  AgProblem(Job& job, const Shape& shape, Seeds sd)
      : j(job), sh(shape), mine(wtp::shard(sh.M, j.nodes, j.rank)), G(size_t(sh.M) * sh.K),
        shard{Dev(size_t(mine.size) * sh.K), Dev(size_t(mine.size) * sh.K)},
        B{Dev(size_t(sh.N) * sh.K), Dev(size_t(sh.N) * sh.K)}, C(size_t(sh.M) * sh.N), full(size_t(sh.M) * sh.K),
        r(size_t(sh.M) * sh.N), s(size_t(sh.M) * sh.N) {
    for (int set = 0; set < 2; ++set) {
      gref::fill_uniform(shard[set].p, shard[set].n, sd.of(set, j.rank, kA), 1.f, j.st);
      gref::fill_uniform(B[set].p, B[set].n, sd.of(set, j.rank, kB), 1.f, j.st);
    }
    // The reference of the checked call (set 1): every rank's shard, times this rank's B.
    for (int q = 0; q < j.nodes; ++q) {
      const wtp::Range sq = wtp::shard(sh.M, j.nodes, q);
      gref::fill_uniform(full.p + size_t(sq.begin) * sh.K, size_t(sq.size) * sh.K, sd.of(1, q, kA), 1.f, j.st);
    }
    j.ref.run(full.p, B[1].p, sh.M, sh.N, sh.K, weave::gemm::BLayout::NK, r.p, s.p, false, j.st);
    check::sqrt_inplace(s.p, r.n, j.st);
  }
  bf16* own() { return G.p + size_t(mine.begin) * sh.K; }
  void inputs(int set) override {
    WEAVE_CUDA_CHECK(
        cudaMemcpyAsync(own(), shard[set].p, shard[set].n * sizeof(bf16), cudaMemcpyDeviceToDevice, j.st));
  }
  void poison() override {
    check::poison(G.p, G.n, j.st);  // inputs(1) then puts the own rows back
    check::poison(C.p, C.n, j.st);
  }
  // C against the reference, and the gathered A against every rank's regenerated shard.
  Finding verify() {
    Finding f;
    f.rep = check::compare({C.p, sh.N}, {r.p, sh.N}, {s.p, sh.N}, sh.M, sh.N, check::gemm_bound(), 128, 128, j.st);
    const unsigned long long bad = mismatches(G.p, full.p, G.n, j.st);
    if (bad) f.extra = concat("; gathered A: ", bad, " of ", G.n, " elements differ");
    return f;
  }
};

// GEMM + ReduceScatter, and GEMM + AllReduce (`all_rows`: every rank gets all M rows of the sum).
// The fused kernel writes the rows this rank gets into `out`; the unfused and NCCL rows reduce in
// place in the M x N product, where this rank's rows are at its shard (AR: all of it).
struct RsProblem : Problem {
  Job& j;
  Shape sh;
  wtp::Range mine;  // the rows this rank gets: its shard (RS) or all M (AR)
  Dev A[2], B[2];   // per input set: this rank's A (M x K) and B (N x K, its K slice)
  Dev out;          // the fused kernel's rows (mine.size x N)
  Dev C;            // the unfused and NCCL rows' M x N product, reduced in place
  DevF r, s;        // set 1's reference (the sum over ranks) and per-element scale

  RsProblem(Job& job, const Shape& shape, Seeds sd, bool all_rows)
      : j(job), sh(shape), mine(all_rows ? wtp::Range{0, sh.M} : wtp::shard(sh.M, j.nodes, j.rank)),
        A{Dev(size_t(sh.M) * sh.K), Dev(size_t(sh.M) * sh.K)}, B{Dev(size_t(sh.N) * sh.K), Dev(size_t(sh.N) * sh.K)},
        out(size_t(mine.size) * sh.N), C(size_t(sh.M) * sh.N), r(size_t(sh.M) * sh.N), s(size_t(sh.M) * sh.N) {
    for (int set = 0; set < 2; ++set) {
      gref::fill_uniform(A[set].p, A[set].n, sd.of(set, j.rank, kA), 1.f, j.st);
      gref::fill_uniform(B[set].p, B[set].n, sd.of(set, j.rank, kB), 1.f, j.st);
    }
    // The reference of the checked call (set 1): the sum over ranks of A_q · B_qᵀ, one float32
    // product over the whole K (every peer's slice regenerated here).
    Dev aq(A[1].n), bq(B[1].n);
    for (int q = 0; q < j.nodes; ++q) {
      const bf16 *a = A[1].p, *b = B[1].p;
      if (q != j.rank) {
        gref::fill_uniform(aq.p, aq.n, sd.of(1, q, kA), 1.f, j.st);
        gref::fill_uniform(bq.p, bq.n, sd.of(1, q, kB), 1.f, j.st);
        a = aq.p, b = bq.p;
      }
      j.ref.run(a, b, sh.M, sh.N, sh.K, weave::gemm::BLayout::NK, r.p, s.p, q > 0, j.st);
    }
    check::sqrt_inplace(s.p, r.n, j.st);
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(j.st));  // before aq and bq are freed
  }
  void inputs(int) override {}
  void poison() override {
    check::poison(out.p, out.n, j.st);
    check::poison(C.p, C.n, j.st);
  }
  // This rank's rows in the M x N product (the unfused and NCCL rows' output).
  const bf16* mine_in_c() const { return C.p + size_t(mine.begin) * sh.N; }
  // This rank's rows, starting at `x` (ld N), against its rows of the reference.
  Finding verify(const bf16* x) {
    const size_t at = size_t(mine.begin) * sh.N;
    return {check::compare({x, sh.N}, {r.p + at, sh.N}, {s.p + at, sh.N}, mine.size, sh.N,
                           check::partial_sum_bound(j.nodes), 128, 128, j.st),
            ""};
  }
};

// ---- the rows of one problem ------------------------------------------------------------------

// The kernels' objects: made once, so that each agrees on a shape with its peers once (the
// agreement is a bootstrap exchange inside the first call of a shape, a warm-up call here).
struct Ops {
  net::NetAgGemm ag;
  net::NetGemmRs rs;
  net::NetGemmAr ar;
  net::NetCollectives coll;
  net::NetGemmRs rs_adaptive;
  net::NetGemmAr ar_adaptive;
  net::NetAgGemm ag_adaptive;
};

// Why the unfused or nccl rows of a problem cannot run ("" if they can). The nccl rows' reason
// for the whole run (no communicator) is printed once, before the table.
std::string unfused_skip(const Job& j, const std::string& kernel, const Shape& sh) {
  return element_shards_differ(sh.M, kernel == "ag_gemm" ? sh.K : sh.N, j.nodes);
}
std::string nccl_skip(const Job& j, const Shape& sh) {
  if (sh.M % j.nodes) return concat("M = ", sh.M, " is not a multiple of the ", j.nodes, " nodes (NCCL's blocks are equal)");
  return "";
}

std::vector<Row> run_ag(Job& j, Ops& ops, const Shape& sh, Seeds sd) {
  const int M = sh.M, N = sh.N, K = sh.K;
  AgProblem p(j, sh, sd);
  const auto gemm = [&](int set) { weave::gemm::gemm(p.G.p, p.B[set].p, p.C.p, M, N, K, weave::gemm::BLayout::NK, {}, j.st); };
  const auto verify = [&] { return p.verify(); };
  std::vector<Impl> impls;
  std::vector<std::string> skipped;
  if (j.c.has_impl(kImplWeave))
    impls.push_back({kImplWeave, [&](int set) { ops.ag.run(p.own(), p.G.p, p.B[set].p, p.C.p, M, N, K, j.st); },
                     [&] { ops.ag.finish(j.st); }, verify});
  if (j.c.has_impl(kImplUnfused)) {
    if (const std::string why = unfused_skip(j, "ag_gemm", sh); !why.empty())
      skipped.push_back(concat(kImplUnfused, ": skipped: ", why));
    else
      impls.push_back({kImplUnfused,
                       [&](int set) {
                         ops.coll.all_gather(p.G.p, static_cast<long long>(M) * K, net::NetDtype::bf16, j.st);
                         gemm(set);
                       },
                       [&] { ops.coll.finish(j.st); }, verify});
  }
  if (j.c.has_impl(kImplNccl) && j.nccl) {
    if (const std::string why = nccl_skip(j, sh); !why.empty()) {
      skipped.push_back(concat(kImplNccl, ": skipped: ", why));
    } else {
      const size_t rows = size_t(M / j.nodes);
      impls.push_back({kImplNccl,
                       [&, rows](int set) {
                         WEAVE_NCCL_CHECK(ncclAllGather(p.G.p + size_t(j.rank) * rows * K, p.G.p, rows * K,
                                                        ncclBfloat16, j.nccl->comm, j.st));
                         baseline_gemm(j, p.G.p, p.B[set].p, p.C.p, sh);
                       },
                       [&] { WEAVE_CUDA_CHECK(cudaStreamSynchronize(j.st)); }, verify});
    }
  }
  if (j.lead())
    for (const std::string& s : skipped) std::printf("  net_ag_gemm %s %s\n", sh.str().c_str(), s.c_str());
  std::vector<Row> rows;
  for (const Impl& im : impls) rows.push_back(measure(j, "ag_gemm", sh, p, im));
  // The adaptive split (net_tp/net_ag_adaptive_kernel.cuh), its statistics over the row's calls.
  if (j.c.has_impl(kImplAdaptive)) {
    const wtp::AdaptiveStats before = ops.ag_adaptive.adaptive_stats();
    rows.push_back(measure(j, "ag_gemm", sh, p,
                           {kImplAdaptive,
                            [&](int set) { ops.ag_adaptive.run(p.own(), p.G.p, p.B[set].p, p.C.p, M, N, K, j.st); },
                            [&] { ops.ag_adaptive.finish(j.st); }, verify}));
    const wtp::AdaptiveStats after = ops.ag_adaptive.adaptive_stats();
    const unsigned long long calls = after.launches - before.launches;
    rows.back().send = rows.back().recv = 0;
    rows.back().early = calls ? double(after.early_reductions - before.early_reductions) / double(calls) : 0;
    rows.back().peak = after.peak_comm_blocks;
  }
  return rows;
}

// GEMM + ReduceScatter (kernel "gemm_rs") or GEMM + AllReduce ("gemm_ar").
std::vector<Row> run_rs(Job& j, Ops& ops, const std::string& kernel, const Shape& sh, Seeds sd) {
  const int M = sh.M, N = sh.N, K = sh.K;
  const bool ar = kernel == "gemm_ar";
  const long long MN = static_cast<long long>(M) * N;
  RsProblem p(j, sh, sd, ar);
  const auto gemm = [&](int set) { weave::gemm::gemm(p.A[set].p, p.B[set].p, p.C.p, M, N, K, weave::gemm::BLayout::NK, {}, j.st); };
  const auto verify_c = [&] { return p.verify(p.mine_in_c()); };
  // The fused kernel of objects `rso` / `aro` (RS or AR, by the kernel), as implementation `name`.
  const auto fused = [&](const char* name, net::NetGemmRs& rso, net::NetGemmAr& aro) {
    return Impl{name,
                [&](int set) {
                  if (ar) aro.run(p.A[set].p, p.B[set].p, p.out.p, M, N, K, j.st);
                  else rso.run(p.A[set].p, p.B[set].p, p.out.p, M, N, K, j.st);
                },
                [&] { ar ? aro.finish(j.st) : rso.finish(j.st); }, [&] { return p.verify(p.out.p); }};
  };
  std::vector<Impl> impls;
  std::vector<std::string> skipped;
  if (j.c.has_impl(kImplWeave)) impls.push_back(fused(kImplWeave, ops.rs, ops.ar));
  if (j.c.has_impl(kImplUnfused)) {
    if (const std::string why = ar ? "" : unfused_skip(j, kernel, sh); !why.empty())
      skipped.push_back(concat(kImplUnfused, ": skipped: ", why));
    else
      impls.push_back({kImplUnfused,
                       [&](int set) {
                         gemm(set);
                         if (ar) ops.coll.all_reduce(p.C.p, MN, net::NetDtype::bf16, j.st);
                         else ops.coll.reduce_scatter(p.C.p, MN, net::NetDtype::bf16, j.st);
                       },
                       [&] { ops.coll.finish(j.st); }, verify_c});
  }
  if (j.c.has_impl(kImplNccl) && j.nccl) {
    if (const std::string why = ar ? "" : nccl_skip(j, sh); !why.empty()) {
      skipped.push_back(concat(kImplNccl, ": skipped: ", why));
    } else {
      // In place. RS: rank r's block of M / nodes rows, which is its shard since M divides evenly.
      const size_t rows = size_t(M / j.nodes);
      impls.push_back({kImplNccl,
                       [&, rows](int set) {
                         baseline_gemm(j, p.A[set].p, p.B[set].p, p.C.p, sh);
                         if (ar)
                           WEAVE_NCCL_CHECK(
                               ncclAllReduce(p.C.p, p.C.p, size_t(MN), ncclBfloat16, ncclSum, j.nccl->comm, j.st));
                         else
                           WEAVE_NCCL_CHECK(ncclReduceScatter(p.C.p, p.C.p + size_t(j.rank) * rows * N, rows * N,
                                                              ncclBfloat16, ncclSum, j.nccl->comm, j.st));
                       },
                       [&] { WEAVE_CUDA_CHECK(cudaStreamSynchronize(j.st)); }, verify_c});
    }
  }
  if (j.lead())
    for (const std::string& s : skipped) std::printf("  %s %s %s\n", row_kernel(kernel), sh.str().c_str(), s.c_str());
  std::vector<Row> rows;
  for (const Impl& im : impls) rows.push_back(measure(j, kernel, sh, p, im));
  // The adaptive split, its statistics over the row's calls.
  const auto stats = [&] { return ar ? ops.ar_adaptive.adaptive_stats() : ops.rs_adaptive.adaptive_stats(); };
  if (j.c.has_impl(kImplAdaptive)) {
    const wtp::AdaptiveStats before = stats();
    rows.push_back(measure(j, kernel, sh, p, fused(kImplAdaptive, ops.rs_adaptive, ops.ar_adaptive)));
    const wtp::AdaptiveStats after = stats();
    const unsigned long long calls = after.launches - before.launches;
    rows.back().send = rows.back().recv = 0;
    rows.back().early = calls ? double(after.early_reductions - before.early_reductions) / double(calls) : 0;
    rows.back().peak = after.peak_comm_blocks;
  }
  // The fixed splits of --sweep, each on an object of its own options.
  for (const auto& [sb, rb] : j.c.sweep) {
    net::NetTpOptions o;
    o.chunk_bytes = j.c.chunk, o.send_blocks = sb, o.recv_blocks = rb, o.b = weave::gemm::BLayout::NK;
    net::NetGemmRs frs(j.path, o);
    net::NetGemmAr far(j.path, o);
    rows.push_back(measure(j, kernel, sh, p, fused(kImplFixed, frs, far)));
    rows.back().send = sb, rows.back().recv = rb;
  }
  return rows;
}

// The table lines and JSON lines of one problem's rows (weave's beside the others' times).
void emit(Job& j, const std::vector<Row>& rows) {
  const weave::bench::netb::Baselines base = weave::bench::netb::baselines(rows);
  const double unfused_us = base.unfused, nccl_us = base.nccl;
  for (const Row& r : rows) {
    const Shape& s = r.sh;
    const double tflops = 2.0 * s.M * s.N * s.K / (r.us * 1e-6) / 1e12;
    const bool weave_row = r.impl == kImplWeave || r.impl == kImplAdaptive || r.impl == kImplFixed,
               nccl_row = r.impl == kImplNccl;
    if (!r.v.ok) j.wrong.push_back(concat(r.kernel, " ", r.impl, " ", s.str()));
    if (!j.lead()) continue;
    auto ratio = [&](double base) {
      char b[32] = "-";
      if (weave_row && !std::isnan(base)) std::snprintf(b, sizeof b, "%.3f", base / r.us);
      return std::string(b);
    };
    const std::string label = r.impl == kImplFixed ? concat(r.impl, " ", r.send, "+", r.recv) : r.impl;
    std::printf("| %s | %s | %s | %.1f | %.1f | %s | %s | %s %.3g |\n", r.kernel.c_str(), label.c_str(),
                s.str().c_str(), r.us, tflops, ratio(unfused_us).c_str(), ratio(nccl_us).c_str(),
                r.v.ok ? "ok" : "WRONG", r.v.worst);
    weave::bench::JsonLine jl;
    jl.add("kernel", r.kernel).add("impl", r.impl).add("S", s.S).add("M", s.M).add("N", s.N).add("K", s.K);
    jl.add("layout", "nk").add("nodes", j.nodes).add("world", j.nodes).add("gemm", nccl_row ? j.nccl_gemm() : "weave");
    jl.add("time_us", r.us).add("tflops", tflops).add("iters", j.c.iters).add("warmup", j.c.warmup);
    weave::bench::netb::NetOptions blocks = j.c;  // the row's own blocks where it has them
    if (r.send >= 0) blocks.send_blocks = r.send, blocks.recv_blocks = r.recv;
    weave::bench::netb::add_path_fields(jl, blocks, nccl_row, j.provider, j.notify, j.shared_gpu).add("correct", r.v.ok);
    weave::bench::add_check_worst(jl, r.v.worst).add("seed", std::to_string(j.seed));
    if (r.impl == kImplAdaptive) jl.add("adaptive", true).add("early_comm_tasks", r.early).add("peak_comm_blocks", static_cast<long long>(r.peak));
    if (weave_row && r.impl != kImplWeave) {  // write_row gives the weave row its ratios
      if (!std::isnan(unfused_us)) jl.add("ratio_vs_unfused", unfused_us / r.us);
      if (!std::isnan(nccl_us)) jl.add("ratio_vs_nccl", nccl_us / r.us);
    }
    weave::bench::netb::write_row(j, jl, r.impl, r.us, base);
  }
  // --sweep: the adaptive split against the best fixed split of the same problem.
  const Row* adaptive = nullptr;
  const Row* best = nullptr;
  for (const Row& r : rows) {
    if (r.impl == kImplAdaptive) adaptive = &r;
    if (r.impl == kImplFixed && (!best || r.us < best->us)) best = &r;
  }
  if (adaptive && best && j.lead()) {
    std::printf("| %s | adaptive-vs-fixed | %s | adaptive %.1f us / best fixed %.1f us (%d + %d blocks) = %.3f | "
                "comm tasks while tiles were left %.1f per call, at most %llu blocks | | | |\n",
                adaptive->kernel.c_str(), adaptive->sh.str().c_str(), adaptive->us, best->us, best->send, best->recv,
                adaptive->us / best->us, adaptive->early, adaptive->peak);
    weave::bench::JsonLine jl;
    jl.add("kernel", adaptive->kernel).add("impl", "adaptive-vs-fixed").add("S", adaptive->sh.S).add("M", adaptive->sh.M)
        .add("N", adaptive->sh.N).add("K", adaptive->sh.K).add("nodes", j.nodes).add("world", j.nodes)
        .add("adaptive_us", adaptive->us).add("best_fixed_us", best->us).add("best_send_blocks", best->send)
        .add("best_recv_blocks", best->recv).add("ratio", adaptive->us / best->us)
        .add("correct", adaptive->v.ok && best->v.ok).add("shared_gpu", j.shared_gpu);
    j.sink.write(jl);
  }
  if (j.lead()) std::fflush(stdout);
}

// ---- the command ---------------------------------------------------------------------------

int run(const weave::bench::Args& a) {
  const Config c = parse(a);
  weave::bench::netb::Run run;
  if (const int status = weave::bench::netb::begin_run(run, kWho, "net_tp", "bench-net-tp", "the inter-node TP kernels are");
      status >= 0)
    return status;
  const int nodes = run.nodes();
  const bool lead = run.lead;

  // The problems to run and the path they need: each widens the path, unless that would take more
  // pinned memory than --max-bounce (then it is left out, saying so).
  struct Todo {
    std::string kernel;
    Shape sh;
  };
  std::vector<Todo> todo;
  Room room;
  for (const std::string& k : c.kernels)
    for (int S : c.sizes) {
      const Shape sh = shape_of(c, S);
      if (sh.M < nodes) {
        if (lead) std::printf("%s %s: skipped: M = %d gives some of the %d nodes no rows\n", row_kernel(k), sh.str().c_str(), sh.M, nodes);
        continue;
      }
      Room need;
      for (const std::string& i : c.impls) need.widen(room_of(k, i, sh, c, nodes));
      if (!c.sweep.empty()) need.widen(room_of(k, kImplFixed, sh, c, nodes));
      if (weave::bench::netb::widen_within(room, need, c.max_bounce, concat(row_kernel(k), " ", sh.str()), "--sizes", lead))
        todo.push_back({k, sh});
    }
  if (todo.empty()) {
    if (lead) std::fprintf(stderr, "%s: no problem left to run (see above)\n", kWho);
    return 1;
  }

  if (const int status = weave::bench::netb::open_run(run, c, room, kWho, "--sizes", check::test_seed); status >= 0)
    return status;
  check::GemmRef ref;
  // Made only where it runs: its handle and 64 MiB workspace are per rank.
  std::unique_ptr<gref::CublasLt> blas;
  if (run.nccl && !c.nccl_weave_gemm) blas = std::make_unique<gref::CublasLt>();
  weave::bench::JsonSink sink(a);  // every rank checks the file opens; rank 0 writes
  Job j(run, sink, c, ref, blas.get());
  net::NetPath& path = *run.path;
  const net::NetPathOptions& po = run.po;

  net::NetTpOptions to;
  to.chunk_bytes = c.chunk;
  to.send_blocks = c.send_blocks;
  to.recv_blocks = c.recv_blocks;
  to.b = weave::gemm::BLayout::NK;
  net::NetTpOptions ta = to;
  ta.adaptive = true;
  Ops ops{net::NetAgGemm(path, to), net::NetGemmRs(path, to), net::NetGemmAr(path, to),
          net::NetCollectives(path, weave::bench::netb::coll_options(c)), net::NetGemmRs(path, ta),
          net::NetGemmAr(path, ta), net::NetAgGemm(path, ta)};

  if (lead) {
    cudaDeviceProp prop{};
    WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&prop, path.device()));
    std::printf("%s: %d nodes of one rank, %s; libfabric %s; path: %zu MiB send, 2 x %zu MiB receive, %u flags; "
                "chunk %lld, %d send + %d receive blocks; %d warm-up + %d timed calls, median of the slowest rank's\n",
                kWho, nodes, prop.name, path.transport().describe().c_str(), po.send_bytes >> 20,
                po.recv_bytes >> 21, po.proxy.flags, c.chunk, c.send_blocks, c.recv_blocks, c.warmup, c.iters);
    weave::bench::netb::print_notes(run, c);
    if (run.nccl) std::printf("nccl rows' GEMM: %s\n", blas ? "cuBLASLt (bf16, fp32 accumulation)" : "weave's (--nccl-gemm weave)");
    std::printf("| kernel | impl | MxNxK | time_us | TFLOP/s | unfused/weave | nccl/weave | check (worst error / bound) |\n"
                "|---|---|---|---|---|---|---|---|\n");
    std::fflush(stdout);
  }
  for (const Todo& t : todo) {
    const Seeds sd{check::derive(j.seed, 0x6e7470, j.problems++)};
    emit(j, t.kernel == "ag_gemm" ? run_ag(j, ops, t.sh, sd) : run_rs(j, ops, t.kernel, t.sh, sd));
  }
  weave::bench::netb::end_run(run);
  return weave::bench::exit_status("net_tp", j.wrong, j.seed, lead);
}

}  // namespace

WEAVE_BENCH(net_tp,
            "the inter-node fused TP kernels (kernels/net_tp: rows net_ag_gemm, net_gemm_rs, net_gemm_ar) between "
            "nodes of one rank each, under weave-run -n N --nodes N (with --share-gpus on fewer GPUs: checks only, "
            "the times time-slice): impl weave (fused) vs weave-unfused (weave's GEMM and NetCollectives, no "
            "overlap) vs nccl (cuBLASLt's GEMM, or weave's with --nccl-gemm weave, + NCCL on its socket transport; one "
            "GPU per rank); M = S, B N x K, every "
            "row checked, exit 1 if any is wrong [--sizes 2048,4096,8192] [--n S] [--k S] "
            "[--kernels ag_gemm,gemm_rs,gemm_ar] "
            "[--impls weave,weave-unfused,nccl,weave-adaptive (the adaptive SM split)] [--chunk 1M] "
            "[--send-blocks 2] [--recv-blocks 6] [--sweep S+R,... (fixed splits beside the adaptive one)] [--iters 20] "
            "[--warmup 5] [--provider tcp] [--domain lo] [--notify ordered|unordered] [--max-bounce 4G] "
            "[--nccl-gemm cublas|weave]",
            run);
