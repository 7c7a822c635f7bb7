// Host side of the gathered attention kernel: maps, push boxes, launch (two instantiations:
// D = 64 and 128, ping-pong on).
#include <algorithm>

#include "gathered_attention/gathered.hpp"
#include "gathered_attention/gathered_kernel.cuh"
#include "gathered_attention/gathered_launch.cuh"
#include "weave/common/error.hpp"
#include "weave/lcsc.cuh"
#include "weave/tile/tma.hpp"

namespace weave::attention {

void push_box(int D, int heads, int* box_heads, int* box_rows) {
  *box_heads = std::min(heads, 8);
  *box_rows = std::min(256, 16384 / (2 * D * *box_heads));
}

// Passed by value as a __grid_constant__ parameter (W up to kMaxWorld: ~9.5 KB of tensor maps).
static_assert(sizeof(GatheredGlobals) <= 32764, "kernel parameters are limited to 32764 bytes");

void plan_gathered(GatheredGlobals& g, int D, cudaStream_t stream) {
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  const lcsc::DeviceInfo info = lcsc::device_info(dev);
  WEAVE_CHECK(g.num_comm >= 1 && g.num_comm <= info.sm_count / 2, "attention: num_comm_sms = ", g.num_comm,
              " must be in [1, ", info.sm_count / 2, "]");
  g.m_blocks = 0;
  for (int i = 0; i < g.n_qchunks; ++i) {
    g.q_mblocks[i] = (g.q_rows[i] + gathered::kBlockRows - 1) / gathered::kBlockRows;
    g.m_blocks += g.q_mblocks[i];
  }
  if (g.n_qchunks < 2) g.q_mblocks[1] = 0;
  // Non-causal tiles all have one length, so one (batch, head) per section costs no tail and the
  // CTAs in flight share the fewest heads' K/V: +2-3 % at 8K, +1 % at 16K against the L2 rule
  // (7 and 3 heads; 1 from 32K). Causal tiles keep the rule: longest first across a section's
  // heads balances their lengths (docs/perf-notes.md, session 7).
  g.heads_per_section = g.causal ? detail::heads_per_section(lcsc::device_info(dev).l2_bytes, g.S, D, g.group) : 1;
  const long long tiles = static_cast<long long>(g.m_blocks) * g.B * g.H;
  WEAVE_CHECK(tiles < (1ll << 31), "attention: too many tiles (", tiles, ")");
  g.total_tiles = static_cast<int>(tiles);
  g.counter = detail::tile_counter(dev, stream);
  g.front = nullptr, g.front_heads = 0, g.front_tag = 0;
  if (!g.causal) {
    g.front_heads = (g.head_base + g.H - 1) / g.group - g.kv_base + 1;
    if (static_cast<size_t>(g.B) * g.front_heads <= detail::kFrontWords)
      g.front = detail::front_words(dev, &g.front_tag);
  }
}

void launch_gathered(GatheredGlobals& g, int D, cudaStream_t stream,
                     const std::function<void(GatheredGlobals&)>& take_rounds) {
  plan_gathered(g, D, stream);
  take_rounds(g);
  if (D == 64) launch_gathered_kernel<GatheredKernel<64, true>>(g, stream);
  else launch_gathered_kernel<GatheredKernel<128, true>>(g, stream);
}

}  // namespace weave::attention
