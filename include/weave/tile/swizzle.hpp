// Shared-memory swizzles shared by TMA and wgmma. A swizzled tile is stored as "atoms": rows
// of S bytes (S = 32, 64 or 128), and within each 8-row group the 16-byte chunk index is XORed
// with the row index, so that a column of 16-byte chunks spreads over all 32 banks. The XOR uses
// absolute shared-memory address bits, so every swizzled buffer starts on a 1024-byte boundary
// (the base-offset field of the wgmma descriptor is then 0).
#pragma once
#include <cstdint>

namespace weave::tile {

enum class Swizzle : int { None = 0, B32 = 32, B64 = 64, B128 = 128 };

constexpr int swizzle_bytes(Swizzle s) { return static_cast<int>(s); }

// Swizzle<B,4,3> applied to a linear byte offset (from a 1024-byte aligned base): bits 4..4+B-1
// (the 16-byte chunk) are XORed with bits 7..7+B-1, B = log2(S/16).
__host__ __device__ constexpr uint32_t swizzle_apply(Swizzle s, uint32_t linear) {
  if (s == Swizzle::None) return linear;
  const uint32_t mask = static_cast<uint32_t>(s) / 16 - 1;
  return linear ^ (((linear >> 7) & mask) << 4);
}

// Byte offset of (row, byte-in-row) inside a swizzled region whose rows are S bytes.
__host__ __device__ constexpr uint32_t swizzled_offset(Swizzle s, uint32_t row, uint32_t byte) {
  return swizzle_apply(s, row * static_cast<uint32_t>(s) + byte);
}

constexpr int kSwizzleAlign = 1024;

}  // namespace weave::tile
