// weave::coll::Collectives captured in CUDA graphs (2+ ranks, weave-run): every algorithm's calls
// captured once, the graph replayed many times with new inputs written before each replay and the
// outputs poisoned, eager calls of the same object in between, a captured graph that is never
// replayed, and the LL scratch restart reached within a test by a short flag period. Integer
// inputs, so every result is exact; every output checked on the device against the recomputed
// reference (check/ref: the inputs are a function of seed, rank and index).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"

using namespace ct;

namespace {


// One call of the graph: its buffers, how to fill its input for a seed, the call, and its check.
struct Op {
  std::string name;
  std::function<void(uint64_t seed)> fill;   // eager, before a replay
  std::function<void()> poison;              // eager, before a replay
  std::function<void()> call;                // captured
  std::function<void(uint64_t seed, int id)> check;
};

// Every algorithm and kind, each on its own buffers (2 * W-row shapes that do not divide).
struct Calls {
  std::vector<std::unique_ptr<Buf>> bufs;
  std::vector<Op> ops;
  DType t;

  explicit Calls(DType type) : t(type) {
    Ctx& x = ctx();
    auto& c = x.coll;
    const int W = comm().world(), me = comm().rank();
    auto buf = [&](long long n) -> Buf& {
      bufs.push_back(std::make_unique<Buf>(std::max<long long>(n, 1), t));
      return *bufs.back();
    };
    auto poison = [this, &x](Buf& b) { return [&b, &x] { WEAVE_CUDA_CHECK(cudaMemsetAsync(b.p, 0xff, b.bytes, x.s)); }; };
    // all_reduce: every algorithm, out of place (in place for LL, whose input is refilled anyway).
    struct Ar {
      coll::AllReduceAlgo algo;
      long long count;
      const char* name;
    };
    for (const Ar& a : {Ar{coll::AllReduceAlgo::ll, 4099, "LL all_reduce"},
                        Ar{coll::AllReduceAlgo::ll128, 300001, "LL128 all_reduce"},
                        Ar{coll::AllReduceAlgo::one_shot, 77777, "one-shot all_reduce"},
                        Ar{coll::AllReduceAlgo::two_shot, 1000LL * 777 + 1, "two-shot all_reduce"},
                        Ar{coll::AllReduceAlgo::push, (1LL << 22) + 5, "push all_reduce"}}) {
      Buf& in = buf(a.count);
      Buf& out = a.algo == coll::AllReduceAlgo::ll ? in : buf(a.count);
      const long long n = a.count;
      ops.push_back({a.name, [&in, n, me, this, &x](uint64_t s) { ref::fill(in.p, n, t, s, me, Values::integers, x.s); },
                     a.algo == coll::AllReduceAlgo::ll ? std::function<void()>([] {}) : poison(out),
                     [&c, &in, &out, n, this, &x, algo = a.algo] {
                       c.set_all_reduce_algo(algo);
                       c.all_reduce(in.p, out.p, n, t, ReduceOp::sum, x.s);
                       c.set_all_reduce_algo(coll::AllReduceAlgo::automatic);
                     },
                     [&out, n, W, me, this, &x](uint64_t s, int id) {
                       x.check.check(out.p, nullptr, ref::map_all_reduce(n, W, me), t, s, Values::integers,
                                     ReduceOp::sum, 0, x.s, id);
                     }});
    }
    // all_gather and reduce_scatter along a strided dimension, each shard algorithm.
    const Shape full = shape({1001, 2LL * W * 65});
    const long long mine = ref::shard_numel(full, 1, W, me);
    for (coll::ShardAlgo algo : {coll::ShardAlgo::direct, coll::ShardAlgo::ll, coll::ShardAlgo::ll128}) {
      const char* an = algo == coll::ShardAlgo::direct ? "direct" : algo == coll::ShardAlgo::ll ? "LL" : "LL128";
      Buf& sh = buf(max_shard_numel(full, 1));
      Buf& fo = buf(full.numel());
      ops.push_back({std::string(an) + " all_gather",
                     [&sh, mine, me, this, &x](uint64_t s) { ref::fill(sh.p, mine, t, s, me, Values::integers, x.s); },
                     poison(fo),
                     [&c, &sh, &fo, full, algo, this, &x] {
                       c.set_all_gather_algo(algo);
                       c.all_gather(sh.p, fo.p, full, 1, t, x.s);
                       c.set_all_gather_algo(coll::ShardAlgo::automatic);
                     },
                     [&fo, full, W, me, this, &x](uint64_t s, int id) {
                       x.check.check(fo.p, nullptr, ref::map_all_gather(full, 1, W, me), t, s, Values::integers,
                                     ReduceOp::sum, 0, x.s, id);
                     }});
      Buf& fi = buf(full.numel());
      Buf& so = buf(max_shard_numel(full, 1));
      ops.push_back({std::string(an) + " reduce_scatter",
                     [&fi, full, me, this, &x](uint64_t s) {
                       ref::fill(fi.p, full.numel(), t, s, me, Values::integers, x.s);
                     },
                     poison(so),
                     [&c, &fi, &so, full, algo, this, &x] {
                       c.set_reduce_scatter_algo(algo);
                       c.reduce_scatter(fi.p, so.p, full, 1, t, ReduceOp::sum, x.s);
                       c.set_reduce_scatter_algo(coll::ShardAlgo::automatic);
                     },
                     [&so, full, W, me, this, &x](uint64_t s, int id) {
                       x.check.check(so.p, nullptr, ref::map_reduce_scatter(full, 1, W, me), t, s, Values::integers,
                                     ReduceOp::sum, 0, x.s, id);
                     }});
    }
    // Ulysses sequence -> head.
    const long long B = 2, S = 1001, H = 2LL * W, D = 64;
    const long long seq_part = B * coll::shard(S, W, me).size * H * D, seq_max = B * coll::shard(S, W, 0).size * H * D;
    Buf& seq = buf(seq_max);
    Buf& head = buf(B * S * (H / W) * D);
    ops.push_back({"Ulysses all_to_all",
                   [&seq, seq_part, me, this, &x](uint64_t s) {
                     ref::fill(seq.p, seq_part, t, s, me, Values::integers, x.s);
                   },
                   poison(head),
                   [&c, &seq, &head, B, S, H, D, this, &x] { c.all_to_all_seq_to_head(seq.p, head.p, B, S, H, D, t, x.s); },
                   [&head, B, S, H, D, W, me, this, &x](uint64_t s, int id) {
                     x.check.check(head.p, nullptr, ref::map_ulysses(true, B, S, H, D, W, me), t, s, Values::integers,
                                   ReduceOp::sum, 0, x.s, id);
                   }});
  }

