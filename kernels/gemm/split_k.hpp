// Split-K of a GEMM's last partial round, as pure functions (CPU-tested, used by the kernel).
//
// Why: a persistent GEMM whose item count is not a multiple of its workers (compute blocks or
// clusters) leaves the last round partly idle, and one with fewer items than workers (decode,
// M <= 256, or a narrow N) leaves most of the machine idle for the whole run. Here the whole
// rounds run as they are, and each item of the last partial round is cut into `splits` equal K
// ranges that run as separate work items; the contributors add their fp32 partial sums together
// at the end (the last to finish adds the others' to its own and stores the tile; no one waits).
//
// The split items are numbered split-major (all first K ranges, then all second ones, ...), so
// the items that run at the same time read the same K range: tiles that share an A row panel or
// a B column panel hit L2 as whole tiles of one round do. (Stream-K, which gives each worker an
// equal contiguous share of all iterations, starts neighbouring tiles at different K offsets:
// measured on one H200 it read tiles' panels from DRAM again and ran 2048x7168x18432 at 0.73 of
// the unsplit time; docs/perf-notes.md.)
#pragma once

namespace weave::gemm {

struct SplitK {
  int items = 0;     // work items in all (tiles, or tile pairs for 2-CTA clusters)
  int iters = 0;     // K iterations per item
  int dp_items = 0;  // items run whole, first
  int splits = 1;    // K ranges of each remaining item (1 <= splits <= iters)
};

// Work item w of the kernel's loop, resolved.
struct Segment {
  int item = 0;
  int k_begin = 0;  // first K iteration
  int k_iters = 0;
  int split = -1;  // which K range of a split item; -1: the item whole
};

__host__ __device__ inline int tail_items(const SplitK& s) { return s.items - s.dp_items; }
__host__ __device__ inline int num_work(const SplitK& s) { return s.dp_items + tail_items(s) * s.splits; }
__host__ __device__ inline int split_begin(const SplitK& s, int j) {
  return static_cast<int>(static_cast<long long>(s.iters) * j / s.splits);
}

__host__ __device__ inline Segment segment(const SplitK& s, int w) {
  if (w < s.dp_items) return {w, 0, s.iters, -1};
  const int v = w - s.dp_items, r = tail_items(s);
  const int j = v / r, t = v % r;
  const int b = split_begin(s, j);
  return {s.dp_items + t, b, split_begin(s, j + 1) - b, j};
}

// Rounds of work (in iterations of one item) for `items` on `workers` with the last partial
// round split `splits` ways.
__host__ __device__ inline long long split_rounds(int items, int iters, int workers, int splits) {
  const int tail = items % workers;
  const long long whole = static_cast<long long>(items / workers) * iters;
  if (tail == 0) return whole;
  const long long per = (static_cast<long long>(iters) + splits - 1) / splits;
  return whole + (static_cast<long long>(tail) * splits + workers - 1) / workers * per;
}

__host__ __device__ inline SplitK make_split_k(int items, int iters, int workers, int splits) {
  SplitK s;
  s.items = items;
  s.iters = iters;
  s.dp_items = items;
  if (splits > iters) splits = iters;
  if (items <= 0 || workers <= 0 || splits <= 1 || items % workers == 0) return s;
  s.dp_items = items - items % workers;
  s.splits = splits;
  return s;
}

// The split count the model prefers for the last partial round: the fewest splits within 2 % of
// the fewest rounds, at most `max_splits` and at most two rounds of split items (each split adds
// a partial's write and read, `split_cost` iterations).
__host__ __device__ inline int best_splits(int items, int iters, int workers, int max_splits, double split_cost) {
  const int tail = workers > 0 ? items % workers : 0;
  if (tail == 0 || iters <= 1) return 1;
  double best = static_cast<double>(split_rounds(items, iters, workers, 1));
  int pick = 1;
  for (int s = 2; s <= max_splits && s <= iters && static_cast<long long>(tail) * s <= 2LL * workers; ++s) {
    const double c = static_cast<double>(split_rounds(items, iters, workers, s)) + split_cost;
    if (c < 0.98 * best) best = c, pick = s;
  }
  return pick;
}

}  // namespace weave::gemm
