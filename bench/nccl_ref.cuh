// The reference side of the collectives tests and of `weave-bench collectives`:
//  - (nccl_comm.hpp: an NCCL communicator made from weave's bootstrap);
//  - NcclCollectives: what weave::coll::Collectives does, done with NCCL plus the copies a user
//    needs when a rank's piece is not contiguous in the final layout (the bench times these too);
//  - deterministic inputs (a hash of seed, rank and index) so any rank can recompute any rank's
//    input on the device, and a checker that compares an output element by element against
//    that recomputation or against another buffer (NCCL's output).
// Included by one translation unit per binary (tests/collectives, tools/weave-bench).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "collectives/collectives.hpp"
#include "weave/common/error.hpp"
#include "weave/config.hpp"
#include "weave/runtime/communicator.hpp"
#include "weave/types.hpp"
#include "nccl_comm.hpp"

namespace weave::ref {

inline ncclDataType_t nccl_type(DType t) {
  return t == DType::bf16 ? ncclBfloat16 : t == DType::fp16 ? ncclFloat16 : ncclFloat32;
}
inline ncclRedOp_t nccl_op(ReduceOp o) { return o == ReduceOp::sum ? ncclSum : o == ReduceOp::max ? ncclMax : ncclMin; }


// ---------------------------------------------------------------------------------------------
// Batched 2-D copies (rows x width bytes, any pitches): the layout changes around NCCL calls.
struct Copy2D {
  const char* src;
  char* dst;
  long long rows, width, spitch, dpitch;  // bytes
};
struct Copy2DBatch {
  Copy2D c[kMaxWorld];
};

namespace detail {
constexpr int kCopyThreads = 256, kCopyVecsPerItem = 4 * kCopyThreads;

// One work item is up to kCopyVecsPerItem vectors of one row, so the index arithmetic (a 64-bit
// division) is paid once per item, not once per element. blockIdx.y selects the copy.
template <class V>
__global__ void copy2d_kernel(const __grid_constant__ Copy2DBatch b) {
  const Copy2D& c = b.c[blockIdx.y];
  const long long wv = c.width / static_cast<long long>(sizeof(V));
  const long long per_row = (wv + kCopyVecsPerItem - 1) / kCopyVecsPerItem, items = c.rows * per_row;
  for (long long it = blockIdx.x; it < items; it += gridDim.x) {
    const long long r = per_row == 1 ? it : it / per_row, k0 = (it - r * per_row) * kCopyVecsPerItem;
    const long long k1 = k0 + kCopyVecsPerItem < wv ? k0 + kCopyVecsPerItem : wv;
    const V* s = reinterpret_cast<const V*>(c.src + r * c.spitch);
    V* d = reinterpret_cast<V*>(c.dst + r * c.dpitch);
    for (long long k = k0 + threadIdx.x; k < k1; k += blockDim.x) d[k] = s[k];
  }
}
}  // namespace detail

// Copies every non-empty entry of `v` (at most kMaxWorld) in one launch, with the widest vector
// that every address, width and pitch allows.
inline void copy2d(const std::vector<Copy2D>& v, int sms, cudaStream_t s) {
  Copy2DBatch b{};
  int n = 0;
  long long align = 16, items = 0;
  for (const Copy2D& c : v) {
    if (c.rows <= 0 || c.width <= 0) continue;
    WEAVE_CHECK(n < kMaxWorld, "copy2d: more than ", kMaxWorld, " copies in one batch");
    b.c[n++] = c;
    for (long long x :
         {reinterpret_cast<long long>(c.src), reinterpret_cast<long long>(c.dst), c.width, c.spitch, c.dpitch})
      while (align > 1 && x % align) align /= 2;
    items = std::max(items, c.rows * ((c.width + 16 * detail::kCopyVecsPerItem - 1) / (16 * detail::kCopyVecsPerItem)));
  }
  if (n == 0) return;
  const dim3 grid(static_cast<unsigned>(std::clamp<long long>(items, 1, 8LL * sms)), n);
  if (align == 16)
    detail::copy2d_kernel<uint4><<<grid, detail::kCopyThreads, 0, s>>>(b);
  else if (align == 8)
    detail::copy2d_kernel<uint2><<<grid, detail::kCopyThreads, 0, s>>>(b);
  else if (align == 4)
    detail::copy2d_kernel<uint32_t><<<grid, detail::kCopyThreads, 0, s>>>(b);
  else if (align == 2)
    detail::copy2d_kernel<uint16_t><<<grid, detail::kCopyThreads, 0, s>>>(b);
  else
    detail::copy2d_kernel<uint8_t><<<grid, detail::kCopyThreads, 0, s>>>(b);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

// A tensor seen as (outer, n, inner) around dimension `dim`.
struct Split {
  long long outer, n, inner;
};
inline Split split(const coll::Shape& s, int dim) {
  WEAVE_CHECK(s.ndim >= 1 && s.ndim <= 4 && dim >= 0 && dim < s.ndim, "split: bad shape/dim");
  Split v{1, s.d[dim], 1};
  for (int i = 0; i < dim; ++i) v.outer *= s.d[i];
  for (int i = dim + 1; i < s.ndim; ++i) v.inner *= s.d[i];
  return v;
}

// ---------------------------------------------------------------------------------------------
// The NCCL baseline. Even splits use NCCL's own collective; uneven splits (a dimension not
// divisible by the world size) use the grouped rooted form (ncclBroadcast / ncclReduce per
// root), which is how NCCL users write all_gatherv / reduce_scatterv. When a rank's piece is not
// contiguous in the final layout (dimensions before `dim` larger than 1), the data goes through
// a chunk-major staging buffer and a copy kernel. Ulysses uses grouped ncclSend/ncclRecv (the
// counts differ per peer when S % W != 0), packing and unpacking around it.
class NcclCollectives {
 public:
  explicit NcclCollectives(runtime::Communicator& c) : c_(c), nccl_(c), sms_(c.sm_count()) {}
  ~NcclCollectives() {
    for (char* p : staging_) cudaFree(p);
  }
  ncclComm_t comm() const { return nccl_.get(); }

  void all_reduce(const void* in, void* out, size_t count, DType t, ReduceOp op, cudaStream_t s) {
    if (count) WEAVE_NCCL_CHECK(ncclAllReduce(in, out, count, nccl_type(t), nccl_op(op), nccl_.get(), s));
  }

  void all_gather(const void* in, void* out, const coll::Shape& full, int dim, DType t, cudaStream_t s) {
    if (full.numel() == 0) return;
    const int W = c_.world(), me = c_.rank();
    const long long e = dtype_size(t);
    const Split sp = split(full, dim);
    char* o = static_cast<char*>(out);
    // Chunk r (rank r's shard, dense) lands at dst[r]: in `out` directly when contiguous there.
    char* stage = sp.outer == 1 ? o : staging(0, full.numel() * e);
    std::vector<char*> dst(W);  // chunk-major; with outer == 1 that is exactly `out`'s layout
    for (int r = 0; r < W; ++r) dst[r] = stage + chunk_off(sp, W, r) * e;
    if (sp.n % W == 0) {
      WEAVE_NCCL_CHECK(ncclAllGather(in, dst[0], chunk(sp, W, me), nccl_type(t), nccl_.get(), s));
    } else {
      WEAVE_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < W; ++r)
        if (long long n = chunk(sp, W, r))
          WEAVE_NCCL_CHECK(ncclBroadcast(r == me ? in : dst[r], dst[r], n, nccl_type(t), r, nccl_.get(), s));
      WEAVE_NCCL_CHECK(ncclGroupEnd());
    }
    if (sp.outer == 1) return;
    std::vector<Copy2D> cp;
    for (int r = 0; r < W; ++r) {
      const coll::Range g = coll::shard(sp.n, W, r);
      const long long w = g.size * sp.inner * e;
      cp.push_back({dst[r], o + g.begin * sp.inner * e, sp.outer, w, w, sp.n * sp.inner * e});
    }
    copy2d(cp, sms_, s);
  }

  void reduce_scatter(const void* in, void* out, const coll::Shape& full, int dim, DType t, ReduceOp op,
                      cudaStream_t s) {
    if (full.numel() == 0) return;
    const int W = c_.world(), me = c_.rank();
    const long long e = dtype_size(t);
    const Split sp = split(full, dim);
    const char* i = static_cast<const char*>(in);
    std::vector<const char*> src(W);
    if (sp.outer == 1) {
      for (int r = 0; r < W; ++r) src[r] = i + coll::shard(sp.n, W, r).begin * sp.inner * e;
    } else {
      char* stage = staging(0, full.numel() * e);
      std::vector<Copy2D> cp;
      for (int r = 0; r < W; ++r) {
        const coll::Range g = coll::shard(sp.n, W, r);
        const long long w = g.size * sp.inner * e;
        src[r] = stage + chunk_off(sp, W, r) * e;
        cp.push_back(
            {i + g.begin * sp.inner * e, stage + chunk_off(sp, W, r) * e, sp.outer, w, sp.n * sp.inner * e, w});
      }
      copy2d(cp, sms_, s);
    }
    if (sp.n % W == 0) {
      WEAVE_NCCL_CHECK(ncclReduceScatter(src[0], out, chunk(sp, W, me), nccl_type(t), nccl_op(op), nccl_.get(), s));
    } else {
      WEAVE_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < W; ++r)
        if (long long n = chunk(sp, W, r)) {
          // Only the root's recvbuff is written; the others pass their send buffer (in-place form).
          void* recv = r == me ? out : const_cast<char*>(src[r]);
          WEAVE_NCCL_CHECK(ncclReduce(src[r], recv, n, nccl_type(t), nccl_op(op), r, nccl_.get(), s));
        }
      WEAVE_NCCL_CHECK(ncclGroupEnd());
    }
  }

