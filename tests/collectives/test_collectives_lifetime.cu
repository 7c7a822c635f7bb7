// Objects destroyed while their calls still run, on 2+ ranks (weave-run). A destroyed signal
// set or Collectives object hands its heap memory back; a late signal or line from a call still
// running (here, or on a peer that is behind) must not land in whatever gets that memory next:
// a new object's counters would start above 0 (its waits pass early) and a tensor's data would
// change under its owner.
//
// - A signal set destroyed while a kernel that signals it on every rank is still held back on one
//   rank: the tensor allocated in its place keeps its contents, and a new set there starts at 0.
// - Collectives objects, in a loop: make one, enqueue 50 calls (random kinds, sizes and paths)
//   with one rank held back, destroy it without synchronizing, make the next with other shapes;
//   every call's output is checked exactly (small-integer inputs).
//
// Seeds are printed; WEAVE_TEST_SEED replays, WEAVE_STRESS_SCALE=k runs k times the iterations.
#include <random>
#include <string>
#include <vector>

#include "common.hpp"
#include "weave/signal.cuh"

using namespace ct;

namespace {

// After `delay_ns`, every rank's counter 0..count-1 of `s` gets one signal from this rank.
__global__ void late_signal(signals s, unsigned long long delay_ns) {
  spin_for_ns(delay_ns);
  for (int i = threadIdx.x; i < s.count; i += blockDim.x) signal_all(s, i);
}

TEST(Lifetime, SignalSetDestroyedWhileSignalled) {
  const int W = comm().world(), me = comm().rank();
  constexpr int kCount = 64;
  cudaStream_t other;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  settle();
  for (int it = 0; it < 4 * stress_scale(); ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it) + ", rank " + std::to_string(me));
    auto old = std::make_unique<runtime::SignalSet>(comm().signals("lifetime, destroyed", kCount));
    unsigned long long* where = old->view().ptr[me];
    // One rank signals 50 ms late: long after every host below has moved on, unless the
    // destructor waits.
    late_signal<<<1, 64, 0, ctx().s>>>(old->view(), me == it % W ? 50'000'000ull : 0);
    WEAVE_CUDA_CHECK(cudaGetLastError());
    old.reset();  // no synchronization before
    {
      // A tensor in the same place, written on another stream: it must keep what was written.
      runtime::SymmetricTensor<unsigned long long> t(comm(), kCount);
      ASSERT_EQ(t.data(), where) << "the heap gave other memory: this test would not test anything";
      WEAVE_CUDA_CHECK(cudaMemsetAsync(t.data(), 0x11, t.bytes(), other));
      WEAVE_CUDA_CHECK(cudaStreamSynchronize(other));
      comm().sync(ctx().s);
      comm().barrier();
      std::vector<unsigned long long> h(kCount);
      WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), t.data(), t.bytes(), cudaMemcpyDeviceToHost));
      int changed = 0;
      for (unsigned long long x : h) changed += x != 0x1111111111111111ull;
      EXPECT_EQ(changed, 0) << "a destroyed set's late signals landed in the tensor that took its memory";
      comm().barrier();
    }
    // A new set in the same place starts at 0 and counts only its own signals.
    runtime::SignalSet fresh = comm().signals("lifetime, new", kCount);
    ASSERT_EQ(fresh.view().ptr[me], where);
    late_signal<<<1, 64, 0, ctx().s>>>(fresh.view(), 0);
    settle();
    std::vector<unsigned long long> h(kCount);
    WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), fresh.view().ptr[me], kCount * 8, cudaMemcpyDeviceToHost));
    for (int i = 0; i < kCount; ++i) EXPECT_EQ(h[i], static_cast<unsigned long long>(W)) << "counter " << i;
  }
  WEAVE_CUDA_CHECK(cudaStreamDestroy(other));
}

// ---------------------------------------------------------------------------------------------

enum class Kind { all_reduce, all_gather, reduce_scatter };

struct Call {
  Kind kind;
  DType t;
  long long count = 0;
  Shape full;
  int dim = 0;
  uint64_t seed = 0;
  unsigned long long delay_ns = 0;  // the late rank's wait before the call
};

