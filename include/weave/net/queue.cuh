// The producer's side of the GPU->host command queue (command.hpp says the protocol): the same
// __host__ __device__ code runs in a kernel's send block and in the CPU tests' threads.
//
// Memory order, by where the code runs:
// - Device (__CUDA_ARCH__): weave's memory-order helpers (memory_order.cuh), system scope since
//   the other party is the host: the header is committed with the release pattern
//   (fence.acq_rel.sys, then st.relaxed.sys of seq), so the body's plain stores to mapped host
//   memory are visible to the proxy before it can see the header; credits and the abort word are
//   read with ld.acquire.sys. The ticket counter is a relaxed atomicAdd on device memory.
// - Host (g++ or nvcc's host pass): std::atomic_ref, release store of the header, acquire loads
//   of head/completed/abort, relaxed fetch_add of the ticket counter.
// The proxy (host) reads headers with acquire and publishes head/completed with release.
#pragma once
#include <cstdint>

#include "weave/net/command.hpp"

#ifdef __CUDA_ARCH__
#include "weave/memory_order.cuh"
#else
#include <atomic>
#include <thread>
#endif

#ifdef __CUDACC__
#define WEAVE_NET_HD __host__ __device__ __forceinline__
#else
#define WEAVE_NET_HD inline
#endif

namespace weave::net {

namespace queue_detail {

WEAVE_NET_HD uint64_t load_acquire(const uint64_t* p) {
#ifdef __CUDA_ARCH__
  return ld_acquire_sys(reinterpret_cast<const unsigned long long*>(p));
#else
  return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(p)).load(std::memory_order_acquire);
#endif
}

WEAVE_NET_HD void store_release(uint64_t* p, uint64_t v) {
#ifdef __CUDA_ARCH__
  fence_acq_rel_sys();
  st_relaxed_sys(reinterpret_cast<unsigned long long*>(p), v);
#else
  std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
#endif
}

WEAVE_NET_HD uint64_t next_ticket(uint64_t* claim) {
#ifdef __CUDA_ARCH__
  return atomicAdd(reinterpret_cast<unsigned long long*>(claim), 1ull);
#else
  return std::atomic_ref<uint64_t>(*claim).fetch_add(1, std::memory_order_relaxed);
#endif
}

// Between two polls of a host word: a short sleep on the device (each poll is a PCIe read);
// on the host a yield, since CPU producers share the cores with the proxy.
WEAVE_NET_HD void poll_pause() {
#ifdef __CUDA_ARCH__
  __nanosleep(64);
#else
  std::this_thread::yield();
#endif
}

}  // namespace queue_detail

// One producing thread's handle (a send block's leader thread, a CPU test thread). It keeps the
// last credit count it read, so it reads the host's `head` only when the ring looks full.
struct Producer {
  QueueView q;
  uint64_t head_seen = 0;

  // Claims a ticket, waits for its slot's credit, writes the body, commits the header. False
  // (nothing queued) once the proxy has failed: its error says why.
  WEAVE_NET_HD bool push(const Command& c) {
    using namespace queue_detail;
    const uint64_t t = next_ticket(q.claim);
    while (t >= head_seen + q.capacity) {
      head_seen = load_acquire(q.head);
      if (t < head_seen + q.capacity) break;
      if (load_acquire(q.abort)) return false;
      poll_pause();
    }
    Command* s = q.slots + (t & (q.capacity - 1));
    s->src_offset = c.src_offset;
    s->dst_offset = c.dst_offset;
    s->bytes = c.bytes;
    s->flag_value = c.flag_value;
    s->chunk = c.chunk;
    s->peer = c.peer;
    s->flags = c.flags;
    store_release(&s->seq, t + 1);
    return true;
  }

  // Waits until `n` commands of this queue (every producer's) completed at the sender: their
  // source bytes may be reused. False once the proxy has failed.
  WEAVE_NET_HD bool wait_completed(uint64_t n) const {
    using namespace queue_detail;
    while (load_acquire(q.completed) < n) {
      if (load_acquire(q.abort)) return false;
      poll_pause();
    }
    return true;
  }

  WEAVE_NET_HD bool aborted() const { return queue_detail::load_acquire(q.abort) != 0; }
};

}  // namespace weave::net
