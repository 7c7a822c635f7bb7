// The 4 x 4 byte transpose in registers shared by the fp8 transpose (transpose.cu) and the
// transposing quantiser (quantize.cu): both move fp8 bytes from source-major words into
// destination-major ones before their shared-memory tile.
#pragma once
#include <cstdint>

namespace weave::gemm_fp8 {

// a_i is row i's word (bytes = columns 0..3, little-endian); o_j gets column j's 4 bytes, row i in
// byte i. 8 byte permutes (prmt).
__device__ __forceinline__ void transpose4x4(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t& o0,
                                             uint32_t& o1, uint32_t& o2, uint32_t& o3) {
  const uint32_t t0 = __byte_perm(a0, a1, 0x5140);  // a0.b0 a1.b0 a0.b1 a1.b1
  const uint32_t t1 = __byte_perm(a0, a1, 0x7362);  // a0.b2 a1.b2 a0.b3 a1.b3
  const uint32_t t2 = __byte_perm(a2, a3, 0x5140);  // a2.b0 a3.b0 a2.b1 a3.b1
  const uint32_t t3 = __byte_perm(a2, a3, 0x7362);  // a2.b2 a3.b2 a2.b3 a3.b3
  o0 = __byte_perm(t0, t2, 0x5410);                 // a0.b0 a1.b0 a2.b0 a3.b0
  o1 = __byte_perm(t0, t2, 0x7632);                 // a0.b1 a1.b1 a2.b1 a3.b1
  o2 = __byte_perm(t1, t3, 0x5410);
  o3 = __byte_perm(t1, t3, 0x7632);
}

}  // namespace weave::gemm_fp8
