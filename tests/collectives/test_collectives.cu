// weave::coll::Collectives on 2+ ranks (run through weave-run) against NCCL, on fresh random
// inputs each run: every collective, dtype and reduction, shapes whose dimensions do not divide
// by the world size (some ranks owning nothing included), in place and out of place. Outputs are
// poisoned first and followed by guard elements that must stay poisoned; out-of-place inputs must
// come back unchanged. Then 1000 back-to-back calls with changing inputs, checked without host
// synchronization; cudaMalloc'd buffers registered with the communicator; and bad input (buffers
// neither in the heap nor registered, arguments that differ across ranks, impossible shapes,
// buffers shorter than the call on the LL paths) rejected with weave::Error before anything is
// launched. (A difference that follows an
// identical call is test_collectives_mismatch.)
//
// Every rank runs the same calls in the same order (failures are EXPECTs, never early returns),
// so one rank's failure does not leave its peers waiting in a collective.
#include "common.hpp"

using namespace ct;

namespace {

struct GatherCase {
  Shape full;
  int dim;
};
// Every dimension of 1- to 4-D tensors; sizes odd or prime, so few divide by the world size, and
// some smaller than it (ranks with an empty shard).
std::vector<GatherCase> gather_cases() {
  std::vector<GatherCase> v = {{shape({777001}), 0},    {shape({1}), 0},        {shape({1000, 777}), 0},
                               {shape({1000, 777}), 1}, {shape({4, 1, 33}), 1}, {shape({2, 3, 5}), 2}};
  for (int d = 0; d < 3; ++d) v.push_back({shape({5, 999, 67}), d});
  for (int d = 0; d < 4; ++d) v.push_back({shape({3, 37, 11, 131}), d});
  // Shapes the LL path takes in 16-bit types too (every shard row a whole number of 4-byte words),
  // ragged across ranks, one with an empty shard, and around the switch points: with 512-byte
  // rows (bf16/fp16) the largest shard is 512 KiB at W*1024 rows (LL under automatic), one row
  // more (direct under automatic), 1 MiB at W*2048 rows (the most LL takes), one row more (direct
  // even when LL is asked for). fp32 doubles every size: the same points from the other side.
  const long long W = comm().world();
  v.push_back({shape({1001, 258}), 0});
  v.push_back({shape({1001, 2 * W * 65}), 1});
  v.push_back({shape({7, 2 * W * 3 + 2, 10}), 1});
  v.push_back({shape({1, 64}), 0});
  for (long long rows : {W * 1024, W * 1024 + 1, W * 2048, W * 2048 + 1}) v.push_back({shape({rows, 256}), 0});
  for (long long rows : {512LL, 513LL}) v.push_back({shape({rows, 2 * W * 256}), 1});
  // Rank 0 owns everything and the call is many blocks long: ranks with an empty shard must still
  // launch their peers' grid (every rank counts every block's "done" signal).
  v.push_back({shape({1, 40001}), 0});
  v.push_back({shape({3001, 1}), 1});
  v.push_back({shape({7, 1, 5003}), 1});
  return v;
}
// Every all_gather / reduce_scatter case runs with each setting; LL falls back to direct where
// the shape or size does not allow it (the cases above include both sides).
const coll::ShardAlgo kShardAlgos[] = {coll::ShardAlgo::automatic, coll::ShardAlgo::direct, coll::ShardAlgo::ll,
                                       coll::ShardAlgo::ll128};
// fn(trace, dtype, case) for every setting (set through `set`, automatic again afterwards),
// dtype and case; in place only where the shard is contiguous (NCCL's convention).
template <class Set, class F>
void for_shard_cases(const char* what, Set&& set, bool in_place, F&& fn) {
  for (auto algo : kShardAlgos) {
    set(algo);
    const char* name = algo == coll::ShardAlgo::automatic ? "auto"
                       : algo == coll::ShardAlgo::direct  ? "direct"
                       : algo == coll::ShardAlgo::ll      ? "ll"
                                                          : "ll128";
    for (DType t : kTypes)
      for (const auto& c : gather_cases()) {
        if (in_place && ref::split(c.full, c.dim).outer != 1) continue;
        fn(std::string(what) + (in_place ? " in place " : " ") + dtype_name(t) + " " + str(c.full) + " dim " +
               std::to_string(c.dim) + " algo " + name + " rank " + std::to_string(comm().rank()),
           t, c);
      }
  }
  set(coll::ShardAlgo::automatic);
}

struct UlyssesCase {
  long long B, S, H, D;
};
// H is a multiple of the world size (the API requires it); S mostly is not.
std::vector<UlyssesCase> ulysses_cases() {
  const long long W = comm().world();
  // The last: one sequence row, so ranks other than 0 send nothing seq_to_head (same grid still).
  return {{1, 1001, 2 * W, 37}, {3, 257, W, 64}, {2, 3, 3 * W, 8}, {2, 4 * W, W, 128}, {1, 1, 4 * W, 2048}};
}

// ---------------------------------------------------------------------------------------------
void all_reduce_case(long long count, DType t, ReduceOp op, bool in_place) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  const uint64_t seed = case_seed();
  Buf in(count, t), out(in_place ? 0 : count, t), want(count, t, false);
  void* o = in_place ? in.p : out.p;
  ref::fill(in.p, count, t, seed, me, Values::uniform, x.s);
  settle();
  const Want w = reference(want, [&](auto& nccl) { nccl.all_reduce(in.p, want.p, count, t, op, x.s); });
  x.coll.all_reduce(in.p, o, count, t, op, x.s);
  settle();
  const OutMap m = ref::map_all_reduce(count, W, me);
  auto r = verify(o, w.p, m, t, seed, op);
  EXPECT_TRUE(r.ok()) << "differs from " << w.name << ": " << r.str();
  expect_reference_ok(w, m, t, seed, op);
  if (!in_place) {
    r = verify(in.p, nullptr, ref::map_input(count, W, me), t, seed);
    EXPECT_TRUE(r.ok()) << "out-of-place call changed its input: " << r.str();
  }
  EXPECT_EQ(guard_touched(o, count, t), 0u) << "wrote past the end of the output";
  settle();
}

