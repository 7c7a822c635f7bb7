// The inter-node collectives' network phase, between rail peers (layout.hpp says where every byte
// goes; at G > 1 the NVLink phases around it are the single-node collectives, node_phase.hpp).
// all_reduce is the ring (ring_role, every block the same role, below). all_gather and
// reduce_scatter have two block roles in one grid, as mKernel's inter-node send and receive SMs:
//   send blocks     (blockIdx < send_blocks): wait at the call's send gate (the previous calls'
//                   commands no longer read the send buffer), then for each of their pieces copy
//                   the bytes from the device buffer into the mapped send buffer and queue the
//                   command (one per step for all_gather's own-shard pieces, one per (step, piece)
//                   for reduce_scatter's partials).
//   receive blocks  (the rest): for each of their pieces wait for its flag (all_gather: one
//                   sender's piece; reduce_scatter: the piece from every sender), copy it into the
//                   device buffer (reduce_scatter: add the N node partials in fp32, round once),
//                   then consume the flags.
// Every wait gives up when the path stops (device.cuh), so a failed peer ends the kernel.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "net_collectives/layout.hpp"
#include "weave/net/device.cuh"

namespace weave::net::coll {

struct KernelArgs {
  NetHandle h;
  char* buf;  // device memory, the whole buffer (in place)
  // reduce_scatter: where the partials are read (layout.hpp's partial_off): buf at G = 1, the
  // node scratch the NVLink reduce-scatter wrote at G > 1.
  const char* src;
  Layout L;
  uint64_t call, commands_before;
  uint64_t recv_base;  // the call's receive slot
  uint32_t flag_base;  // the call slot's first flag
  int send_blocks;
};

// 16-byte groups of elements, unpacked to fp32 for the reduction.
template <class T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int n = 4;
  __device__ static void load(const uint4& v, float* f) {
    f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
  }
  __device__ static uint4 store(const float* f) {
    return {__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3])};
  }
  __device__ static float to_float(float x) { return x; }
  __device__ static float from_float(float x) { return x; }
};
template <>
struct Vec<__nv_bfloat16> {
  static constexpr int n = 8;
  __device__ static void load(const uint4& v, float* f) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
  __device__ static uint4 store(const float* f) {
    uint32_t w[4];
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i]));
      const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i + 1]));
      w[i] = lo | (hi << 16);
    }
    return {w[0], w[1], w[2], w[3]};
  }
  __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};

// Item j of a rank's (step, piece) list, steps in order: false past the end.
template <class CountFn>
__device__ inline bool nth_item(const Layout& L, long long j, CountFn count, int* s, int* p) {
  for (int st = 0; st < steps(L); ++st) {
    const int n = count(st);
    if (j < n) {
      *s = st, *p = static_cast<int>(j);
      return true;
    }
    j -= n;
  }
  return false;
}

// Send blocks b = 0 .. nb - 1 of the grid. `staged(j)` (one thread; false: give up) before
// command j's source is read: at G = 1 always true, in the fused kernel the wait for the node's
// partial (net_coll_fused_schedule.hpp's ready counter).
struct NoWait {
  __device__ bool operator()(long long) const { return true; }
};
template <class W>
inline constexpr bool is_no_wait = std::is_same_v<W, NoWait>;  // G = 1: no agreement to make
template <class T, class Staged = NoWait>
__device__ void send_role(const KernelArgs& a, int b, int nb, Staged staged = {}) {
  const NetHandle& h = a.h;
  const Layout& L = a.L;
  const int r = h.rank;
  if (!open_send_gate(h, a.call, a.commands_before, b == 0)) return;
  Producer prod{h.queue};
  const bool ag = L.plan.coll == Coll::all_gather;
  // all_gather: the own shard's pieces, each to every step's peer; reduce_scatter: (step, piece).
  const long long items = ag ? step_pieces(L, r, 0) : commands(L, r);
  for (long long j = b; j < items; j += nb) {
    int s = 0, p = static_cast<int>(j);
    if (!ag) nth_item(L, j, [&](int st) { return step_pieces(L, r, st); }, &s, &p);
    const PieceCmd c0 = piece_cmd(L, r, s, p);
    if constexpr (!is_no_wait<Staged>)
      if (!block_agree(threadIdx.x == 0 ? staged(j) : true)) return;
    block_copy_out(h.send + c0.src_off, ag ? a.buf + c0.data_off : a.src + c0.part_off, static_cast<uint64_t>(c0.bytes));
    __syncthreads();
    bool ok = true;
    if (threadIdx.x == 0) {
      for (int st = ag ? 0 : s; ok && st < (ag ? steps(L) : s + 1); ++st) {
        const PieceCmd c = piece_cmd(L, r, st, p);
        const Command cmd{static_cast<uint64_t>(c.src_off), a.recv_base + static_cast<uint64_t>(c.dst_off),
                          static_cast<uint64_t>(c.bytes), 1, a.flag_base + c.chunk, static_cast<uint16_t>(c.peer),
                          kNotify, 0};
        ok = push(h, prod, cmd);
      }
    }
    if (!block_agree(ok)) return;
  }
}

