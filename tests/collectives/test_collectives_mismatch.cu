// One rank repeats its previous collective call exactly while the others change their arguments:
// with WEAVE_DEBUG=1 (set by CTest) every call is checked with every rank, so every rank must get
// weave::Error before anything is launched and stay usable. An implementation that compares
// arguments across ranks only when a rank's own arguments changed lets the repeating rank launch
// alone; this test then fails (no error on that rank, whose kernel waits for peers that never come
// until the wait times out) instead of passing. Without debug mode the repeating rank may launch
// before it sees the difference and is then stopped (tests/tp/test_call_agreement.cu covers that).
// It has its own binary so that such a failure cannot disturb test_collectives.
#include <functional>
#include <string>

#include "common.hpp"

using namespace ct;

namespace {

TEST(Collectives, RejectsDifferenceAfterAnIdenticalCall) {
  const int W = comm().world(), me = comm().rank();
  const Shape full = shape({1000, 777}), wider = shape({1000, 778});
  Buf a(wider.numel(), DType::bf16), b(wider.numel(), DType::bf16);
  const uint64_t seed = case_seed();
  ref::fill(a.p, ref::shard_numel(full, 0, W, me), DType::bf16, seed, me, Values::uniform, ctx().s);
  settle();
  ctx().coll.all_gather(a.p, b.p, full, 0, DType::bf16, ctx().s);
  settle();
  auto r = verify(b.p, nullptr, ref::map_all_gather(full, 0, W, me), DType::bf16, seed);
  EXPECT_TRUE(r.ok()) << "the first, valid all_gather: " << r.str();
  WEAVE_CUDA_CHECK(cudaMemsetAsync(b.p, 0xff, b.bytes, ctx().s));
  settle();
  expect_rejected("all_gather, rank 0 repeats its last call, the others change the shape", "differ",
                  [&] { ctx().coll.all_gather(a.p, b.p, me == 0 ? full : wider, 0, DType::bf16, ctx().s); }, {&b});
  // Still usable afterwards: the valid call again.
  ctx().coll.all_gather(a.p, b.p, full, 0, DType::bf16, ctx().s);
  settle();
  r = verify(b.p, nullptr, ref::map_all_gather(full, 0, W, me), DType::bf16, seed);
  EXPECT_TRUE(r.ok()) << "the valid all_gather after the rejected one: " << r.str();
}

}  // namespace