TEST(Collectives, AllReduce) {
  const long long counts[] = {0, 1, 2, 7, 777, 65537, 1000 * 777 + 1, (1 << 21) + 3};
  const coll::AllReduceAlgo algos[] = {coll::AllReduceAlgo::automatic, coll::AllReduceAlgo::one_shot,
                                       coll::AllReduceAlgo::two_shot, coll::AllReduceAlgo::ll,
                                       coll::AllReduceAlgo::push, coll::AllReduceAlgo::ll128};
  // Push pipelines a call in steps per warp: these counts take 5-6 steps, more than the scratch
  // ring's slots, on an odd count (the tail past the last 16-byte unit); fp32's first is 64 MiB,
  // where automatic takes push on 2 ranks.
  const long long push_counts[] = {(1 << 24) + 7, 9000001};
  for (auto algo : algos) {
    ctx().coll.set_all_reduce_algo(algo);
    std::vector<long long> ns(std::begin(counts), std::end(counts));
    if (algo == coll::AllReduceAlgo::push || algo == coll::AllReduceAlgo::automatic)
      ns.insert(ns.end(), std::begin(push_counts), std::end(push_counts));
    // LL128: several steps per warp on an odd count (bf16 6 MB; fp32 past the 2-rank limit, so
    // it falls back to two-shot).
    if (algo == coll::AllReduceAlgo::ll128) ns.push_back(3000001);
    for (DType t : kTypes)
      for (ReduceOp op : kOps)
        for (long long n : ns)
          for (bool in_place : {false, true}) {
            SCOPED_TRACE(std::string("all_reduce ") + dtype_name(t) + " " + op_name(op) + " count " +
                         std::to_string(n) + (in_place ? " in place" : " out of place") + " algo " +
                         std::to_string(static_cast<int>(algo)) + " rank " + std::to_string(comm().rank()));
            all_reduce_case(n, t, op, in_place);
          }
  }
  ctx().coll.set_all_reduce_algo(coll::AllReduceAlgo::automatic);
  // Automatic takes push only where it was measured faster: 2 ranks, >= 64 MiB.
  EXPECT_EQ(ctx().coll.all_reduce_algo(size_t(64) << 20, false),
            comm().world() == 2 ? coll::AllReduceAlgo::push : coll::AllReduceAlgo::two_shot);
  EXPECT_EQ(ctx().coll.all_reduce_algo(size_t(32) << 20, true), coll::AllReduceAlgo::two_shot);
}

// Automatic takes push only if its scratch (33 MiB on 2 ranks) exists or fits in the heap: with
// a fresh object and the heap filled up, or fragmented into ranges too small for it, a 64 MiB
// all_reduce runs two-shot, correctly; once room is made, push (on 2 ranks). Each checked against
// NCCL (or the recomputed reference).
TEST(Collectives, AutomaticPushNeedsRoomInTheHeap) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  const DType t = DType::bf16;
  const long long count = (32LL << 20) + 3, bytes = count * 2;
  Buf in(count, t), out(count, t), want(count, t, false);
  coll::Collectives fresh(comm());
  auto check = [&](coll::AllReduceAlgo expect, const char* what) {
    SCOPED_TRACE(std::string(what) + " rank " + std::to_string(me));
    EXPECT_EQ(fresh.all_reduce_algo(bytes, false), expect);
    const uint64_t seed = case_seed();
    ref::fill(in.p, count, t, seed, me, Values::uniform, x.s);
    WEAVE_CUDA_CHECK(cudaMemsetAsync(out.p, 0xff, out.bytes, x.s));
    settle();
    const Want w = reference(want, [&](auto& nccl) { nccl.all_reduce(in.p, want.p, count, t, ReduceOp::sum, x.s); });
    fresh.all_reduce(in.p, out.p, count, t, ReduceOp::sum, x.s);
    settle();
    auto r = verify(out.p, w.p, ref::map_all_reduce(count, W, me), t, seed);
    EXPECT_TRUE(r.ok()) << "differs from " << w.name << ": " << r.str();
    EXPECT_EQ(guard_touched(out.p, count, t), 0u) << "wrote past the end of the output";
  };
  // Fill the heap with 1 MiB pieces (allocations are collective and fail alike on every rank), so
  // what is left is below 1 MiB per free range; freed however the test ends, so that a failed check
  // does not leave the next tests a full heap.
  struct Filler {
    std::vector<void*> v;
    void release() {
      for (void* f : v)
        if (f) comm().free(f);
      v.clear();
    }
    ~Filler() {
      try {
        release();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "freeing the heap filler: " << e.what();
      }
    }
  } filler_;
  std::vector<void*>& filler = filler_.v;
  for (;;) {
    try {
      filler.push_back(comm().alloc(size_t(1) << 20));
    } catch (const weave::Error&) {
      break;
    }
  }
  ASSERT_LT(comm().heap_bytes() - comm().heap_used(), size_t(32) << 20) << "heap too fragmented to fill";
  check(coll::AllReduceAlgo::two_shot, "heap full");
  // Every other piece freed: hundreds of MiB free in all, but no range above 1 MiB, so push's
  // scratch (33 MiB on 2 ranks) still does not fit and automatic must not take it.
  for (size_t i = 0; i < filler.size(); i += 2) comm().free(std::exchange(filler[i], nullptr));
  ASSERT_GT(comm().heap_bytes() - comm().heap_used(), size_t(64) << 20) << "too few pieces to fragment the heap";
  check(coll::AllReduceAlgo::two_shot, "heap fragmented");
  filler_.release();
  check(W == 2 ? coll::AllReduceAlgo::push : coll::AllReduceAlgo::two_shot, "heap with room");
  settle();
}

// In place means NCCL's convention: `in` is this rank's shard inside `out`, which requires the
// shard to be contiguous there (every dimension before `dim` of size 1).
void all_gather_case(const Shape& full, int dim, DType t, bool in_place) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  const uint64_t seed = case_seed();
  const long long n = full.numel(), mine = ref::shard_numel(full, dim, W, me), e = dtype_size(t);
  const ref::Split sp = ref::split(full, dim);
  Buf out(n, t), in(in_place ? 0 : max_shard_numel(full, dim), t), want(n, t, false);
  char* i = in_place ? out.p + sp.outer * coll::shard(sp.n, W, me).begin * sp.inner * e : in.p;
  ref::fill(i, mine, t, seed, me, Values::uniform, x.s);
  settle();
  const Want w = reference(want, [&](auto& nccl) { nccl.all_gather(i, want.p, full, dim, t, x.s); });
  x.coll.all_gather(i, out.p, full, dim, t, x.s);
  settle();
  const OutMap m = ref::map_all_gather(full, dim, W, me);
  auto r = verify(out.p, w.p, m, t, seed);
  EXPECT_TRUE(r.ok()) << "differs from " << w.name << ": " << r.str();
  expect_reference_ok(w, m, t, seed);
  if (!in_place) {
    r = verify(in.p, nullptr, ref::map_input(mine, W, me), t, seed);
    EXPECT_TRUE(r.ok()) << "out-of-place call changed its input: " << r.str();
    EXPECT_EQ(guard_touched(in.p, max_shard_numel(full, dim), t), 0u) << "wrote past the end of the input";
  }
  EXPECT_EQ(guard_touched(out.p, n, t), 0u) << "wrote past the end of the output";
  settle();
}

