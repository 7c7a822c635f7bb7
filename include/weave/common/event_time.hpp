// Device time of enqueued work, measured with CUDA events: the one timing loop of the tuner and
// the benchmarks.
#pragma once
#include <cuda_runtime.h>

#include <cmath>

#include "weave/common/error.hpp"

namespace weave {

// Large GEMMs run at the card's power cap (700 W on H200): after a pause the SM clock holds a
// boost for ~40-60 ms and then drops by ~15 % (weave-bench gemm --trace, perf-notes 21), and a
// heavier or lighter predecessor leaves its own clock behind. A sample of one implementation
// is taken after this much of the same work has run, so that it sees its own steady state.
constexpr double kSteadyWarmUs = 100e3;

// A steady-state sample of work whose one call takes `call_us`: `warm` untimed calls covering
// kSteadyWarmUs, then `iters` timed calls covering `timed_us`; at least one of each.
struct SamplePlan {
  int warm = 0, iters = 0;  // iters == 0: not yet known
};
inline SamplePlan steady_plan(double call_us, double timed_us, int max_warm, int max_iters,
                              double warm_us = kSteadyWarmUs) {
  const double t = call_us > 1 ? call_us : 1;
  auto calls = [t](double window_us, int hi) {
    const double n = std::ceil(window_us / t);
    return n < 1 ? 1 : n > hi ? hi : static_cast<int>(n);
  };
  return {calls(warm_us, max_warm), calls(timed_us, max_iters)};
}

// Mean time (µs) per call of `iters` calls of fn on `stream`, between two events recorded after
// `before()` has enqueued whatever should precede them (nothing, or a kernel that holds the
// stream while the host enqueues the whole loop).
template <class B, class F>
double events_us(cudaStream_t stream, B&& before, F&& fn, int iters) {
  cudaEvent_t a, b;
  WEAVE_CUDA_CHECK(cudaEventCreate(&a));
  WEAVE_CUDA_CHECK(cudaEventCreate(&b));
  before();
  WEAVE_CUDA_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < iters; ++i) fn();
  WEAVE_CUDA_CHECK(cudaEventRecord(b, stream));
  WEAVE_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  WEAVE_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  WEAVE_CUDA_CHECK(cudaEventDestroy(a));
  WEAVE_CUDA_CHECK(cudaEventDestroy(b));
  return 1e3 * ms / iters;
}

}  // namespace weave
