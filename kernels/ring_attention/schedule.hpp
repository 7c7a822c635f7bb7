// Ring attention's sharding as pure __host__ __device__ functions (CPU-tested in tests/sp). The
// gather schedule (slices, counters, push units) is attention/gathered_schedule.hpp.
#pragma once
#include "gathered_attention/gathered_schedule.hpp"

namespace weave::sp::ring {

// 0: contiguous (W chunks, rank r holds chunk r); 1: zigzag (2W chunks, rank r holds r and
// 2W-1-r, so every rank has one early and one late chunk: equal causal work).
__host__ __device__ inline int num_chunks(int W, int zigzag) { return zigzag ? 2 * W : W; }
__host__ __device__ inline int chunks_per_rank(int zigzag) { return zigzag ? 2 : 1; }
__host__ __device__ inline int chunk_id(int W, int zigzag, int rank, int i) { return i == 0 ? rank : 2 * W - 1 - rank; }
__host__ __device__ inline attention::gathered::Rows chunk(long long S, int W, int zigzag, int rank, int i) {
  return attention::gathered::split(S, num_chunks(W, zigzag), chunk_id(W, zigzag, rank, i));
}
// Local row of chunk i's first row (chunks stored back to back in i order).
__host__ __device__ inline long long local_offset(long long S, int W, int zigzag, int rank, int i) {
  return i == 0 ? 0 : chunk(S, W, zigzag, rank, 0).rows;
}
__host__ __device__ inline long long local_rows(long long S, int W, int zigzag, int rank) {
  long long n = 0;
  for (int i = 0; i < chunks_per_rank(zigzag); ++i) n += chunk(S, W, zigzag, rank, i).rows;
  return n;
}

}  // namespace weave::sp::ring