  // One eager round: fill, poison, call, check (by seed).
  void eager(uint64_t seed, int id) {
    for (size_t i = 0; i < ops.size(); ++i) {
      ops[i].fill(seed + i);
      ops[i].poison();
      ops[i].call();
      ops[i].check(seed + i, id);
    }
  }
  // One graph of every call.
  wt::Graph capture() {
    return wt::Graph(ctx().s, [&] {
      for (Op& o : ops) o.call();
    });
  }
  // Fill and poison, replay, check: the graph's calls see this replay's inputs.
  void replay(const wt::Graph& g, uint64_t seed, int id) {
    Ctx& x = ctx();
    for (size_t i = 0; i < ops.size(); ++i) ops[i].fill(seed + i), ops[i].poison();
    g.launch(x.s);
    for (size_t i = 0; i < ops.size(); ++i) ops[i].check(seed + i, id);
  }
};

void report(const char* what, DType t) {
  Ctx& x = ctx();
  auto r = x.check.result(x.s);
  EXPECT_TRUE(r.ok()) << what << " " << dtype_name(t) << " rank " << comm().rank() << ": " << r.str();
  settle();
}

// Eager calls first (they make the LL128 and push scratch), then one graph of every kind replayed
// with new inputs each time, eager rounds in between, a second graph captured and dropped unplayed,
// and more replays and eager rounds after it.
TEST(CollectivesGraph, EveryAlgorithmReplaysWithNewInputs) {
  Ctx& x = ctx();
  const int replays = gpus_shared() ? 60 : 300;
  for (DType t : {DType::bf16, DType::fp32}) {
    const uint64_t seed = case_seed() & 0xFFFFFFFFFFull;
    Calls calls(t);
    x.check.reset(x.s);
    settle();
    calls.eager(seed, 1);
    report("eager calls before the capture", t);
    const wt::Graph g = calls.capture();
    x.check.reset(x.s);
    settle();
    for (int r = 0; r < replays; ++r) {
      calls.replay(g, seed + 100 * (r + 1), r + 1);
      if (r % 7 == 3) calls.eager(seed + 100 * (r + 1) + 50, r + 1);
      if (r == replays / 2) calls.capture();  // a graph destroyed without a replay
    }
    report("graph replays with eager rounds in between", t);
  }
}

// Capture of a kind whose scratch no eager call made yet is refused on every rank with a clear
// error, nothing captured; the eager call then makes it and a capture works.
TEST(CollectivesGraph, CaptureNeedsTheScratchAnEagerCallMakes) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  coll::Collectives fresh(comm());
  fresh.set_all_reduce_algo(coll::AllReduceAlgo::ll128);
  const long long n = 30001;
  Buf in(n, DType::bf16), out(n, DType::bf16);
  settle();
  const auto [msg, nodes] =
      wt::under_capture(x.s, [&] { fresh.all_reduce(in.p, out.p, n, DType::bf16, ReduceOp::sum, x.s); });
  EXPECT_NE(msg.find("eager"), std::string::npos)
      << "an LL128 capture before any eager LL128 call was accepted, or refused without saying why: " << msg;
  EXPECT_EQ(nodes, 0u) << "the refused call captured something";
  settle();
  const uint64_t seed = case_seed();
  ref::fill(in.p, n, DType::bf16, seed, me, Values::integers, x.s);
  fresh.all_reduce(in.p, out.p, n, DType::bf16, ReduceOp::sum, x.s);
  x.check.reset(x.s);
  x.check.check(out.p, nullptr, ref::map_all_reduce(n, W, me), DType::bf16, seed, Values::integers, ReduceOp::sum, 0,
                x.s, 1);
  report("the eager LL128 call after the refused capture", DType::bf16);
}

