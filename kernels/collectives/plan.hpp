// The schedule of every collective as data: which strided transfers rank r performs, between
// which ranks' buffers, and how many signals each rank receives per call. Pure functions of
// (collective, shape, world, rank), called by the host entry and by the CPU schedule tests.
#pragma once
#include <cstdint>

#include "collectives/collectives.hpp"
#include "weave/config.hpp"

namespace weave::coll {

// One 3-D strided transfer: outer x rows x row_bytes. With one source it is a copy; with several
// it is an element-wise reduction over the sources (read at the same offset on every source
// rank). Every destination receives the same bytes. Offsets and pitches are in bytes.
struct Xfer {
  int nsrc = 0, ndst = 0;
  int src_rank[kMaxWorld] = {};
  int dst_rank[kMaxWorld] = {};
  long long src_off = 0, dst_off = 0;
  long long outer = 1, rows = 1, row_bytes = 0;
  long long src_outer_pitch = 0, dst_outer_pitch = 0, src_pitch = 0, dst_pitch = 0;
};

inline constexpr int kMaxXfers = kMaxWorld + 1;

enum class Kind : int { all_reduce_one_shot, all_reduce_two_shot, all_gather, reduce_scatter, seq_to_head, head_to_seq };

struct Plan {
  int n = 0;
  Xfer x[kMaxXfers];
};

namespace detail {
__host__ __device__ inline void add_all_ranks(int* list, int& n, int world) {
  for (int r = 0; r < world; ++r) list[n++] = r;
}
// A tensor seen as (outer, mid, inner) around dimension `dim`.
struct Split3 {
  long long outer, mid, inner;
};
__host__ __device__ inline Split3 split3(const Shape& s, int dim) {
  Split3 v{1, s.d[dim], 1};
  for (int i = 0; i < dim; ++i) v.outer *= s.d[i];
  for (int i = dim + 1; i < s.ndim; ++i) v.inner *= s.d[i];
  return v;
}
}  // namespace detail

// all_reduce of `bytes` (count * element size). One-shot: rank r reads every rank's input and
// writes its own output. Two-shot: rank r reduces its 16-byte-aligned share of every rank's input
// and writes that share into every rank's output; the unaligned tail goes to the last rank.
__host__ __device__ inline Plan plan_all_reduce(bool two_shot, long long bytes, int world, int r) {
  Plan p;
  if (bytes <= 0) return p;
  if (!two_shot) {
    Xfer& x = p.x[p.n++];
    detail::add_all_ranks(x.src_rank, x.nsrc, world);
    x.dst_rank[x.ndst++] = r;
    x.row_bytes = bytes;
    return p;
  }
  const long long n16 = bytes / 16;
  const Range sh = shard(n16, world, r);
  if (sh.size > 0) {
    Xfer& x = p.x[p.n++];
    detail::add_all_ranks(x.src_rank, x.nsrc, world);
    detail::add_all_ranks(x.dst_rank, x.ndst, world);
    x.src_off = x.dst_off = sh.begin * 16;
    x.row_bytes = sh.size * 16;
  }
  if (r == world - 1 && bytes > n16 * 16) {
    Xfer& x = p.x[p.n++];
    detail::add_all_ranks(x.src_rank, x.nsrc, world);
    detail::add_all_ranks(x.dst_rank, x.ndst, world);
    x.src_off = x.dst_off = n16 * 16;
    x.row_bytes = bytes - n16 * 16;
  }
  return p;
}

// Destinations in the order rank r serves them: r+1, r+2, ..., r itself last. At any moment the
// ranks push to different peers, and the local copy, which needs no NVLink, comes last.
__host__ __device__ inline int staggered(int r, int k, int world) { return (r + 1 + k) % world; }

// all_gather along `dim`: rank r pushes its shard (outer, mid_r, inner) into every rank's output
// at mid offset begin_r.
__host__ __device__ inline Plan plan_all_gather(const Shape& full, int dim, int elt, int world, int r) {
  Plan p;
  const detail::Split3 v = detail::split3(full, dim);
  const Range sh = shard(v.mid, world, r);
  if (sh.size == 0 || v.outer == 0 || v.inner == 0) return p;
  for (int k = 0; k < world; ++k) {
    const int q = staggered(r, k, world);
    Xfer& x = p.x[p.n++];
    x.src_rank[x.nsrc++] = r;
    x.dst_rank[x.ndst++] = q;
    x.dst_off = sh.begin * v.inner * elt;
    x.rows = v.outer;
    x.row_bytes = sh.size * v.inner * elt;
    x.src_pitch = x.row_bytes;
    x.dst_pitch = v.mid * v.inner * elt;
  }
  return p;
}

// reduce_scatter along `dim`: rank r reduces its shard's slab of every rank's full input into its
// own output.
__host__ __device__ inline Plan plan_reduce_scatter(const Shape& full, int dim, int elt, int world, int r) {
  Plan p;
  const detail::Split3 v = detail::split3(full, dim);
  const Range sh = shard(v.mid, world, r);
  if (sh.size == 0 || v.outer == 0 || v.inner == 0) return p;
  Xfer& x = p.x[p.n++];
  detail::add_all_ranks(x.src_rank, x.nsrc, world);
  x.dst_rank[x.ndst++] = r;
  x.src_off = sh.begin * v.inner * elt;
  x.rows = v.outer;
  x.row_bytes = sh.size * v.inner * elt;
  x.src_pitch = v.mid * v.inner * elt;
  x.dst_pitch = x.row_bytes;
  return p;
}

// Ulysses (B, S_r, H, D) on rank r -> (B, S, H/W, D) on every rank: rank r pushes head group q of
// its sequence rows to rank q, at sequence offset begin_r. head_to_seq is the inverse.
__host__ __device__ inline Plan plan_ulysses(bool seq_to_head, long long B, long long S, long long H, long long D,
                                             int elt, int world, int r) {
  Plan p;
  const long long Hq = H / world, piece = Hq * D * elt;
  for (int k = 0; k < world; ++k) {
    const int q = staggered(r, k, world);
    const Range rs = shard(S, world, seq_to_head ? r : q);  // the sequence rows that move
    if (rs.size == 0 || B == 0 || piece == 0) continue;
    Xfer& x = p.x[p.n++];
    x.src_rank[x.nsrc++] = r;
    x.dst_rank[x.ndst++] = q;
    x.outer = B;
    x.rows = rs.size;
    x.row_bytes = piece;
    if (seq_to_head) {  // src (B, S_r, H, D), dst (B, S, Hq, D)
      x.src_off = q * piece;
      x.dst_off = rs.begin * piece;
      x.src_outer_pitch = rs.size * H * D * elt;
      x.dst_outer_pitch = S * piece;
      x.src_pitch = H * D * elt;
      x.dst_pitch = piece;
    } else {  // src (B, S, Hq, D), dst (B, S_q, H, D)
      x.src_off = rs.begin * piece;
      x.dst_off = r * piece;
      x.src_outer_pitch = S * piece;
      x.dst_outer_pitch = rs.size * H * D * elt;
      x.src_pitch = piece;
      x.dst_pitch = H * D * elt;
    }
  }
  return p;
}

// Per call, every rank's block 0 signals "arrived" to every rank and every block of every rank
// signals "done" to every rank (after its reads and writes): what each rank waits for.
__host__ __device__ inline unsigned long long arrivals_per_call(int world) { return world; }
__host__ __device__ inline unsigned long long dones_per_call(int world, int blocks) {
  return static_cast<unsigned long long>(world) * blocks;
}

}  // namespace weave::coll