TEST(Collectives, AllGather) {
  for (bool in_place : {false, true})
    for_shard_cases("all_gather", [](coll::ShardAlgo a) { ctx().coll.set_all_gather_algo(a); }, in_place,
                    [&](const std::string& trace, DType t, const GatherCase& c) {
                      SCOPED_TRACE(trace);
                      all_gather_case(c.full, c.dim, t, in_place);
                    });
}

// In place: `out` is this rank's shard inside `in` (NCCL's convention; needs outer == 1).
void reduce_scatter_case(const Shape& full, int dim, DType t, ReduceOp op, bool in_place) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  const uint64_t seed = case_seed();
  const long long n = full.numel(), mine = ref::shard_numel(full, dim, W, me), e = dtype_size(t);
  const ref::Split sp = ref::split(full, dim);
  Buf in(n, t), out(in_place ? 0 : max_shard_numel(full, dim), t), want(mine, t, false);
  char* o = in_place ? in.p + sp.outer * coll::shard(sp.n, W, me).begin * sp.inner * e : out.p;
  ref::fill(in.p, n, t, seed, me, Values::uniform, x.s);
  settle();
  const Want w = reference(want, [&](auto& nccl) { nccl.reduce_scatter(in.p, want.p, full, dim, t, op, x.s); });
  x.coll.reduce_scatter(in.p, o, full, dim, t, op, x.s);
  settle();
  const OutMap m = ref::map_reduce_scatter(full, dim, W, me);
  auto r = verify(o, w.p, m, t, seed, op);
  EXPECT_TRUE(r.ok()) << "differs from " << w.name << ": " << r.str();
  expect_reference_ok(w, m, t, seed, op);
  if (!in_place) {
    r = verify(in.p, nullptr, ref::map_input(n, W, me), t, seed);
    EXPECT_TRUE(r.ok()) << "out-of-place call changed its input: " << r.str();
    EXPECT_EQ(guard_touched(out.p, mine, t), 0u) << "wrote past the end of the output";
  }
  EXPECT_EQ(guard_touched(in.p, n, t), 0u) << "wrote past the end of the input";
  settle();
}

TEST(Collectives, ReduceScatter) {
  auto set = [](coll::ShardAlgo a) { ctx().coll.set_reduce_scatter_algo(a); };
  for_shard_cases("reduce_scatter", set, false, [](const std::string& trace, DType t, const GatherCase& c) {
    for (ReduceOp op : kOps) {
      SCOPED_TRACE(trace + " " + op_name(op));
      reduce_scatter_case(c.full, c.dim, t, op, false);
    }
  });
  for_shard_cases("reduce_scatter", set, true, [](const std::string& trace, DType t, const GatherCase& c) {
    SCOPED_TRACE(trace);
    reduce_scatter_case(c.full, c.dim, t, ReduceOp::sum, true);
  });
}

void ulysses_case(const UlyssesCase& u, bool to_head, DType t) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  const uint64_t seed = case_seed();
  const long long seq_part = u.B * coll::shard(u.S, W, me).size * u.H * u.D;
  const long long seq_max = u.B * coll::shard(u.S, W, 0).size * u.H * u.D;  // rank 0's part is the largest
  const long long head_part = u.B * u.S * (u.H / W) * u.D;
  const long long in_n = to_head ? seq_part : head_part, out_n = to_head ? head_part : seq_part;
  Buf in(to_head ? seq_max : head_part, t), out(to_head ? head_part : seq_max, t), want(out_n, t, false);
  ref::fill(in.p, in_n, t, seed, me, Values::uniform, x.s);
  settle();
  const Want w = reference(want, [&](auto& nccl) {
    if (to_head)
      nccl.all_to_all_seq_to_head(in.p, want.p, u.B, u.S, u.H, u.D, t, x.s);
    else
      nccl.all_to_all_head_to_seq(in.p, want.p, u.B, u.S, u.H, u.D, t, x.s);
  });
  if (to_head)
    x.coll.all_to_all_seq_to_head(in.p, out.p, u.B, u.S, u.H, u.D, t, x.s);
  else
    x.coll.all_to_all_head_to_seq(in.p, out.p, u.B, u.S, u.H, u.D, t, x.s);
  settle();
  const OutMap m = ref::map_ulysses(to_head, u.B, u.S, u.H, u.D, W, me);
  auto r = verify(out.p, w.p, m, t, seed);
  EXPECT_TRUE(r.ok()) << "differs from " << w.name << ": " << r.str();
  expect_reference_ok(w, m, t, seed);
  r = verify(in.p, nullptr, ref::map_input(in_n, W, me), t, seed);
  EXPECT_TRUE(r.ok()) << "changed its input: " << r.str();
  EXPECT_EQ(guard_touched(out.p, out_n, t), 0u) << "wrote past the end of the output";
  settle();
}

TEST(Collectives, UlyssesAllToAll) {
  for (DType t : kTypes)
    for (const auto& u : ulysses_cases())
      for (bool to_head : {true, false}) {
        SCOPED_TRACE(std::string(to_head ? "seq_to_head " : "head_to_seq ") + dtype_name(t) + " B" +
                     std::to_string(u.B) + " S" + std::to_string(u.S) + " H" + std::to_string(u.H) + " D" +
                     std::to_string(u.D) + " rank " + std::to_string(comm().rank()));
        ulysses_case(u, to_head, t);
      }
}

// ---------------------------------------------------------------------------------------------
// 1000 calls in a row on one stream with no host synchronization, the inputs rewritten before
// each call (integers, so every result is exact), each output checked on the device as it comes.
// A call that returns while a peer still reads its buffers shows up as wrong elements here.
constexpr int kIters = 1000;