  // (B, S_me, H, D) -> (B, S, H/W, D): rank q gets heads [q*H/W, (q+1)*H/W) of our sequence part.
  void all_to_all_seq_to_head(const void* in, void* out, long long B, long long S, long long H, long long D, DType t,
                              cudaStream_t s) {
    const int W = c_.world(), me = c_.rank();
    const long long e = dtype_size(t), Hq = H / W, row = Hq * D * e;
    const coll::Range mine = coll::shard(S, W, me);
    // Pack: chunk q = (B, S_me, Hq, D), dense, one after the other.
    char* send = staging(0, B * mine.size * H * D * e);
    std::vector<Copy2D> cp;
    for (int q = 0; q < W; ++q)
      cp.push_back(
          {static_cast<const char*>(in) + q * row, send + q * B * mine.size * row, B * mine.size, row, H * D * e, row});
    copy2d(cp, sms_, s);
    // Receive chunk q = (B, S_q, Hq, D); it is out[:, S_q range] itself when B == 1.
    char* o = static_cast<char*>(out);
    char* recv = B == 1 ? o : staging(1, B * S * row);
    WEAVE_NCCL_CHECK(ncclGroupStart());
    for (int q = 0; q < W; ++q) {
      const coll::Range g = coll::shard(S, W, q);
      if (B * mine.size > 0)
        WEAVE_NCCL_CHECK(
            ncclSend(send + q * B * mine.size * row, B * mine.size * row / e, nccl_type(t), q, nccl_.get(), s));
      if (B * g.size > 0)
        WEAVE_NCCL_CHECK(ncclRecv(recv + B * g.begin * row, B * g.size * row / e, nccl_type(t), q, nccl_.get(), s));
    }
    WEAVE_NCCL_CHECK(ncclGroupEnd());
    if (B == 1) return;
    cp.clear();
    for (int q = 0; q < W; ++q) {
      const coll::Range g = coll::shard(S, W, q);
      cp.push_back({recv + B * g.begin * row, o + g.begin * row, B, g.size * row, g.size * row, S * row});
    }
    copy2d(cp, sms_, s);
  }

