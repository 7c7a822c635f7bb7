// Shared pieces of the collectives tests (one translation unit per binary): the per-process
// communicator, weave collectives, NCCL reference, checker and stream; poisoned buffers with
// guards; checks; and the "rejected before any launch" helper.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../../bench/nccl_ref.cuh"
#include "check/seed.hpp"
#include "../primitives/common.hpp"
#include "collectives/collectives.hpp"
#include "weave/memory_order.cuh"
#include "weave/runtime/env.hpp"

namespace ct {

using namespace weave;
using coll::Shape;
using ref::OutMap;
using ref::Values;

inline constexpr long long kGuard = 64;  // elements after every output that no call may touch
inline const DType kTypes[] = {DType::bf16, DType::fp16, DType::fp32};
inline const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::max, ReduceOp::min};

// ---------------------------------------------------------------------------------------------
// Per-process state: one communicator (with a heap large enough for the collectives' scratch
// next to the test buffers), weave's collectives, the NCCL reference, a checker and a stream.
inline runtime::Communicator& comm() {
  auto& slot = wt::comm_slot();
  if (!slot) {
    runtime::CommOptions o;
    o.heap_bytes = size_t(1) << 30;
    slot = std::make_unique<runtime::Communicator>(o);
  }
  return *slot;
}

struct Ctx {
  coll::Collectives coll;
  ref::Checker check;
  cudaStream_t s = nullptr;
  explicit Ctx(runtime::Communicator& c) : coll(c), comm_(c) {
    WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  ~Ctx() {
    nccl_.reset();
    cudaStreamDestroy(s);
  }
  // Created on first use (collectively: every rank reaches the same first use); never where ranks
  // share a GPU, which NCCL refuses (`reference` then uses none).
  ref::NcclCollectives& nccl() {
    if (!nccl_) nccl_ = std::make_unique<ref::NcclCollectives>(comm_);
    return *nccl_;
  }

 private:
  runtime::Communicator& comm_;
  std::unique_ptr<ref::NcclCollectives> nccl_;
};
inline std::unique_ptr<Ctx>& ctx_slot() {
  static std::unique_ptr<Ctx> c;
  return c;
}
inline Ctx& ctx() {
  auto& c = ctx_slot();
  if (!c) c = std::make_unique<Ctx>(comm());
  return *c;
}
// NCCL and the collectives go before the communicator (a static, destroyed after main).
struct Teardown : ::testing::Environment {
  void TearDown() override { ctx_slot().reset(); }
};
inline const auto* const kTeardown = ::testing::AddGlobalTestEnvironment(new Teardown);

// Device work done and every rank past this point: no rank launches into buffers a peer is still
// poisoning, filling or checking.
inline void settle() {
  comm().sync(ctx().s);
  comm().barrier();
}

// A fresh per-case seed, the same on every rank.
inline uint64_t case_seed() {
  static uint64_t base = wt::job_seed(), n = 0;
  return ref::mix64(base + ++n);
}

// The stress tests' seed: rank 0's WEAVE_TEST_SEED (check::test_seed: the environment's, else
// drawn and printed by each rank) on every rank; rank 0 says which one runs, to replay with.
inline uint64_t stress_seed() {
  static const uint64_t seed = [] {
    const uint64_t mine = weave::check::test_seed();
    std::vector<uint64_t> all(comm().world());
    comm().bootstrap().all_gather(&mine, all.data(), sizeof mine);
    if (comm().rank() == 0)
      std::printf("stress tests use rank 0's seed: WEAVE_TEST_SEED=%llu replays them\n", (unsigned long long)all[0]);
    return all[0];
  }();
  return seed;
}
// WEAVE_STRESS_SCALE=k: the stress tests run k times as many rounds and calls (default 1, bounded).
inline int stress_scale() { return std::max(1, weave::env::get_int("WEAVE_STRESS_SCALE")); }
// Stress loops that wait on a peer's progress step by step run in small versions where ranks take
// turns on a GPU (wt::gpus_shared).
inline bool gpus_shared() { return wt::gpus_shared(comm()); }

using wt::spin_for_ns;
using wt::spin_ns;

// A buffer of `elems` elements plus the guard, poisoned (0xff bytes: NaN in every dtype). In the
// symmetric heap (every rank must ask for the same size) or, with `heap` false, cudaMalloc'd.
struct Buf {
  char* p = nullptr;
  size_t bytes;
  bool heap;
  Buf(long long elems, DType t, bool in_heap = true) : bytes((elems + kGuard) * dtype_size(t)), heap(in_heap) {
    if (heap)
      p = static_cast<char*>(comm().alloc(bytes));
    else
      WEAVE_CUDA_CHECK(cudaMalloc(&p, bytes));
    WEAVE_CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes, ctx().s));
  }
  ~Buf() {
    if (heap)
      comm().free(p);
    else
      cudaFree(p);
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

// Number of bytes in [p, p + bytes) that are no longer poison.
inline size_t unpoisoned(const void* p, size_t bytes) {
  std::vector<unsigned char> h(bytes);
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(ctx().s));
  WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
  return std::count_if(h.begin(), h.end(), [](unsigned char c) { return c != 0xff; });
}
// The guard after `numel` elements at p.
inline size_t guard_touched(const void* p, long long numel, DType t) {
  return unpoisoned(static_cast<const char*>(p) + numel * dtype_size(t), kGuard * dtype_size(t));
}