TEST(Collectives, BackToBack) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  const Shape full = shape({1000, 777});
  const UlyssesCase u{2, 1001, 2LL * W, 64};
  auto report = [&](const char* what, DType t) {
    auto r = x.check.result(x.s);
    EXPECT_TRUE(r.ok()) << what << " " << dtype_name(t) << " rank " << me << ": " << r.str();
    settle();
  };
  for (DType t : kTypes) {
    const uint64_t seed = case_seed();
    // all_reduce: a one-shot-sized and a two-shot-sized count, then push with one step per call
    // (the ring's slots reused from call to call) and with 6-8 steps; out of place and in place
    // alternately.
    struct Run {
      coll::AllReduceAlgo algo;
      long long count;
      int iters;
    };
    for (const Run& run : {Run{coll::AllReduceAlgo::automatic, 1001, kIters},
                           Run{coll::AllReduceAlgo::automatic, 1000LL * 777 + 1, kIters},
                           Run{coll::AllReduceAlgo::push, 1000LL * 777 + 1, kIters},
                           Run{coll::AllReduceAlgo::push, (1LL << 23) + 5, 100}}) {
      const long long count = run.count;
      x.coll.set_all_reduce_algo(run.algo);
      Buf a(count, t), b(count, t);
      x.check.reset(x.s);
      settle();
      for (int it = 0; it < run.iters; ++it) {
        const uint64_t s = seed + it;
        ref::fill(a.p, count, t, s, me, Values::integers, x.s);
        void* o = it % 2 ? a.p : b.p;
        x.coll.all_reduce(a.p, o, count, t, ReduceOp::sum, x.s);
        x.check.check(o, nullptr, ref::map_all_reduce(count, W, me), t, s, Values::integers, ReduceOp::sum, 0, x.s,
                      it + 1);
      }
      report(run.algo == coll::AllReduceAlgo::push ? "push all_reduce back to back" : "all_reduce back to back", t);
    }
    x.coll.set_all_reduce_algo(coll::AllReduceAlgo::automatic);
    {  // all_gather and reduce_scatter along the non-contiguous dimension
      Buf shard_buf(max_shard_numel(full, 1), t), full_buf(full.numel(), t), shard_out(max_shard_numel(full, 1), t);
      const long long mine = ref::shard_numel(full, 1, W, me);
      x.check.reset(x.s);
      settle();
      for (int it = 0; it < kIters; ++it) {
        const uint64_t s = seed + 7 * it;
        ref::fill(shard_buf.p, mine, t, s, me, Values::integers, x.s);
        x.coll.all_gather(shard_buf.p, full_buf.p, full, 1, t, x.s);
        x.check.check(full_buf.p, nullptr, ref::map_all_gather(full, 1, W, me), t, s, Values::integers, ReduceOp::sum,
                      0, x.s, it + 1);
      }
      report("all_gather back to back", t);
      x.check.reset(x.s);
      settle();
      for (int it = 0; it < kIters; ++it) {
        const uint64_t s = seed + 11 * it;
        ref::fill(full_buf.p, full.numel(), t, s, me, Values::integers, x.s);
        x.coll.reduce_scatter(full_buf.p, shard_out.p, full, 1, t, ReduceOp::sum, x.s);
        x.check.check(shard_out.p, nullptr, ref::map_reduce_scatter(full, 1, W, me), t, s, Values::integers,
                      ReduceOp::sum, 0, x.s, it + 1);
      }
      report("reduce_scatter back to back", t);
    }
    // The LL-family kinds interleaved, LL then LL128 (one call counter, one scratch region each):
    // all_gather and reduce_scatter along a strided dimension and an LL all_reduce in both
    // passes; then in the LL pass an all_gather in which a rank owns nothing (it still sends its
    // flag lines), in the LL128 pass an LL128 all_reduce of several steps per warp, in place on
    // odd iterations. Every output checked.
    for (const coll::ShardAlgo proto : {coll::ShardAlgo::ll, coll::ShardAlgo::ll128}) {
      auto& c = x.coll;
      const bool ll128 = proto == coll::ShardAlgo::ll128;
      c.set_all_gather_algo(proto);
      c.set_reduce_scatter_algo(proto);
      const Shape ls = shape({1001, 2LL * W * 65}), tiny = shape({1, 64});
      const long long mine = ref::shard_numel(ls, 1, W, me), tmine = ref::shard_numel(tiny, 0, W, me);
      const long long big = 1000LL * 777 + 1;
      EXPECT_EQ(c.all_gather_algo(ls, 1, t), proto);
      EXPECT_EQ(c.reduce_scatter_algo(ls, 1, t), proto);
      if (!ll128) EXPECT_EQ(c.all_gather_algo(tiny, 0, t), coll::ShardAlgo::ll);
      Buf sh(max_shard_numel(ls, 1), t), full_buf(ls.numel(), t), sh_out(max_shard_numel(ls, 1), t);
      Buf ar(4099, t), ar_out(4099, t), tin(64, t), tout(64, t), bin(ll128 ? big : 1, t), bout(ll128 ? big : 1, t);
      x.check.reset(x.s);
      settle();
      for (int it = 0; it < kIters; ++it) {
        const uint64_t s = seed + (ll128 ? 19 : 17) * it;
        ref::fill(sh.p, mine, t, s, me, Values::integers, x.s);
        c.all_gather(sh.p, full_buf.p, ls, 1, t, x.s);
        x.check.check(full_buf.p, nullptr, ref::map_all_gather(ls, 1, W, me), t, s, Values::integers, ReduceOp::sum, 0,
                      x.s, it + 1);
        ref::fill(full_buf.p, ls.numel(), t, s + 1, me, Values::integers, x.s);
        c.reduce_scatter(full_buf.p, sh_out.p, ls, 1, t, ReduceOp::sum, x.s);
        x.check.check(sh_out.p, nullptr, ref::map_reduce_scatter(ls, 1, W, me), t, s + 1, Values::integers,
                      ReduceOp::sum, 0, x.s, it + 1);
        c.set_all_reduce_algo(coll::AllReduceAlgo::ll);
        ref::fill(ar.p, 4099, t, s + 2, me, Values::integers, x.s);
        c.all_reduce(ar.p, ar_out.p, 4099, t, ReduceOp::sum, x.s);
        x.check.check(ar_out.p, nullptr, ref::map_all_reduce(4099, W, me), t, s + 2, Values::integers, ReduceOp::sum, 0,
                      x.s, it + 1);
        if (ll128) {
          c.set_all_reduce_algo(coll::AllReduceAlgo::ll128);
          ref::fill(bin.p, big, t, s + 3, me, Values::integers, x.s);
          void* o = it % 2 ? bin.p : bout.p;
          c.all_reduce(bin.p, o, big, t, ReduceOp::sum, x.s);
          x.check.check(o, nullptr, ref::map_all_reduce(big, W, me), t, s + 3, Values::integers, ReduceOp::sum, 0, x.s,
                        it + 1);
        } else {
          ref::fill(tin.p, tmine, t, s + 3, me, Values::integers, x.s);
          c.all_gather(tin.p, tout.p, tiny, 0, t, x.s);
          x.check.check(tout.p, nullptr, ref::map_all_gather(tiny, 0, W, me), t, s + 3, Values::integers,
                        ReduceOp::sum, 0, x.s, it + 1);
        }
      }
      report(ll128 ? "LL128 all_gather / reduce_scatter / all_reduce with LL interleaved back to back"
                   : "LL all_gather / reduce_scatter / all_reduce interleaved back to back",
             t);
      c.set_all_gather_algo(coll::ShardAlgo::automatic);
      c.set_reduce_scatter_algo(coll::ShardAlgo::automatic);
      c.set_all_reduce_algo(coll::AllReduceAlgo::automatic);
    }
    {  // Ulysses there and back: the round trip must give each rank its own input again
      const long long seq_part = u.B * coll::shard(u.S, W, me).size * u.H * u.D;
      const long long seq_max = u.B * coll::shard(u.S, W, 0).size * u.H * u.D;
      const long long head_part = u.B * u.S * (u.H / W) * u.D;
      Buf seq(seq_max, t), head(head_part, t), back(seq_max, t);
      x.check.reset(x.s);
      settle();
      for (int it = 0; it < kIters; ++it) {
        const uint64_t s = seed + 13 * it;
        ref::fill(seq.p, seq_part, t, s, me, Values::integers, x.s);
        x.coll.all_to_all_seq_to_head(seq.p, head.p, u.B, u.S, u.H, u.D, t, x.s);
        x.check.check(head.p, nullptr, ref::map_ulysses(true, u.B, u.S, u.H, u.D, W, me), t, s, Values::integers,
                      ReduceOp::sum, 0, x.s, it + 1);
        x.coll.all_to_all_head_to_seq(head.p, back.p, u.B, u.S, u.H, u.D, t, x.s);
        x.check.check(back.p, nullptr, ref::map_input(seq_part, W, me), t, s, Values::integers, ReduceOp::sum, 0, x.s,
                      it + 1);
      }
      report("Ulysses all_to_all round trip back to back", t);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// cudaMalloc'd buffers registered with the communicator work like heap buffers.
// One object called alternately on two streams with no synchronisation between the calls, for
// each all_reduce path (LL, two-shot, push): every call must wait for the object's previous one
// (scratch parity, ring steps, signal totals), so every output equals its own reference.
TEST(Collectives, OneObjectOnTwoStreams) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  cudaStream_t st[2];
  for (auto& s : st) WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  struct Case {
    coll::AllReduceAlgo algo;
    long long count;
  };
  for (const Case& c : {Case{coll::AllReduceAlgo::ll, 40001}, Case{coll::AllReduceAlgo::two_shot, 1000003},
                        Case{coll::AllReduceAlgo::push, 3000017}, Case{coll::AllReduceAlgo::ll128, 1000003}}) {
    x.coll.set_all_reduce_algo(c.algo);
    constexpr int kCalls = 6;
    std::vector<std::unique_ptr<Buf>> in, out;
    std::vector<uint64_t> seeds;
    for (int i = 0; i < kCalls; ++i) {
      seeds.push_back(case_seed());
      in.push_back(std::make_unique<Buf>(c.count, DType::bf16));
      out.push_back(std::make_unique<Buf>(c.count, DType::bf16));
      ref::fill(in[i]->p, c.count, DType::bf16, seeds[i], me, Values::uniform, x.s);
    }
    settle();
    for (int i = 0; i < kCalls; ++i)
      x.coll.all_reduce(in[i]->p, out[i]->p, c.count, DType::bf16, ReduceOp::sum, st[i % 2]);
    for (auto& s : st) WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
    settle();
    for (int i = 0; i < kCalls; ++i) {
      auto r = verify(out[i]->p, nullptr, ref::map_all_reduce(c.count, W, me), DType::bf16, seeds[i]);
      EXPECT_TRUE(r.ok()) << "algo " << static_cast<int>(c.algo) << " call " << i << " on stream " << i % 2 << ": "
                          << r.str();
    }
    settle();
  }
  x.coll.set_all_reduce_algo(coll::AllReduceAlgo::automatic);
  for (auto& s : st) WEAVE_CUDA_CHECK(cudaStreamDestroy(s));
}

TEST(Collectives, RegisteredBuffers) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  const DType t = DType::bf16;
  const Shape full = shape({1000, 777});
  const long long n = full.numel(), shard_max = max_shard_numel(full, 1), mine = ref::shard_numel(full, 1, W, me);
  Buf shard_in(shard_max, t, false), full_buf(n, t, false), shard_out(shard_max, t, false), want(n, t, false);
  // Deregistered however the test ends: a later cudaMalloc at a still-registered address would
  // pass the next test's "unregistered" cases.
  struct Registered {
    std::vector<const Buf*> bufs;
    explicit Registered(std::initializer_list<const Buf*> b) : bufs(b) {
      for (const Buf* x : bufs) comm().register_buffer(x->p, x->bytes);
    }
    ~Registered() {
      try {
        for (const Buf* x : bufs) comm().deregister_buffer(x->p);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "deregistering: " << e.what();
      }
    }
  } registered{&shard_in, &full_buf, &shard_out};
  uint64_t seed = case_seed();
  ref::fill(shard_in.p, mine, t, seed, me, Values::uniform, x.s);
  settle();
  Want w = reference(want, [&](auto& nccl) { nccl.all_gather(shard_in.p, want.p, full, 1, t, x.s); });
  x.coll.all_gather(shard_in.p, full_buf.p, full, 1, t, x.s);
  settle();
  auto r = verify(full_buf.p, w.p, ref::map_all_gather(full, 1, W, me), t, seed);
  EXPECT_TRUE(r.ok()) << "all_gather on registered buffers differs from " << w.name << ": " << r.str();

  seed = case_seed();
  ref::fill(full_buf.p, n, t, seed, me, Values::uniform, x.s);
  settle();
  w = reference(want, [&](auto& nccl) { nccl.reduce_scatter(full_buf.p, want.p, full, 1, t, ReduceOp::sum, x.s); });
  x.coll.reduce_scatter(full_buf.p, shard_out.p, full, 1, t, ReduceOp::sum, x.s);
  settle();
  r = verify(shard_out.p, w.p, ref::map_reduce_scatter(full, 1, W, me), t, seed);
  EXPECT_TRUE(r.ok()) << "reduce_scatter on registered buffers differs from " << w.name << ": " << r.str();

  w = reference(want, [&](auto& nccl) { nccl.all_reduce(full_buf.p, want.p, n, t, ReduceOp::sum, x.s); });
  x.coll.all_reduce(full_buf.p, full_buf.p, n, t, ReduceOp::sum, x.s);
  settle();
  r = verify(full_buf.p, w.p, ref::map_all_reduce(n, W, me), t, seed);
  EXPECT_TRUE(r.ok()) << "in-place all_reduce on a registered buffer differs from " << w.name << ": " << r.str();
  settle();
}