// Sizes 4 KiB..16 MiB per rank, any 2-D shape (LL only where it fits; direct otherwise).
Call random_call(std::mt19937_64& rng, int W) {
  Call c;
  c.kind = static_cast<Kind>(rng() % 3);
  c.t = kTypes[rng() % 3];
  const long long e = dtype_size(c.t);
  const long long bytes = 4096LL << (rng() % 13), elems = std::max<long long>(1, bytes / e - (long long)(rng() % 5));
  c.delay_ns = rng() % 20001;
  if (c.kind == Kind::all_reduce) {
    c.count = elems;
    return c;
  }
  c.full.ndim = 2;
  c.dim = static_cast<int>(rng() % 2);
  const long long cols = 1 + static_cast<long long>(rng() % 3000);
  const long long total = c.kind == Kind::all_gather ? elems * W : elems;  // all_gather: elems per shard
  c.full.d[0] = std::max<long long>(1, total / cols);
  c.full.d[1] = cols;
  return c;
}

TEST(Lifetime, CollectivesDestroyedWithCallsInFlight) {
  Ctx& x = ctx();
  const int W = comm().world(), me = comm().rank();
  constexpr int kCalls = 50;
  // The largest buffer: an all_gather output of W shards of up to 16 MiB (counted in fp32 elements).
  const long long max_elems = (static_cast<long long>(W) * (16 << 20) + 65536) / 4;
  Buf in(max_elems, DType::fp32), out(max_elems, DType::fp32);
  std::mt19937_64 rng(stress_seed() ^ 0x11FE);
  const coll::AllReduceAlgo ar[] = {coll::AllReduceAlgo::automatic, coll::AllReduceAlgo::ll, coll::AllReduceAlgo::ll128,
                                    coll::AllReduceAlgo::two_shot, coll::AllReduceAlgo::push};
  const coll::ShardAlgo sh[] = {coll::ShardAlgo::automatic, coll::ShardAlgo::ll, coll::ShardAlgo::ll128,
                                coll::ShardAlgo::direct, coll::ShardAlgo::automatic};
  settle();
  // Ranks sharing one GPU take turns for every step of every call: a small version there.
  const int iterations = gpus_shared() ? 2 : 12 * stress_scale();
  for (int it = 0; it < iterations; ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it) + ", rank " + std::to_string(me));
    auto co = std::make_unique<coll::Collectives>(comm());
    co->set_all_reduce_algo(ar[it % 5]);
    co->set_all_gather_algo(sh[it % 5]);
    co->set_reduce_scatter_algo(sh[(it + 2) % 5]);
    const int late = it % W;
    std::vector<Call> calls;
    for (int i = 0; i < kCalls; ++i) {
      calls.push_back(random_call(rng, W));
      calls.back().seed = ref::mix64(stress_seed() + 7919ull * it + i);
    }
    x.check.reset(x.s);
    comm().barrier();
    if (me == late) spin_ns<<<1, 1, 0, x.s>>>(2'000'000ull);
    for (int i = 0; i < kCalls; ++i) {
      const Call& c = calls[i];
      OutMap m;
      long long in_n = 0;
      if (c.kind == Kind::all_reduce) {
        in_n = c.count, m = ref::map_all_reduce(c.count, W, me);
      } else if (c.kind == Kind::all_gather) {
        in_n = ref::shard_numel(c.full, c.dim, W, me), m = ref::map_all_gather(c.full, c.dim, W, me);
      } else {
        in_n = c.full.numel(), m = ref::map_reduce_scatter(c.full, c.dim, W, me);
      }
      ref::fill(in.p, in_n, c.t, c.seed, me, Values::integers, x.s);
      if (me == late) spin_ns<<<1, 1, 0, x.s>>>(c.delay_ns);
      if (c.kind == Kind::all_reduce) co->all_reduce(in.p, out.p, c.count, c.t, ReduceOp::sum, x.s);
      else if (c.kind == Kind::all_gather) co->all_gather(in.p, out.p, c.full, c.dim, c.t, x.s);
      else co->reduce_scatter(in.p, out.p, c.full, c.dim, c.t, ReduceOp::sum, x.s);
      x.check.check(out.p, nullptr, m, c.t, c.seed, Values::integers, ReduceOp::sum, 0.f, x.s, i + 1);
    }
    co.reset();  // calls still in flight (one rank 2 ms behind); no synchronization before
    comm().sync(x.s);  // a wait that timed out (or a stopped call) is reported with its record
    const auto r = x.check.result(x.s);
    EXPECT_TRUE(r.ok()) << r.str()
                        << (r.first_tag > 0 ? " (call " + std::to_string(r.first_tag - 1) + " of the object)" : "");
    comm().barrier();
  }
  settle();
}

}  // namespace
