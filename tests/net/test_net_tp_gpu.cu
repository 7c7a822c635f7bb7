// The inter-node fused TP kernels between simulated nodes of one rank each (weave-run -n N
// --nodes N; on one GPU with --share-gpus: correctness only), and their hierarchical forms
// (NetTpGpuHier.*: weave-run -n 4 --nodes 2, nodes of 2 ranks). Every rank regenerates every rank's
// inputs from the job seed and checks its own output per element and per tile against a float32
// cuBLASLt reference of the whole problem (check/gemm_ref.hpp), on poisoned outputs, ragged
// shapes, both B layouts, several network chunk sizes, a_shard apart and in place, 200
// back-to-back calls with fresh inputs and poisoned outputs of their own, each checked, and the
// rejections: a bad argument or a shape mismatch
// on one rank throws on every rank, and a rank that fails alone releases its peers' kernels.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "check/device_buffer.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "check/gemm_baseline.cuh"
#include "net_coll_check.hpp"
#include "net_tp/net_tp.hpp"
#include "tp_common/schedule.hpp"
#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"
#include "weave/runtime/launch.hpp"

namespace net = weave::net;
namespace check = weave::check;
namespace gref = weave::gemm::ref;
namespace rt = weave::runtime;
using bf16 = __nv_bfloat16;
using weave::gemm::BLayout;
using Dev = check::DeviceBuffer<bf16>;
using DevF = check::DeviceBuffer<float>;

namespace {

using net_coll_test::job_seed;
using net_coll_test::options;

using check::gemm_ref;

enum What : uint64_t { kA = 1, kB = 2 };
uint64_t input_seed(uint64_t call, int q, What w) { return check::derive(call, uint64_t(q), w); }

// Every rank's verdict through the bootstrap: a wrong output anywhere fails the case everywhere.
void expect_all_ranks(net::NetPath& path, const check::Report& rep, const std::string& what) {
  const double mine[2] = {rep.ok ? 1.0 : 0.0, rep.worst};
  std::vector<double> all(2 * path.world());
  path.bootstrap().all_gather(mine, all.data(), sizeof mine);
  std::string bad;
  double worst = 0;
  for (int q = 0; q < path.world(); ++q) {
    if (all[2 * q] == 0) bad += " " + std::to_string(q);
    if (!(all[2 * q + 1] <= worst)) worst = all[2 * q + 1];
  }
  if (path.rank() == 0) std::printf("check %s: worst %.4g%s\n", what.c_str(), worst, bad.empty() ? "" : "  WRONG");
  EXPECT_TRUE(rep.ok) << what << " on rank " << path.rank() << ": " << rep.str();
  EXPECT_TRUE(bad.empty()) << what << ": wrong on rank(s)" << bad;
}

// One checked AG+GEMM problem: this rank's inputs for seed `call`, poisoned outputs, and the
// reference (every rank's shard regenerated into the gathered A, times this rank's B).
struct AgCase {
  int M, N, K;
  BLayout bl;
  Dev own_gathered, B, C, ref_a;
  DevF r, s;
  bf16* gathered;  // own_gathered, or M x K elsewhere (a node communicator's heap at G > 1)
  AgCase(int m, int n, int k, BLayout b, bf16* elsewhere = nullptr)
      : M(m), N(n), K(k), bl(b), own_gathered(elsewhere ? 1 : size_t(m) * k), B(size_t(n) * k), C(size_t(m) * n),
        ref_a(size_t(m) * k), r(size_t(m) * n), s(size_t(m) * n), gathered(elsewhere ? elsewhere : own_gathered.p) {}

