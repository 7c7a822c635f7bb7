// Host rules of one collective call (collectives, the TP kernels, ring and Ulysses attention),
// beside Communicator::agree_call (the cross-rank check): a call's own checks collected as its
// `problem`, one object's calls one after the other, the per-shape signal sets of a kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "weave/common/capture.hpp"
#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::runtime {

// Bytes [a, a + na) and [b, b + nb) share an address.
inline bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return na && nb && x < y + nb && y < x + na;
}

// A call under stream capture that needs what only an eager call of its shape makes (signal sets,
// scratch): thrown before anything is enqueued, so a caller may try another variant.
class NotPrepared : public Error {
 public:
  using Error::Error;
};

using ::weave::capturing;

// What is wrong with this rank's own arguments ("" when nothing): `checks` runs the checks that
// can fail on one rank alone (weave::Error), for Communicator::agree_call's `problem`.
template <class F>
std::string local_problem(F&& checks) {
  try {
    checks();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// One call in flight per object (its gathered buffers and counters serve one call at a time):
// a call on another stream than the previous call's first waits for that call's kernel. Calls
// enqueued into a CUDA graph (`capturing`, the call's own capturing(s), taken once per call) are
// left out: a graph cannot wait for an event recorded outside it, so a graph's replays and the
// object's eager calls must not overlap (the caller's stream order).
class CallOrder {
 public:
  CallOrder() = default;
  CallOrder(const CallOrder&) = delete;
  CallOrder& operator=(const CallOrder&) = delete;
  ~CallOrder() {
    if (done_) cudaEventDestroy(done_);
  }
  void before(cudaStream_t s, bool capturing = false) {
    if (done_ && s != last_ && !capturing) WEAVE_CUDA_CHECK(cudaStreamWaitEvent(s, done_, 0));
  }
  void after(cudaStream_t s, bool capturing = false) {
    if (capturing) return;
    if (!done_) WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    WEAVE_CUDA_CHECK(cudaEventRecord(done_, s));
    last_ = s;
  }

 private:
  cudaEvent_t done_ = nullptr;
  cudaStream_t last_ = nullptr;
};

// The counters of one kernel, one set per distinct shape. A launch's expected counts are
// `round * per_round` with per_round a function of the shape, so a set only ever serves one
// shape (a set reused for another shape would hold a running total that round * per_round does
// not describe). Sets live as long as the kernel object; creating one is collective, and every
// rank creates it at the same call because the shapes are checked to agree.
class ShapeSignals {
 public:
  explicit ShapeSignals(std::string name) : name_(std::move(name)) {}
  // Set `which` (< counts.size()) for `shape`, with counts[which] counters. Making a shape's sets
  // synchronizes the device, which a stream capture forbids: the first call of a shape must be an
  // eager one (when the call is `capturing` and the sets are new, this throws saying so).
  SignalSet& get(Communicator& c, const std::vector<long long>& shape, const std::vector<int>& counts,
                 int which, bool capturing = false) {
    auto it = sets_.find(shape);
    if (it == sets_.end()) {
      if (capturing)
        throw NotPrepared(name_ + ": the first call of this shape (and variant) must run outside a CUDA graph capture "
                          "(it creates the shape's signal sets, which synchronizes); make one eager call first");
      std::vector<std::unique_ptr<SignalSet>> v;
      for (size_t i = 0; i < counts.size(); ++i)
        v.push_back(std::make_unique<SignalSet>(
            c.signals(name_ + "." + std::to_string(gen_) + "." + std::to_string(i), counts[i])));
      ++gen_;
      it = sets_.emplace(shape, std::move(v)).first;
    }
    return *it->second.at(which);
  }
  // Set `which` for `shape` if a call made it, else null (finding makes nothing: making is collective).
  const SignalSet* find(const std::vector<long long>& shape, int which) const {
    const auto it = sets_.find(shape);
    return it == sets_.end() || which >= static_cast<int>(it->second.size()) ? nullptr : it->second[which].get();
  }

 private:
  std::string name_;
  int gen_ = 0;
  std::map<std::vector<long long>, std::vector<std::unique_ptr<SignalSet>>> sets_;
};

}  // namespace weave::runtime