// reduce_scatter: piece p of this rank's shard, the own (node's) partial plus the N - 1 arrived
// ones in step order (senders r - 1, r - 2, ...: the same order on every rank), into the buffer.
// Not inlined: inlined into the receive role it made both kernels spill (28 bytes in the G = 1
// fp32 kernel, 80 in the fused one, at 64 registers); a call per piece of kilobytes costs nothing.
template <class T>
__device__ __noinline__ void reduce_piece(const KernelArgs& a, int p) {
  const NetHandle& h = a.h;
  const Layout& L = a.L;
  const int r = h.rank, N = steps(L) + 1;
  const Bytes sh = shard(L.plan, r), pc = piece_of(L, sh.size, p);
  T* out = reinterpret_cast<T*>(a.buf + sh.off + pc.off);
  const T* own = reinterpret_cast<const T*>(a.src + partial_off(L, r, pc.off));  // this node's partial (out at G = 1)
  const long long n = pc.size / static_cast<long long>(sizeof(T));
  const long long groups = pc.size / 16;  // pieces start 16-aligned; a ragged tail is scalar
  constexpr int kV = Vec<T>::n;
  for (long long g = threadIdx.x; g < groups; g += blockDim.x) {
    float acc[kV], x[kV];
    Vec<T>::load(reinterpret_cast<const uint4*>(own)[g], acc);
    for (int s = 0; s < N - 1; ++s) {
      const PieceRecv v = piece_recv(L, r, s, p);
      Vec<T>::load(ld_volatile_v4(reinterpret_cast<const uint4*>(h.recv + a.recv_base + v.recv_off) + g), x);
      for (int i = 0; i < kV; ++i) acc[i] += x[i];
    }
    reinterpret_cast<uint4*>(out)[g] = Vec<T>::store(acc);
  }
  for (long long i = groups * kV + threadIdx.x; i < n; i += blockDim.x) {
    float acc = Vec<T>::to_float(own[i]);
    for (int s = 0; s < N - 1; ++s) {
      const PieceRecv v = piece_recv(L, r, s, p);
      const volatile T* in = reinterpret_cast<const volatile T*>(h.recv + a.recv_base + v.recv_off);
      acc += Vec<T>::to_float(const_cast<const T&>(in[i]));
    }
    out[i] = Vec<T>::from_float(acc);
  }
}

// all_gather at G = 1: an arrived piece into this rank's buffer (the fused kernel's copies it into
// every node rank's).
struct CopyIn {
  char* buf;
  __device__ void operator()(long long data_off, const char* in, long long bytes) const {
    block_copy_in(buf + data_off, in, static_cast<uint64_t>(bytes));
  }
};

