// What a kernel takes to use the network path (net_path.hpp makes it, device.cuh uses it):
// plain data, passed by value as a kernel parameter. Every pointer is a device address:
//
// - `queue`: the command ring (command.hpp) in mapped pinned host memory; its ticket counter
//   `claim` is a word in device memory (the kernels are the ring's only producers, and atomics on
//   mapped host memory are not atomic across PCIe on every system).
// - `send`, `recv`: the registered bounce buffers. On providers without FI_HMEM (tcp here) they
//   are pinned host memory mapped into the GPU: a kernel writes its outgoing chunk straight into
//   `send` and the NIC (the provider) reads it from there; peers' writes land in `recv`, which
//   the kernel reads once the chunk's flag is up. Command offsets index these two regions. Where
//   FI_HMEM exists they could be device memory behind the same fields (not built yet).
// - `flags`: one arrival word per chunk (mapped host memory, written by the peer's flag write or
//   by this rank's proxy). A kernel waits for flag >= 1 and consumes it (sets it back to 0) once
//   it has read the chunk; see device.cuh for why no later arrival can race with that reset.
// - `words`: a few words in device memory, zeroed at set-up (net_path.cpp says which).
// - `fault`: mapped host memory where the first failed device-side wait records itself; the host
//   reads it after the stream's work ended (NetPath::finish) and throws.
#pragma once
#include <cstdint>

#include "weave/net/command.hpp"

namespace weave::net {

enum FaultKind : uint32_t {
  kFaultNone = 0,
  kFaultAbort = 1,    // the proxy failed (its abort word), or another block of this rank faulted
  kFaultTimeout = 2,  // a wait outlasted timeout_ns with the proxy healthy
};

// The first device-side failure of a NetPath (later ones are not recorded: one explains all).
struct DeviceFault {
  uint32_t kind;   // FaultKind; written last
  uint32_t chunk;  // the chunk waited for (~0u: a command push or a completion wait)
  uint64_t expected, seen;
  uint64_t waited_ns;
};

// Indices into NetHandle::words (device memory).
enum DeviceWord : uint32_t {
  kWordClaim = 0,  // the ring's ticket counter
  kWordGate = 1,   // a call's send gate: call index + 1 once the previous calls' sends completed
  kWordFault = 2,  // non-zero once a block of this rank recorded a fault (claims the record)
  kDeviceWords = 4,
};

struct NetHandle {
  QueueView queue;
  char* send;
  char* recv;
  uint64_t* flags;
  uint64_t* words;
  DeviceFault* fault;
  uint64_t send_bytes, recv_bytes;
  uint32_t nflags;
  int rank, world;
  unsigned long long timeout_ns;  // device-side waits; 0 = never
};

}  // namespace weave::net