// The LL flags' period shortened to 3 (a restart of every scratch every 6 LL-family calls): LL
// and LL128 calls of alternating large and small sizes, eager and captured, each output checked.
// A restart that let a stale line through (same flag and parity 2 * period calls later) or that
// deadlocked would show here.
TEST(CollectivesGraph, LLScratchRestartsEagerAndCaptured) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  coll::Collectives c(comm());
  c.set_ll_flag_period(3);
  const DType t = DType::bf16;
  const long long big = 200001, small = 515;
  Buf a(big, t), b(big, t), sa(small, t), sb(small, t);
  const int rounds = gpus_shared() ? 40 : 200;
  auto inputs = [&](uint64_t s) {  // new inputs, outputs poisoned
    ref::fill(a.p, big, t, s, me, Values::integers, x.s);
    ref::fill(sa.p, small, t, s + 1, me, Values::integers, x.s);
    WEAVE_CUDA_CHECK(cudaMemsetAsync(b.p, 0xff, b.bytes, x.s));
    WEAVE_CUDA_CHECK(cudaMemsetAsync(sb.p, 0xff, sb.bytes, x.s));
  };
  auto calls = [&](bool ll128_big) {
    c.set_all_reduce_algo(ll128_big ? coll::AllReduceAlgo::ll128 : coll::AllReduceAlgo::ll);
    c.all_reduce(a.p, b.p, big, t, ReduceOp::sum, x.s);
    c.set_all_reduce_algo(coll::AllReduceAlgo::ll);
    c.all_reduce(sa.p, sb.p, small, t, ReduceOp::sum, x.s);
  };
  auto check = [&](uint64_t s, int id) {
    x.check.check(b.p, nullptr, ref::map_all_reduce(big, W, me), t, s, Values::integers, ReduceOp::sum, 0, x.s, id);
    x.check.check(sb.p, nullptr, ref::map_all_reduce(small, W, me), t, s + 1, Values::integers, ReduceOp::sum, 0, x.s,
                  id);
  };
  x.check.reset(x.s);
  settle();
  const uint64_t seed = case_seed() & 0xFFFFFFFFFFull;
  for (int r = 0; r < rounds; ++r) {  // eager: 2 or 3 calls per round, so restarts fall on every kind
    const uint64_t s = seed + 10 * r;
    inputs(s);
    calls(r % 2);
    check(s, r + 1);
    if (r % 3 == 0) {
      c.set_all_reduce_algo(coll::AllReduceAlgo::ll);
      c.all_reduce(sa.p, sa.p, small, t, ReduceOp::sum, x.s);  // a third call: the restart moves between kinds
    }
  }
  report("LL restarts, eager", t);
  // Captured: the big LL128 call and the small LL call, replayed (6 calls = one restart every 3 replays).
  const wt::Graph g(x.s, [&] { calls(true); });
  x.check.reset(x.s);
  settle();
  for (int r = 0; r < rounds; ++r) {
    const uint64_t s = seed + 7777 + 10 * r;
    inputs(s);
    g.launch(x.s);
    check(s, r + 1);
  }
  report("LL restarts, captured", t);
  EXPECT_THROW(c.set_ll_flag_period(4), weave::Error);
}

}  // namespace
