// Ring attention across simulated nodes of one rank each (weave-run -n N --nodes N; on one GPU
// with --share-gpus: correctness only): every rank regenerates the whole sequence's Q, K and V
// from the job seed and checks its own rows' O and LSE against the float32 attention reference
// (check/attention_ref.hpp, which shares no code with weave's kernels); outputs poisoned; ragged
// chunks (own rows copied in) and chunks on key blocks (read in place), causal or not, zigzag and
// contiguous, GQA, D 64 and 128; 200 back-to-back calls of alternating shapes, each checked; a shape
// mismatch throws on every rank.
// The hierarchical form (NetRingGpuHier.*: weave-run -n 4 --nodes 2, nodes of 2 ranks; the gathered
// K and V in the node communicator's heap): the same checks on every rank, plus every other rank's
// rows in its gathered K and V bit for bit; 200 back-to-back calls; a gathered buffer outside the heap
// on one rank rejected on every rank, then a correct call.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "check/attention_ref.hpp"
#include "check/device_buffer.hpp"
#include "check/seed.hpp"
#include "net_coll_check.hpp"
#include "net_ring_attention/net_ring_attention.hpp"
#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"

namespace net = weave::net;
namespace sp = weave::sp;
namespace check = weave::check;
using bf16 = __nv_bfloat16;
using Bytes = check::DeviceBuffer<char>;

