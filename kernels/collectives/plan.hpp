// The schedule of every collective as data: which strided transfers rank r performs, between
// which ranks' buffers, and how many signals each rank receives per call. Pure functions of
// (collective, shape, world, rank), called by the host entry and by the CPU schedule tests.
#pragma once
#include <cstddef>
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

// ---------------------------------------------------------------------------------------------
// Push all_reduce (push.cuh): the two-shot split (rank q owns slab q), but the reduce-scatter
// half pushes instead of pulling: rank r stores slab q of its input into rank q's scratch, q
// reduces its own slab with what arrived (local memory) and pushes the result into every
// output, as two-shot's second half. Stores reach the link's ceiling, peer loads do not
// (perf-notes). The work is split over `pipes` independent pipelines (one per warp of the grid;
// every rank runs the same grid): pipe p of every rank handles the same piece of every slab at
// step k, so pipe p pairs with pipe p of every peer through its own counters and scratch slots.
// No pipe waits for another (a block-wide barrier before each signal would make every SM stall
// for its stores' acknowledgements at about the same moment). Steps are pipelined: iteration i
// pushes step i and reduces step i - kPushLag. Scratch is a ring of `slots` slots per (pipe,
// source); a slot is rewritten only after its reader signalled it free.
struct PushPlan {
  long long slab[kMaxWorld + 1] = {};  // rank q owns bytes [slab[q], slab[q + 1]); the last ends at `bytes`
  long long chunk = 0;                 // bytes per pipe and step: a multiple of 16, <= slot_bytes
  long long slot_bytes = 0;            // scratch bytes per slot
  int slots = 0;                       // slots per (pipe, source), >= kPushLag + 1
  int pipes = 0, steps = 0;
};

inline constexpr int kPushLag = 1;
// At least this many steps per call while the chunk can shrink (to its granule): fewer would
// leave the pipeline's first push and last reduction unhidden for most of the call.
inline constexpr int kPushMinSteps = 4;

// slot_bytes: the most a step moves per pipe (the scratch layout); granule: the chunk's
// multiple (one 16-byte unit per lane).
__host__ __device__ inline PushPlan plan_push_all_reduce(long long bytes, int world, int pipes, long long slot_bytes,
                                                         int slots, long long granule) {
  PushPlan p;
  p.pipes = pipes;
  p.slot_bytes = slot_bytes;
  p.slots = slots;
  const long long n16 = bytes / 16;
  long long largest = 0;
  for (int q = 0; q < world; ++q) p.slab[q] = shard(n16, world, q).begin * 16;
  p.slab[world] = bytes;
  for (int q = 0; q < world; ++q) largest = largest > p.slab[q + 1] - p.slab[q] ? largest : p.slab[q + 1] - p.slab[q];
  p.chunk = largest / (pipes * kPushMinSteps) / granule * granule;  // rounded down: >= kPushMinSteps steps
  p.chunk = p.chunk < granule ? granule : p.chunk > slot_bytes ? slot_bytes : p.chunk;
  const long long per_step = p.chunk * pipes;
  p.steps = static_cast<int>(largest > 0 ? (largest + per_step - 1) / per_step : 1);
  return p;
}

// The bytes of slab q that pipe e handles at step k (may be empty): steps sweep the slab in
// order, the pipes side by side within a step.
__host__ __device__ inline Range push_piece(const PushPlan& p, int q, int e, int k) {
  const long long begin = (static_cast<long long>(k) * p.pipes + e) * p.chunk, size = p.slab[q + 1] - p.slab[q];
  const long long n = size - begin;
  if (n <= 0) return {p.slab[q + 1], 0};
  return {p.slab[q] + begin, n < p.chunk ? n : p.chunk};
}

// Scratch on every rank: [slot][source][pipe] of slot_bytes; the source index skips the owner.
__host__ __device__ inline long long push_scratch_bytes(int world, int pipes, long long slot_bytes, int slots) {
  return static_cast<long long>(slots) * (world - 1) * pipes * slot_bytes;
}
// Where source rank `src` writes global step `step` of pipe e in rank dst's scratch.
__host__ __device__ inline long long push_slot(const PushPlan& p, int world, int src, int dst, int e,
                                               unsigned long long step) {
  const long long slot = static_cast<long long>(step % p.slots), from = (src - dst - 1 + world) % world;
  return ((slot * (world - 1) + from) * p.pipes + e) * p.slot_bytes;
}

