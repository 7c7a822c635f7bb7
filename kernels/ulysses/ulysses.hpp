// Ulysses attention forward (sequence parallel, README.md): input sharded by sequence rows,
// attention computed by head groups. The all-to-all to (S, H/W), the attention and the
// all-to-all back run in one kernel: no collective kernel, no reshape copies. Backward is not
// implemented.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>

#include "weave/runtime/communicator.hpp"

namespace weave::sp {

using bf16 = __nv_bfloat16;

struct UlyssesShape {
  int B = 1;
  long long S = 1;  // total sequence; rank r holds rows shard(S, W, r) (first S % W ranks +1 row)
  int Hq = 1, Hkv = 1, D = 128;
};

struct UlyssesOptions {
  bool causal = false;
  float softmax_scale = 0.f;  // 0: 1/sqrt(D)
  int num_comm_sms = -1;      // < 0: the tuner picks
};

struct UlyssesLaunchInfo {
  int num_comm_sms = 0;
  int compute_blocks = 0;
  bool tuned = false;
};

// Rows of the total sequence rank r holds: [begin, begin + rows).
struct RowShard {
  long long begin = 0, rows = 0;
};
RowShard ulysses_shard(long long S, int W, int rank);

class Ulysses {
 public:
  explicit Ulysses(runtime::Communicator& c);
  ~Ulysses();
  Ulysses(const Ulysses&) = delete;
  Ulysses& operator=(const Ulysses&) = delete;

  // Collective. q (B, L, Hq, D), k and v (B, L, Hkv, D), o (B, L, Hq, D), bf16 contiguous,
  // L = ulysses_shard(S, W, rank).rows. Rank r computes query heads [r*Hq/W, (r+1)*Hq/W) over the
  // whole sequence and writes each O tile straight into the rank that owns its rows. Hq not a
  // multiple of W is rejected; Hkv < W (GQA) replicates K/V heads. o must be addressable by
  // peers (symmetric heap or registered, at the same offset on every rank) with room for the
  // largest shard, B * ceil(S / W) * Hq * D elements, and must not overlap q, k or v; q, k, v
  // may be any device memory of this rank. Bad input on any rank, or shapes that differ across
  // ranks, throws weave::Error on every rank before any launch.
  UlyssesLaunchInfo forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, const UlyssesShape& s,
                            const UlyssesOptions& opt = {}, cudaStream_t stream = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

namespace detail {
// What is wrong with one rank's arguments of Ulysses::forward (empty: nothing), checked on every
// rank before any launch (forward also checks that o is peer-addressable with room for the
// largest shard); `rank` and `sm_count` are this rank's. `extent(name, p, bytes)` (when given)
// checks that q, k and v hold the bytes the shape needs. Exposed for the CPU tests.
using ExtentCheck = std::function<void(const char* name, const void* p, size_t bytes)>;
std::string ulysses_input_problem(const UlyssesShape& s, const UlyssesOptions& o, int W, int rank, int sm_count,
                                  const void* q, const void* k, const void* v, const void* out,
                                  const ExtentCheck& extent = {});
}  // namespace detail

}  // namespace weave::sp
