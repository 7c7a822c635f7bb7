// Warp-level tensor core multiply (mma.sync, sm_80+), the register-operand form, and the global
// load that feeds it: for kernels whose operands go straight from global memory into registers
// (no shared memory, no descriptors).
//
// m16n8k16, bf16 inputs, fp32 accumulators. Per lane l (group g = l / 4, c = l % 4):
//   a[0] = A(g, 2c..2c+1)    a[1] = A(g+8, 2c..2c+1)   a[2] = A(g, 2c+8..2c+9)   a[3] = A(g+8, 2c+8..2c+9)
//   b[0] = B(2c..2c+1, g)    b[1] = B(2c+8..2c+9, g)
//   d[0..1] = D(g, 2c..2c+1) d[2..3] = D(g+8, 2c..2c+1)
// (each a/b word holds two bf16, the lower k in the low half).
#pragma once
#include <cstdint>

namespace weave::tile::mma {

__device__ __forceinline__ void m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// m16n8k32, fp8 inputs (e4m3 / e5m2 each; sm_89+), fp32 accumulators. The same register layout
// with 4 fp8 per word: a[0] = A(g, 4c..4c+3), a[1] = A(g+8, 4c..4c+3), a[2] = A(g, 4c+16..4c+19),
// a[3] = A(g+8, 4c+16..4c+19); b[0] = B(4c..4c+3, g), b[1] = B(4c+16..4c+19, g).
template <bool kAE5M2, bool kBE5M2>
__device__ __forceinline__ void m16n8k32_fp8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#define WEAVE_MMA_FP8(TA, TB)                                                                              \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." TA "." TB                                           \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                       \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                             \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
  if constexpr (!kAE5M2 && !kBE5M2) WEAVE_MMA_FP8("e4m3", "e4m3");
  else if constexpr (kAE5M2 && !kBE5M2) WEAVE_MMA_FP8("e5m2", "e4m3");
  else if constexpr (!kAE5M2 && kBE5M2) WEAVE_MMA_FP8("e4m3", "e5m2");
  else WEAVE_MMA_FP8("e5m2", "e5m2");
#undef WEAVE_MMA_FP8
}

// 16 bytes read once: not kept in L1, and the L2 fetches the 128-byte line around them (the warp's
// neighbouring loads ask for the rest of it next). Non-coherent path: the data must not change
// while the kernel runs. 128 bytes, not 256: with 256 the decode tile's back-to-back launches ran
// 12-41 % slower than one cold launch on an H100 (clocks steady at 1980 MHz), its L2 fabric crossings
// per DRAM sector 1.5x cuBLAS's; 128 brought them level (docs/perf-notes.md, 2026-12-07 fifth session).
__device__ __forceinline__ uint4 ld_stream_v4(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

}  // namespace weave::tile::mma