// Counters on every rank (2 * pipes * world): data[e][src] counts the steps src's pipe e pushed
// here; free[e][dst] the steps dst's pipe e reduced from this rank's pushes (and, the signal
// coming after its output stores, wrote into this rank's output). Both advance by `steps` per
// call; `base` is the total before the call (every call runs every pipe).
__host__ __device__ inline int push_data_counter(int e, int src, int world) { return e * world + src; }
__host__ __device__ inline int push_free_counter(int e, int dst, int world, int pipes) {
  return (pipes + e) * world + dst;
}
// Iteration i pushes step i (i < steps) once slot (base + i) % slots is free: its reader
// reduced step i - slots (nothing to wait for while this is <= base).
__host__ __device__ inline unsigned long long push_free_expect(const PushPlan& p, unsigned long long base, int i) {
  return base + i + 1 >= static_cast<unsigned long long>(p.slots) ? base + i + 1 - p.slots : 0;
}
// Iteration i reduces step j = i - kPushLag once every source pushed it.
__host__ __device__ inline unsigned long long push_data_expect(unsigned long long base, int j) { return base + j + 1; }

// Destinations in the order rank r serves them: r+1, r+2, ..., r itself last. At any moment the
// ranks push to different peers, and the local copy, which needs no NVLink, comes last.
__host__ __device__ inline int staggered(int r, int k, int world) { return (r + 1 + k) % world; }

namespace detail {
// all_gather and reduce_scatter along `dim` move rank r's shard of the (outer, mid, inner) view as
// one transfer: `outer` rows of the shard's bytes, packed on the shard side and at the shard's
// offset (pitch: a full row) on the full side. `gather`: the shard is the source and the full
// side every rank's output; otherwise every rank's full input is the source and the shard my
// output.
__host__ __device__ inline Plan plan_shard_xfer(bool gather, const Shape& full, int dim, int elt, int world, int r) {
  Plan p;
  const Split3 v = split3(full, dim);
  const Range sh = shard(v.mid, world, r);
  if (sh.size == 0 || v.outer == 0 || v.inner == 0) return p;
  Xfer& x = p.x[p.n++];
  x.rows = v.outer;
  x.row_bytes = sh.size * v.inner * elt;
  const long long full_pitch = v.mid * v.inner * elt;
  if (gather) {
    x.src_rank[x.nsrc++] = r;
    for (int k = 0; k < world; ++k) x.dst_rank[x.ndst++] = staggered(r, k, world);
    x.dst_off = sh.begin * v.inner * elt;
    x.src_pitch = x.row_bytes;
    x.dst_pitch = full_pitch;
  } else {
    add_all_ranks(x.src_rank, x.nsrc, world);
    x.dst_rank[x.ndst++] = r;
    x.src_off = sh.begin * v.inner * elt;
    x.src_pitch = full_pitch;
    x.dst_pitch = x.row_bytes;
  }
  return p;
}
}  // namespace detail

// all_gather along `dim`: rank r pushes its shard (outer, mid_r, inner) into every rank's output
// at mid offset begin_r. One transfer with every rank as a destination (staggered, itself last):
// each unit is loaded once and its local store overlaps the remote ones, instead of a separate
// local copy after the pushes (which cost ~10 % at 8 MiB and 1 GiB, perf-notes).
__host__ __device__ inline Plan plan_all_gather(const Shape& full, int dim, int elt, int world, int r) {
  return detail::plan_shard_xfer(true, full, dim, elt, world, r);
}

