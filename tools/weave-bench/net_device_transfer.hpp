// weave-bench net's device-memory transfer rows (net.cpp, part "device"): one message from device
// memory on the sender to device memory on the receiver through the network path as the
// inter-node kernels use it (kernels/net_collectives/kernel.cuh, net_tp, net_ring_attention): SM
// copies into the mapped send buffer, one command per chunk pushed from the GPU, the receiver's
// blocks polling the chunk flags and copying out of the mapped receive buffer, then an empty
// command back (the ack). NCCL's rows are device to device, so these are the rows its times
// compare with; the host-memory rows leave out both PCIe crossings and the GPU's polls.
//
// net.cpp is C++: the kernels and their launchers are in net_device_transfer.cu.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "weave/common/host_device.hpp"
#include "weave/net/handle.hpp"

namespace weave::bench::netdev {

namespace net = ::weave::net;

// splitmix64's finaliser: the messages' pattern and stamps, the same on the host (fill, checks)
// and in the kernels.
WEAVE_HD inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// The first 8 bytes of chunk j of message `message`: new for every message, so a chunk that did
// not arrive still holds an earlier message's stamp.
WEAVE_HD inline uint64_t chunk_stamp(uint64_t seed, uint64_t message, uint64_t j) {
  return mix64(seed ^ mix64(message * 0x100000001ull + j));
}

// One message: its bytes in chunks (a multiple of 16 bytes, the last one shorter), its stamps,
// and its call on the path (NetPath::Call; both ranks number their calls alike, so the receive
// slot and the flag half are the same on both).
struct Message {
  uint64_t bytes, chunk;
  uint64_t seed, index;             // chunk_stamp(seed, index, j)
  uint64_t call, commands_before;   // the sender's call: its send gate
  uint64_t recv_offset;             // the call's receive slot
  uint32_t flag_offset, ack_flag;   // chunk j raises flag_offset + j, the ack flag_offset + ack_flag
  int peer;
  WEAVE_HD uint64_t chunks() const { return (bytes + chunk - 1) / chunk; }
};

constexpr int kThreads = 256;

// Blocks of a launch: no more than the chunks (a block without a chunk would only wait).
inline int grid(const Message& m, int blocks) {
  return static_cast<int>(std::min<uint64_t>(m.chunks(), static_cast<uint64_t>(blocks)));
}

// Sender, `src` in device memory (at least 8 bytes per chunk): after the call's send gate each
// block stamps its chunks in `src`, copies them into the send buffer at their offsets and queues a
// command per chunk; block 0 then waits for the ack and consumes its flag, so the kernel ends
// once the receiver has every chunk in device memory.
void launch_send(const net::NetHandle& h, const Message& m, char* src, int blocks, cudaStream_t st);
// Receiver, `dst` in device memory: each block waits for its chunks' flags, copies them into
// `dst`, checks their stamps and consumes the flags. `done` counts finished blocks over the calls
// (device memory); the block that brings it to `done_target` queues the ack. `first_bad` (device
// memory, 0 at first) gets 1 + (message << 32 | chunk) of the first chunk whose stamp was wrong.
void launch_receive(const net::NetHandle& h, const Message& m, char* dst, unsigned long long* done,
                    unsigned long long done_target, unsigned long long* first_bad, int blocks, cudaStream_t st);


}  // namespace weave::bench::netdev
