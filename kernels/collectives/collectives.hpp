// Collectives on symmetric buffers, written on weave's primitives: all_reduce, all_gather and
// reduce_scatter along any dimension of a 1-4-D tensor (in the final layout, no transposes), and
// the Ulysses all-to-all. Every call is collective: all ranks call it with the same arguments
// (checked) on buffers in the symmetric heap or registered with the communicator (checked).
#pragma once
#include <cuda_runtime.h>

#include <memory>

#include "weave/common/split.hpp"
#include "weave/runtime/communicator.hpp"
#include "weave/types.hpp"

namespace weave::coll {

// A row-major tensor shape of 1 to 4 dimensions, innermost last.
struct Shape {
  int ndim = 1;
  long long d[4] = {1, 1, 1, 1};
  long long numel() const {
    long long n = 1;
    for (int i = 0; i < ndim; ++i) n *= d[i];
    return n;
  }
};

// How a dimension of n elements is split over `world` ranks (weave/common/split.hpp). Used by
// all_gather, reduce_scatter and the Ulysses sequence split.
using Range = Part<long long>;
__host__ __device__ inline Range shard(long long n, int world, int r) { return near_equal_part(n, world, r); }

// all_reduce algorithms: one-shot (every rank reads every input: one phase, (W-1)x the bytes per
// rank), two-shot (each rank reduces 1/W of the elements and writes them to every rank), LL
// (every rank writes its input, with a flag in every 8-byte line, into every rank's scratch: no
// signal phase, twice the bytes; up to Collectives::kLLMaxBytes, 4-byte aligned buffers), and
// push (two-shot whose first half stores each slab into its owner's scratch instead of the owner
// loading it, pipelined per warp through a bounded scratch ring made by the first push call;
// for large inputs), and LL128 (LL with one flag per 128-byte line: 3 % more bytes instead of
// twice, in a scratch made by the first LL128 call; up to Collectives::ll128_max_bytes).
enum class AllReduceAlgo : int { automatic = 0, one_shot = 1, two_shot = 2, ll = 3, push = 4, ll128 = 5 };

// all_gather / reduce_scatter algorithms: direct (peers' user buffers read or written in place,
// framed by an arrival and a completion signal phase) and LL (flagged lines through the library's
// scratch, no signal phase, twice the bytes; for shards up to Collectives::kLLMaxBytes whose rows
// are whole 4-byte words, on 4-byte aligned buffers), and LL128 (the same with one flag per 128-byte
// line, for shards up to Collectives::ll128_max_bytes).
enum class ShardAlgo : int { automatic = 0, direct = 1, ll = 2, ll128 = 3 };

// Whether an algorithm reaches `in` and `out` from this rank only (LL, LL128: peers write only the
// library's scratch). Then they may be any device memory of this rank; every other algorithm
// needs them in the symmetric heap or registered.
constexpr bool local_buffers(AllReduceAlgo a) { return a == AllReduceAlgo::ll || a == AllReduceAlgo::ll128; }
constexpr bool local_buffers(ShardAlgo a) { return a == ShardAlgo::ll || a == ShardAlgo::ll128; }

// Which of a call's buffers peers reach at this rank's place (Communicator::peers), from the plans:
// the ones whose places the call agreement compares. The same answer on every rank.
struct Reached {
  bool in = false, out = false;
};
// all_reduce: one-shot reads every rank's input; two-shot also writes every rank's output; push
// writes the outputs only, unless it may still fall back to two-shot (`push_settled` false: an
// automatic push whose scratch is not made yet).
constexpr Reached reached(AllReduceAlgo a, bool push_settled) {
  return local_buffers(a)                     ? Reached{}
         : a == AllReduceAlgo::one_shot       ? Reached{true, false}
         : a == AllReduceAlgo::push && push_settled ? Reached{false, true}
                                              : Reached{true, true};
}
// Direct all_gather pushes into every rank's output; direct reduce_scatter reads every rank's
// input; the other side is this rank's alone (in place, at its own shard).
constexpr Reached reached(ShardAlgo a, bool gather) {
  return local_buffers(a) ? Reached{} : Reached{!gather, gather};
}
// The Ulysses all_to_all pushes into every rank's output.
constexpr Reached reached_ulysses() { return Reached{false, true}; }

class Collectives {
 public:
  static constexpr size_t kLLMaxBytes = size_t(1) << 20;
  // The most bytes one LL128 call sends to one peer (all_reduce: the input; all_gather: a shard;
  // reduce_scatter: a slab): 16 MiB / world, so that the scratch is ~33 MiB at any world size.
  static size_t ll128_max_bytes(int world) { return (size_t(16) << 20) / world / 4 * 4; }
  // Collective: allocates the signal sets and scratch it needs in the communicator's heap.
  explicit Collectives(runtime::Communicator& comm);
  // Heap bytes the constructor's scratch takes at this world size (the LL scratch: 2 parities x
  // world sources of kLLMaxBytes / 4 8-byte lines); later LL128 and push calls add their own.
  static size_t scratch_bytes(int world) { return 2 * size_t(world) * (kLLMaxBytes / 4) * 8; }
  ~Collectives();

  // out[i] = op over ranks of in[i], `count` elements; in == out is in place.
  void all_reduce(const void* in, void* out, size_t count, DType t, ReduceOp op, cudaStream_t s);
  // Overrides the per-size choice (for benchmarks and tests). In place never uses one-shot; LL
  // falls back where the size or alignment does not allow it.
  void set_all_reduce_algo(AllReduceAlgo a);
  // The algorithm all_reduce picks for `bytes` per rank with the current setting.
  AllReduceAlgo all_reduce_algo(size_t bytes, bool in_place, bool aligned4 = true) const;

  // The full tensor has shape `full`; along `dim` rank r owns shard(full.d[dim], world, r).
  // all_gather: `in` is this rank's shard (shape `full` with d[dim] = its shard size), `out` the full tensor.
  void all_gather(const void* in, void* out, const Shape& full, int dim, DType t, cudaStream_t s);
  // reduce_scatter: `in` is a full tensor on every rank, `out` this rank's shard of the reduction.
  // In place (NCCL's convention): all_gather's `in` may be this rank's slice of `out`, and
  // reduce_scatter's `out` this rank's slice of `in`, where that slice is contiguous (dim 0, or
  // every dimension before `dim` of size 1).
  void reduce_scatter(const void* in, void* out, const Shape& full, int dim, DType t, ReduceOp op, cudaStream_t s);
  // Override the per-size choice (benchmarks and tests); LL falls back to direct where the shape,
  // size or alignment does not allow it.
  void set_all_gather_algo(ShardAlgo a);
  void set_reduce_scatter_algo(ShardAlgo a);
  // The algorithm each picks for this call with the current setting.
  ShardAlgo all_gather_algo(const Shape& full, int dim, DType t, bool aligned4 = true) const;
  ShardAlgo reduce_scatter_algo(const Shape& full, int dim, DType t, bool aligned4 = true) const;

  // Ulysses: (B, S/W, H, D) -> (B, S, H/W, D) and back; S split by shard(S, W, r), H % W == 0.
  void all_to_all_seq_to_head(const void* in, void* out, long long B, long long S, long long H, long long D, DType t,
                              cudaStream_t s);
  void all_to_all_head_to_seq(const void* in, void* out, long long B, long long S, long long H, long long D, DType t,
                              cudaStream_t s);

  // Tests only: the LL flags' period (plan.hpp, ll_flag; odd, >= 3; default 2^32 - 1), short
  // enough that a test reaches the scratch restart. Collective: every rank sets the same value.
  void set_ll_flag_period(unsigned period);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::coll