// A small valid all_gather, checked: the communicator and the collectives still work.
void still_works(const char* after) {
  SCOPED_TRACE(std::string("valid call after: ") + after);
  all_gather_case(shape({999, 5}), 0, DType::fp32, false);
}

// Within a test: the algorithms that reach peers' buffers (two-shot, direct), automatic again after.
struct PeerAlgos {
  coll::Collectives& c;
  explicit PeerAlgos(coll::Collectives& x) : c(x) {
    c.set_all_reduce_algo(coll::AllReduceAlgo::two_shot);
    c.set_all_gather_algo(coll::ShardAlgo::direct);
    c.set_reduce_scatter_algo(coll::ShardAlgo::direct);
  }
  ~PeerAlgos() {
    c.set_all_reduce_algo(coll::AllReduceAlgo::automatic);
    c.set_all_gather_algo(coll::ShardAlgo::automatic);
    c.set_reduce_scatter_algo(coll::ShardAlgo::automatic);
  }
};

// Buffers that peers reach at this rank's place, at different places on different ranks (rank 0
// passes one heap buffer, the others another, each valid on its own): every rank rejects the
// call, nothing is written, and the next call works.
TEST(Collectives, RejectsBuffersAtDifferentPlaces) {
  const int me = comm().rank();
  const DType t = DType::bf16;
  const Shape full = shape({1003, 779});
  const long long n = full.numel(), shard = max_shard_numel(full, 1);
  const UlyssesCase u{1, 257, 2LL * comm().world(), 64};
  const long long seq = u.B * coll::shard(u.S, comm().world(), 0).size * u.H * u.D, head = u.B * u.S * (u.H / comm().world()) * u.D;
  Buf a(n, t), b(n, t), part(shard, t), sa(seq, t), ha(head, t), hb(head, t);
  settle();
  auto& c = ctx().coll;
  cudaStream_t s = ctx().s;
  const PeerAlgos peer_algos(c);
  const char* needle = "different places";
  Buf& mine = me == 0 ? a : b;
  expect_rejected("all_gather, outputs at different places", needle,
                  [&] { c.all_gather(part.p, mine.p, full, 1, t, s); }, {&a, &b});
  expect_rejected("reduce_scatter, inputs at different places", needle,
                  [&] { c.reduce_scatter(mine.p, part.p, full, 1, t, ReduceOp::sum, s); }, {&part});
  expect_rejected("all_reduce (two-shot), inputs at different places", needle,
                  [&] { c.all_reduce(mine.p, me == 0 ? b.p : a.p, n, t, ReduceOp::sum, s); }, {me == 0 ? &b : &a});
  expect_rejected("seq_to_head, outputs at different places", needle,
                  [&] { c.all_to_all_seq_to_head(sa.p, (me == 0 ? ha : hb).p, u.B, u.S, u.H, u.D, t, s); }, {&ha, &hb});
  still_works("buffers at different places");
}

