// weave-bench net's GPU-producer proxy rows (net.cpp, part "proxy_gpu"): the proxy's command
// latency and rate with the commands pushed from a kernel, through the path's GPU mode and the
// device-side push the inter-node kernels use (device.cuh's push: a ticket from the device-memory
// counter, the credit check against the mapped `head`, the body's stores into the mapped ring, then
// the header's release pattern fence.acq_rel.sys + st.relaxed.sys), where the host rows
// (part "proxy") push from a host thread.
//
// - latency(): one thread pushes one command at a time. Per command it stamps the start, the
//   push's return, and the moments it sees the proxy's `taken` and `posted` words reach the
//   command's ticket + 1 (both read every turn, ld.relaxed.sys on mapped host memory, back to back,
//   so that seeing `taken` never delays seeing `posted`); the proxy's on_taken / on_posted hooks
//   (ProxyOptions, set by net.cpp) write those words. Then, untimed, it
//   waits until the command completed (as the host rows do) before the next one.
// - null_loop(): the same shape without the proxy: the thread writes i + 1 into a mapped host word
//   with the header's release pattern, a host thread spinning on it (net.cpp) echoes it into a
//   second word, the thread polls that one (the same two-read turns). Its time is the two PCIe
//   crossings and the polls the latency includes; the difference is the proxy's own share.
// - rate(): `producers` blocks of one thread push commands back to back (as fast as the ring's
//   credits allow), each with its own Producer as a kernel's send block has; the clock runs from
//   the earliest block's first push until block 0 sees the proxy's `completed` reach the total.
//
// Stamps are %globaltimer (ns) and %clock64 (SM cycles) side by side: which one the row reports is
// decided on the host from the globaltimer's measured update step (timer_probe()).
//
// Commands: command_of(g) for the g-th command of the row (g = 0, 1, ...), the host rows' scheme:
// 64 bytes at offset 64 g (mod 1 MiB), arrival flag g % flags, flag value g / flags + 1 (ordered:
// the value written; unordered: one arrival each), so that after n commands flag j holds
// (n - 1 - j) / flags + 1 for j < n either way. In rate(), block b pushes the g with
// g = first + b (mod producers); since producers divides flags, every command naming one flag
// comes from one block, in order: the ordered mode's last flag write is the largest value.
//
// net.cpp is C++: the kernels and their launchers are here.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "weave/common/host_device.hpp"
#include "weave/net/command.hpp"
#include "weave/net/handle.hpp"

namespace weave::bench::netproxy {

namespace net = ::weave::net;

constexpr uint64_t kPayload = 64;           // bytes per command
constexpr uint64_t kPayloadSpan = 1u << 20;  // offsets wrap here (the path's send and receive buffers are >= this)

// The g-th command of a row (see above); the host rows' commands are the same.
WEAVE_HD inline net::Command command_of(uint64_t g, uint32_t flags, int peer) {
  return net::Command{(g * kPayload) % kPayloadSpan,
                      (g * kPayload) % kPayloadSpan,
                      kPayload,
                      g / flags + 1,
                      static_cast<uint32_t>(g % flags),
                      static_cast<uint16_t>(peer),
                      net::kNotify,
                      0};
}

// One sample's stamps: t* %globaltimer (ns), c* %clock64 (cycles of the thread's SM). start: just
// before the push (the null loop: before its write); pushed: the push returned; taken, posted:
// the proxy's word seen (the null loop: `posted` is the echo seen, `pushed` and `taken` unused).
struct Stamp {
  unsigned long long t_start, t_pushed, t_taken, t_posted;
  unsigned long long c_start, c_pushed, c_taken, c_posted;
};

// The rate run's clock (globaltimer ns), in device memory: start = the earliest block's first
// push (set to ~0 before the launch), done = block 0 saw every command completed (0: it did not).
// bad: 1 + g of a command that could not be pushed. credit_reads: pushes that read the ring's
// `head` (a producer reads it only when the ring looks full by its last reading): about producers /
// capacity per command while the ring never filled (the proxy kept up with the GPU), about 1 while
// it stayed full (the proxy was the bottleneck; each push then waits for a credit).
struct RateTimes {
  unsigned long long start, done, bad, credit_reads;
};

// The globaltimer's update step in ns (the smallest change between consecutive distinct readings,
// over 32 changes), into `out` (device memory).
void launch_timer_probe(unsigned long long* out, cudaStream_t st);

// One thread: commands first .. first + n - 1 (command_of), one at a time; stamps[i] for each.
// `taken` and `posted`: device addresses of the mapped words the proxy's hooks write (ticket + 1;
// with one producer the ticket is g). `bad` (device memory, 0 before): 1 + i of the sample that
// stopped (the path failed or a wait outlasted the handle's timeout: the fault record says which).
void launch_latency(const net::NetHandle& h, uint64_t first, uint32_t n, uint32_t flags, int peer,
                    const unsigned long long* taken, const unsigned long long* posted, Stamp* stamps,
                    unsigned long long* bad, cudaStream_t st);

// One thread, n round trips: writes i + 1 into `ping` (release pattern), waits for `pong` >= i + 1.
// The handle only bounds the wait (its abort word and timeout). `bad` as latency's.
void launch_null_loop(const net::NetHandle& h, uint32_t n, unsigned long long* ping, const unsigned long long* pong,
                      Stamp* stamps, unsigned long long* bad, cudaStream_t st);

// `producers` blocks (a power of two dividing `flags`) push commands first .. end - 1; `times` as
// RateTimes says (start set to ~0, the rest to 0 before the launch).
void launch_rate(const net::NetHandle& h, uint64_t first, uint64_t end, uint32_t flags, int peer, int producers,
                 RateTimes* times, cudaStream_t st);

}  // namespace weave::bench::netproxy
