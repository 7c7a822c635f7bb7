// The kernel's side of the network path (handle.hpp says what the handle holds): push a command,
// wait for a chunk's arrival, consume it, and the block-wide helpers the inter-node kernels share.
// A failure never hangs a kernel: every wait also watches the proxy's abort word and this rank's
// fault word, and gives up after the handle's timeout; the first block that gives up records why
// (DeviceFault) and the others follow it out. The host then throws (NetPath::finish).
//
// Memory order (docs/architecture.md, memory_order.cuh), system scope since the other party is
// the host proxy or the provider writing host memory:
// - Send: the block writes its chunk into the mapped send buffer with plain stores, then
//   __syncthreads, then one thread pushes the command, whose header is committed with the release
//   pattern (queue.cuh): cumulative over the block's stores, so the proxy that acquires the
//   header sees the chunk before it posts the write.
// - Receive: one thread polls the chunk's flag with ld.acquire.sys; the data is in host memory
//   written before the flag (ordered mode: the provider's data write, then its flag write, in
//   order on one connection; unordered: the receiving proxy's release store after the write's
//   completion). __syncthreads extends the acquire to the block, whose reads of the chunk are
//   .volatile (relaxed.sys: never an L1 line of an earlier use of the same buffer).
// - Consume: flag back to 0 after the block's reads. No arrival for the same chunk can race with
//   it: the chunk's next use is two calls later (the receive buffer alternates between two
//   slots), and a peer starts that call only after this rank finished this one (every call has
//   every rank receive something from every peer; the proxy's next take of a command of this
//   rank, a release by this kernel's later pushes, is what orders the reset before it).
#pragma once
#include <cstdint>

#include "weave/memory_order.cuh"
#include "weave/net/handle.hpp"
#include "weave/net/queue.cuh"