// reduce_scatter along `dim`: rank r reduces its shard's slab of every rank's full input into its
// own output.
__host__ __device__ inline Plan plan_reduce_scatter(const Shape& full, int dim, int elt, int world, int r) {
  return detail::plan_shard_xfer(false, full, dim, elt, world, r);
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

// ---------------------------------------------------------------------------------------------
// LL all_gather / reduce_scatter (ll.cuh): no transfer touches a peer's user buffers. Rank r
// writes words of its input as flagged lines into rank q's scratch slot for r; q polls the lines
// and writes its own output. Word i of a region lies at byte off + (i / wpr) * pitch + (i % wpr) * 4.
struct WordRegion {
  long long off = 0, rows = 0, wpr = 0, pitch = 0;
  __host__ __device__ long long words() const { return rows * wpr; }
  __host__ __device__ long long byte(long long i) const { return off + (i / wpr) * pitch + (i % wpr) * 4; }
};

// Every rank sends at least one line to every peer and polls at least one from every peer, even
// where a shard is empty: the scratch-reuse argument (ll.cuh) needs every LL call to hear from
// every peer. A line past a region's words carries only the flag.
// `wpl` data words per line: 1 for LL (8-byte lines), kLL128Words for LL128 (128-byte lines).
struct LLPlan {
  WordRegion send[kMaxWorld];  // words of my input that go to rank q (all_gather: my whole input)
  long long lines_to[kMaxWorld] = {}, lines_from[kMaxWorld] = {};  // per peer, >= 1; 0 for myself
  WordRegion place[kMaxWorld];  // all_gather: where rank p's words (p == me: my input) land in my output
  WordRegion own;               // reduce_scatter: my slab of my input; the output is its words, contiguous
  long long max_lines = 0;      // the most lines any rank writes into one scratch slot
};

namespace detail {
// Rank q's slab of a full tensor (outer, mid, inner) as words; needs ll_shape_ok.
__host__ __device__ inline WordRegion slab_words(const Split3& v, int elt, int world, int q) {
  const Range sh = shard(v.mid, world, q);
  const long long row_words = sh.size * v.inner * elt / 4;
  WordRegion g;
  g.off = sh.begin * v.inner * elt;
  g.rows = row_words ? v.outer : 0;
  g.wpr = row_words ? row_words : 1;
  g.pitch = v.mid * v.inner * elt;
  return g;
}
__host__ __device__ inline WordRegion contiguous_words(long long words) {
  WordRegion g;
  g.rows = words ? 1 : 0;
  g.wpr = words ? words : 1;
  return g;
}
__host__ __device__ inline long long at_least_one(long long n) { return n > 0 ? n : 1; }
}  // namespace detail

// LL128 line layout (ll128.cuh): a 128-byte line is 8 lanes x 4 words; lane j's word k holds data
// word 8k + j of the line, so that the 8 lanes of a group read or write 8 consecutive words per
// step (32 contiguous bytes), and lane 7's word 3 holds the flag. 31 data words per line.
inline constexpr int kLL128Words = 31;
// Data word (in line units) that lane j, word k of a line carries; -1 for the flag.
__host__ __device__ constexpr int ll128_slot_word(int j, int k) { return 8 * k + j < kLL128Words ? 8 * k + j : -1; }
// Lines that carry `words` data words with `wpl` words per line; at least one (a flag-only line).
__host__ __device__ inline long long ll_lines(long long words, int wpl) {
  return detail::at_least_one((words + wpl - 1) / wpl);
}

// Whether LL can carry this shape: every rank's shard row a whole number of 4-byte words (then so
// are every offset and pitch, which are sums of them).
__host__ __device__ inline bool ll_shape_ok(const Shape& full, int dim, int elt, int world) {
  const detail::Split3 v = detail::split3(full, dim);
  for (int q = 0; q < world; ++q)
    if (shard(v.mid, world, q).size * v.inner * elt % 4) return false;
  return true;
}

namespace detail {
// Every rank's slab of the full tensor as words into g[], and the plan's largest slot (>= 1 line).
__host__ __device__ inline void ll_slabs(LLPlan& p, WordRegion* g, const Shape& full, int dim, int elt, int world,
                                         int wpl) {
  const Split3 v = split3(full, dim);
  for (int q = 0; q < world; ++q) {
    g[q] = slab_words(v, elt, world, q);
    const long long lines = ll_lines(g[q].words(), wpl);
    p.max_lines = p.max_lines > lines ? p.max_lines : lines;
  }
}
}  // namespace detail

// all_gather: rank r's contiguous input to every peer; rank p's lines land in p's slab.
__host__ __device__ inline LLPlan plan_ll_all_gather(const Shape& full, int dim, int elt, int world, int r,
                                                     int wpl = 1) {
  LLPlan p;
  detail::ll_slabs(p, p.place, full, dim, elt, world, wpl);
  const long long mine = p.place[r].words();
  for (int q = 0; q < world; ++q) {
    p.send[q] = detail::contiguous_words(mine);
    p.lines_to[q] = q == r ? 0 : ll_lines(mine, wpl);
    p.lines_from[q] = q == r ? 0 : ll_lines(p.place[q].words(), wpl);
  }
  return p;
}

// reduce_scatter: rank q's slab of rank r's input to rank q; r reduces its own slab.
__host__ __device__ inline LLPlan plan_ll_reduce_scatter(const Shape& full, int dim, int elt, int world, int r,
                                                         int wpl = 1) {
  LLPlan p;
  detail::ll_slabs(p, p.send, full, dim, elt, world, wpl);
  p.own = p.send[r];
  for (int q = 0; q < world; ++q) {
    p.lines_to[q] = q == r ? 0 : ll_lines(p.send[q].words(), wpl);
    p.lines_from[q] = q == r ? 0 : ll_lines(p.own.words(), wpl);
  }
  return p;
}

// LL-family calls are numbered on the device (n = 1, 2, ...: CallState::ll_calls + 1, read by the
// call itself, so that a CUDA graph's replays take new numbers). A line's 32-bit flag is
// ll_flag(n): never 0 (the zeroed scratch's), and the same flag comes back after `period` calls
// (2^32 - 1 in use; tests shorten it; odd, so that flag and parity repeat
// together only every 2 * period calls). The slot parity is n's own, so consecutive calls always
// alternate (ll.cuh's reuse argument). A line written at call n and not rewritten since would pass
// for call n + 2 * period's (same flag, same parity), so the first call of every 2 * period
// (ll_restart_at) zeroes every rank's scratch before any line of it is written (ll.cuh, ll_begin).
inline constexpr unsigned kLLFlagPeriod = 0xFFFFFFFFu;
__host__ __device__ inline unsigned ll_flag(unsigned long long n, unsigned period) {
  return static_cast<unsigned>((n - 1) % period) + 1;
}
__host__ __device__ inline int ll_parity(unsigned long long n) { return static_cast<int>(n & 1); }
__host__ __device__ inline bool ll_restart_at(unsigned long long n, unsigned period) {
  return n > 1 && (n - 1) % (2ull * period) == 0;
}

// ---------------------------------------------------------------------------------------------
// Choosing the algorithm (collectives.cu calls these with what it knows of the machine and the
// heap; the schedule tests call them for every size and setting).

// LL128 takes a line's data from a load issued after its flag was seen (ll128.cuh), which is sound
// only where a 128-byte line stored by one warp instruction reaches the peer's memory as one write:
// on NVLink.
// Without NVML the link type is not visible, so a pair counts as NVLink-connected when CUDA reports
// peer access and native peer atomics (cudaDevP2PAttrNativeAtomicSupported): NVLink carries native
// atomics, PCIe peer-to-peer does not. A machine where some pair fails gets no LL128 at all (every
// rank must choose alike; collectives.cu combines every rank's view).
struct PeerLink {
  bool access = false, native_atomics = false;
};
// links[i * world + j]: from device i to device j (the diagonal is not read).
inline bool ll128_links_ok(const PeerLink* links, int world) {
  for (int i = 0; i < world; ++i)
    for (int j = 0; j < world; ++j)
      if (i != j && !(links[i * world + j].access && links[i * world + j].native_atomics)) return false;
  return true;
}

// Per-size limits of the automatic choice (measured; README.md). One-shot pulls (W-1) x bytes per
// rank, two-shot 2 (W-1)/W x bytes in two directions: below kOneShotMaxBytes the single phase wins.
inline constexpr size_t kOneShotMaxBytes = size_t(512) << 10;
// LL doubles the bytes on the link; below these sizes its saved signal phases win (all_reduce; the
// largest all_gather shard; the largest reduce_scatter output slab).
inline constexpr size_t kLLAutoMaxBytes = size_t(256) << 10;
inline constexpr size_t kLLGatherAutoMaxBytes = size_t(512) << 10;
inline constexpr size_t kLLScatterAutoMaxBytes = size_t(256) << 10;
// From here on the push all_reduce beats two-shot on 2 ranks (equal at 64 MiB, 3-5 % faster from
// 128 MiB, 10 % slower at 32 MiB).
inline constexpr size_t kPushAutoMinBytes = size_t(64) << 20;
// LL128 (3 % more bytes, no signal phase) up to these sizes; all_gather's direct path (one phase of
// plain stores each way) is as fast from 2 MiB shards on.
inline constexpr size_t kLL128AutoMaxBytes = size_t(8) << 20;
inline constexpr size_t kLL128GatherAutoMaxBytes = size_t(1) << 20;

// What the choice depends on besides the call's arguments; the same on every rank.
struct AlgoEnv {
  int world = 2;
  bool ll128_links = true;  // ll128_links_ok over every pair of ranks
  bool ll128_fits = true;   // the LL128 scratch exists or fits in the heap
  bool push_fits = true;    // the push scratch exists or fits in the heap
};

// all_reduce of `bytes` per rank: the requested algorithm, or the next one down where it cannot run
// (LL: size or alignment; LL128: size, alignment, heap or links; one-shot: in place).
inline AllReduceAlgo choose_all_reduce(AllReduceAlgo a, const AlgoEnv& e, size_t bytes, bool in_place,
                                       bool aligned4) {
  const bool ll_ok = bytes <= Collectives::kLLMaxBytes && aligned4;
  // Push only where it was measured (2 ranks), and only if its scratch exists or fits in the heap:
  // automatic must not turn a call two-shot can make into an allocation failure.
  const bool push_ok = e.world == 2 && bytes >= kPushAutoMinBytes && e.push_fits;
  const bool ll128_ok = e.ll128_links && e.ll128_fits && aligned4 && bytes <= Collectives::ll128_max_bytes(e.world);
  if (a == AllReduceAlgo::automatic)
    a = ll_ok && bytes <= kLLAutoMaxBytes         ? AllReduceAlgo::ll
        : ll128_ok && bytes <= kLL128AutoMaxBytes ? AllReduceAlgo::ll128
        : bytes <= kOneShotMaxBytes               ? AllReduceAlgo::one_shot
        : push_ok                                 ? AllReduceAlgo::push
                                                  : AllReduceAlgo::two_shot;
  if (a == AllReduceAlgo::ll && !ll_ok) a = AllReduceAlgo::two_shot;
  if (a == AllReduceAlgo::ll128 && !ll128_ok) a = AllReduceAlgo::two_shot;
  if (a == AllReduceAlgo::one_shot && in_place) a = AllReduceAlgo::two_shot;  // would overwrite what peers read
  return a;
}

// all_gather (gather) / reduce_scatter: LL or LL128 where the shape allows it (ll_shape_ok) and every
// rank's shard (all_gather) or slab (reduce_scatter) fits the scratch slot, within the automatic
// limit unless forced; direct otherwise.
inline ShardAlgo choose_shard(ShardAlgo a, bool gather, const AlgoEnv& e, const Shape& full, int dim, int elt,
                              bool aligned4) {
  const long long d = full.d[dim] > 0 ? full.d[dim] : 1;
  const size_t largest = static_cast<size_t>(full.numel() / d * shard(full.d[dim], e.world, 0).size * elt);
  const bool shape_ok = aligned4 && ll_shape_ok(full, dim, elt, e.world);
  const bool ll_ok = shape_ok && largest <= Collectives::kLLMaxBytes;
  const bool ll128_ok = shape_ok && e.ll128_links && e.ll128_fits && largest <= Collectives::ll128_max_bytes(e.world);
  const size_t ll_auto = gather ? kLLGatherAutoMaxBytes : kLLScatterAutoMaxBytes;
  const size_t ll128_auto = gather ? kLL128GatherAutoMaxBytes : kLL128AutoMaxBytes;
  if (a == ShardAlgo::automatic)
    a = ll_ok && largest <= ll_auto         ? ShardAlgo::ll
        : ll128_ok && largest <= ll128_auto ? ShardAlgo::ll128
                                            : ShardAlgo::direct;
  if (a == ShardAlgo::ll && !ll_ok) a = ShardAlgo::direct;
  if (a == ShardAlgo::ll128 && !ll128_ok) a = ShardAlgo::direct;
  return a;
}

// ---------------------------------------------------------------------------------------------
// Buffers that share bytes. Every path reads a peer's input or writes a peer's output while that
// peer may be anywhere in its own call, so overlapping buffers are a race unless the overlap is
// one the algorithms are written for: all_reduce exactly in place, and NCCL's in place for
// all_gather / reduce_scatter (the shard is this rank's slice of the full tensor, which needs the
// slice to be contiguous: every dimension before `dim` of size 1).
inline bool bytes_overlap(uintptr_t a, size_t na, uintptr_t b, size_t nb) {
  return na && nb && a < b + nb && b < a + na;
}
enum class Overlap : int { apart, in_place, bad };
inline Overlap all_reduce_overlap(uintptr_t in, uintptr_t out, size_t bytes) {
  if (in == out) return Overlap::in_place;
  return bytes_overlap(in, bytes, out, bytes) ? Overlap::bad : Overlap::apart;
}
// gather: `in` is this rank's shard, `out` the full tensor; reduce_scatter the other way round.
inline Overlap shard_overlap(bool gather, uintptr_t in, uintptr_t out, const Shape& full, int dim, int elt,
                             int world, int r) {
  const long long n = full.numel();
  if (n == 0) return Overlap::apart;
  const detail::Split3 v = detail::split3(full, dim);
  const Range sh = shard(v.mid, world, r);
  const size_t full_bytes = static_cast<size_t>(n) * elt;
  const size_t shard_bytes = static_cast<size_t>(v.outer * sh.size * v.inner) * elt;
  const uintptr_t whole = gather ? out : in, part = gather ? in : out;
  if (!bytes_overlap(whole, full_bytes, part, shard_bytes)) return Overlap::apart;
  const uintptr_t slice = whole + static_cast<uintptr_t>(sh.begin * v.inner * elt);
  return v.outer == 1 && part == slice ? Overlap::in_place : Overlap::bad;
}

// The direct path's kernel shape (kernel.cuh: CopyShape, PairShape, ReduceShape), which sets the
// bytes per block and so the grid. Every rank counts its peers' "done" signals with its own grid
// (dones_per_call), so every rank must launch the same grid: the shape comes from the collective
// and the world, never from this rank's plan, whose transfers vanish where its share is empty (a
// shard of size 0, a Ulysses rank without sequence rows).
enum class DirectShape : int { copy, pair, reduce };
// Sources per transfer of every rank's plan of collective k (the schedule test checks it).
__host__ __device__ inline int direct_sources(Kind k, int world) {
  return k == Kind::all_gather || k == Kind::seq_to_head || k == Kind::head_to_seq ? 1 : world;
}
__host__ __device__ inline DirectShape direct_shape(Kind k, int world) {
  const int n = direct_sources(k, world);
  return n == 1 ? DirectShape::copy : n == 2 ? DirectShape::pair : DirectShape::reduce;
}

// Per call, every rank's block 0 signals "arrived" to every rank and every block of every rank
// signals "done" to every rank (after its reads and writes): what each rank waits for.
__host__ __device__ inline unsigned long long arrivals_per_call(int world) { return world; }
__host__ __device__ inline unsigned long long dones_per_call(int world, int blocks) {
  return static_cast<unsigned long long>(world) * blocks;
}

}  // namespace weave::coll
