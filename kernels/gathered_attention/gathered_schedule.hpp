// Schedule of attention over a gathered sequence (ring and Ulysses attention, README.md of
// kernels/ring_attention and kernels/ulysses): pure __host__ __device__ functions that the
// kernel (gathered_kernel.cuh), the hosts and the CPU tests (tests/sp) share.
//
// The sequence of S rows is cut into `n` near-equal chunks (the first S % n one row longer); each
// chunk is held by one rank. Every rank gathers what it needs of every chunk into local buffers
// in global row order. Readiness is tracked per (batch, head group, slice): a slice is
// kSliceRows global rows (a whole number of 128-row key blocks), and every chunk that intersects
// a slice sends one "piece" into it followed by one signal, so the counter of a slice expects
// exactly `chunks_in_slice` signals per call.
#pragma once
#include "attention/key_blocks.hpp"  // the visible-block and mask rule of both attention kernels
#include "weave/common/split.hpp"

namespace weave::attention::gathered {

constexpr int kBlockRows = 128;               // key block and query tile rows
constexpr int kSliceBlocks = 4;               // key blocks per readiness counter
constexpr int kSliceRows = kBlockRows * kSliceBlocks;

struct Rows {
  long long begin = 0, rows = 0;
  __host__ __device__ long long end() const { return begin + rows; }
};

// Chunk i of S rows cut into n near-equal chunks (weave/common/split.hpp).
__host__ __device__ inline Rows split(long long S, int n, int i) {
  const Part<long long> p = near_equal_part(S, n, i);
  return {p.begin, p.size};
}
// The chunk holding row `row` (S >= n: no empty chunk).
__host__ __device__ inline int chunk_of_row(long long S, int n, long long row) {
  const long long q = S / n, rem = S % n;
  const long long big = rem * (q + 1);
  return row < big ? static_cast<int>(row / (q + 1)) : static_cast<int>(rem + (row - big) / q);
}

__host__ __device__ inline int num_slices(long long S) { return static_cast<int>((S + kSliceRows - 1) / kSliceRows); }
__host__ __device__ inline Rows slice_rows(long long S, int s) {
  const long long b = static_cast<long long>(s) * kSliceRows;
  return {b, (S - b < kSliceRows ? S - b : kSliceRows)};
}
// Signals a slice's counter receives per call: one per chunk intersecting the slice.
__host__ __device__ inline int chunks_in_slice(long long S, int n, int s) {
  const Rows r = slice_rows(S, s);
  return chunk_of_row(S, n, r.end() - 1) - chunk_of_row(S, n, r.begin) + 1;
}
// Of those, the chunks in `mine[0..nmine)` (a rank that fills its own rows itself, before the
// launch, expects only its peers' signals).
__host__ __device__ inline int own_chunks_in_slice(long long S, int n, int s, const int* mine, int nmine);
// The rows chunk c sends into slice s (rows == 0: none).
__host__ __device__ inline Rows piece(long long S, int n, int c, int s) {
  const Rows ch = split(S, n, c), sl = slice_rows(S, s);
  const long long b = ch.begin > sl.begin ? ch.begin : sl.begin;
  const long long e = ch.end() < sl.end() ? ch.end() : sl.end();
  return {b, e > b ? e - b : 0};
}

__host__ __device__ inline int own_chunks_in_slice(long long S, int n, int s, const int* mine, int nmine) {
  int k = 0;
  for (int i = 0; i < nmine; ++i) k += piece(S, n, mine[i], s).rows > 0 ? 1 : 0;
  return k;
}

// Readiness counters: ((b * groups) + g) * slices + s.
__host__ __device__ inline int counter_index(int b, int g, int s, int groups, int slices) {
  return (b * groups + g) * slices + s;
}

// Key blocks a query tile with global rows [q_begin, q_end) visits (block i = global key rows
// [128 i, 128 i + 128)): all of S, or for causal only those up to the tile's last row
// (key_blocks.hpp). The counter a key block waits for is its slice (block / kSliceBlocks).
__host__ __device__ inline int visible_blocks(long long S, long long q_end, bool causal) {
  return attention::visible_blocks<kBlockRows>(S, q_end, causal);
}
__host__ __device__ inline int slice_of_block(int n) { return n / kSliceBlocks; }
// Visiting order (online softmax does not care): blocks start, ..., n - 1, 0, ..., start - 1,
// where start holds `start_row`, a row whose K/V this rank has first (ring: the tile's own
// chunk, copied before the launch; Ulysses: its own shard), so tiles begin on local data while
// the peers' pushes are still arriving.
__host__ __device__ inline int first_block(long long start_row, int n) {
  const int b = static_cast<int>(start_row / kBlockRows);
  return b < n ? b : 0;
}
__host__ __device__ inline int block_at(int i, int start, int n) { return i + start < n ? i + start : i + start - n; }

// Where a non-causal tile starts when CTAs already work on its (batch, kv head): producers
// record the key block at which they last began a slice as `front_word(tag, block)` (tag: the
// launch), and a later tile of that head begins there instead of at `fallback`, its own first
// block. The CTAs on one head then read each K/V block at about the same time and share it
// through L2 even after they drift out of step (at 128K one head's K + V is 64 MB, more than
// L2; perf-notes, session 9). Any start in [0, n) visits the same blocks (block_at).
__host__ __device__ inline unsigned long long front_word(unsigned tag, int block) {
  return (static_cast<unsigned long long>(tag) << 32) | static_cast<unsigned>(block);
}
__host__ __device__ inline int aligned_start(unsigned long long word, unsigned tag, int n, int fallback) {
  const unsigned b = static_cast<unsigned>(word);
  return static_cast<unsigned>(word >> 32) == tag && b < static_cast<unsigned>(n) ? static_cast<int>(b) : fallback;
}

// A key block needs the mask when it runs past S, or (causal) some key in it lies after the
// first query row of `row_min` (a 64-row consumer half; key_blocks.hpp, the consumers' rule).
// The callers hold S < 2^30 (ring and Ulysses reject more).
__host__ __device__ inline bool block_needs_mask(int S, int n, int row_min, bool causal) {
  return attention::block_needs_mask<kBlockRows>(S, n, row_min, causal);
}

// The push plan of the rank holding chunks `mine[0..nmine)`: units (b, g, s, i) in this order
// (batch, head group, slice, own chunk), those with an empty piece skipped. Communicator c of
// nc takes units c, c + nc, ... of the flat index below.
__host__ __device__ inline int num_units(int B, int groups, int slices, int nmine) {
  return B * groups * slices * nmine;
}
struct Unit {
  int b, g, s, i;
};
__host__ __device__ inline Unit unit_at(int u, int groups, int slices, int nmine) {
  Unit x;
  x.i = u % nmine;
  u /= nmine;
  x.s = u % slices;
  u /= slices;
  x.g = u % groups;
  x.b = u / groups;
  return x;
}

}  // namespace weave::attention::gathered