  // (B, S, H/W, D) -> (B, S_me, H, D): rank q gets our heads for its sequence part.
  void all_to_all_head_to_seq(const void* in, void* out, long long B, long long S, long long H, long long D, DType t,
                              cudaStream_t s) {
    const int W = c_.world(), me = c_.rank();
    const long long e = dtype_size(t), Hq = H / W, row = Hq * D * e;
    const coll::Range mine = coll::shard(S, W, me);
    const char* i = static_cast<const char*>(in);
    // Send chunk q = in[:, S_q range] (B, S_q, Hq, D); contiguous when B == 1, packed otherwise.
    const char* send = i;
    if (B > 1) {
      char* st = staging(0, B * S * row);
      std::vector<Copy2D> cp;
      for (int q = 0; q < W; ++q) {
        const coll::Range g = coll::shard(S, W, q);
        cp.push_back({i + g.begin * row, st + B * g.begin * row, B, g.size * row, S * row, g.size * row});
      }
      copy2d(cp, sms_, s);
      send = st;
    }
    char* recv = staging(1, W * B * mine.size * row);
    WEAVE_NCCL_CHECK(ncclGroupStart());
    for (int q = 0; q < W; ++q) {
      const coll::Range g = coll::shard(S, W, q);
      if (B * g.size > 0)
        WEAVE_NCCL_CHECK(ncclSend(send + B * g.begin * row, B * g.size * row / e, nccl_type(t), q, nccl_.get(), s));
      if (B * mine.size > 0)
        WEAVE_NCCL_CHECK(
            ncclRecv(recv + q * B * mine.size * row, B * mine.size * row / e, nccl_type(t), q, nccl_.get(), s));
    }
    WEAVE_NCCL_CHECK(ncclGroupEnd());
    // Unpack: chunk q (B, S_me, Hq, D) goes to out[:, :, q*Hq .. (q+1)*Hq, :].
    std::vector<Copy2D> cp;
    for (int q = 0; q < W; ++q)
      cp.push_back(
          {recv + q * B * mine.size * row, static_cast<char*>(out) + q * row, B * mine.size, row, row, H * D * e});
    copy2d(cp, sms_, s);
  }

