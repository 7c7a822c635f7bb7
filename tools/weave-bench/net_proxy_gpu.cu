// The kernels and launchers that net_proxy_gpu.hpp declares (what they time is described there).
#include "net_proxy_gpu.hpp"

#include "weave/common/error.hpp"
#include "weave/net/device.cuh"

namespace weave::bench::netproxy {

namespace kernels {

// Polls the words `a` and `b` (b reaches `want` no earlier than a) until b reaches `want`, and
// stamps when each was first seen there. Each turn issues both reads (relaxed.sys: nothing is read
// through them, and two relaxed reads overlap where acquire ones would wait for each other), back
// to back: one PCIe round trip per turn, so seeing `a` never delays seeing `b`. The stamps are read
// inside the branch on the value, i.e. after the read returned. After each 1024 turns (about a
// millisecond) it also looks at the path's abort and fault words and the handle's timeout, as the
// kernels' waits do: false when it gives up.
__device__ bool wait_two(const net::NetHandle& h, const unsigned long long* a, const unsigned long long* b,
                         unsigned long long want, unsigned long long& ta, unsigned long long& ca,
                         unsigned long long& tb, unsigned long long& cb) {
  bool have_a = false;
  unsigned long long t0 = 0;
  for (uint32_t i = 1;; ++i) {
    const unsigned long long va = ld_relaxed_sys(a), vb = ld_relaxed_sys(b);
    if (vb >= want) {
      tb = globaltimer_stamp();
      cb = clock64_stamp();
      if (!have_a) ta = tb, ca = cb;
      return true;
    }
    if (!have_a && va >= want) {
      ta = globaltimer_stamp();
      ca = clock64_stamp();
      have_a = true;
    }
    if ((i & 1023) == 0) {
      if (t0 == 0) t0 = globaltimer();
      else if (net::wait_gives_up(h, ~0u, want, vb, t0)) return false;
    }
  }
}

__global__ void timer_probe(unsigned long long* out) {
  // Bounded: a timer that never moves gives ~0 (the host refuses it) instead of a hang.
  constexpr uint32_t kMaxReads = 1u << 26;
  uint32_t reads = 0;
  unsigned long long prev = globaltimer_stamp(), step = ~0ull;
  while (globaltimer_stamp() == prev && ++reads < kMaxReads) {
  }
  prev = globaltimer_stamp();  // at a change: every later difference is a whole step
  for (int changes = 0; changes < 32 && ++reads < kMaxReads;) {
    const unsigned long long t = globaltimer_stamp();
    if (t != prev) {
      step = t - prev < step ? t - prev : step;
      prev = t;
      ++changes;
    }
  }
  *out = step;
}

__global__ void __launch_bounds__(1) latency(const net::NetHandle h, uint64_t first, uint32_t n, uint32_t flags,
                                             int peer, const unsigned long long* taken,
                                             const unsigned long long* posted, Stamp* stamps,
                                             unsigned long long* bad) {
  net::Producer prod{h.queue};  // one per kernel, as a send block keeps it over its pushes
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t g = first + i;
    const net::Command c = command_of(g, flags, peer);
    Stamp s;
    s.c_start = clock64_stamp();
    s.t_start = globaltimer_stamp();
    const bool ok = net::push(h, prod, c);
    s.t_pushed = globaltimer_stamp();
    s.c_pushed = clock64_stamp();
    if (!ok || !wait_two(h, taken, posted, g + 1, s.t_taken, s.c_taken, s.t_posted, s.c_posted)) {
      *bad = 1 + i;
      return;
    }
    stamps[i] = s;
    // Untimed: the command's completion before the next one, as the host rows wait for it.
    if (!net::wait_completed(h, g + 1)) {
      *bad = 1 + i;
      return;
    }
  }
}

// The same shape without the proxy: the write is the header's commit in push (queue.cuh's
// store_release: fence.acq_rel.sys, st.relaxed.sys), the wait the same two-read poll (both of the
// echoed word).
__global__ void __launch_bounds__(1) null_loop(const net::NetHandle h, uint32_t n, unsigned long long* ping,
                                               const unsigned long long* pong, Stamp* stamps,
                                               unsigned long long* bad) {
  for (uint32_t i = 0; i < n; ++i) {
    Stamp s{};
    s.c_start = clock64_stamp();
    s.t_start = globaltimer_stamp();
    net::queue_detail::store_release(reinterpret_cast<uint64_t*>(ping), i + 1);
    if (!wait_two(h, pong, pong, i + 1, s.t_taken, s.c_taken, s.t_posted, s.c_posted)) {
      *bad = 1 + i;
      return;
    }
    s.t_taken = s.c_taken = 0;
    stamps[i] = s;
  }
}

__global__ void __launch_bounds__(1) rate(const net::NetHandle h, uint64_t first, uint64_t end, uint32_t flags,
                                          int peer, RateTimes* times) {
  const unsigned long long t0 = globaltimer_stamp();
  atomicMin(&times->start, t0);
  net::Producer prod{h.queue};
  unsigned long long reads = 0;
  for (uint64_t g = first + blockIdx.x; g < end; g += gridDim.x) {
    const uint64_t seen = prod.head_seen;
    if (!net::push(h, prod, command_of(g, flags, peer))) {
      atomicCAS(&times->bad, 0ull, 1ull + g);
      return;
    }
    reads += prod.head_seen != seen;  // the push read `head` (registers only: nothing added to the push)
  }
  atomicAdd(&times->credit_reads, reads);
  if (blockIdx.x == 0 && net::wait_completed(h, end)) times->done = globaltimer_stamp();
}

}  // namespace kernels

void launch_timer_probe(unsigned long long* out, cudaStream_t st) {
  kernels::timer_probe<<<1, 1, 0, st>>>(out);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

void launch_latency(const net::NetHandle& h, uint64_t first, uint32_t n, uint32_t flags, int peer,
                    const unsigned long long* taken, const unsigned long long* posted, Stamp* stamps,
                    unsigned long long* bad, cudaStream_t st) {
  kernels::latency<<<1, 1, 0, st>>>(h, first, n, flags, peer, taken, posted, stamps, bad);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

void launch_null_loop(const net::NetHandle& h, uint32_t n, unsigned long long* ping, const unsigned long long* pong,
                      Stamp* stamps, unsigned long long* bad, cudaStream_t st) {
  kernels::null_loop<<<1, 1, 0, st>>>(h, n, ping, pong, stamps, bad);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

void launch_rate(const net::NetHandle& h, uint64_t first, uint64_t end, uint32_t flags, int peer, int producers,
                 RateTimes* times, cudaStream_t st) {
  WEAVE_CHECK(producers >= 1 && (producers & (producers - 1)) == 0 && flags % producers == 0,
              "weave-bench net: GPU producers (", producers, ") must be a power of two dividing the flags (", flags, ")");
  kernels::rate<<<producers, 1, 0, st>>>(h, first, end, flags, peer, times);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace weave::bench::netproxy