// `got` against `want` (NCCL's output) or, with want null, against the recomputed inputs.
inline ref::Checker::Result verify(const void* got, const void* want, const OutMap& m, DType t, uint64_t seed,
                                   ReduceOp op = ReduceOp::sum, Values v = Values::uniform) {
  Ctx& x = ctx();
  x.check.reset(x.s);
  x.check.check(got, want, m, t, seed, v, op, v == Values::integers ? 0.f : ref::sum_rtol(t, comm().world()), x.s);
  return x.check.result(x.s);
}

// The reference output a case compares with: NCCL's, run into `want` by `run(nccl)`, or where
// ranks share a GPU (NCCL refuses them) none, and the case's output is compared with the values the
// checker recomputes from the inputs' seeds: the reference NCCL's own output is checked against.
struct Want {
  const void* p;
  const char* name;
};
template <class F>
inline Want reference(const Buf& want, F&& run) {
  if (gpus_shared()) return {nullptr, "the recomputed reference"};
  run(ctx().nccl());
  return {want.p, "NCCL"};
}
// The NCCL output itself against the recomputed reference (a harness bug if it is off).
inline void expect_reference_ok(const Want& w, const OutMap& m, DType t, uint64_t seed, ReduceOp op = ReduceOp::sum) {
  if (!w.p) return;
  const auto r = verify(w.p, nullptr, m, t, seed, op);
  EXPECT_TRUE(r.ok()) << "the NCCL reference itself is off (test harness bug): " << r.str();
}

inline std::string str(const Shape& s) {
  std::string o;
  for (int i = 0; i < s.ndim; ++i) o += (i ? "x" : "") + std::to_string(s.d[i]);
  return o;
}
inline Shape shape(std::initializer_list<long long> d) {
  Shape s;
  s.ndim = static_cast<int>(d.size());
  int i = 0;
  for (long long x : d) s.d[i++] = x;
  return s;
}
inline long long max_shard_numel(const Shape& full, int dim) {
  long long m = 0;
  for (int r = 0; r < comm().world(); ++r) m = std::max(m, ref::shard_numel(full, dim, comm().world(), r));
  return m;
}

// ---------------------------------------------------------------------------------------------
// Rejections. `f` must throw weave::Error whose message contains `needle`, having launched
// nothing: the buffers in `untouched` are still all poison afterwards, and a valid call right
// after still works (no rank is left waiting for a kernel its peers never started).
template <class F>
inline void expect_rejected(const char* what, const char* needle, F&& f, std::initializer_list<const Buf*> untouched) {
  try {
    f();
    ADD_FAILURE() << what << ": accepted, expected weave::Error mentioning '" << needle << "'";
  } catch (const weave::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << what << ": the message does not mention '" << needle << "': " << e.what();
  }
  comm().sync(ctx().s);
  for (const Buf* b : untouched)
    EXPECT_EQ(unpoisoned(b->p, b->bytes), 0u) << what << ": something was written (a kernel ran)";
  comm().barrier();
}

}  // namespace ct