 private:
  // Elements of rank r's piece, and its offset in a chunk-major staging buffer.
  static long long chunk(const Split& sp, int W, int r) { return sp.outer * coll::shard(sp.n, W, r).size * sp.inner; }
  static long long chunk_off(const Split& sp, int W, int r) {
    return sp.outer * coll::shard(sp.n, W, r).begin * sp.inner;
  }
  // Staging buffer `which`, grown on demand (the first, untimed call allocates).
  char* staging(int which, long long bytes) {
    if (bytes > size_[which]) {
      WEAVE_CUDA_CHECK(cudaFree(staging_[which]));  // synchronizes: nothing in flight uses it
      staging_[which] = nullptr;
      size_[which] = 0;
      WEAVE_CUDA_CHECK(cudaMalloc(&staging_[which], bytes));
      size_[which] = bytes;
    }
    return staging_[which];
  }

  runtime::Communicator& c_;
  bench::NcclComm nccl_;
  int sms_;
  char* staging_[2] = {nullptr, nullptr};
  long long size_[2] = {0, 0};
};

// ---------------------------------------------------------------------------------------------
// Deterministic inputs: element i of rank r's input is a hash of (seed, r, i). `uniform` gives
// values in [-1, 1) (rounding matters); `integers` gives -8..8, whose sums over up to 8 ranks are
// exact in every dtype, so any summation order gives the same bits.
enum class Values : int { uniform = 0, integers = 1 };

__host__ __device__ inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__host__ __device__ inline float input_value(uint64_t seed, int rank, long long i, Values v) {
  const uint64_t h = mix64(seed ^ mix64((uint64_t(rank) << 56) ^ uint64_t(i)));
  if (v == Values::integers) return float(int((h >> 32) % 17) - 8);
  return float(h >> 40) * (2.0f / 16777216.0f) - 1.0f;  // 24 random bits: exact in fp32
}

template <class T>
__host__ __device__ inline T to_t(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(x);
  else
    return __float2bfloat16_rn(x);
}
template <class T>
__host__ __device__ inline float to_float(T x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(x);
  else
    return __bfloat162float(x);
}
template <class T>
__host__ __device__ inline uint32_t bits_of(T x) {
  uint32_t u = 0;
  memcpy(&u, &x, sizeof(T));
  return u;
}

