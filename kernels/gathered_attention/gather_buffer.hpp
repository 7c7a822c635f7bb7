// One symmetric-heap buffer that a sequence-parallel kernel object gathers into, grown
// (collectively: every rank calls get() with the same size, the shapes being checked equal
// across ranks first) when a shape needs more than it has. Once a CUDA graph captured a call
// on it, a buffer it outgrows is kept, not freed (the graph's replays still use it).
#pragma once
#include <cuda_runtime.h>

#include <utility>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/runtime/call.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::attention {

class GatherBuffer {
 public:
  explicit GatherBuffer(runtime::Communicator& c) : c_(c) {}
  ~GatherBuffer() {
    if (!p_ && kept_.empty()) return;
    // A causal ring call can end on this rank while peers are still pushing rows it never reads
    // into this buffer: every rank drains before the memory goes back to the heap. Best effort
    // (a destructor must not throw; a broken job has already reported its error).
    try {
      WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
      c_.barrier();
    } catch (...) {
    }
    if (p_) c_.free(p_);
    for (void* p : kept_) c_.free(p);
  }
  GatherBuffer(const GatherBuffer&) = delete;
  GatherBuffer& operator=(const GatherBuffer&) = delete;
  // `capturing`: the call is being captured into a CUDA graph, which cannot allocate.
  void* get(size_t need, bool capturing) {
    captured_ = captured_ || capturing;
    if (need > bytes_) {
      if (capturing)
        throw runtime::NotPrepared(detail::concat(
            "the gathered buffer must grow to ", need, " bytes, which a CUDA graph capture cannot do (allocation is "
            "collective and synchronizes); make one eager call of this shape first"));
      // The old buffer is let go before the allocation, and forgotten with it: an allocation that
      // throws (the heap is full) leaves no freed buffer for a later call or the destructor.
      if (p_ && captured_) {
        kept_.push_back(std::exchange(p_, nullptr));
      } else if (p_) {
        WEAVE_CUDA_CHECK(cudaDeviceSynchronize());  // no kernel of this rank still reads it
        c_.barrier();                                // nor writes into a peer's (theirs are done too)
        c_.free(std::exchange(p_, nullptr));
      }
      bytes_ = 0;
      p_ = c_.alloc(need, 1024);
      bytes_ = need;
    }
    return p_;
  }

 private:
  runtime::Communicator& c_;
  void* p_ = nullptr;
  size_t bytes_ = 0;
  bool captured_ = false;
  std::vector<void*> kept_;  // outgrown buffers a captured graph may still use
};

}  // namespace weave::attention
