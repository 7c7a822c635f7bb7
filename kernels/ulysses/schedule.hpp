// Ulysses attention's head and row assignment as pure __host__ __device__ functions (CPU-tested
// in tests/sp). The gather schedule (slices, counters, push units) is
// attention/gathered_schedule.hpp; here the W row shards are its chunks.
#pragma once
#include "gathered_attention/gathered_schedule.hpp"

namespace weave::sp::uly {

__host__ __device__ inline attention::gathered::Rows shard(long long S, int W, int rank) {
  return attention::gathered::split(S, W, rank);
}
// Rank r computes query heads [r * Hq / W, (r + 1) * Hq / W) (Hq % W == 0).
__host__ __device__ inline int q_heads(int Hq, int W) { return Hq / W; }
// The K/V heads those query heads use (GQA: query head h uses kv head h / (Hq / Hkv)):
// [kv_first, kv_first + kv_count). With Hkv < W several ranks use the same kv head.
__host__ __device__ inline int kv_first(int Hq, int Hkv, int W, int rank) { return rank * q_heads(Hq, W) / (Hq / Hkv); }
__host__ __device__ inline int kv_count(int Hq, int Hkv, int W, int rank) {
  const int group = Hq / Hkv, hp = q_heads(Hq, W);
  return ((rank + 1) * hp - 1) / group - kv_first(Hq, Hkv, W, rank) + 1;
}
// The gathered K/V buffers hold the most any rank needs (same allocation on every rank).
__host__ __device__ inline int kv_heads_max(int Hq, int Hkv, int W) {
  int m = 0;
  for (int r = 0; r < W; ++r) m = kv_count(Hq, Hkv, W, r) > m ? kv_count(Hq, Hkv, W, r) : m;
  return m;
}
// O stores rank `owner` receives per call: every (batch, query head) tile half (64 global rows)
// intersecting its rows, from whichever rank computed that head.
__host__ __device__ inline long long o_stores(long long S, int W, int B, int Hq, int owner) {
  const attention::gathered::Rows r = shard(S, W, owner);
  if (r.rows == 0) return 0;
  return static_cast<long long>(B) * Hq * ((r.end() - 1) / 64 - r.begin / 64 + 1);
}

}  // namespace weave::sp::uly