namespace {

using net_coll_test::job_seed;
using net_coll_test::options;

check::AttentionRef& aref() {
  static check::AttentionRef r;
  return r;
}

struct Case {
  int B, S, Hq, Hkv, D;
};

// The whole sequence's Q, K, V (identical on every rank) and this rank's rows of them.
struct Inputs {
  Case c;
  std::vector<std::pair<long long, long long>> ranges;  // (global begin, rows) per own chunk
  long long L = 0;
  std::unique_ptr<Bytes> fq, fk, fv, q, k, v;
  Inputs(const Case& cc, sp::Sharding sh, int W, int r, uint64_t seed) : c(cc) {
    for (int i = 0; i < sp::chunks_per_rank(sh); ++i) {
      const auto ch = sp::chunk_range(c.S, W, sh, r, i);
      ranges.push_back({ch.begin, ch.rows});
      L += ch.rows;
    }
    const float sd = static_cast<float>(check::qk_std(c.D, 0.f));
    fq = full(c.Hq), fk = full(c.Hkv), fv = full(c.Hkv);
    check::fill_normal(as(fq), c.B, c.S, c.Hq * c.D, check::derive(seed, 1), sd);
    check::fill_normal(as(fk), c.B, c.S, c.Hkv * c.D, check::derive(seed, 2), sd);
    check::fill_normal(as(fv), c.B, c.S, c.Hkv * c.D, check::derive(seed, 3), 1.f);
    q = rows(*fq, c.Hq), k = rows(*fk, c.Hkv), v = rows(*fv, c.Hkv);
  }
  static bf16* as(const std::unique_ptr<Bytes>& b) { return reinterpret_cast<bf16*>(b->p); }
  std::unique_ptr<Bytes> full(int H) const { return std::make_unique<Bytes>(size_t(c.B) * c.S * H * c.D * 2); }
  std::unique_ptr<Bytes> rows(const Bytes& t, int H) const {
    const size_t row = size_t(H) * c.D * 2;
    auto out = std::make_unique<Bytes>(size_t(c.B) * L * row);
    for (int b = 0; b < c.B; ++b) {
      long long off = 0;
      for (auto& rg : ranges) {
        EXPECT_EQ(cudaMemcpy(out->p + (size_t(b) * L + off) * row, t.p + (size_t(b) * c.S + rg.first) * row,
                             rg.second * row, cudaMemcpyDeviceToDevice),
                  cudaSuccess);
        off += rg.second;
      }
    }
    return out;
  }
  check::AttnReport check_out(const bf16* o, const float* lse, bool causal) const {
    check::AttnProblem p;
    p.B = c.B, p.Hq = c.Hq, p.Hkv = c.Hkv, p.D = c.D, p.Skv = c.S, p.Lq = c.S, p.Lo = L, p.causal = causal;
    std::vector<check::RowRange> rr;
    long long off = 0;
    for (auto& rg : ranges) {
      rr.push_back({rg.first, off, rg.first, rg.second});
      off += rg.second;
    }
    return aref().check(p, as(fq), as(fk), as(fv), rr, o, lse);
  }
  // Rows of the other ranks in gathered K and V ((B, S, Hkv, D) each) that differ from the whole
  // sequence's, bit for bit (this rank's own rows may be read in place and never written there).
  long long gathered_mismatches(const bf16* gk, const bf16* gv) const {
    const size_t row = size_t(c.Hkv) * c.D * 2, n = size_t(c.B) * c.S * row;
    long long bad = 0;
    for (const auto& [mine, full] : {std::pair{gk, fk.get()}, std::pair{gv, fv.get()}}) {
      std::vector<char> got(n), want(n);
      EXPECT_EQ(cudaMemcpy(got.data(), mine, n, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(want.data(), full->p, n, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int b = 0; b < c.B; ++b)
        for (long long i = 0; i < c.S; ++i) {
          const bool own = std::any_of(ranges.begin(), ranges.end(),
                                       [&](const auto& rg) { return i >= rg.first && i < rg.first + rg.second; });
          const size_t off = (size_t(b) * c.S + i) * row;
          bad += !own && std::memcmp(got.data() + off, want.data() + off, row) != 0;
        }
    }
    return bad;
  }
};

void expect_all_ranks(net::NetPath& path, const check::AttnReport& rep, const std::string& what) {
  const int mine = rep.ok() && rep.has_lse ? 1 : 0;
  std::vector<int> all(path.world());
  path.bootstrap().all_gather(&mine, all.data(), sizeof mine);
  std::string bad;
  for (int q = 0; q < path.world(); ++q)
    if (!all[q]) bad += " " + std::to_string(q);
  std::printf("[rank %d] %s: O worst %.3f, LSE worst %.3f%s\n", path.rank(), what.c_str(), rep.o.worst, rep.lse.worst,
              rep.ok() ? "" : "  WRONG");
  EXPECT_TRUE(rep.ok()) << what << " on rank " << path.rank() << ": " << rep.str();
  EXPECT_TRUE(bad.empty()) << what << ": wrong on rank(s)" << bad;
}

std::string label(const Case& c, bool causal, sp::Sharding sh) {
  return "net ring S=" + std::to_string(c.S) + " B=" + std::to_string(c.B) + " D=" + std::to_string(c.D) +
         " Hq/Hkv=" + std::to_string(c.Hq) + "/" + std::to_string(c.Hkv) + " causal=" + std::to_string(causal) +
         " zigzag=" + std::to_string(static_cast<int>(sh));
}

TEST(NetRingGpu, MatchesReference) {
  net::NetPath path(options());
  ASSERT_EQ(path.topo().gpus, 1) << "run under weave-run -n N --nodes N";
  const int W = path.world(), r = path.rank();
  const uint64_t seed = job_seed(path);
  net::NetRingAttention ra(path);
  const Case cases[] = {{1, 1000, 4, 2, 128}, {2, 3001, 4, 4, 64}, {1, 777, 8, 1, 128}, {1, 512 * W, 4, 2, 128},
                        {2, 256 * W, 4, 4, 64}};
  int i = 0;
  for (const Case& c : cases)
    for (bool causal : {false, true})
      for (auto sh : {sp::Sharding::Zigzag, sp::Sharding::Contiguous}) {
        const Inputs in(c, sh, W, r, check::derive(seed, i++));
        const size_t on = size_t(c.B) * in.L * c.Hq * c.D, nl = size_t(c.B) * c.Hq * in.L;
        check::DeviceBuffer<bf16> o(on);
        check::DeviceBuffer<float> lse(nl);
        check::poison(o.p, on);
        check::poison(lse.p, nl);
        sp::RingOptions opt;
        opt.causal = causal, opt.sharding = sh;
        ra.forward(Inputs::as(in.q), Inputs::as(in.k), Inputs::as(in.v), o.p, lse.p, {c.B, c.S, c.Hq, c.Hkv, c.D}, opt,
                   nullptr);
        ra.finish(nullptr);
        expect_all_ranks(path, in.check_out(o.p, lse.p, causal), label(c, causal, sh));
      }
  path.shutdown();
}

// 200 calls back to back without a host wait, alternating two shapes (both receive slots, a layout
// change between consecutive calls) and the mask every two, every call's output in its own poisoned
// buffer, all checked after finish().
TEST(NetRingGpu, BackToBackAlternatingShapes) {
  net::NetPath path(options());
  const int W = path.world(), r = path.rank();
  const uint64_t seed = job_seed(path);
  net::NetRingAttention ra(path);
  const Case cases[2] = {{1, 1000, 4, 2, 128}, {2, 640, 4, 4, 64}};
  const Inputs in0(cases[0], sp::Sharding::Zigzag, W, r, check::derive(seed, 100));
  const Inputs in1(cases[1], sp::Sharding::Zigzag, W, r, check::derive(seed, 101));
  const Inputs* in[2] = {&in0, &in1};
  constexpr int kCalls = 200;
  std::vector<std::unique_ptr<check::DeviceBuffer<bf16>>> os;
  std::vector<std::unique_ptr<check::DeviceBuffer<float>>> ls;
  for (int k = 0; k < kCalls; ++k) {
    const Case& c = cases[k % 2];
    const long long L = in[k % 2]->L;
    os.push_back(std::make_unique<check::DeviceBuffer<bf16>>(size_t(c.B) * L * c.Hq * c.D));
    ls.push_back(std::make_unique<check::DeviceBuffer<float>>(size_t(c.B) * c.Hq * L));
    check::poison(os.back()->p, os.back()->n);
    check::poison(ls.back()->p, ls.back()->n);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int k = 0; k < kCalls; ++k) {
    const Case& c = cases[k % 2];
    sp::RingOptions opt;
    opt.causal = k % 4 < 2;
    ra.forward(Inputs::as(in[k % 2]->q), Inputs::as(in[k % 2]->k), Inputs::as(in[k % 2]->v), os[k]->p, ls[k]->p,
               {c.B, c.S, c.Hq, c.Hkv, c.D}, opt, nullptr);
  }
  ra.finish(nullptr);
  for (int k = 0; k < kCalls; ++k)
    expect_all_ranks(path, in[k % 2]->check_out(os[k]->p, ls[k]->p, k % 4 < 2),
                     "back-to-back call " + std::to_string(k) + " " + label(cases[k % 2], k % 4 < 2, sp::Sharding::Zigzag));
  path.shutdown();
}

// The causal flag differs between ranks: an error on every rank before anything is queued, then a correct call.
TEST(NetRingGpu, MismatchRejectedOnEveryRank) {
  net::NetPath path(options());
  const int W = path.world(), r = path.rank();
  const uint64_t seed = job_seed(path);
  net::NetRingAttention ra(path);
  const Case c{1, 1000, 4, 2, 128};
  const Inputs in(c, sp::Sharding::Zigzag, W, r, check::derive(seed, 7));
  check::DeviceBuffer<bf16> o(size_t(in.L) * c.Hq * c.D);
  check::DeviceBuffer<float> lse(size_t(c.Hq) * in.L);
  std::string msg;
  try {
    sp::RingOptions opt;
    opt.causal = r == 0;
    ra.forward(Inputs::as(in.q), Inputs::as(in.k), Inputs::as(in.v), o.p, nullptr, {c.B, c.S, c.Hq, c.Hkv, c.D}, opt,
               nullptr);
  } catch (const weave::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("called with (operator"), std::string::npos) << "rank " << r << ": " << msg;
  check::poison(o.p, o.n);
  ra.forward(Inputs::as(in.q), Inputs::as(in.k), Inputs::as(in.v), o.p, lse.p, {c.B, c.S, c.Hq, c.Hkv, c.D}, {}, nullptr);
  ra.finish(nullptr);
  expect_all_ranks(path, in.check_out(o.p, lse.p, false), "after the mismatch");
  path.shutdown();
}

// ---- the hierarchical form (nodes of G > 1 ranks: weave-run -n 4 --nodes 2) ---------------------

namespace rt = weave::runtime;

rt::Communicator node_comm(net::NetPath& path) {
  rt::CommOptions o;
  o.heap_bytes = size_t(512) << 20;
  return rt::Communicator(rt::node_launch_info(rt::detect_launch(), path.bootstrap().hostnames()[path.rank()]), o);
}

// A test's job at G > 1: the path, this node's communicator, the job's seed, the operator.
struct HierJob {
  net::NetPath path{options()};
  rt::Communicator node = node_comm(path);
  const int W = path.world(), r = path.rank();
  const uint64_t seed = job_seed(path);
  net::NetRingAttention ra{path, node};
};

// One call's outputs (poisoned) and gathered K and V (in the node's heap, poisoned: node peers
// write into them only after this rank entered the call, which stream-orders after the poison).
struct HierCall {
  rt::Communicator& node;
  const Inputs& in;
  bool causal;
  sp::Sharding sh;
  check::DeviceBuffer<bf16> o;
  check::DeviceBuffer<float> lse;
  bf16 *gk, *gv;
  HierCall(rt::Communicator& n, const Inputs& i, bool ca, sp::Sharding s)
      : node(n), in(i), causal(ca), sh(s), o(size_t(i.c.B) * i.L * i.c.Hq * i.c.D), lse(size_t(i.c.B) * i.c.Hq * i.L) {
    const size_t kv = size_t(in.c.B) * in.c.S * in.c.Hkv * in.c.D;
    gk = static_cast<bf16*>(node.alloc(kv * sizeof(bf16)));
    gv = static_cast<bf16*>(node.alloc(kv * sizeof(bf16)));
    check::poison(o.p, o.n);
    check::poison(lse.p, lse.n);
    check::poison(gk, kv);
    check::poison(gv, kv);
  }
  ~HierCall() {
    node.free(gk);
    node.free(gv);
  }
  void run(net::NetRingAttention& ra) {
    sp::RingOptions opt;
    opt.causal = causal, opt.sharding = sh;
    const Case& c = in.c;
    ra.forward(Inputs::as(in.q), Inputs::as(in.k), Inputs::as(in.v), o.p, lse.p, gk, gv, {c.B, c.S, c.Hq, c.Hkv, c.D},
               opt, nullptr);
  }
  void check(net::NetPath& path, const std::string& what) const {
    expect_all_ranks(path, in.check_out(o.p, lse.p, causal), what);
    const long long bad = in.gathered_mismatches(gk, gv);
    EXPECT_EQ(bad, 0) << what << ": rows of the gathered K/V wrong on rank " << path.rank();
  }
};

// Every rank's O and LSE against the reference, and its gathered K/V bit for bit: ragged chunks
// (S per rank not a multiple of the 128-row tile), chunks on key blocks (own rows read in place),
// GQA, D 64 and 128, B 1 and 2, causal or not, both shardings.
TEST(NetRingGpuHier, MatchesReference) {
  HierJob j;
  ASSERT_GT(j.path.topo().gpus, 1) << "run under weave-run -n 4 --nodes 2 (nodes of more than one rank)";
  const int W = j.W;
  const Case cases[] = {{1, 1000, 4, 2, 128}, {2, 3001, 4, 4, 64}, {1, 777, 8, 1, 128}, {1, 512 * W, 4, 2, 128}};
  int i = 0;
  for (const Case& c : cases)
    for (bool causal : {false, true})
      for (auto sh : {sp::Sharding::Zigzag, sp::Sharding::Contiguous}) {
        const Inputs in(c, sh, W, j.r, check::derive(j.seed, i++));
        HierCall call(j.node, in, causal, sh);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        call.run(j.ra);
        j.ra.finish(nullptr);
        call.check(j.path, "hier " + label(c, causal, sh));
        j.node.barrier();  // nobody frees a gathered buffer a node peer's call still writes
      }
  j.path.shutdown();
}

// 200 calls back to back without a host wait, alternating two shapes (one ragged, one with GQA)
// and the mask every two, each with fresh inputs, poisoned outputs and gathered buffers of its own,
// all checked after one finish().
TEST(NetRingGpuHier, BackToBackAlternatingShapes) {
  HierJob j;
  ASSERT_GT(j.path.topo().gpus, 1);
  const Case cases[2] = {{1, 1000, 4, 2, 128}, {2, 700, 8, 2, 64}};
  constexpr int kCalls = 200;
  std::vector<std::unique_ptr<Inputs>> ins;
  std::vector<std::unique_ptr<HierCall>> calls;
  for (int k = 0; k < kCalls; ++k) {
    const auto sh = k % 3 == 2 ? sp::Sharding::Contiguous : sp::Sharding::Zigzag;
    ins.push_back(std::make_unique<Inputs>(cases[k % 2], sh, j.W, j.r, check::derive(j.seed, 200 + k)));
    calls.push_back(std::make_unique<HierCall>(j.node, *ins.back(), k % 4 < 2, sh));
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (auto& c : calls) c->run(j.ra);
  j.ra.finish(nullptr);
  for (int k = 0; k < kCalls; ++k)
    calls[k]->check(j.path, "hier back-to-back call " + std::to_string(k) + " " +
                                label(cases[k % 2], calls[k]->causal, calls[k]->sh));
  j.node.barrier();
  calls.clear();
  j.path.shutdown();
}

// A gathered K outside the node's heap on one rank (a new shape: the agreement): an error on every
// rank before anything is queued, then a correct call.
TEST(NetRingGpuHier, GatheredOutsideTheHeapRejectedOnEveryRank) {
  HierJob j;
  ASSERT_GT(j.path.topo().gpus, 1);
  const int r = j.r;
  const Case c{1, 1000, 4, 2, 128};
  const Inputs in(c, sp::Sharding::Zigzag, j.W, r, check::derive(j.seed, 300));
  HierCall call(j.node, in, true, sp::Sharding::Zigzag);
  check::DeviceBuffer<bf16> plain(size_t(c.B) * c.S * c.Hkv * c.D);
  std::string msg;
  try {
    sp::RingOptions opt;
    opt.causal = true;
    j.ra.forward(Inputs::as(in.q), Inputs::as(in.k), Inputs::as(in.v), call.o.p, call.lse.p,
                 r == 1 ? plain.p : call.gk, call.gv, {c.B, c.S, c.Hq, c.Hkv, c.D}, opt, nullptr);
  } catch (const weave::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(r == 1 ? "heap" : "rejected its arguments"), std::string::npos) << "rank " << r << ": " << msg;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  j.node.barrier();
  call.run(j.ra);
  j.ra.finish(nullptr);
  call.check(j.path, "hier after the rejection");
  j.node.barrier();
  j.path.shutdown();
}

}  // namespace