// Receive blocks b = 0 .. nb - 1. all_gather: `deliver(data_off, arrival, bytes)` (all threads) puts
// each arrived piece in place. reduce_scatter: `own(p)` (one thread; false: give up) before the
// own partial of piece p is read (as send_role's `staged`). With one node (the fused kernel only)
// reduce_scatter's pieces are the own partial alone and all_gather has nothing to receive.
template <class T, class Deliver, class Own = NoWait>
__device__ void recv_role(const KernelArgs& a, int b, int nb, Deliver deliver, Own own = {}) {
  const NetHandle& h = a.h;
  const Layout& L = a.L;
  const int r = h.rank;
  if (L.plan.coll == Coll::all_gather) {
    long long total = 0;
    for (int s = 0; s < steps(L); ++s) total += recv_pieces(L, r, s);
    for (long long j = b; j < total; j += nb) {
      int s = 0, p = 0;
      nth_item(L, j, [&](int st) { return recv_pieces(L, r, st); }, &s, &p);
      const PieceRecv v = piece_recv(L, r, s, p);
      if (!block_agree(threadIdx.x == 0 ? wait_arrival(h, a.flag_base + v.chunk) : true)) return;
      deliver(v.data_off, h.recv + a.recv_base + v.recv_off, v.bytes);
      __syncthreads();
      if (threadIdx.x == 0) consume(h, a.flag_base + v.chunk);
    }
  } else {
    const int np = pieces(L, shard(L.plan, r).size);  // every sender sends the own shard's pieces
    for (int p = b; p < np; p += nb) {
      bool ok = true;
      if (threadIdx.x == 0) {
        for (int s = 0; ok && s < steps(L); ++s) ok = wait_arrival(h, a.flag_base + piece_recv(L, r, s, p).chunk);
        ok = ok && own(p);
      }
      if (!block_agree(ok)) return;
      reduce_piece<T>(a, p);
      __syncthreads();
      if (threadIdx.x == 0)
        for (int s = 0; s < steps(L); ++s) consume(h, a.flag_base + piece_recv(L, r, s, p).chunk);
    }
  }
}

// All threads: dst[i] = local[i] + in[i] (fp32, rounded to T), and dst2[i] too unless null. `in`
// is an arrival in the mapped receive buffer (volatile reads); dst may be local (in place: each
// thread reads its elements before it writes them).
template <class T>
__device__ void combine(char* dst, char* dst2, const char* local, const char* in, uint64_t bytes) {
  constexpr int kV = Vec<T>::n;
  const uint64_t groups = bytes / 16;
  for (uint64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    float acc[kV], x[kV];
    Vec<T>::load(reinterpret_cast<const uint4*>(local)[g], acc);
    Vec<T>::load(ld_volatile_v4(reinterpret_cast<const uint4*>(in) + g), x);
    for (int i = 0; i < kV; ++i) acc[i] += x[i];
    const uint4 v = Vec<T>::store(acc);
    reinterpret_cast<uint4*>(dst)[g] = v;
    if (dst2) reinterpret_cast<uint4*>(dst2)[g] = v;
  }
  const uint64_t n = bytes / sizeof(T);
  for (uint64_t i = groups * kV + threadIdx.x; i < n; i += blockDim.x) {
    const T y = Vec<T>::from_float(Vec<T>::to_float(reinterpret_cast<const T*>(local)[i]) +
                                   Vec<T>::to_float(const_cast<const T&>(reinterpret_cast<const volatile T*>(in)[i])));
    reinterpret_cast<T*>(dst)[i] = y;
    if (dst2) reinterpret_cast<T*>(dst2)[i] = y;
  }
}

