// LL ("low latency") all-reduce for small inputs. Every rank writes its input into every peer's
// scratch as 8-byte lines {4 data bytes, 4 flag bytes}; an aligned 8-byte store is single-copy
// atomic, so a reader that sees this call's flag in a line sees the line's data too: no fence and
// no signal phase, only the stores' flight. The price is twice the bytes on the link, so it wins
// only while latency, not bandwidth, decides.
//
// Scratch reuse: slot [parity][source] is rewritten two LL calls later. A rank that starts call
// n+2 has finished call n+1, whose data every peer wrote in its own call n+1, after its call n
// (and so its reads of the slot) ended: no extra synchronization is needed.
#pragma once
#include <cstdint>

#include "weave/config.hpp"
#include "weave/reduce.cuh"
#include "weave/signal.cuh"

namespace weave::coll {

struct LLArgs {
  const unsigned char* in;  // this rank's input
  unsigned char* out;
  unsigned long long* slot[kMaxWorld];        // rank q's scratch[parity][this rank]: where my lines go
  const unsigned long long* mine[kMaxWorld];  // my scratch[parity][r]: rank r's lines
  long long bytes;                            // input bytes (a multiple of the element size)
  unsigned flag;                              // this call's number; never 0
  signals sig;                                // rank, world, and the timeout diagnostics
};

inline constexpr int kLLThreads = 512;

namespace detail {
// Word i (4 bytes) of a buffer of `bytes` bytes; a 16-bit tensor of odd length ends in half a word.
__device__ __forceinline__ uint32_t ll_load(const unsigned char* p, long long i, long long bytes) {
  if (4 * i + 4 <= bytes) return *reinterpret_cast<const uint32_t*>(p + 4 * i);
  return *reinterpret_cast<const uint16_t*>(p + 4 * i);
}
__device__ __forceinline__ void ll_store(unsigned char* p, long long i, long long bytes, uint32_t w) {
  if (4 * i + 4 <= bytes) *reinterpret_cast<uint32_t*>(p + 4 * i) = w;
  else *reinterpret_cast<uint16_t*>(p + 4 * i) = static_cast<uint16_t>(w);
}
__device__ __forceinline__ unsigned long long ld_relaxed_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_sys(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
}  // namespace detail

template <class T, ReduceOp Op>
__global__ void __launch_bounds__(kLLThreads) ll_all_reduce_kernel(const __grid_constant__ LLArgs a) {
  constexpr int E = 4 / sizeof(T);
  const int W = a.sig.world, me = a.sig.rank;
  const long long words = (a.bytes + 3) / 4, stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (long long i = first; i < words; i += stride) {
    const unsigned long long line = static_cast<unsigned long long>(a.flag) << 32 | detail::ll_load(a.in, i, a.bytes);
    for (int k = 0; k < W - 1; ++k) detail::st_relaxed_sys(a.slot[(me + 1 + k) % W] + i, line);
  }
  for (long long i = first; i < words; i += stride) {
    float acc[E];
    for (int r = 0; r < W; ++r) {
      uint32_t w;
      if (r == me) {
        w = detail::ll_load(a.in, i, a.bytes);
      } else {
        unsigned long long line = 0;
        const unsigned long long* p = a.mine[r] + i;
        weave::detail::poll(
            a.sig, r, a.flag, [&] { return static_cast<unsigned>((line = detail::ld_relaxed_sys(p)) >> 32) == a.flag; },
            [&] { return line >> 32; });
        w = static_cast<uint32_t>(line);
      }
      const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
      for (int j = 0; j < E; ++j)
        acc[j] = r == 0 ? weave::detail::to_f32(e[j]) : weave::detail::combine<Op>(acc[j], weave::detail::to_f32(e[j]));
    }
    uint32_t w;
    T* o = reinterpret_cast<T*>(&w);
#pragma unroll
    for (int j = 0; j < E; ++j) o[j] = weave::detail::from_f32<T>(acc[j]);
    detail::ll_store(a.out, i, a.bytes, w);
  }
}

}  // namespace weave::coll
