// Ring attention forward (sequence parallel, README.md): the sequence is sharded across the W
// ranks; every rank keeps its queries and attends to every rank's keys and values, in one
// persistent kernel per call (communicator SMs move K/V chunks, compute SMs run the attention
// pipeline on chunks as they become ready). Backward is not implemented.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>

#include "weave/runtime/communicator.hpp"

namespace weave::sp {

using bf16 = __nv_bfloat16;

// How the total sequence S is split over W ranks (pure, CPU-tested, shared with the benchmark
// and the tests). The sequence is cut into `chunks(W)` chunks of near-equal length (the first
// S % chunks get one row more); rank r holds the chunks `chunk_of(r, i)`, i < chunks_per_rank,
// stored back to back in that order.
enum class Sharding : int {
  Contiguous = 0,  // chunk r: rank r holds rows [r*S/W, (r+1)*S/W)
  Zigzag = 1,      // 2W chunks; rank r holds chunks r and 2W-1-r (balanced causal work)
};
struct ChunkRange {
  long long begin = 0, rows = 0;  // global rows [begin, begin + rows)
};
int chunks_per_rank(Sharding sh);
ChunkRange chunk_range(long long S, int W, Sharding sh, int rank, int i);  // i < chunks_per_rank
long long local_rows(long long S, int W, Sharding sh, int rank);            // sum of its chunks

struct RingShape {
  int B = 1;
  long long S = 1;  // total sequence over all ranks
  int Hq = 1, Hkv = 1, D = 128;
};

struct RingOptions {
  bool causal = false;
  float softmax_scale = 0.f;  // 0: 1/sqrt(D)
  Sharding sharding = Sharding::Zigzag;
  int num_comm_sms = -1;  // < 0: the tuner picks (cached per shape, world, device)
};

struct RingLaunchInfo {
  int num_comm_sms = 0;
  int compute_blocks = 0;
  bool tuned = false;
  // This rank's K/V rows were read from k and v in place (every own chunk starts on a 128-row
  // key block and ends on one or at S), not copied into the gathered buffers first.
  bool own_in_place = false;
};

class RingAttention {
 public:
  explicit RingAttention(runtime::Communicator& c);
  ~RingAttention();
  RingAttention(const RingAttention&) = delete;
  RingAttention& operator=(const RingAttention&) = delete;

  // Collective. This rank's shard of the sequence in `sharding` order:
  //   q (B, L, Hq, D), k and v (B, L, Hkv, D), o (B, L, Hq, D) bf16 contiguous, L = local_rows();
  //   lse (B, Hq, L) fp32 or null: natural-log softmax denominator of each query row over the
  //   whole sequence, scale included (same convention as weave::attention::forward).
  // q, k, v, o and lse may be any device memory of this rank (only this rank reads or writes
  // them; the K/V exchange goes through the object's own symmetric buffers); o may be q itself
  // (in place) but must not overlap k, v or lse. Shapes, options and dtypes are checked across
  // ranks; bad input on any rank throws weave::Error on every rank before any launch.
  RingLaunchInfo forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, const RingShape& s,
                         const RingOptions& opt = {}, cudaStream_t stream = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

namespace detail {
// What is wrong with one rank's arguments of RingAttention::forward (empty: nothing), checked
// on every rank before any launch; `rank` and `sm_count` are this rank's. `extent(name, p, bytes)`
// (when given) checks that a buffer holds the bytes the shape needs. Exposed for the CPU tests.
using ExtentCheck = std::function<void(const char* name, const void* p, size_t bytes)>;
std::string ring_input_problem(const RingShape& s, const RingOptions& o, int W, int rank, int sm_count, const void* q,
                               const void* k, const void* v, const void* out, const void* lse,
                               const ExtentCheck& extent = {});
}  // namespace detail

}  // namespace weave::sp
