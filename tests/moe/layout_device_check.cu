// Compiles every device-callable function of kernels/moe/layout.hpp as device code (sm_90a).
// The kernel is never launched; test_moe_layout.cpp tests the same functions on the host.
#include "moe/layout.hpp"

namespace weave::moe {

__global__ void moe_layout_device_check(const int* topk_idx, const int* counts, int T, int k,
                                        Geometry g, int s, int capacity, int* scratch, int* out) {
  int* row_counts = scratch;                   // E
  int* tokens = row_counts + g.experts;        // W
  int* base = tokens + g.world;                // E
  int* cursor = base + g.experts;              // E, zeroed by the caller
  int* rows = cursor + g.experts;              // k
  count_rows(topk_idx, T, k, g, row_counts);
  count_tokens(topk_idx, T, k, g, tokens);
  send_bases(counts, g, s, base);
  place_token(topk_idx, k, base, cursor, rows);
  const RowOwner o = locate_row(counts, g, s, rows[0]);
  out[0] = primary_slot(topk_idx, k, g, k - 1) + valid_expert(topk_idx[0], g);
  out[1] = expert_rows(counts, g, 0) + rank_rows(counts, g, s) + block_begin(counts, g, s, 0, 0);
  out[2] = first_overflow(counts, g, s, capacity) + o.local + o.src;
}

}  // namespace weave::moe
