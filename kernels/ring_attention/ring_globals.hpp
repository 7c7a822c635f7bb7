// The parts of ring attention's kernel parameters that do not depend on how K/V travel: shared by
// the single-node kernel (NVLink pushes, ring_attention.cu) and the inter-node one
// (kernels/net_ring_attention, the network path).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "gathered_attention/gathered.hpp"
#include "ring_attention/ring_attention.hpp"

namespace weave::sp::ring {

// Rank r of W: its query chunks, O targets and LSE, the K/V maps over the gathered buffers gk and
// gv ((B, S, Hkv, D) each), the one-group contiguous piece geometry (row_bytes, strides, slices,
// chunks), its chunks, and its own rows read in place from k and v where every own chunk lies on
// 128-row key blocks (g.n_own > 0; else 0 and copy_own_rows puts them into gk and gv). Leaves the
// communicators' fields (num_comm, push, signals, rounds) to the caller.
void fill_globals(attention::GatheredGlobals& g, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                  const RingShape& s, const RingOptions& opt, int W, int r, bf16* gk, bf16* gv);

// This rank's K and V rows into their place in gk and gv (stream-ordered copy kernels, one per chunk
// and tensor: runtime::device_copy_2d).
void copy_own_rows(const bf16* k, const bf16* v, bf16* gk, bf16* gv, const RingShape& s, int W, int r, int zz,
                   cudaStream_t stream);

}  // namespace weave::sp::ring
