// The GPU->host command queue of the network path (mKernel section 3.3): plain data that the
// device (a kernel's inter-node send blocks) and the host (the proxy, src/net/proxy.cpp) both
// see. No device code here; the producer's side is queue.cuh, the consumer's the proxy.
//
// A ring of fixed-size commands in pinned, mapped host memory (cudaHostAlloc; the CPU tests use
// ordinary memory through the same structs). A producer claims a ticket t (one counter shared by
// the producers), waits for a credit (t < head + capacity: the proxy has taken the command that
// last used the slot), writes the command's body into slot t % capacity, then commits its header
// `seq = t + 1` last, with release order. The proxy reads slot t's header with acquire order,
// takes the body when `seq == t + 1` (a slot's seq grows by `capacity` per lap, so a stale one
// never matches), and publishes `head` (release) once it has copied the bodies out: the credits.
// It takes commands only while fewer than its outstanding-request limit are unfinished, so a
// slow network fills the ring and the producers wait: backpressure, nothing dropped.
#pragma once
#include <cstdint>

namespace weave::net {

// The proxy puts up to this many ready commands for one peer into one submission.
inline constexpr uint32_t kMaxBatch = 8;

enum CommandFlags : uint16_t {
  // Publish the chunk's arrival at the receiver once the data is there: flag[chunk] becomes
  // `flag_value` (ordered mode: the proxy writes it after the data) or grows by one (unordered
  // mode: the receiving proxy adds one per write-with-immediate). Both agree when flag_value
  // is the chunk's arrival count including this one (its epoch); receivers wait for >= epoch.
  kNotify = 1u << 0,
  // Close the submission after this command even where more commands of the same peer are
  // ready (the producer knows the burst ends here). Never makes the proxy wait for more.
  kLastOfBatch = 1u << 1,
};

// 48 bytes, as the paper's. Offsets are bytes into the sender's source region and into the
// peer's receive region (both registered once at set-up), never addresses.
struct alignas(16) Command {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t bytes;       // may be 0 (a notification only)
  uint64_t flag_value;  // see kNotify
  uint32_t chunk;       // index of the receiver's arrival flag; named in every diagnostic
  uint16_t peer;        // destination rank
  uint16_t flags;       // CommandFlags
  uint64_t seq;         // the header: ticket + 1, written last (release), read first (acquire)
};
static_assert(sizeof(Command) == 48, "the command is 48 bytes");

// The consumer's words the producers read, and the producers' ticket counter. One cache line
// each: the proxy writes `head` and `completed` while producers hammer `claim`.
struct RingControl {
  alignas(64) uint64_t head;       // commands the proxy has taken out of the ring (credits)
  alignas(64) uint64_t completed;  // commands whose transfer (and notification) completed locally
  alignas(64) uint64_t abort;      // non-zero once the proxy failed: producers stop waiting
  alignas(64) uint64_t claim;      // next ticket (the GPU path keeps its counter in device memory)
};

// What a producer needs, passed by value (a kernel parameter). `slots`, `head`, `completed` and
// `abort` point into the mapped host ring (device pointers on the GPU); `claim` is the ticket
// counter: the ring's own word for CPU producers, a device-memory word for a kernel (atomics on
// mapped host memory are not atomic across the PCIe bus on every system).
struct QueueView {
  Command* slots;
  uint64_t* claim;
  const uint64_t* head;
  const uint64_t* completed;
  const uint64_t* abort;
  uint32_t capacity;  // a power of two
};

}  // namespace weave::net
