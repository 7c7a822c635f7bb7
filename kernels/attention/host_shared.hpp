// Host pieces the single-GPU attention launch (attention.cu) shares with the gathered kernel's
// (kernels/gathered_attention): the 4-D TMA map of a (B, rows, H, D) tensor, the per-device
// tile counters and front words, the L2 section size. Defined in attention.cu.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace weave::attention {

// A (B, rows, H, D) bf16 tensor whose batches are `batch_stride` elements apart, as a 4-D TMA
// map {D, H, rows, B} read or written in boxes {box_d, box_h, box_rows, 1}; 128-byte swizzle
// when `swizzle` (attention operand tiles), none otherwise (plain copies).
CUtensorMap map_rows(const void* base, int D, int H, long long rows, int B, long long batch_stride, uint32_t box_d,
                     uint32_t box_h, uint32_t box_rows, bool swizzle);

}  // namespace weave::attention

namespace weave::attention::detail {
// Defined in attention.cu; the gathered kernel's launch (gathered.cu) uses them too.
int* tile_counter(int dev, cudaStream_t stream);  // a zeroed tile counter from a per-device pool
constexpr size_t kFrontWords = size_t(1) << 16;
unsigned long long* front_words(int dev, unsigned* tag);  // kFrontWords per device; a fresh tag
int heads_per_section(int l2, long long S, int D, int group);  // heads whose K/V fit in half of L2
}  // namespace weave::attention::detail