// Where output element i of a collective on this rank comes from: one element of one rank's
// input (gathers, all-to-all, and the `input` kind, which describes a buffer that must still hold
// this rank's input) or the reduction over all ranks of one input index (rank = -1).
struct Src {
  int rank;
  long long index;
};
struct OutMap {
  enum Kind : int { input, all_reduce, all_gather, reduce_scatter, seq_to_head, head_to_seq } kind = input;
  int world = 1, rank = 0;
  long long outer = 1, n = 1, inner = 1;  // gather/scatter: the full tensor around `dim`
  long long B = 0, S = 0, H = 0, D = 0;   // Ulysses
  long long numel = 0;                    // output elements on this rank

  // The rank whose shard(len, world, r) holds index k: the first len % world ranks hold one more.
  __host__ __device__ int owner(long long len, long long k) const {
    const long long q = len / world, rem = len % world, edge = rem * (q + 1);
    return static_cast<int>(k < edge ? k / (q + 1) : rem + (k - edge) / q);
  }
  __host__ __device__ Src src(long long i) const {
    switch (kind) {
      case all_reduce:
        return {-1, i};
      case all_gather: {
        const long long j = i % inner, k = (i / inner) % n, o = i / (inner * n);
        const int r = owner(n, k);
        const coll::Range g = coll::shard(n, world, r);
        return {r, (o * g.size + (k - g.begin)) * inner + j};
      }
      case reduce_scatter: {
        const coll::Range g = coll::shard(n, world, rank);
        const long long j = i % inner, k = (i / inner) % g.size, o = i / (inner * g.size);
        return {-1, (o * n + g.begin + k) * inner + j};
      }
      case seq_to_head: {  // out (B, S, Hq, D) from rank owner(s)'s (B, S_r, H, D)
        const long long Hq = H / world, d = i % D, h = (i / D) % Hq, s = (i / (D * Hq)) % S, b = i / (D * Hq * S);
        const int r = owner(S, s);
        const coll::Range g = coll::shard(S, world, r);
        return {r, ((b * g.size + (s - g.begin)) * H + rank * Hq + h) * D + d};
      }
      case head_to_seq: {  // out (B, S_me, H, D) from rank h / Hq's (B, S, Hq, D)
        const coll::Range g = coll::shard(S, world, rank);
        const long long Hq = H / world, d = i % D, h = (i / D) % H, s = (i / (D * H)) % g.size,
                        b = i / (D * H * g.size);
        return {static_cast<int>(h / Hq), ((b * S + g.begin + s) * Hq + h % Hq) * D + d};
      }
      default:
        return {rank, i};
    }
  }
};

inline OutMap map_input(long long numel, int W, int r) {
  OutMap m;
  m.kind = OutMap::input, m.world = W, m.rank = r, m.numel = numel;
  return m;
}
inline OutMap map_all_reduce(long long count, int W, int r) {
  OutMap m = map_input(count, W, r);
  m.kind = OutMap::all_reduce;
  return m;
}
inline OutMap map_all_gather(const coll::Shape& full, int dim, int W, int r) {
  const Split sp = split(full, dim);
  OutMap m = map_input(full.numel(), W, r);
  m.kind = OutMap::all_gather, m.outer = sp.outer, m.n = sp.n, m.inner = sp.inner;
  return m;
}
inline OutMap map_reduce_scatter(const coll::Shape& full, int dim, int W, int r) {
  const Split sp = split(full, dim);
  OutMap m = map_input(sp.outer * coll::shard(sp.n, W, r).size * sp.inner, W, r);
  m.kind = OutMap::reduce_scatter, m.outer = sp.outer, m.n = sp.n, m.inner = sp.inner;
  return m;
}
inline OutMap map_ulysses(bool to_head, long long B, long long S, long long H, long long D, int W, int r) {
  OutMap m = map_input(to_head ? B * S * (H / W) * D : B * coll::shard(S, W, r).size * H * D, W, r);
  m.kind = to_head ? OutMap::seq_to_head : OutMap::head_to_seq;
  m.B = B, m.S = S, m.H = H, m.D = D;
  return m;
}
// Elements of this rank's input for each collective (the inverse view of the maps above).
inline long long shard_numel(const coll::Shape& full, int dim, int W, int r) {
  const Split sp = split(full, dim);
  return sp.outer * coll::shard(sp.n, W, r).size * sp.inner;
}