// all_reduce: the ring of layout.hpp between rail peers, one (sub-chunk, piece) item at a time, on
// ring blocks b = 0 .. blocks - 1 (at G = 1 the whole grid). Block b takes items b, b + blocks, ...
// on every rank (the same count everywhere), each to its end: a rank's wait for an item needs only the previous
// rail peer's work on the same item, which that rank's block b reaches after the same earlier
// items, so the ring cannot deadlock. Hooks of the fused kernel (no-ops at G = 1): `local(j)` (one
// thread; false: give up) before item j's local bytes are read (the node's sum in place),
// `kept(j)` (one thread, after __syncthreads) once its result is in the buffer.
struct NoSignal {
  __device__ void operator()(long long) const {}
};
template <class T, class Local = NoWait, class Kept = NoSignal>
__device__ void ring_role(const KernelArgs& a, int b, int blocks, Local local = {}, Kept kept = {}) {
  const NetHandle& h = a.h;
  const Layout& L = a.L;
  const int r = h.rank, N = L.plan.topo.nodes;
  const uint16_t next = static_cast<uint16_t>(L.plan.topo.rail_peer(r, 1));
  if (!open_send_gate(h, a.call, a.commands_before, b == 0)) return;
  Producer prod{h.queue};
  const auto cmd = [&](int which, int c, int p, const Bytes& pc) {
    const uint64_t off = static_cast<uint64_t>(ring_slot_off(L, r, which, pc));
    return Command{off, a.recv_base + off, static_cast<uint64_t>(pc.size), 1, a.flag_base + ring_chunk_id(L, which, c, p),
                   next, kNotify, 0};
  };
  const long long items = ring_items(L, r);
  for (long long j = b; j < items; j += blocks) {
    int c = 0, p = 0;
    ring_item(L, r, j, &c, &p);
    const Bytes pc = ring_piece(L, r, c, p);
    const int d = ring_dist(L, r, c), e = (d + 1) % N;
    char* data = a.buf + pc.off;
    const uint64_t nb = static_cast<uint64_t>(pc.size);
    const long long sums = ring_slot_off(L, r, 0, pc), results = ring_slot_off(L, r, 1, pc);
    // Reduce-scatter: start the sum (d = 0), or add to the arrived partial sum and pass it on; the
    // last hop's receiver keeps the result and starts the all-gather with it.
    const uint32_t f_rs = a.flag_base + ring_chunk_id(L, 0, c, p);
    if constexpr (!is_no_wait<Local>)
      if (!block_agree(threadIdx.x == 0 ? local(j) : true)) return;
    if (d == 0) {
      block_copy_out(h.send + sums, data, nb);
    } else {
      if (!block_agree(threadIdx.x == 0 ? wait_arrival(h, f_rs) : true)) return;
      const char* in = h.recv + a.recv_base + sums;
      if (d <= N - 2)
        combine<T>(h.send + sums, nullptr, data, in, nb);
      else
        combine<T>(data, h.send + results, data, in, nb);
    }
    __syncthreads();
    bool ok = true;
    if (threadIdx.x == 0) {
      if (d != 0) consume(h, f_rs);
      ok = push(h, prod, d <= N - 2 ? cmd(0, c, p, pc) : cmd(1, c, p, pc));
      if (ok && e == 0) kept(j);
    }
    if (!block_agree(ok)) return;
    // All-gather: every rank but the result's owner receives it, keeps it, and passes it on
    // unless it is the ring's last (e = N - 1).
    if (e == 0) continue;
    const uint32_t f_ag = a.flag_base + ring_chunk_id(L, 1, c, p);
    if (!block_agree(threadIdx.x == 0 ? wait_arrival(h, f_ag) : true)) return;
    const char* in = h.recv + a.recv_base + results;
    block_copy_in(data, in, nb);
    if (e <= N - 2) block_copy_in(h.send + results, in, nb);
    __syncthreads();
    if (threadIdx.x == 0) {
      consume(h, f_ag);
      kept(j);
      if (e <= N - 2) ok = push(h, prod, cmd(1, c, p, pc));
    }
    if (!block_agree(ok)) return;
  }
}

template <class T>
__global__ void __launch_bounds__(256) net_collective_kernel(const __grid_constant__ KernelArgs a) {
  const int b = static_cast<int>(blockIdx.x), grid = static_cast<int>(gridDim.x);
  if (a.L.plan.coll == Coll::all_reduce)
    ring_role<T>(a, b, grid);
  else if (b < a.send_blocks)
    send_role<T>(a, b, a.send_blocks);
  else
    recv_role<T>(a, b - a.send_blocks, grid - a.send_blocks, CopyIn{a.buf});
}

}  // namespace weave::net::coll
