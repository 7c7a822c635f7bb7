// Host-visible parameters of the gathered attention kernel (gathered_kernel.cuh) and the host
// helpers ring and Ulysses attention build them with (gathered.cu).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "attention/host_shared.hpp"  // map_rows, detail:: (tile counters, front words, L2 sections)
#include "weave/config.hpp"
#include "weave/signal_types.hpp"

namespace weave::attention {

constexpr int kMaxPushTensors = 3;

// One tensor this rank pushes: boxes {D, box_heads, box_rows, 1} of its own chunk i's rows
// (chunk-relative row coordinates in both maps, so each map clips at the chunk's end).
struct PushTensor {
  CUtensorMap src[2];             // own chunk i of the local input
  CUtensorMap dst[kMaxWorld][2];  // rank d's gathered buffer, rows of own chunk i
  int head0[kMaxWorld];           // source head of destination d's head 0
  int heads[kMaxWorld];           // heads destination d needs
  int box_heads, box_rows;
  uint32_t box_bytes;
  // Contiguous mode (GatheredGlobals::contig): chunk i's first row in the local input and in
  // rank d's gathered buffer.
  const uint8_t* src_ptr[2];
  uint8_t* dst_ptr[kMaxWorld][2];
};

struct GatheredGlobals {
  // Compute side.
  CUtensorMap q[2];          // per query chunk, chunk-relative rows; boxes {64, 1, 128, 1}
  CUtensorMap k, v;          // gathered (B, S, Hkv_g, D), global rows; boxes {64, 1, 128, 1}
  CUtensorMap o[kMaxWorld];  // output targets (ring: per query chunk; Ulysses: per owner rank)
  int n_qchunks;
  int q_begin[2], q_rows[2], q_mblocks[2];
  int q_lse_off[2];             // local row of the chunk's first row (LSE index)
  int start_row[2];             // key row a tile of the chunk visits first (gathered_schedule.hpp)
  int n_otargets, o_by_owner;   // o_by_owner: every target intersecting a tile half gets its rows
  int o_begin[kMaxWorld], o_rows[kMaxWorld];
  __nv_bfloat16* o_ptr[kMaxWorld];  // o_by_owner: each owner's O (B, o_rows, o_heads, D), as mapped here
  int o_heads;
  float* lse;                   // (B, H, lse_rows) or null
  int lse_rows;
  int B, S, H;                  // S: the whole sequence; H: query heads computed here
  int group, head_base, kv_base;  // global head = head_base + h; gathered kv head = global / group - kv_base
  int m_blocks;                 // query blocks over all query chunks
  int heads_per_section;
  float scale, scale_log2;
  int causal;
  int total_tiles;
  int* counter;
  // Non-causal only (else null): per (batch, gathered kv head), the front_word of the block the
  // CTAs on that head last began a slice at (gathered_schedule.hpp, aligned_start).
  unsigned long long* front;
  int front_heads;     // gathered kv heads per batch
  unsigned front_tag;  // this launch's tag, never 0 (the buffer starts zeroed)
  // Readiness: counter_index(b, g, s) expects ready_round * chunks_in_slice(S, n_chunks, s).
  // Rounds are read on the device where a CUDA graph may replay the launch (signal_types.hpp).
  signals ready;
  Round ready_round;
  int groups, group_heads, slices, n_chunks;
  int wait_q;  // Q tiles are gathered too (Ulysses)
  // Communicators.
  int num_comm, rank, world;
  signals arrive;  // arrive[0]: ranks in this call (every gathered buffer is free)
  Round arrive_round;
  int n_mine, mine[2];  // this rank's chunks
  int skip_self;        // this rank's own rows are not pushed (the host copied them, or they are read in place)
  // Own rows read in place (ring): key blocks [own_b0[i], own_b1[i]) are rows of this rank's
  // chunk i (first row own_row0[i]), loaded through k_own[i] / v_own[i] (the local input,
  // chunk-relative rows) instead of the gathered buffers, which then never hold them. 0: none.
  int n_own;
  int own_b0[2], own_b1[2], own_row0[2];
  CUtensorMap k_own[2], v_own[2];
  int n_push;
  PushTensor push[kMaxPushTensors];
  // Contiguous mode: a piece (b, rows of one chunk, all heads) is one byte range at
  // b * src_bstride (+ rows * row_bytes) in the source and b * dst_bstride in the destination.
  int contig;
  long long src_bstride, dst_bstride, row_bytes;
  // Ulysses completion: odone[0] on rank p counts O stores into p, odone_round * odone_per in all.
  int count_o;
  signals odone;
  Round odone_round;
  unsigned long long odone_per;
};

// Box shape for pushing `heads` heads of D: at most 8 heads, 16 KB.
void push_box(int D, int heads, int* box_heads, int* box_rows);

// Fills the tile order (m_blocks, sections, total_tiles, counter, the non-causal front words)
// after checking g.num_comm against the device; launch_gathered's first step, for launches of an
// extended kernel (gathered_launch.cuh) too.
void plan_gathered(GatheredGlobals& g, int D, cudaStream_t stream);

// Fills the tile order (m_blocks, sections, total_tiles, counter) and launches on every SM of
// the current device: g.num_comm communicator CTAs and the rest compute. D is 64 or 128.
// `take_rounds(g)` sets the rounds once every check passed, right before the launch: a call
// rejected on every rank takes no round (the next call would wait for one nobody signals).
void launch_gathered(GatheredGlobals& g, int D, cudaStream_t stream,
                     const std::function<void(GatheredGlobals&)>& take_rounds);

}  // namespace weave::attention