// ---------------------------------------------------------------------------------------------
// Filling and checking on the device.
namespace detail {
template <class T>
__global__ void fill_kernel(T* p, long long n, uint64_t seed, int rank, Values v) {
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < n; i += 256LL * gridDim.x)
    p[i] = to_t<T>(input_value(seed, rank, i, v));
}

struct CheckOut {
  unsigned long long bad;
  long long first;      // smallest failing index
  long long first_tag;  // smallest tag (e.g. iteration) with a failure
};

// Element i: the expected value (recomputed from the inputs, in fp32 in rank order, rounded once
// to T, as weave documents) or `ref[i]`, and the tolerance: exact for copies, max and min; for sums
// rtol x sum of |inputs| (summation order differs between implementations).
template <class T>
__device__ bool check_one(const T* got, const T* ref, const OutMap& m, long long i, uint64_t seed, Values v,
                          ReduceOp op, float rtol, float* g_out, float* w_out) {
  const Src s = m.src(i);
  const T g = got[i];
  const bool tolerant = s.rank < 0 && op == ReduceOp::sum && rtol > 0;
  T want;
  float mag = 0;
  if (ref && !tolerant) {
    want = ref[i];  // nothing to recompute
  } else if (s.rank >= 0) {
    want = to_t<T>(input_value(seed, s.rank, s.index, v));
  } else {
    float acc = 0;
    for (int r = 0; r < m.world; ++r) {
      const float x = to_float(to_t<T>(input_value(seed, r, s.index, v)));
      mag += fabsf(x);
      acc = r == 0 ? x : op == ReduceOp::sum ? acc + x : op == ReduceOp::max ? fmaxf(acc, x) : fminf(acc, x);
    }
    want = to_t<T>(acc);
  }
  if (ref) want = ref[i];
  *g_out = to_float(g), *w_out = to_float(want);
  if (s.rank >= 0) return bits_of(g) == bits_of(want);
  if (!tolerant) return to_float(g) == to_float(want);  // +0 == -0; NaN fails
  return fabsf(to_float(g) - to_float(want)) <= rtol * mag + 1e-7f;
}

template <class T>
__global__ void check_kernel(const T* got, const T* ref, OutMap m, uint64_t seed, Values v, ReduceOp op, float rtol,
                             long long tag, CheckOut* out) {
  float g, w;
  for (long long i = blockIdx.x * 256LL + threadIdx.x; i < m.numel; i += 256LL * gridDim.x)
    if (!check_one(got, ref, m, i, seed, v, op, rtol, &g, &w)) {
      atomicAdd(&out->bad, 1ull);
      atomicMin(reinterpret_cast<unsigned long long*>(&out->first), static_cast<unsigned long long>(i));
      atomicMin(reinterpret_cast<unsigned long long*>(&out->first_tag), static_cast<unsigned long long>(tag));
    }
}

template <class T>
__global__ void describe_kernel(const T* got, const T* ref, OutMap m, uint64_t seed, Values v, ReduceOp op, long long i,
                                float* gw) {
  check_one(got, ref, m, i, seed, v, op, 0.f, &gw[0], &gw[1]);
}

template <class F>
void by_dtype(DType t, F&& f) {
  if (t == DType::bf16)
    f(__nv_bfloat16{});
  else if (t == DType::fp16)
    f(__half{});
  else
    f(float{});
}
}  // namespace detail

// Writes rank `rank`'s input (n elements) into p.
inline void fill(void* p, long long n, DType t, uint64_t seed, int rank, Values v, cudaStream_t s) {
  if (n <= 0) return;
  const unsigned grid = static_cast<unsigned>(std::clamp<long long>((n + 255) / 256, 1, 4096));
  detail::by_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    detail::fill_kernel<T><<<grid, 256, 0, s>>>(static_cast<T*>(p), n, seed, rank, v);
  });
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