TEST(Collectives, RejectsUnregisteredBuffers) {
  const int W = comm().world();
  const DType t = DType::bf16;
  const Shape full = shape({1000, 777});
  const long long n = full.numel(), shard = max_shard_numel(full, 1);
  const UlyssesCase u{2, 1001, 2LL * W, 64};
  const long long seq = u.B * coll::shard(u.S, W, 0).size * u.H * u.D, head = u.B * u.S * (u.H / W) * u.D;
  Buf heap_full(n, t), heap_shard(shard, t), heap_seq(seq, t), heap_head(head, t);
  Buf loose_full(n, t, false), loose_shard(shard, t, false), loose_seq(seq, t, false), loose_head(head, t, false);
  settle();
  auto& c = ctx().coll;
  cudaStream_t s = ctx().s;
  const char* needle = "registered";
  // The LL family (which automatic takes up to 8 MiB) copies through its own scratch and rightly
  // accepts buffers only this rank can reach.
  const PeerAlgos peer_algos(c);
  expect_rejected("all_reduce, unregistered input", needle,
                  [&] { c.all_reduce(loose_full.p, heap_full.p, n, t, ReduceOp::sum, s); }, {&heap_full});
  expect_rejected("all_reduce, unregistered output", needle,
                  [&] { c.all_reduce(heap_full.p, loose_full.p, n, t, ReduceOp::sum, s); }, {&loose_full});
  expect_rejected("all_reduce in place, unregistered", needle,
                  [&] { c.all_reduce(loose_full.p, loose_full.p, n, t, ReduceOp::sum, s); }, {&loose_full});
  expect_rejected("all_gather, unregistered input", needle,
                  [&] { c.all_gather(loose_shard.p, heap_full.p, full, 1, t, s); }, {&heap_full});
  expect_rejected("all_gather, unregistered output", needle,
                  [&] { c.all_gather(heap_shard.p, loose_full.p, full, 1, t, s); }, {&loose_full});
  expect_rejected("reduce_scatter, unregistered input", needle,
                  [&] { c.reduce_scatter(loose_full.p, heap_shard.p, full, 1, t, ReduceOp::sum, s); }, {&heap_shard});
  expect_rejected("reduce_scatter, unregistered output", needle,
                  [&] { c.reduce_scatter(heap_full.p, loose_shard.p, full, 1, t, ReduceOp::sum, s); }, {&loose_shard});
  expect_rejected("seq_to_head, unregistered input", needle,
                  [&] { c.all_to_all_seq_to_head(loose_seq.p, heap_head.p, u.B, u.S, u.H, u.D, t, s); }, {&heap_head});
  expect_rejected("seq_to_head, unregistered output", needle,
                  [&] { c.all_to_all_seq_to_head(heap_seq.p, loose_head.p, u.B, u.S, u.H, u.D, t, s); }, {&loose_head});
  expect_rejected("head_to_seq, unregistered input", needle,
                  [&] { c.all_to_all_head_to_seq(loose_head.p, heap_seq.p, u.B, u.S, u.H, u.D, t, s); }, {&heap_seq});
  expect_rejected("head_to_seq, unregistered output", needle,
                  [&] { c.all_to_all_head_to_seq(heap_head.p, loose_seq.p, u.B, u.S, u.H, u.D, t, s); }, {&loose_seq});
  still_works("unregistered buffers");
}

