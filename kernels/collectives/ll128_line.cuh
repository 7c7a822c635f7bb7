// The LL128 line protocol (ll128.cuh has the kernels built on it): the layout of a 128-byte line
// (plan.hpp, ll128_slot_word), how a warp stores one (8 lanes, one 16-byte store each, the flag in
// lane 7's last word, the warp converged so that the line leaves in one store instruction), and how
// a warp receives one (detail::receive). Separate from the kernels so that tests can drive the
// protocol directly (tests/collectives/test_ll128_stress.cu).
#pragma once
#include <cstdint>

#include "collectives/plan.hpp"
#include "weave/memory_order.cuh"
#include "weave/signal.cuh"

namespace weave::coll {

inline constexpr int kLL128Threads = 512;
// 16-byte pieces of a line: a line is 8 of them.
inline constexpr int kLL128Pieces = 8;

namespace detail {

// One lane's 16-byte piece of a line, stored and loaded as one volatile vector access
// (weave/memory_order.cuh says why volatile).
__device__ __forceinline__ void st_piece(uint4* p, const uint4& v) { st_volatile_v4(p, v); }
__device__ __forceinline__ uint4 ld_piece(const uint4* p) { return ld_volatile_v4(p); }
__device__ __forceinline__ uint32_t& at(uint4& v, int k) { return (&v.x)[k]; }

struct LL128Lane {
  long long warp, warps;  // this warp in the grid, warps in the grid
  int group, j;           // 8-lane group in the warp (0..3), lane in the group (0..7)
  __device__ LL128Lane() {
    const long long t = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
    warp = t >> 5;
    warps = (static_cast<long long>(gridDim.x) * blockDim.x) >> 5;
    group = (threadIdx.x & 31) >> 3;
    j = threadIdx.x & 7;
  }
  __device__ long long line(long long step) const { return (step * warps + warp) * 4 + group; }
  // Steps this warp takes to cover `lines` lines (warp-uniform).
  __device__ long long steps(long long lines) const {
    const long long quads = (lines + 3) / 4;
    return quads > warp ? (quads - warp + warps - 1) / warps : 0;
  }
};

// This lane's piece of line L: data words from word(i) (i < n), the flag in lane 7's last word.
template <class Word>
__device__ __forceinline__ uint4 pack(const LL128Lane& l, long long L, long long n, unsigned flag, Word&& word) {
  uint4 v;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int w = ll128_slot_word(l.j, k);
    const long long i = L * kLL128Words + w;
    at(v, k) = w >= 0 && i < n ? word(i) : 0u;
  }
  if (l.j == 7) v.w = flag;
  return v;
}
template <class Store>
__device__ __forceinline__ void unpack(const LL128Lane& l, long long L, long long n, const uint4& v, Store&& store) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int w = ll128_slot_word(l.j, k);
    const long long i = L * kLL128Words + w;
    if (w >= 0 && i < n) store(i, (&v.x)[k]);
  }
}

// The piece of line `L` of rank `from`'s slot `slot` (lines it wrote for this rank), once the
// line carries this call's flag; warp-collective (every lane calls it; `active` false for a group
// without a line this step). Times out like every weave wait, naming the rank.
//
// The writer stores a line with one warp instruction, but nothing promises that one warp load
// reads the line at one instant: its pieces may be read a little apart, so the load that first
// sees the flag can hold pieces from before the line arrived. The data therefore comes from a
// load issued after the flag was seen (the line has landed in this GPU's memory by then) whose
// own flag still matches; were it ever not to, the group starts over. Cost: one more load of the
// line, from L2, per line and peer.
__device__ __forceinline__ uint4 receive(const signals& sig, const LL128Lane& l, const uint4* slot, long long L,
                                         bool active, int from, unsigned flag) {
  const uint4* p = slot + L * kLL128Pieces + l.j;
  const int flag_lane = (threadIdx.x & 31) | 7;
  uint4 v = make_uint4(0, 0, 0, 0);
  // Per 8-lane group (every lane of a group sees its flag lane's word, so the state is uniform in
  // the group): 0 waiting for the flag, 1 flag seen (the next load is the data), 2 done.
  int state = active ? 0 : 2;
  unsigned seen = flag;
  weave::detail::poll(
      sig, from, flag,
      [&] {
        if (state < 2) v = ld_piece(p);
        const unsigned f = __shfl_sync(0xffffffffu, v.w, flag_lane);
        if (state < 2) state = f == flag ? state + 1 : 0, seen = f;
        return __all_sync(0xffffffffu, state == 2) != 0;
      },
      [&] { return __reduce_min_sync(0xffffffffu, seen); });
  return v;
}

}  // namespace detail

}  // namespace weave::coll