// Relative tolerance of sums against another implementation or the recomputation: a few units
// in the last place of T per rounding step, and up to W-1 rounding steps.
inline float sum_rtol(DType t, int world) {
  const float base = t == DType::bf16 ? 1e-2f : t == DType::fp16 ? 1e-3f : 1e-5f;
  return base * std::max(1.0f, (world - 1) / 2.0f);
}

// Checks outputs element by element. Results accumulate over launches (a loop of calls can be
// checked without host synchronization) until result() reads them.
class Checker {
 public:
  Checker() {
    WEAVE_CUDA_CHECK(cudaMalloc(&dev_, sizeof(detail::CheckOut)));
    WEAVE_CUDA_CHECK(cudaMalloc(&gw_, 2 * sizeof(float)));
    reset();
  }
  ~Checker() {
    cudaFree(dev_);
    cudaFree(gw_);
  }
  Checker(const Checker&) = delete;
  Checker& operator=(const Checker&) = delete;

  void reset(cudaStream_t s = nullptr) {
    detail::CheckOut init{0, -1, -1};  // -1: all bits set, larger than any index
    WEAVE_CUDA_CHECK(cudaMemcpyAsync(dev_, &init, sizeof init, cudaMemcpyHostToDevice, s));
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  // `got` (numel = m.numel elements) against the recomputed inputs, or against `ref` when given.
  // `rtol` applies to sums only (0: exact); `v`/`seed` are the inputs' generator.
  void check(const void* got, const void* ref, const OutMap& m, DType t, uint64_t seed, Values v, ReduceOp op,
             float rtol, cudaStream_t s, long long tag = 0) {
    if (m.numel <= 0) return;
    const unsigned grid = static_cast<unsigned>(std::clamp<long long>((m.numel + 255) / 256, 1, 4096));
    detail::by_dtype(t, [&](auto tagT) {
      using T = decltype(tagT);
      detail::check_kernel<T><<<grid, 256, 0, s>>>(static_cast<const T*>(got), static_cast<const T*>(ref), m, seed, v,
                                                   op, rtol, tag, dev_);
    });
    WEAVE_CUDA_CHECK(cudaGetLastError());
    last_ = {got, ref, m, t, seed, v, op};
  }
  struct Result {
    unsigned long long bad = 0;
    long long first = -1, first_tag = -1;
    float got = 0, want = 0;  // at `first`, for the last check() call
    bool ok() const { return bad == 0; }
    std::string str() const {
      if (!bad) return "all elements match";
      std::ostringstream o;
      o << bad << " element(s) wrong, first at index " << first << " (got " << got << ", want " << want << ")";
      if (first_tag > 0) o << ", first in call " << first_tag;
      return o.str();
    }
  };
  // Synchronizes `s` and reads the accumulated result.
  Result result(cudaStream_t s = nullptr) {
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
    detail::CheckOut h{};
    WEAVE_CUDA_CHECK(cudaMemcpy(&h, dev_, sizeof h, cudaMemcpyDeviceToHost));
    Result r;
    r.bad = h.bad;
    if (h.bad) {
      r.first = h.first, r.first_tag = h.first_tag;
      if (last_.got && h.first < last_.m.numel) {
        detail::by_dtype(last_.t, [&](auto tagT) {
          using T = decltype(tagT);
          detail::describe_kernel<T><<<1, 1, 0, s>>>(static_cast<const T*>(last_.got), static_cast<const T*>(last_.ref),
                                                     last_.m, last_.seed, last_.v, last_.op, h.first, gw_);
        });
        float gw[2];
        WEAVE_CUDA_CHECK(cudaMemcpyAsync(gw, gw_, sizeof gw, cudaMemcpyDeviceToHost, s));
        WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
        r.got = gw[0], r.want = gw[1];
      }
    }
    return r;
  }

 private:
  struct Last {
    const void* got = nullptr;
    const void* ref = nullptr;
    OutMap m{};
    DType t = DType::bf16;
    uint64_t seed = 0;
    Values v = Values::uniform;
    ReduceOp op = ReduceOp::sum;
  };
  detail::CheckOut* dev_ = nullptr;
  float* gw_ = nullptr;
  Last last_;
};

}  // namespace weave::ref