// Arguments that differ across ranks: every rank must get the error. Buffers are large enough for
// every rank's arguments, so only the disagreement itself can be the reason. Consecutive calls
// differ on every rank, so an implementation that re-checks only changed arguments still checks.
TEST(Collectives, RejectsArgumentsThatDifferAcrossRanks) {
  const int W = comm().world(), me = comm().rank();
  const bool odd = me != 0;  // rank 0 against the others
  const Shape full = shape({1000, 777}), wider = shape({1000, 778});
  const long long big = wider.numel() + 64;
  const UlyssesCase u{2, 1001, 2LL * W, 64};
  const long long seq_big = u.B * (u.S + W) * u.H * u.D;
  Buf a(big, DType::fp32), b(big, DType::fp32), sa(seq_big, DType::fp32), sb(seq_big, DType::fp32);
  settle();
  auto& c = ctx().coll;
  cudaStream_t s = ctx().s;
  const char* needle = "differ";
  expect_rejected("all_reduce, count differs", needle,
                  [&] { c.all_reduce(a.p, b.p, 1000 + me, DType::bf16, ReduceOp::sum, s); }, {&b});
  expect_rejected("all_reduce, dtype differs", needle,
                  [&] { c.all_reduce(a.p, b.p, 1002, odd ? DType::fp16 : DType::bf16, ReduceOp::sum, s); }, {&b});
  expect_rejected("all_reduce, op differs", needle,
                  [&] { c.all_reduce(a.p, b.p, 999, DType::fp32, odd ? ReduceOp::max : ReduceOp::sum, s); }, {&b});
  expect_rejected("all_gather, shape differs", needle,
                  [&] { c.all_gather(a.p, b.p, odd ? wider : full, 1, DType::bf16, s); }, {&b});
  expect_rejected("all_gather, dtype differs", needle,
                  [&] { c.all_gather(a.p, b.p, full, 0, odd ? DType::fp16 : DType::bf16, s); }, {&b});
  expect_rejected("all_gather, dim differs", needle, [&] { c.all_gather(a.p, b.p, full, odd ? 0 : 1, DType::fp32, s); },
                  {&b});
  expect_rejected("reduce_scatter, op differs", needle,
                  [&] { c.reduce_scatter(a.p, b.p, full, 0, DType::bf16, odd ? ReduceOp::min : ReduceOp::sum, s); },
                  {&b});
  expect_rejected("reduce_scatter, shape differs", needle,
                  [&] { c.reduce_scatter(a.p, b.p, odd ? wider : full, 1, DType::fp16, ReduceOp::sum, s); }, {&b});
  expect_rejected("seq_to_head, S differs", needle,
                  [&] { c.all_to_all_seq_to_head(sa.p, sb.p, u.B, u.S + me, u.H, u.D, DType::bf16, s); }, {&sb});
  expect_rejected("head_to_seq, dtype differs", needle,
                  [&] { c.all_to_all_head_to_seq(sa.p, sb.p, u.B, u.S, u.H, u.D, odd ? DType::fp16 : DType::bf16, s); },
                  {&sb});
  still_works("arguments that differ across ranks");
}

// Buffers that share bytes other than in place (all_reduce: in == out; all_gather /
// reduce_scatter: the shard is this rank's slice of the full tensor, contiguous there) would race
// (peers read and write them during the call): every rank refuses the call before any launch.
TEST(Collectives, RejectsOverlappingBuffers) {
  const int W = comm().world(), me = comm().rank();
  const DType t = DType::bf16;
  const long long e = 2, rows = 64, cols = 1000;
  const Shape full = shape({rows, cols});
  Buf a(2 * full.numel() + 4096, t);
  settle();
  auto& c = ctx().coll;
  cudaStream_t s = ctx().s;
  const char* needle = "overlap";
  char* col_slice = a.p + coll::shard(cols, W, me).begin * e;         // this rank's columns in row 0
  char* row_slice = a.p + coll::shard(rows, W, me).begin * cols * e;  // this rank's rows
  expect_rejected("all_gather dim 1, the input at this rank's columns of the output", needle,
                  [&] { c.all_gather(col_slice, a.p, full, 1, t, s); }, {&a});
  expect_rejected("reduce_scatter dim 1, the output at this rank's columns of the input", needle,
                  [&] { c.reduce_scatter(a.p, col_slice, full, 1, t, ReduceOp::sum, s); }, {&a});
  expect_rejected("all_gather dim 0, the input one element past this rank's rows", needle,
                  [&] { c.all_gather(row_slice + e, a.p, full, 0, t, s); }, {&a});
  expect_rejected("reduce_scatter dim 0, the output one element before this rank's rows", needle,
                  [&] { c.reduce_scatter(a.p + full.numel() * e, a.p + full.numel() * e - e, full, 0, t, ReduceOp::sum,
                                         s); },
                  {&a});
  expect_rejected("all_reduce, the output shifted by two elements", needle,
                  [&] { c.all_reduce(a.p, a.p + 2 * e, 1000, t, ReduceOp::sum, s); }, {&a});
  expect_rejected("seq_to_head, the output over the input", needle,
                  [&] { c.all_to_all_seq_to_head(a.p, a.p + 64, 2, 64, 2LL * W, 8, t, s); }, {&a});
  still_works("overlapping buffers");
}

