// Running counts that kernels wait for (a signal set's round; the signals a counter has received
// over every call, where a call's share varies), kept right when CUDA graphs replay launches that
// the host counted once at capture.
#pragma once
#include <cuda_runtime.h>

#include <array>

#include "weave/signal_types.hpp"

namespace weave::runtime {

// What one advance does to up to RunningCounts::kMax cells: cell[i] = max(cell[i] + add[i], floor[i]).
struct CountStep {
  static constexpr int kMax = 4;
  unsigned long long add[kMax];
  unsigned long long floor[kMax];
  int n;
};

// Enqueues `step` on `s` as one thread, launched without programmatic serialization: it starts
// after the previous kernel on the stream (which may read the cells) has completed, and the next
// launch, which reads the cells after pdl_enter, sees its stores.
void advance_counts(unsigned long long* cells, const CountStep& step, cudaStream_t s);

// n counts advanced together, one per device cell (this rank's device memory, zero at the start).
// The host's sums serve until the first launch captured into a CUDA graph; from then on (the host
// cannot know how often a graph is replayed) every launch enqueues one advance_counts before it
// and its kernels read the cells (Round). The floor is the eager launches' sum (with this one; a
// captured launch: the sum at capture plus its add), which no replay can precede, so a cell
// equals the sum over the launches that ran, whether a graph is replayed many times or never.
// Every rank's launches come in the same order, so the cells agree across ranks.
class RunningCounts {
 public:
  static constexpr int kMax = CountStep::kMax;
  using Adds = std::array<unsigned long long, kMax>;
  using Counts = std::array<Round, kMax>;

  RunningCounts() = default;
  // Views `cells` (n zeroed words the caller owns, e.g. after a signal set's counters).
  RunningCounts(unsigned long long* cells, int n);
  // Owns n zeroed cells of its own (cudaMalloc on the current device).
  explicit RunningCounts(int n);
  ~RunningCounts();
  RunningCounts(RunningCounts&& o) noexcept;
  RunningCounts& operator=(RunningCounts&& o) noexcept;
  RunningCounts(const RunningCounts&) = delete;
  RunningCounts& operator=(const RunningCounts&) = delete;

  // The counts after a launch on `s` adds `adds` (`capturing`: whether `s` is capturing a graph).
  Counts advance(const Adds& adds, cudaStream_t s, bool capturing);
  // The sums after an eager launch of counts that are never captured (no device cell involved;
  // an error once some launch was captured).
  Adds add_on_host(const Adds& adds);
  // The host's sum of count i over eager launches.
  unsigned long long host(int i) const { return host_[i]; }
  // Whether the counts live on the device (some launch was captured).
  bool on_device() const { return device_; }

 private:
  unsigned long long* cells_ = nullptr;
  int n_ = 0;
  bool owned_ = false;
  bool device_ = false;
  Adds host_{};
};

}  // namespace weave::runtime