  void inputs(uint64_t call, int rank, bf16* a_shard, int nodes) {
    const auto mine = weave::tp::shard(M, nodes, rank);
    gref::fill_uniform(a_shard, size_t(mine.size) * K, input_seed(call, rank, kA));
    gref::fill_uniform(B.p, B.n, input_seed(call, rank, kB));
    check::poison(C.p, C.n);
    check::poison(gathered, size_t(M) * K);
    if (a_shard != gathered + size_t(mine.begin) * K) return;
    gref::fill_uniform(a_shard, size_t(mine.size) * K, input_seed(call, rank, kA));  // in place: after the poison
  }
  void reference(uint64_t call, int nodes) {
    for (int q = 0; q < nodes; ++q) {
      const auto sq = weave::tp::shard(M, nodes, q);
      gref::fill_uniform(ref_a.p + size_t(sq.begin) * K, size_t(sq.size) * K, input_seed(call, q, kA));
    }
    gemm_ref().run(ref_a.p, B.p, M, N, K, bl, r.p, s.p);
    check::sqrt_inplace(s.p, r.n);
  }
  check::Report check_c() const { return check::compare({C.p, N}, {r.p, N}, {s.p, N}, M, N, check::gemm_bound()); }
  check::Report check_gathered() const {
    DevF g(size_t(M) * K);
    check::to_float(g.p, ref_a.p, g.n);
    return check::compare({gathered, K}, {g.p, K}, {nullptr, 0}, M, K, check::Bound{});
  }
};

// `call` throws a weave::Error on this rank whose message contains `part`.
template <class Call>
void expect_error(const char* what, int rank, Call&& call, const std::string& part) {
  std::string msg;
  try {
    call();
  } catch (const weave::Error& e) {
    msg = e.what();
  }
  EXPECT_FALSE(msg.empty()) << what << ": no error on rank " << rank;
  EXPECT_NE(msg.find(part), std::string::npos) << what << ": " << msg;
}

struct Shape {
  int M, N, K;
};
constexpr int kBackToBack = 200;  // calls without a host wait

struct Calls {
  uint64_t base, n = 0;
  explicit Calls(net::NetPath& p) : base(job_seed(p)) {}
  uint64_t next() { return check::derive(base, 0xA6, n++); }
};

std::string label(const char* op, int M, int N, int K, BLayout bl, long long chunk) {
  return std::string(op) + " " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
         (bl == BLayout::NK ? " nk" : " kn") + " chunk " + std::to_string(chunk);
}
std::string label(int M, int N, int K, BLayout bl, long long chunk, bool in_place) {
  return label("ag_gemm", M, N, K, bl, chunk) + (in_place ? " in place" : "");
}

// n AG+GEMM problems for calls without a host wait: call k's shape from `shape(k)`, its gathered
// A at `gathered(k)` (nullptr: its own), its shard, fresh inputs and poisoned outputs of its own.
struct AgBatch {
  std::vector<std::unique_ptr<AgCase>> cases;
  std::vector<std::unique_ptr<Dev>> shards;
  std::vector<uint64_t> seeds;
  template <class Shape, class Gathered>
  AgBatch(Calls& calls, int W, int r, int n, Shape&& shape, Gathered&& gathered) {
    for (int k = 0; k < n; ++k) {
      const auto sh = shape(k);
      cases.push_back(std::make_unique<AgCase>(sh.M, sh.N, sh.K, BLayout::NK, gathered(k)));
      shards.push_back(std::make_unique<Dev>(size_t(weave::tp::shard(sh.M, W, r).size) * sh.K));
      seeds.push_back(calls.next());
      cases.back()->inputs(seeds.back(), r, shards.back()->p, W);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void run(net::NetAgGemm& ag) {
    for (size_t k = 0; k < cases.size(); ++k) {
      AgCase& c = *cases[k];
      ag.run(shards[k]->p, c.gathered, c.B.p, c.C.p, c.M, c.N, c.K, nullptr);
    }
  }
  // After the finish: every call's C and gathered A against its reference, on every rank.
  void check(net::NetPath& path, const std::string& prefix) {
    for (size_t k = 0; k < cases.size(); ++k) {
      AgCase& c = *cases[k];
      c.reference(seeds[k], path.world());
      const std::string what = prefix + " call " + std::to_string(k);
      expect_all_ranks(path, c.check_c(), what + ": C");
      expect_all_ranks(path, c.check_gathered(), what + ": gathered A");
    }
  }
};

// Ragged rows (shards not 128-row multiples, a 1-row-per-node one), N off the 256 grid, short K;
// both layouts, three chunks, a_shard apart and in place; C and the gathered A on every rank. With
// `adaptive`, the adaptive split (also the ledger's launch count, and no more blocks communicating
// while tiles were left than the grid has: a tile's rows that have not arrived hand every block to
// the communication, sm_ledger.cuh, which three nodes sharing one GPU reached).
void ag_matches_reference(bool adaptive) {
  net::NetPath path(options());
  ASSERT_EQ(path.topo().gpus, 1) << "run under weave-run -n N --nodes N";
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const Shape shapes[] = {{3000, 1000, 1000}, {1000, 264, 512}, {257, 8, 64}, {2048, 2048, 2048}, {W + 1, 24, 136}};
  for (const Shape& sh : shapes)
    for (BLayout bl : {BLayout::NK, BLayout::KN})
      for (long long chunk : {1LL << 20, 48LL << 10, 1LL << 12})
        for (bool in_place : {false, true}) {
          if (chunk == (1LL << 12) && sh.M * static_cast<long long>(sh.K) > 1000000) continue;  // flags per slot
          net::NetTpOptions o;
          o.b = bl, o.chunk_bytes = chunk, o.adaptive = adaptive;
          net::NetAgGemm ag(path, o);
          AgCase c(sh.M, sh.N, sh.K, bl);
          const auto mine = weave::tp::shard(sh.M, W, r);
          Dev apart(size_t(mine.size) * sh.K);
          bf16* a_shard = in_place ? c.gathered + size_t(mine.begin) * sh.K : apart.p;
          const uint64_t call = calls.next();
          c.inputs(call, r, a_shard, W);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ag.run(a_shard, c.gathered, c.B.p, c.C.p, sh.M, sh.N, sh.K, nullptr);
          ag.finish(nullptr);
          c.reference(call, W);
          const std::string what = (adaptive ? "adaptive " : "") + label(sh.M, sh.N, sh.K, bl, chunk, in_place);
          expect_all_ranks(path, c.check_c(), what + ": C");
          expect_all_ranks(path, c.check_gathered(), what + ": gathered A");
          const weave::tp::AdaptiveStats a = ag.adaptive_stats();
          EXPECT_EQ(a.launches, adaptive ? 1u : 0u) << what;
          EXPECT_LE(a.peak_comm_blocks, static_cast<unsigned long long>(sms)) << what;
        }
  path.shutdown();
}

TEST(NetTpGpu, AgGemmMatchesReference) { ag_matches_reference(false); }

// 200 calls back to back without a host wait: every call's inputs fresh, its outputs in poisoned
// buffers of their own, all checked after one finish(). Alternating shapes exercise both receive
// slots and a shape change between consecutive calls.
TEST(NetTpGpu, AgGemmBackToBack) {
  net::NetPath path(options());
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  net::NetTpOptions o;
  o.chunk_bytes = 32 << 10;
  net::NetAgGemm ag(path, o);
  AgBatch b(
      calls, W, r, kBackToBack, [](int k) { return k % 2 ? Shape{300, 128, 1024} : Shape{515, 264, 320}; },
      [](int) { return nullptr; });
  b.run(ag);
  ag.finish(nullptr);
  b.check(path, "back-to-back");
  path.shutdown();
}

// Rejections. A new shape is agreed first, so one rank's bad argument or a mismatch throws on
// every rank and nothing is launched; the path stays usable (a correct call follows). On a shape
// every rank agreed on before, the rank with the bad argument fails the path, and the peers'
// kernels, already waiting for its rows, end: their finish() throws, naming the reason (or a peer
// that had not launched yet reads the rejection and throws naming the rank).
TEST(NetTpGpu, AgGemmRejectsBadCallsOnEveryRank) {
  net::NetPath path(options());
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  net::NetAgGemm ag(path);
  const int M = 600, N = 264, K = 320;
  AgCase c(M, N, K, BLayout::NK);
  const auto mine = weave::tp::shard(M, W, r);
  Dev a(size_t(mine.size) * K);
  const auto expect_throw_everywhere = [&](const char* what, auto&& call, const std::string& part) {
    expect_error(what, r, call, part);
  };
  // K not a multiple of 8 on rank W - 1 only: the others learn it in the agreement.
  expect_throw_everywhere(
      "bad K on one rank",
      [&] { ag.run(a.p, c.gathered, c.B.p, c.C.p, M, N, r == W - 1 ? K - 4 : K, nullptr); },
      r == W - 1 ? "not a multiple of 8" : "rank");
  // A null C on rank 0 only.
  expect_throw_everywhere(
      "null C on one rank", [&] { ag.run(a.p, c.gathered, c.B.p, r == 0 ? nullptr : c.C.p, M, N, K, nullptr); },
      r == 0 ? "null pointer" : "rejected its arguments");
  // M differs between ranks.
  {
    Dev a2(size_t(weave::tp::shard(M + 8 * r, W, r).size) * K);
    AgCase c2(M + 8 * r, N, K, BLayout::NK);
    expect_throw_everywhere(
        "M differs", [&] { ag.run(a2.p, c2.gathered, c2.B.p, c2.C.p, M + 8 * r, N, K, nullptr); }, "called with");
  }
  // A short C buffer (one row short) on rank 0.
  {
    Dev shortC(size_t(M - 1) * N);
    expect_throw_everywhere(
        "short C", [&] { ag.run(a.p, c.gathered, c.B.p, r == 0 ? shortC.p : c.C.p, M, N, K, nullptr); },
        r == 0 ? "allocation ends" : "rejected its arguments");
  }
  // The path is still usable: a correct call.
  const uint64_t call = calls.next();
  c.inputs(call, r, a.p, W);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ag.run(a.p, c.gathered, c.B.p, c.C.p, M, N, K, nullptr);
  ag.finish(nullptr);
  c.reference(call, W);
  expect_all_ranks(path, c.check_c(), "after the rejections: C");
  // Now a bad pointer on an agreed shape: rank 0 throws and fails the path; every other rank's
  // kernel is released and its finish() throws with rank 0's reason.
  std::string msg;
  try {
    ag.run(a.p, c.gathered, c.B.p, r == 0 ? c.C.p + 1 : c.C.p, M, N, K, nullptr);
    ag.finish(nullptr);
  } catch (const weave::Error& e) {
    msg = e.what();
  }
  // A peer that launched learns rank 0's reason from the failed path; one that read rank 0's
  // rejecting post before it launched (which one depends on timing: at 3 nodes either happens)
  // rejects the call with the rejecting rank named, and launches nothing.
  const bool reason = msg.find("16-byte aligned") != std::string::npos;
  EXPECT_TRUE(reason || (r != 0 && msg.find("rank 0 rejected its arguments") != std::string::npos))
      << "rank " << r << ": " << msg;
}

// ---- GEMM + ReduceScatter ---------------------------------------------------------------------

// One checked GEMM + RS problem: this rank's A and B for seed `call`, its poisoned output rows,
// and the reference: the sum over every rank's regenerated A_q * B_q (float32), its rows of it.
struct RsCase {
  int M, N, K;
  BLayout bl;
  Dev A, B, own_out, ra, rb;
  DevF r, s;
  bf16* out;  // own_out, or out_rows x N elsewhere (a node communicator's heap for AR at G > 1)
  size_t out_n;
  RsCase(int m, int n, int k, BLayout b, int out_rows, bf16* elsewhere = nullptr)
      : M(m), N(n), K(k), bl(b), A(size_t(m) * k), B(size_t(n) * k), own_out(elsewhere ? 1 : size_t(out_rows) * n),
        ra(size_t(m) * k), rb(size_t(n) * k), r(size_t(m) * n), s(size_t(m) * n),
        out(elsewhere ? elsewhere : own_out.p), out_n(size_t(out_rows) * n) {}
  void inputs(uint64_t call, int rank) {
    gref::fill_uniform(A.p, A.n, input_seed(call, rank, kA));
    gref::fill_uniform(B.p, B.n, input_seed(call, rank, kB));
    check::poison(out, out_n);
  }
  void reference(uint64_t call, int nodes) {
    for (int q = 0; q < nodes; ++q) {
      gref::fill_uniform(ra.p, ra.n, input_seed(call, q, kA));
      gref::fill_uniform(rb.p, rb.n, input_seed(call, q, kB));
      gemm_ref().run(ra.p, rb.p, M, N, K, bl, r.p, s.p, q > 0);
    }
    check::sqrt_inplace(s.p, r.n);
  }
  check::Report check_out(int rank, int nodes) const {
    const auto mine = weave::tp::shard(M, nodes, rank);
    return check::compare({out, N}, {r.p + size_t(mine.begin) * N, N}, {s.p + size_t(mine.begin) * N, N}, mine.size,
                          N, check::partial_sum_bound(nodes));
  }
  // AR: all M rows.
  check::Report check_all(int world) const {
    return check::compare({out, N}, {r.p, N}, {s.p, N}, M, N, check::partial_sum_bound(world));
  }
};

// A 64-bit hash of a device bf16 array (host copy): every rank's all-reduce output must match.
uint64_t hash_of(const bf16* p, size_t n) {
  std::vector<uint16_t> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  uint64_t x = 1469598103934665603ull;
  for (uint16_t v : h) x = (x ^ v) * 1099511628211ull;
  return x;
}

// AR: every rank's output against the reference, and bit-identical on every rank.
void expect_ar(net::NetPath& path, const RsCase& c, const std::string& what) {
  expect_all_ranks(path, c.check_all(path.world()), what);
  const uint64_t mine = hash_of(c.out, c.out_n);
  std::vector<uint64_t> all(path.world());
  path.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  for (int q = 0; q < path.world(); ++q) EXPECT_EQ(all[q], mine) << what << ": rank " << q << "'s output differs";
}

// AR (all rows, bit-identical on every rank) or RS (this rank's rows), on every rank.
void expect_rs_or_ar(net::NetPath& path, const RsCase& c, bool ar, const std::string& what) {
  if (ar) expect_ar(path, c, what);
  else expect_all_ranks(path, c.check_out(path.rank(), path.world()), what);
}

// One RS or AR call on a fresh problem into a poisoned output (AR's at `ar_out` when given, e.g. a
// node's heap), checked on every rank. `run(c)` makes the call and its finish; `barrier` (when
// given) keeps a node peer from writing before every rank's poison is in place, and the next call
// from writing while a peer still checks.
template <class Run>
void rs_call(net::NetPath& path, Calls& calls, bool ar, int M, int N, int K, BLayout bl, const std::string& what,
             Run&& run, bf16* ar_out = nullptr, rt::Communicator* barrier = nullptr) {
  const int W = path.world(), r = path.rank();
  RsCase c(M, N, K, bl, ar ? M : weave::tp::shard(M, W, r).size, ar ? ar_out : nullptr);
  const uint64_t call = calls.next();
  c.inputs(call, r);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (barrier) barrier->barrier();
  run(c);
  c.reference(call, W);
  expect_rs_or_ar(path, c, ar, what);
  if (barrier) barrier->barrier();
}

// n RS / AR problems for calls without a host wait: call k's shape from `shape(k)`, AR where
// `is_ar(k)` (its output at `ar_out(k)`, nullptr: its own), fresh inputs and a poisoned output of
// its own each.
struct RsBatch {
  std::vector<std::unique_ptr<RsCase>> cases;
  std::vector<uint64_t> seeds;
  std::vector<bool> ar;
  template <class ShapeOf, class IsAr, class ArOut>
  RsBatch(Calls& calls, int W, int r, int n, ShapeOf&& shape, IsAr&& is_ar, ArOut&& ar_out) {
    for (int k = 0; k < n; ++k) {
      const Shape sh = shape(k);
      ar.push_back(is_ar(k));
      cases.push_back(std::make_unique<RsCase>(sh.M, sh.N, sh.K, BLayout::NK,
                                               ar.back() ? sh.M : weave::tp::shard(sh.M, W, r).size,
                                               ar.back() ? ar_out(k) : nullptr));
      seeds.push_back(calls.next());
      cases.back()->inputs(seeds.back(), r);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // Every call in order: the AR ones on `ar_op`, the others on *rs_of(k).
  template <class RsOf, class Ar>
  void run(RsOf&& rs_of, Ar& ar_op) {
    for (size_t k = 0; k < cases.size(); ++k) {
      RsCase& c = *cases[k];
      if (ar[k]) ar_op.run(c.A.p, c.B.p, c.out, c.M, c.N, c.K, nullptr);
      else rs_of(static_cast<int>(k))->run(c.A.p, c.B.p, c.out, c.M, c.N, c.K, nullptr);
    }
  }
  // After the finish: every call against its reference, on every rank; name(k) labels call k.
  template <class Name>
  void check(net::NetPath& path, Name&& name) {
    for (size_t k = 0; k < cases.size(); ++k) {
      cases[k]->reference(seeds[k], path.world());
      expect_rs_or_ar(path, *cases[k], ar[k], name(static_cast<int>(k)));
    }
  }
};

TEST(NetTpGpu, GemmRsMatchesReference) {
  net::NetPath path(options());
  ASSERT_EQ(path.topo().gpus, 1) << "run under weave-run -n N --nodes N";
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  const Shape shapes[] = {{3000, 1000, 1000}, {1000, 264, 512}, {257, 8, 64}, {2048, 2048, 2048}, {W + 1, 24, 136}};
  for (const Shape& sh : shapes)
    for (BLayout bl : {BLayout::NK, BLayout::KN})
      for (long long chunk : {1LL << 20, 48LL << 10, 1LL << 12}) {
        if (chunk == (1LL << 12) && sh.M * static_cast<long long>(sh.N) > 1000000) continue;  // flags per slot
        net::NetTpOptions o;
        o.b = bl, o.chunk_bytes = chunk;
        net::NetGemmRs rs(path, o);
        const std::string what = label("gemm_rs", sh.M, sh.N, sh.K, bl, chunk);
        rs_call(path, calls, false, sh.M, sh.N, sh.K, bl, what, [&](RsCase& c) {
          rs.run(c.A.p, c.B.p, c.out, c.M, c.N, c.K, nullptr);
          rs.finish(nullptr);
        });
      }
  path.shutdown();
}

// 200 calls back to back, alternating shapes, fresh inputs and a poisoned output buffer per call,
// one finish().
TEST(NetTpGpu, GemmRsBackToBack) {
  net::NetPath path(options());
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  net::NetTpOptions o;
  o.chunk_bytes = 32 << 10;
  net::NetGemmRs rs(path, o);
  RsBatch b(
      calls, W, r, kBackToBack, [](int k) { return k % 2 ? Shape{300, 1024, 128} : Shape{515, 264, 320}; },
      [](int) { return false; }, [](int) { return nullptr; });
  b.run([&](int) { return &rs; }, rs);
  rs.finish(nullptr);
  b.check(path, [](int k) { return "gemm_rs back-to-back call " + std::to_string(k); });
  path.shutdown();
}

// A short output on one rank throws on every rank (a new shape: the agreement), and a correct
// call follows on the same path.
TEST(NetTpGpu, GemmRsRejectsBadCallsOnEveryRank) {
  net::NetPath path(options());
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  net::NetGemmRs rs(path);
  const int M = 600, N = 264, K = 320;
  const int rows = weave::tp::shard(M, W, r).size;
  RsCase c(M, N, K, BLayout::NK, rows);
  Dev short_out(size_t(rows - 1) * N);
  std::string msg;
  try {
    rs.run(c.A.p, c.B.p, r == 0 ? short_out.p : c.out, M, N, K, nullptr);
  } catch (const weave::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(r == 0 ? "allocation ends" : "rejected its arguments"), std::string::npos) << msg;
  const uint64_t call = calls.next();
  c.inputs(call, r);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  rs.run(c.A.p, c.B.p, c.out, M, N, K, nullptr);
  rs.finish(nullptr);
  c.reference(call, W);
  expect_all_ranks(path, c.check_out(r, W), "gemm_rs after the rejection");
  path.shutdown();
}

// ---- GEMM + AllReduce -------------------------------------------------------------------------

TEST(NetTpGpu, GemmArMatchesReferenceOnEveryRank) {
  net::NetPath path(options());
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  const Shape shapes[] = {{3000, 1000, 1000}, {257, 8, 64}, {1024, 2048, 512}, {W + 1, 24, 136}};
  for (const Shape& sh : shapes)
    for (BLayout bl : {BLayout::NK, BLayout::KN})
      for (long long chunk : {1LL << 20, 48LL << 10}) {
        net::NetTpOptions o;
        o.b = bl, o.chunk_bytes = chunk;
        net::NetGemmAr ar(path, o);
        rs_call(path, calls, true, sh.M, sh.N, sh.K, bl, label("gemm_ar", sh.M, sh.N, sh.K, bl, chunk), [&](RsCase& c) {
          ar.run(c.A.p, c.B.p, c.out, c.M, c.N, c.K, nullptr);
          ar.finish(nullptr);
        });
      }
  // 200 calls back to back, RS and AR alternating on one path (both operators' areas and call
  // slots), each with fresh inputs and a poisoned output of its own.
  net::NetTpOptions o;
  o.chunk_bytes = 32 << 10;
  net::NetGemmAr ar(path, o);
  net::NetGemmRs rs(path, o);
  RsBatch b(
      calls, W, r, kBackToBack, [](int) { return Shape{515, 264, 320}; }, [](int k) { return k % 2 == 0; },
      [](int) { return nullptr; });
  b.run([&](int) { return &rs; }, ar);
  ar.finish(nullptr);
  b.check(path, [](int k) {
    return std::string(k % 2 ? "gemm_rs" : "gemm_ar") + " alternating call " + std::to_string(k);
  });
  path.shutdown();
}

// Ranks calling different operators with equal shapes: an error on every rank, nothing launched.
TEST(NetTpGpu, DifferentOperatorsRejectedOnEveryRank) {
  net::NetPath path(options());
  const int W = path.world(), r = path.rank();
  const int M = 600, N = 264, K = 320;
  RsCase c(M, N, K, BLayout::NK, M);
  net::NetGemmRs rs(path);
  net::NetGemmAr ar(path);
  std::string msg;
  try {
    if (r == 0) rs.run(c.A.p, c.B.p, c.out, M, N, K, nullptr);
    else ar.run(c.A.p, c.B.p, c.out, M, N, K, nullptr);
  } catch (const weave::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("called with (operator"), std::string::npos) << "rank " << r << " of " << W << ": " << msg;
  path.shutdown();
}

// ---- the adaptive SM split (NetTpOptions::adaptive, one rank per node) -------------------------

// One checked adaptive RS or AR call of a new object; returns its statistics.
weave::tp::AdaptiveStats adaptive_call(net::NetPath& path, Calls& calls, bool ar, int M, int N, int K, BLayout bl,
                                       long long chunk) {
  net::NetTpOptions o;
  o.b = bl, o.chunk_bytes = chunk, o.adaptive = true;
  const std::string what = label(ar ? "adaptive gemm_ar" : "adaptive gemm_rs", M, N, K, bl, chunk);
  const auto call = [&](auto& op) {
    rs_call(path, calls, ar, M, N, K, bl, what, [&](RsCase& c) {
      op.run(c.A.p, c.B.p, c.out, c.M, c.N, c.K, nullptr);
      op.finish(nullptr);
    });
    return op.adaptive_stats();
  };
  if (ar) {
    net::NetGemmAr op(path, o);
    return call(op);
  }
  net::NetGemmRs op(path, o);
  return call(op);
}

// Outputs against the reference on every rank (AR: bit-identical everywhere), ragged shapes, both
// layouts, two chunks; the ledger counted the launch, and no more blocks communicated while tiles
// were left than the grid minus one.
TEST(NetTpGpu, AdaptiveGemmRsArMatchReference) {
  net::NetPath path(options());
  ASSERT_EQ(path.topo().gpus, 1) << "run under weave-run -n N --nodes N";
  const int W = path.world();
  Calls calls(path);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const Shape shapes[] = {{3000, 1000, 1000}, {1000, 264, 512}, {257, 8, 64}, {2048, 2048, 2048}, {W + 1, 24, 136}};
  for (const Shape& sh : shapes)
    for (BLayout bl : {BLayout::NK, BLayout::KN})
      for (long long chunk : {1LL << 20, 48LL << 10})
        for (bool ar : {false, true}) {
          const weave::tp::AdaptiveStats a = adaptive_call(path, calls, ar, sh.M, sh.N, sh.K, bl, chunk);
          EXPECT_EQ(a.launches, 1u) << sh.M << "x" << sh.N << "x" << sh.K;
          EXPECT_LT(a.peak_comm_blocks, static_cast<unsigned long long>(sms));
        }
  path.shutdown();
}

// 200 calls back to back on one path: adaptive RS, adaptive AR and the fixed RS in turn (the
// adaptive ones share the send gate and the call slots with the fixed kernel's), fresh inputs and
// a poisoned output per call, each checked; each adaptive object's ledger counted its launches.
TEST(NetTpGpu, AdaptiveBackToBackBesideTheFixedSplit) {
  net::NetPath path(options());
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  net::NetTpOptions o;
  o.chunk_bytes = 32 << 10;
  net::NetGemmRs fixed(path, o);
  o.adaptive = true;
  net::NetGemmRs rs(path, o);
  net::NetGemmAr ar(path, o);
  RsBatch b(
      calls, W, r, kBackToBack, [](int k) { return k % 2 ? Shape{515, 264, 320} : Shape{300, 1024, 128}; },
      [](int k) { return k % 3 == 1; }, [](int) { return nullptr; });
  b.run([&](int k) { return k % 3 == 0 ? &rs : &fixed; }, ar);
  rs.finish(nullptr);
  b.check(path, [](int k) {
    return std::string(k % 3 == 0 ? "adaptive gemm_rs" : k % 3 == 1 ? "adaptive gemm_ar" : "gemm_rs") + " call " +
           std::to_string(k);
  });
  EXPECT_EQ(rs.adaptive_stats().launches, static_cast<unsigned long long>((kBackToBack + 2) / 3));
  EXPECT_EQ(ar.adaptive_stats().launches, static_cast<unsigned long long>((kBackToBack + 1) / 3));
  EXPECT_EQ(fixed.adaptive_stats().launches, 0u);
  path.shutdown();
}

// A failure during an adaptive call ends in a diagnostic, not a hang: rank 0's kernel waits for
// arrivals that never come, (a) because every other rank aborts its path (the abort releases the
// blocks polling for the arrivals), (b) because the other ranks stay healthy but do not call (the
// poll outlasts the path's 1 s timeout, recorded as the late chunk). `make(path, calls)` returns
// the call of an adaptive operator on its inputs (without finish) and its finish; the first call
// agrees the shape on every rank.
struct FailingCall {
  std::function<void()> run, finish;
};
template <class Make>
void expect_diagnostic_when_peers_fail(Make&& make) {
  for (bool abort : {true, false}) {
    net::NetPathOptions po = options();
    if (!abort) po.wait_timeout_s = 1;
    net::NetPath path(po);
    const int r = path.rank();
    Calls calls(path);
    const FailingCall op = make(path, calls);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    op.run();  // agrees on the shape
    op.finish();
    const auto t0 = std::chrono::steady_clock::now();
    std::string error;
    if (r == 0) {
      op.run();
      try {
        op.finish();
      } catch (const weave::Error& e) {
        error = e.what();
      }
      if (abort) EXPECT_NE(error.find("the test's peer gives up"), std::string::npos) << error;
      else EXPECT_TRUE(error.find("gave up after") != std::string::npos && error.find("chunk") != std::string::npos)
          << error;
    } else {
      if (abort) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        path.abort("the test's peer gives up");
      }
      error = net_coll_test::failure_learnt(path);
      EXPECT_FALSE(error.empty()) << "rank " << r << " never learnt of the failure";
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 20) << error;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the context is still usable
  }
}

TEST(NetTpGpu, AdaptiveCallEndsInADiagnosticWhenPeersFail) {
  expect_diagnostic_when_peers_fail([](net::NetPath& path, Calls& calls) {
    net::NetTpOptions o;
    o.adaptive = true;
    const int M = 1000, N = 264, K = 512, W = path.world(), r = path.rank();
    auto rs = std::make_shared<net::NetGemmRs>(path, o);
    auto c = std::make_shared<RsCase>(M, N, K, BLayout::NK, weave::tp::shard(M, W, r).size);
    c->inputs(calls.next(), r);
    return FailingCall{[=] { rs->run(c->A.p, c->B.p, c->out, M, N, K, nullptr); }, [=] { rs->finish(nullptr); }};
  });
}

// The adaptive AG + GEMM: rank 0's tiles of the peers' rows and its receives wait for sends that
// never come; its polls give up on the abort or past the timeout.
TEST(NetTpGpu, AdaptiveAgGemmEndsInADiagnosticWhenPeersFail) {
  expect_diagnostic_when_peers_fail([](net::NetPath& path, Calls& calls) {
    net::NetTpOptions o;
    o.adaptive = true;
    const int M = 1000, N = 264, K = 512, W = path.world(), r = path.rank();
    auto ag = std::make_shared<net::NetAgGemm>(path, o);
    auto c = std::make_shared<AgCase>(M, N, K, BLayout::NK);
    auto a = std::make_shared<Dev>(size_t(weave::tp::shard(M, W, r).size) * K);
    c->inputs(calls.next(), r, a->p, W);
    return FailingCall{[=] { ag->run(a->p, c->gathered, c->B.p, c->C.p, M, N, K, nullptr); },
                       [=] { ag->finish(nullptr); }};
  });
}

// The adaptive AG + GEMM against the same reference as the fixed kernel's test, on the same cases.
TEST(NetTpGpu, AdaptiveAgGemmMatchesReference) { ag_matches_reference(true); }

// 200 calls back to back on one path, the adaptive and the fixed AG + GEMM in turn (they share the
// send gate and the call slots), alternating shapes, fresh inputs and poisoned outputs of their
// own, each checked after one finish(); the adaptive object's ledger counted its launches.
TEST(NetTpGpu, AdaptiveAgGemmBackToBackBesideTheFixedSplit) {
  net::NetPath path(options());
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  net::NetTpOptions o;
  o.chunk_bytes = 32 << 10;
  net::NetAgGemm fixed(path, o);
  o.adaptive = true;
  net::NetAgGemm adaptive(path, o);
  AgBatch b(
      calls, W, r, kBackToBack, [](int k) { return k % 4 < 2 ? Shape{300, 128, 1024} : Shape{515, 264, 320}; },
      [](int) { return nullptr; });
  for (size_t k = 0; k < b.cases.size(); ++k) {
    AgCase& c = *b.cases[k];
    (k % 2 ? fixed : adaptive).run(b.shards[k]->p, c.gathered, c.B.p, c.C.p, c.M, c.N, c.K, nullptr);
  }
  adaptive.finish(nullptr);
  b.check(path, "adaptive / fixed ag_gemm back-to-back");
  EXPECT_EQ(adaptive.adaptive_stats().launches, static_cast<unsigned long long>(kBackToBack / 2));
  EXPECT_EQ(fixed.adaptive_stats().launches, 0u);
  path.shutdown();
}

// ---- hierarchical AllGather + GEMM (nodes of G > 1 ranks: weave-run -n 4 --nodes 2) -------------

rt::Communicator node_comm(net::NetPath& path) {
  rt::CommOptions o;
  o.heap_bytes = size_t(512) << 20;
  return rt::Communicator(rt::node_launch_info(rt::detect_launch(), path.bootstrap().hostnames()[path.rank()]), o);
}

// Every rank's output against the reference, the gathered A bit for bit (in the node's heap: the
// node peers and this rank's receive blocks write it), ragged shapes, both layouts, two chunks,
// a_shard apart and in place; then back-to-back calls of two shapes, each checked.
TEST(NetTpGpuHier, AgGemmMatchesReference) {
  net::NetPath path(options());
  ASSERT_GT(path.topo().gpus, 1) << "run under weave-run -n 4 --nodes 2 (nodes of more than one rank)";
  rt::Communicator node = node_comm(path);
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  const Shape shapes[] = {{3000, 1000, 1000}, {1000, 264, 512}, {W + 1, 24, 136}, {2048, 2048, 1024}};
  size_t most = 0;
  for (const Shape& sh : shapes) most = std::max(most, size_t(sh.M) * sh.K);
  bf16* g = static_cast<bf16*>(node.alloc(most * sizeof(bf16)));
  for (const Shape& sh : shapes)
    for (BLayout bl : {BLayout::NK, BLayout::KN})
      for (long long chunk : {1LL << 20, 48LL << 10})
        for (bool in_place : {false, true}) {
          net::NetTpOptions o;
          o.b = bl, o.chunk_bytes = chunk;
          net::NetAgGemm ag(path, node, o);
          AgCase c(sh.M, sh.N, sh.K, bl, g);
          const auto mine = weave::tp::shard(sh.M, W, r);
          Dev apart(size_t(mine.size) * sh.K);
          bf16* a_shard = in_place ? g + size_t(mine.begin) * sh.K : apart.p;
          const uint64_t call = calls.next();
          c.inputs(call, r, a_shard, W);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          ag.run(a_shard, g, c.B.p, c.C.p, sh.M, sh.N, sh.K, nullptr);
          ag.finish(nullptr);
          c.reference(call, W);
          const std::string what = "hier " + label(sh.M, sh.N, sh.K, bl, chunk, in_place);
          expect_all_ranks(path, c.check_c(), what + ": C");
          expect_all_ranks(path, c.check_gathered(), what + ": gathered A");
          node.barrier();  // nobody's next call writes g while a peer still checks it
        }
  node.free(g);
  // 200 calls back to back: every call's gathered A and C of its own, poisoned, one finish.
  net::NetTpOptions o;
  o.chunk_bytes = 32 << 10;
  net::NetAgGemm ag(path, node, o);
  const auto shape = [](int k) { return k % 2 ? Shape{300, 128, 1024} : Shape{515, 264, 320}; };
  std::vector<bf16*> gs;
  AgBatch b(calls, W, r, kBackToBack, shape, [&](int k) {
    gs.push_back(static_cast<bf16*>(node.alloc(size_t(shape(k).M) * shape(k).K * sizeof(bf16))));
    return gs.back();
  });
  node.barrier();  // every rank's poison is in place before any peer writes
  b.run(ag);
  ag.finish(nullptr);
  b.check(path, "hier back-to-back");
  node.barrier();
  for (bf16* p : gs) node.free(p);
  path.shutdown();
}

// a_gathered outside the node's heap on one rank: an error on every rank (a new shape: the
// agreement), then a correct call.
TEST(NetTpGpuHier, AgGemmRejectsAGatheredOutsideTheHeap) {
  net::NetPath path(options());
  ASSERT_GT(path.topo().gpus, 1);
  rt::Communicator node = node_comm(path);
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  net::NetAgGemm ag(path, node);
  const int M = 600, N = 264, K = 320;
  bf16* g = static_cast<bf16*>(node.alloc(size_t(M) * K * sizeof(bf16)));
  AgCase c(M, N, K, BLayout::NK, g);
  Dev a(size_t(weave::tp::shard(M, W, r).size) * K), plain(size_t(M) * K);
  std::string msg;
  try {
    ag.run(a.p, r == 1 ? plain.p : g, c.B.p, c.C.p, M, N, K, nullptr);
  } catch (const weave::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(r == 1 ? "heap" : "rejected its arguments"), std::string::npos) << "rank " << r << ": " << msg;
  const uint64_t call = calls.next();
  c.inputs(call, r, a.p, W);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  node.barrier();
  ag.run(a.p, g, c.B.p, c.C.p, M, N, K, nullptr);
  ag.finish(nullptr);
  c.reference(call, W);
  expect_all_ranks(path, c.check_c(), "hier after the rejection: C");
  node.barrier();
  node.free(g);
  path.shutdown();
}

// ---- hierarchical GEMM + ReduceScatter and GEMM + AllReduce (weave-run -n 4 --nodes 2) ----------

// One call of the hierarchical RS or AR on fresh inputs into a poisoned output (AR: in the node's
// heap), checked on every rank against the float32 reference of the whole sum: RS this rank's rows,
// AR all rows and bit-identical on every rank. partial_sum_bound(W) covers the W bf16 partials and
// the remote nodes' partials rounded once more to cross the network (N - 1 more terms of the same
// size, inside its 4 W).
void hier_rs_call(net::NetPath& path, rt::Communicator& node, Calls& calls, bool ar, int M, int N, int K, BLayout bl,
                  long long chunk, bf16* heap_out) {
  net::NetTpOptions o;
  o.b = bl, o.chunk_bytes = chunk;
  const auto call = [&](auto& op) {
    rs_call(
        path, calls, ar, M, N, K, bl, label(ar ? "hier gemm_ar" : "hier gemm_rs", M, N, K, bl, chunk),
        [&](RsCase& c) {
          op.run(c.A.p, c.B.p, c.out, c.M, c.N, c.K, nullptr);
          op.finish(nullptr);
        },
        heap_out, &node);
  };
  if (ar) {
    net::NetGemmAr op(path, node, o);
    call(op);
  } else {
    net::NetGemmRs op(path, node, o);
    call(op);
  }
}

// Ragged shapes (M not a multiple of 128 nor of W; N off the 256 grid; one row per rank but one),
// both B layouts, two chunks, RS and AR.
TEST(NetTpGpuHier, GemmRsArMatchReference) {
  net::NetPath path(options());
  ASSERT_GT(path.topo().gpus, 1) << "run under weave-run -n 4 --nodes 2 (nodes of more than one rank)";
  rt::Communicator node = node_comm(path);
  const int W = path.world();
  Calls calls(path);
  const Shape shapes[] = {{1001, 1000, 520}, {3000, 264, 1000}, {W + 1, 24, 136}, {517, 2048, 256}};
  size_t most = 0;
  for (const Shape& sh : shapes) most = std::max(most, size_t(sh.M) * sh.N);
  bf16* heap_out = static_cast<bf16*>(node.alloc(most * sizeof(bf16)));
  for (bool ar : {false, true})
    for (const Shape& sh : shapes)
      for (BLayout bl : {BLayout::NK, BLayout::KN})
        for (long long chunk : {1LL << 20, 48LL << 10})
          hier_rs_call(path, node, calls, ar, sh.M, sh.N, sh.K, bl, chunk, heap_out);
  node.free(heap_out);
  path.shutdown();
}

// 200 calls back to back without a host wait, shapes alternating every call and RS / AR every two
// (one object each on one path), every call's inputs fresh and its output its own, poisoned (AR's
// in the node's heap), all checked after the finish.
TEST(NetTpGpuHier, GemmRsArBackToBack) {
  net::NetPath path(options());
  ASSERT_GT(path.topo().gpus, 1);
  rt::Communicator node = node_comm(path);
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  net::NetTpOptions o;
  o.chunk_bytes = 32 << 10;
  net::NetGemmRs rs(path, node, o);
  net::NetGemmAr ar(path, node, o);
  const auto shape = [](int k) { return k % 2 ? Shape{300, 1024, 128} : Shape{515, 264, 320}; };
  const auto is_ar = [](int k) { return (k / 2) % 2 == 1; };
  std::vector<bf16*> outs;
  RsBatch b(calls, W, r, kBackToBack, shape, is_ar, [&](int k) {
    outs.push_back(static_cast<bf16*>(node.alloc(size_t(shape(k).M) * shape(k).N * sizeof(bf16))));
    return outs.back();
  });
  node.barrier();  // every rank's poison is in place before a node peer writes
  b.run([&](int) { return &rs; }, ar);
  rs.finish(nullptr);
  ar.finish(nullptr);
  b.check(path, [&](int k) {
    return std::string(is_ar(k) ? "hier gemm_ar" : "hier gemm_rs") + " back-to-back call " + std::to_string(k);
  });
  node.barrier();
  for (bf16* p : outs) node.free(p);
  path.shutdown();
}

// AR's output outside the node's heap on one rank, and RS with M differing between ranks: an error
// on every rank (new shapes: the agreement), then correct calls of both on the same objects.
TEST(NetTpGpuHier, GemmRsArRejectBadCallsOnEveryRank) {
  net::NetPath path(options());
  ASSERT_GT(path.topo().gpus, 1);
  rt::Communicator node = node_comm(path);
  const int W = path.world(), r = path.rank();
  Calls calls(path);
  {
    net::NetTpOptions o;
    o.adaptive = true;
    expect_error("adaptive at G > 1", r, [&] { net::NetGemmRs bad(path, node, o); }, "one rank per node");
    expect_error("adaptive ag_gemm at G > 1", r, [&] { net::NetAgGemm bad(path, node, o); }, "one rank per node");
  }
  net::NetGemmRs rs(path, node);
  net::NetGemmAr ar(path, node);
  const int M = 600, N = 264, K = 320;
  bf16* heap_out = static_cast<bf16*>(node.alloc(size_t(M) * N * sizeof(bf16)));
  RsCase c(M, N, K, BLayout::NK, M, heap_out);
  Dev plain(size_t(M) * N);
  expect_error("AR out outside the heap on rank 1", r,
               [&] { ar.run(c.A.p, c.B.p, r == 1 ? plain.p : c.out, M, N, K, nullptr); },
               r == 1 ? "heap" : "rejected its arguments");
  {
    const int Mr = M + 8 * r;
    RsCase c2(Mr, N, K, BLayout::NK, weave::tp::shard(Mr, W, r).size);
    expect_error("RS with M differing", r, [&] { rs.run(c2.A.p, c2.B.p, c2.out, Mr, N, K, nullptr); }, "called with");
  }
  uint64_t call = calls.next();
  c.inputs(call, r);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  node.barrier();
  ar.run(c.A.p, c.B.p, c.out, M, N, K, nullptr);
  ar.finish(nullptr);
  c.reference(call, W);
  expect_ar(path, c, "hier gemm_ar after the rejections");
  RsCase c3(M, N, K, BLayout::NK, weave::tp::shard(M, W, r).size);
  call = calls.next();
  c3.inputs(call, r);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  rs.run(c3.A.p, c3.B.p, c3.out, M, N, K, nullptr);
  rs.finish(nullptr);
  c3.reference(call, W);
  expect_all_ranks(path, c3.check_out(r, W), "hier gemm_rs after the rejections");
  node.barrier();
  node.free(heap_out);
  path.shutdown();
}

}  // namespace