TEST(Collectives, RejectsImpossibleShapes) {
  const int W = comm().world();
  const DType t = DType::fp32;
  Buf a(1 << 20, t), b(1 << 20, t);
  settle();
  auto& c = ctx().coll;
  cudaStream_t s = ctx().s;
  Shape five = shape({2, 2, 2, 2});
  five.ndim = 5;
  Shape none = shape({4});
  none.ndim = 0;
  const char* any = "";  // any message: these are local checks with no fixed wording
  expect_rejected("all_gather, dim == ndim", any, [&] { c.all_gather(a.p, b.p, shape({10, 10}), 2, t, s); }, {&b});
  expect_rejected("all_gather, dim < 0", any, [&] { c.all_gather(a.p, b.p, shape({10, 10}), -1, t, s); }, {&b});
  expect_rejected("reduce_scatter, 5 dimensions", any,
                  [&] { c.reduce_scatter(a.p, b.p, five, 0, t, ReduceOp::sum, s); }, {&b});
  expect_rejected("all_gather, 0 dimensions", any, [&] { c.all_gather(a.p, b.p, none, 0, t, s); }, {&b});
  expect_rejected("all_gather, negative size", any, [&] { c.all_gather(a.p, b.p, shape({10, -3}), 0, t, s); }, {&b});
  expect_rejected("seq_to_head, H not a multiple of the world size", any,
                  [&] { c.all_to_all_seq_to_head(a.p, b.p, 1, 16, W + 1, 8, t, s); }, {&b});
  expect_rejected("head_to_seq, H not a multiple of the world size", any,
                  [&] { c.all_to_all_head_to_seq(a.p, b.p, 1, 16, 2 * W - 1, 8, t, s); }, {&b});
  expect_rejected("all_reduce, output buffer too small", "",
                  [&] { c.all_reduce(a.p, b.p, 1 << 21, t, ReduceOp::sum, s); }, {&b});
  still_works("impossible shapes");
}

// The LL family reaches a call's buffers from this rank only, so nothing checks them where
// peers' pointers are made: a buffer shorter than the call must still be rejected on every rank
// before any launch (heap buffers and, which only LL accepts, cudaMalloc'd ones), naming it.
TEST(Collectives, RejectsShortLocalBuffers) {
  const int W = comm().world();
  const DType t = DType::bf16;
  const long long n = 65537;  // all_reduce: 128 KiB, which LL and LL128 both take
  const Shape full = shape({1001, 2LL * W * 65});  // BackToBack's LL-family shape: LL and LL128 take it
  const long long shard = max_shard_numel(full, 1);
  // Half of what the call needs (the guard included): short by far more than any rounding.
  Buf ar_in(n, t), ar_out(n, t), ar_short(n / 2 - kGuard, t), ar_loose(n / 2 - kGuard, t, false);
  Buf full_ok(full.numel(), t), shard_ok(shard, t), full_short(full.numel() / 2 - kGuard, t),
      shard_short(shard / 2 - kGuard, t), full_loose(full.numel() / 2 - kGuard, t, false);
  settle();
  auto& c = ctx().coll;
  cudaStream_t s = ctx().s;
  for (const bool ll128 : {false, true}) {
    const coll::AllReduceAlgo ar = ll128 ? coll::AllReduceAlgo::ll128 : coll::AllReduceAlgo::ll;
    const coll::ShardAlgo sh = ll128 ? coll::ShardAlgo::ll128 : coll::ShardAlgo::ll;
    c.set_all_reduce_algo(ar);
    c.set_all_gather_algo(sh);
    c.set_reduce_scatter_algo(sh);
    SCOPED_TRACE(ll128 ? "LL128" : "LL");
    EXPECT_EQ(c.all_reduce_algo(size_t(n) * 2, false), ar);
    EXPECT_EQ(c.all_gather_algo(full, 1, t), sh);
    EXPECT_EQ(c.reduce_scatter_algo(full, 1, t), sh);
    expect_rejected("all_reduce, short input", "all_reduce: in needs",
                    [&] { c.all_reduce(ar_short.p, ar_out.p, n, t, ReduceOp::sum, s); }, {&ar_out});
    expect_rejected("all_reduce, short output", "all_reduce: out needs",
                    [&] { c.all_reduce(ar_in.p, ar_short.p, n, t, ReduceOp::sum, s); }, {&ar_short});
    expect_rejected("all_reduce, short cudaMalloc'd output", "all_reduce: out needs",
                    [&] { c.all_reduce(ar_in.p, ar_loose.p, n, t, ReduceOp::sum, s); }, {&ar_loose});
    expect_rejected("all_reduce in place, short", "all_reduce: in needs",
                    [&] { c.all_reduce(ar_short.p, ar_short.p, n, t, ReduceOp::sum, s); }, {&ar_short});
    expect_rejected("all_gather, short input", "all_gather: in needs",
                    [&] { c.all_gather(shard_short.p, full_ok.p, full, 1, t, s); }, {&full_ok});
    expect_rejected("all_gather, short output", "all_gather: out needs",
                    [&] { c.all_gather(shard_ok.p, full_short.p, full, 1, t, s); }, {&full_short});
    expect_rejected("all_gather, short cudaMalloc'd output", "all_gather: out needs",
                    [&] { c.all_gather(shard_ok.p, full_loose.p, full, 1, t, s); }, {&full_loose});
    expect_rejected("reduce_scatter, short input", "reduce_scatter: in needs",
                    [&] { c.reduce_scatter(full_short.p, shard_ok.p, full, 1, t, ReduceOp::sum, s); }, {&shard_ok});
    expect_rejected("reduce_scatter, short output", "reduce_scatter: out needs",
                    [&] { c.reduce_scatter(full_ok.p, shard_short.p, full, 1, t, ReduceOp::sum, s); }, {&shard_short});
  }
  c.set_all_reduce_algo(coll::AllReduceAlgo::automatic);
  c.set_all_gather_algo(coll::ShardAlgo::automatic);
  c.set_reduce_scatter_algo(coll::ShardAlgo::automatic);
  still_works("short local buffers");
}

}  // namespace
