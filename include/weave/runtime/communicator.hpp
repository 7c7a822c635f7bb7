// Communicator: this rank's place in the job, its GPU, the symmetric heap mapped by every local
// peer, registered external buffers, signal sets, and the error path of device-side timeouts.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weave/config.hpp"
#include "weave/runtime/bootstrap.hpp"
#include "weave/runtime/launch.hpp"
#include "weave/runtime/running_counts.hpp"
#include "weave/signal_types.hpp"

namespace weave::runtime {

// Device waits give up after this long without progress: long enough for a rank to run minutes
// behind its peers (a rank-0-only evaluation, a checkpoint write), as NCCL's watchdog allows,
// short enough that a real hang ends with a diagnostic instead of a silent stall.
constexpr double kDefaultWaitTimeoutS = 600.0;

struct CommOptions {
  size_t heap_bytes = 0;             // 0: $WEAVE_HEAP_BYTES, else 1 GiB; rounded up to the VMM granularity
  double wait_timeout_s = -1;        // < 0: $WEAVE_WAIT_TIMEOUT_S, else kDefaultWaitTimeoutS; 0: never
  bool multicast = false;            // weave has no multicast path; asking for it is an error
  std::chrono::milliseconds bootstrap_timeout{60000};
  int device = -1;                   // < 0: the local rank's GPU (local rank % GPUs with WEAVE_SHARE_GPUS)
  // Names this communicator's bootstrap among the job's: empty = the job id and a per-process
  // count (every rank creates its communicators in the same order). Communicators over subsets of
  // a job's ranks (torch process groups) are not created in one order everywhere: they pass a name
  // agreed through the group instead.
  std::string instance;
  int debug = -1;                    // < 0: $WEAVE_DEBUG; 1: agree_call checks every call with every rank
};

using PeerPtrs = std::array<void*, kMaxWorld>;

// A communicator spans one node (NVLink); across nodes ranks meet on the network path
// (weave::net::NetPath). In a multi-node job, this node's view of `job`: its ranks only (rank =
// local rank, world = local world), under a job id made unique per node from `node` (its name:
// NetPath::bootstrap().hostnames()[rank], or $WEAVE_HOSTNAME), so that the simulated nodes of
// one machine (weave-run --nodes) never meet on one bootstrap socket. The Communicator made from
// it is collective over the node's ranks only.
LaunchInfo node_launch_info(const LaunchInfo& job, const std::string& node);

class SignalSet;

class Communicator {
 public:
  // Over `info`'s job, which must be one node (else the error points to node_launch_info).
  explicit Communicator(CommOptions opt = {});
  Communicator(const LaunchInfo& info, CommOptions opt);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int world() const;
  // Unique among this process's communicators, never reused (not the same across ranks): names
  // per-communicator state kept outside it (the tuner's agreed choices).
  unsigned long long uid() const;
  int local_rank() const;
  int device() const;
  const cudaDeviceProp& props() const;
  int sm_count() const { return props().multiProcessorCount; }
  size_t smem_optin() const { return props().sharedMemPerBlockOptin; }
  Bootstrap& bootstrap();

  // Symmetric heap. Collective: every rank calls alloc/free with the same sizes in the same
  // order (alloc checks the sizes agree) and gets the same offset.
  void* alloc(size_t bytes, size_t align = 256);
  void free(void* ptr);
  // Not collective: hands `ptr` back when ranks drop their buffers in different orders (Python's
  // garbage collector). It returns to the heap at the first alloc at which every rank has released
  // it, after a quiesce (no kernel of any rank still touching it), so that ranks' heaps stay alike.
  void release(void* ptr);
  size_t heap_bytes() const;
  size_t heap_used() const;
  // Whether an alloc of `bytes` would succeed now (one free range holds it; the free total does not
  // tell on a fragmented heap). The same answer on every rank, whose heaps are alike, so a choice
  // made on it is too. Several allocations fit where their sum does.
  bool heap_fits(size_t bytes, size_t align = 256) const;

  // External device memory (cudaMalloc'd) made addressable by every rank through CUDA IPC.
  // Collective; deregister on every rank before freeing it.
  void register_buffer(void* ptr, size_t bytes);
  void deregister_buffer(void* ptr);

  // Per-rank addresses of [ptr, ptr + bytes), which must lie in the heap or in a registered
  // buffer; otherwise throws with a message saying so (before anything is launched).
  PeerPtrs peers(const void* ptr, size_t bytes) const;

  // A named set of monotonic counters in the heap (zeroed once, at creation). Collective.
  SignalSet signals(const std::string& name, int count);

  // All ranks check that `values` agree (e.g. a shape); throws naming `what` and the ranks.
  void check_same(const std::string& what, const std::vector<long long>& values);