namespace weave::net {

namespace device_detail {

__device__ __forceinline__ unsigned long long* u64(uint64_t* p) { return reinterpret_cast<unsigned long long*>(p); }
__device__ __forceinline__ const unsigned long long* u64(const uint64_t* p) {
  return reinterpret_cast<const unsigned long long*>(p);
}

}  // namespace device_detail

// The proxy failed or another block of this rank gave up: stop waiting.
__device__ __forceinline__ bool stopped(const NetHandle& h) {
  using namespace device_detail;
  return ld_acquire_sys(u64(h.queue.abort)) != 0 || ld_relaxed_gpu(u64(h.words + kWordFault)) != 0;
}

// Records the first fault of this rank (later ones return without writing). The host reads the
// record only after the stream's work ended, so plain stores suffice; the claim is an atomic in
// device memory, not on the mapped record (atomics across PCIe are not universal).
__device__ __forceinline__ void record_fault(const NetHandle& h, FaultKind kind, uint32_t chunk, uint64_t expected,
                                             uint64_t seen, uint64_t waited_ns) {
  using namespace device_detail;
  if (atomicCAS(u64(h.words + kWordFault), 0ull, static_cast<unsigned long long>(kind)) != 0) return;
  volatile DeviceFault* f = h.fault;
  f->chunk = chunk;
  f->expected = expected;
  f->seen = seen;
  f->waited_ns = waited_ns;
  f->kind = kind;
}

// Why a wait ended unsuccessfully: the proxy's abort, another block's fault, or the timeout.
// Returns false when the wait should go on.
__device__ __forceinline__ bool wait_gives_up(const NetHandle& h, uint32_t chunk, uint64_t expected, uint64_t seen,
                                              unsigned long long t0) {
  if (stopped(h)) {
    record_fault(h, kFaultAbort, chunk, expected, seen, globaltimer() - t0);
    return true;
  }
  const unsigned long long waited = globaltimer() - t0;
  if (h.timeout_ns && waited > h.timeout_ns) {
    record_fault(h, kFaultTimeout, chunk, expected, seen, waited);
    return true;
  }
  return false;
}

// One thread: waits until chunk's flag reaches `value` (1 for a consumed flag). False when the
// path stopped or the wait timed out (recorded).
__device__ inline bool wait_arrival(const NetHandle& h, uint32_t chunk, uint64_t value = 1) {
  using namespace device_detail;
  const unsigned long long* f = u64(h.flags + chunk);
  uint64_t v = ld_acquire_sys(f);
  if (v >= value) return true;
  const unsigned long long t0 = globaltimer();
  for (uint32_t i = 1;; ++i) {
    __nanosleep(100);  // each poll is a read across PCIe
    v = ld_acquire_sys(f);
    if (v >= value) return true;
    if ((i & 63) == 0 && wait_gives_up(h, chunk, value, v, t0)) return false;
  }
}

// Any thread: whether the chunk has arrived, without waiting (acquire, like wait_arrival).
__device__ __forceinline__ bool arrived(const NetHandle& h, uint32_t chunk, uint64_t value = 1) {
  return ld_acquire_sys(device_detail::u64(h.flags + chunk)) >= value;
}

// One thread, after the block read the chunk (__syncthreads before): the flag back to 0.
__device__ __forceinline__ void consume(const NetHandle& h, uint32_t chunk) {
  st_relaxed_sys(device_detail::u64(h.flags + chunk), 0ull);
}

// One thread: queues a command (after __syncthreads over the block's writes of its source). False
// once the proxy failed (recorded).
__device__ inline bool push(const NetHandle& h, Producer& p, const Command& c) {
  if (p.push(c)) return true;
  record_fault(h, kFaultAbort, ~0u, 0, 0, 0);
  return false;
}

// One thread: waits until `n` commands of this path completed at the sender (their source bytes
// may be overwritten). False when the path stopped or the wait timed out.
__device__ inline bool wait_completed(const NetHandle& h, uint64_t n) {
  using namespace device_detail;
  uint64_t v = ld_acquire_sys(u64(h.queue.completed));
  if (v >= n) return true;
  const unsigned long long t0 = globaltimer();
  for (uint32_t i = 1;; ++i) {
    __nanosleep(100);
    v = ld_acquire_sys(u64(h.queue.completed));
    if (v >= n) return true;
    if ((i & 63) == 0 && wait_gives_up(h, ~0u, n, v, t0)) return false;
  }
}

// One thread, before its block writes the send buffer in call `call`: the previous calls'
// commands still read it until they complete. The `leader` (one per call) waits for completed >=
// commands_before, then opens the gate for the call; the others wait for the gate. No command of
// this call is pushed before the gate opens, so the count cannot be made up by this call's own
// completions. False when the path stopped or the wait timed out (recorded).
__device__ inline bool pass_send_gate(const NetHandle& h, uint64_t call, uint64_t commands_before, bool leader) {
  using namespace device_detail;
  bool ok;
  unsigned long long* gate = u64(h.words + kWordGate);
  if (leader) {
    ok = wait_completed(h, commands_before);
    if (ok) {
      fence_acq_rel_sys();  // release pattern: the completions seen here, then the gate
      st_relaxed_sys(gate, call + 1);
    }
  } else {
    ok = true;
    const unsigned long long t0 = globaltimer();
    for (uint32_t i = 0; ld_acquire_sys(gate) < call + 1; ++i) {
      __nanosleep(100);
      if ((i & 63) == 63 && wait_gives_up(h, ~0u, call + 1, ld_acquire_sys(gate), t0)) {
        ok = false;
        break;
      }
    }
  }
  return ok;
}

// Every thread of every sending block: pass_send_gate by thread 0, its verdict in every thread
// (false when the path stopped). `word`: an int in shared memory (the form without it declares its
// own: a kernel whose dynamic shared memory already takes the whole budget passes a word of it
// instead).
__device__ inline bool open_send_gate(const NetHandle& h, uint64_t call, uint64_t commands_before, bool leader,
                                      int* word) {
  int& ok = *word;
  if (threadIdx.x == 0) ok = pass_send_gate(h, call, commands_before, leader);
  __syncthreads();
  const bool r = ok;
  __syncthreads();  // `ok` is reused by the next call of this function
  return r;
}
__device__ __forceinline__ bool open_send_gate(const NetHandle& h, uint64_t call, uint64_t commands_before,
                                               bool leader) {
  __shared__ int ok;
  return open_send_gate(h, call, commands_before, leader, &ok);
}

// Every thread learns what thread 0 decided; the shared word is free again afterwards.
__device__ __forceinline__ bool block_agree(bool mine_if_thread0, int* word) {
  if (threadIdx.x == 0) *word = mine_if_thread0;
  __syncthreads();
  const bool r = *word;
  __syncthreads();
  return r;
}
__device__ __forceinline__ bool block_agree(bool mine_if_thread0) {
  __shared__ int v;
  return block_agree(mine_if_thread0, &v);
}

// All threads of the block: copies `bytes` from device memory into the mapped send buffer, 16
// bytes per access where both ends are 16-byte aligned (the collectives' pieces are).
__device__ inline void block_copy_out(char* dst, const char* src, uint64_t bytes) {
  uint64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const uint64_t n16 = bytes / 16;
    for (uint64_t i = threadIdx.x; i < n16; i += blockDim.x)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    done = n16 * 16;
  }
  for (uint64_t i = done + threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
}

// All threads of the block: copies an arrived chunk out of the mapped receive buffer (volatile
// reads, see above) into device memory.
__device__ inline void block_copy_in(char* dst, const char* src, uint64_t bytes) {
  uint64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const uint64_t n16 = bytes / 16;
    for (uint64_t i = threadIdx.x; i < n16; i += blockDim.x)
      reinterpret_cast<uint4*>(dst)[i] = ld_volatile_v4(reinterpret_cast<const uint4*>(src) + i);
    done = n16 * 16;
  }
  for (uint64_t i = done + threadIdx.x; i < bytes; i += blockDim.x) dst[i] = static_cast<const volatile char*>(src)[i];
}

}  // namespace weave::net
