// Which key blocks a query tile visits and which of them run the mask: the rule both attention
// forward kernels (attention_kernel.cuh, kernels/gathered_attention) and their hosts and CPU
// tests share, as pure __host__ __device__ functions. Rows are positions in the key sequence
// (the gathered kernel's query rows are global positions too).
#pragma once

namespace weave::attention {

// Key blocks of BN rows (block n = keys [BN n, BN n + BN)) a query tile whose rows end before
// `q_end` visits: all ceil(S / BN), or for causal only those up to the tile's last row. I is the
// callers' row type (int in the single-GPU kernel, long long in the gathered schedule): the
// kernels compute it once per tile in that width.
template <int BN, class I>
__host__ __device__ __forceinline__ int visible_blocks(I S, I q_end, bool causal) {
  const I rows = causal ? (q_end < S ? q_end : S) : S;
  return static_cast<int>((rows + BN - 1) / BN);
}

// Key block n needs the mask when it runs past S, or (causal) some key in it lies after the
// first query row `row_min` (a 64-row consumer half). 32-bit: it runs once per key block in the
// consumers' critical path, and the callers hold S < 2^30.
template <int BN>
__host__ __device__ __forceinline__ bool block_needs_mask(int S, int n, int row_min, bool causal) {
  const int end = (n + 1) * BN;
  return end > S || (causal && end - 1 > row_min);
}

}  // namespace weave::attention