  // The cross-rank check of one operator call (the NVLink operators call it, `problem` from
  // call.hpp's local_problem): `op` names the operator,
  // `values` its shapes, dtypes and options (at most 11), `problem` what this rank found wrong with
  // its own arguments ("" = nothing). A plan (op, values) is checked with every rank at its first
  // call, where every rank throws together if the plans differ or any rank has a problem. Later
  // calls of an agreed plan do not wait for the peers: each posts its plan for its call number,
  // and a rank that finds a peer's post for the same number different, or has a problem of its
  // own, throws and stops every peer's kernels that wait for this call (their next sync throws
  // naming this rank and why; the communicators are unusable afterwards). With debug (WEAVE_DEBUG)
  // every call is checked with every rank and a rejected call leaves everything usable. Whether
  // `stream` is capturing a graph is part of the plan (ranks capture together, so a call that
  // cannot be captured is then rejected by every rank together). `peer_buffers`: the buffers
  // whose peers' copies the call reaches at this rank's place (Communicator::peers); their places
  // (buffer_place) must be the same on every rank, which every call compares without making a new
  // plan (a difference on a plan's first call or in debug: rejected on every rank; on an agreed
  // plan: found by the rank that posts second, which stops the peers that launched).
  void agree_call(const std::string& op, const std::string& what, const std::vector<long long>& values,
                  const std::string& problem, cudaStream_t stream, const std::vector<const void*>& peer_buffers = {});
  // Where peers reach `p`: its offset in the symmetric heap, or (the k-th registration, offset) as
  // (k << 44) + offset; -1 for anything else. The same on every rank for buffers that
  // peers may reach at this rank's place.
  long long buffer_place(const void* p) const;
  bool debug_calls() const;
  // Writes `why` to every peer's abort word: their waiting kernels trap and their sync() throws
  // naming this rank. Marks this communicator unusable. Never throws.
  void abort_peers(const std::string& why) noexcept;
  // Throws weave::Error (naming who and name) unless [p, p + bytes) lies in one live heap
  // allocation, one registered buffer or one device allocation.
  void check_buffer(const char* who, const char* name, const void* p, size_t bytes) const;

  // Synchronizes `stream` and turns any device error into weave::Error; a timed-out wait
  // becomes an error that prints who waited for what. Afterwards the communicator is unusable.
  void sync(cudaStream_t stream = nullptr);
  void barrier();  // host-side barrier of all ranks (device work is not included)
  // Collective: returns once no rank has device work left that was enqueued before its call
  // (this device synchronized, then a barrier). Heap memory that kernels may still touch, here or
  // from a peer, can be handed back to the allocator after it. Never throws: on an unusable
  // communicator or a device error it returns false having waited for what it could.
  bool quiesce() noexcept;

  // Device-visible parts of the wait diagnostics.
  WaitRecord* wait_record() const;
  const volatile int* abort_word() const;  // nullptr where host memory cannot be mapped
  unsigned long long wait_timeout_ns() const;
  int name_id(const std::string& name);
  const std::string& signal_name(int id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A typed RAII view of one collective heap allocation.
template <class T>
class SymmetricTensor {
 public:
  SymmetricTensor(Communicator& c, size_t n) : c_(&c), n_(n), p_(static_cast<T*>(c.alloc(n * sizeof(T)))) {}
  ~SymmetricTensor() {
    if (p_) c_->free(p_);
  }
  SymmetricTensor(SymmetricTensor&& o) noexcept : c_(o.c_), n_(o.n_), p_(o.p_) { o.p_ = nullptr; }
  SymmetricTensor(const SymmetricTensor&) = delete;
  SymmetricTensor& operator=(const SymmetricTensor&) = delete;
  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  Communicator* c_;
  size_t n_;
  T* p_;
};

// Host side of a signal set: the counters' heap allocation and the round number kernels wait for.
// Creating and destroying one are collective: the destructor waits until no rank has device work
// left (Communicator::quiesce) before the counters go back to the heap, so that a late signal
// from a call still running (here or on a peer) cannot land in the next set zeroed there.
class SignalSet {
 public:
  SignalSet(Communicator& c, const std::string& name, int count);
  ~SignalSet();
  SignalSet(SignalSet&& o) noexcept;
  SignalSet(const SignalSet&) = delete;
  SignalSet& operator=(const SignalSet&) = delete;
  signals view() const { return view_; }
  // The next round number (1, 2, ...) of a set whose launches are never captured: counters are
  // never reset, a launch waits for multiples.
  unsigned long long next_round() { return round_.add_on_host({1})[0]; }
  // The next round of a launch on `s` (`capturing`: whether `s` is capturing a CUDA graph): the
  // host's number until the set's first captured launch, then read on the device from the set's
  // round cell, which a one-thread kernel on `s` advances (RunningCounts with one count of 1 per
  // launch), so that a graph replayed many times or never leaves it equal to the launches run.
  Round next_round(cudaStream_t s, bool capturing) { return round_.advance({1}, s, capturing)[0]; }
  bool device_rounds() const { return round_.on_device(); }
  unsigned long long round() const { return round_.host(0); }
  int count() const { return view_.count; }

 private:
  Communicator* c_;
  signals view_{};
  RunningCounts round_;  // over this rank's round cell, after its counters (local only)
};

}  // namespace weave::runtime
