// The measuring side of the tuner: a candidate's sample (time_launches, steady-state plans over
// every rank) and the device part of its key, for the kernels whose calls pick their
// variant and num_comm_sms through Tuner::choose (tuner.hpp).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/common/event_time.hpp"
#include "weave/runtime/call.hpp"  // capturing
#include "weave/runtime/communicator.hpp"
#include "weave/runtime/tuner.hpp"

namespace weave::runtime {

// A tuner sample's plan: kSteadyWarmUs of the same candidate first (the power cap's steady
// state, event_time.hpp), then ~20 ms timed; in a bounded search (Tuner::budget_s) the sample's
// window instead, four fifths warm-up and one fifth timed (shorter samples rank candidates by the
// clock they catch: the price of a first call that does not stall for seconds).
inline SamplePlan tune_plan(double launch_us) {
  const double w = search_sample_window_us();
  if (w > 0) return steady_plan(launch_us, std::min(20e3, 0.2 * w), 2000, 200, std::min(kSteadyWarmUs, 0.8 * w));
  return steady_plan(launch_us, 20e3, 2000, 200);
}

// The slowest rank's host time (µs) of one call of fn from an idle stream to its end: what a
// sample plan starts from. Every rank takes the same plan from it, since every rank must call as
// often (the calls wait for each other).
template <class F>
double slowest_call_us(Communicator& c, cudaStream_t s, F&& fn) {
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(s));
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> all(c.world());
  c.bootstrap().all_gather(&us, all.data(), sizeof us);
  for (double x : all) us = x > us ? x : us;
  return us;
}

// One tuner sample of `launch` (the caller's stream), by `plan`, which the candidate's first
// sample fills (iters == 0) from the second of two calls: the first may carry a variant's
// one-time setup, and a plan of one or two launches then timed the host's enqueue gap (ag_gemm
// v9 sampled 92 µs, 37 in the table). Then the warm-up and timed launches back to back, so that
// the timed window starts in the candidate's own steady state.
template <class F>
double time_launches(Communicator& c, cudaStream_t s, F&& launch, SamplePlan& plan) {
  if (plan.iters == 0) {
    launch();
    plan = tune_plan(slowest_call_us(c, s, launch));
  }
  for (int i = 0; i < plan.warm; ++i) launch();
  return events_us(s, [] {}, launch, plan.iters);
}

// The plans of one search, one per candidate.
using TunePlans = std::map<std::pair<int, int>, SamplePlan>;
inline SamplePlan& plan_of(TunePlans& p, const TuneCandidate& t) { return p[{t.variant, t.num_comm_sms}]; }

// Under a CUDA graph capture, which can neither time launches nor agree with the peers: the
// choice an eager call on `c` made (the model's, searched, or taken from rank 0's cache) under
// `key` for this candidate set, the same on every rank, or an error that says what to do (`what`:
// the call, for it). Not this rank's own cache: ranks' files may differ, and another
// communicator's choice may differ from its peers'.
inline TuneResult captured_choice(Communicator& c, const std::string& key, const std::vector<TuneCandidate>& cands,
                                  const std::string& what) {
  TuneResult r;
  WEAVE_CHECK(Tuner::global().agreed(c.uid(), key, &r) && r.candidates == candidate_set(cands), what,
              ": the first call of this shape chooses its configuration with every rank (and may time launches), "
              "which a CUDA graph capture cannot do; make one eager call of this shape first, or fix the "
              "configuration (num_comm_sms, variant)");
  return r;
}
// The cached choice for `key`, else the cost model's pick (`model`, asked only then), or in
// search mode the search that times `launch(t)` (one call with candidate t, enqueued on `s`) for
// the candidates; under a CUDA graph capture only the choice an eager call made
// (captured_choice; `what` names the call in its error).
template <class F>
TuneResult tuned_choice(Communicator& c, const std::string& key, const std::vector<TuneCandidate>& cands,
                        cudaStream_t s, const std::string& what, const TuneModel& model, F&& launch) {
  if (capturing(s)) return captured_choice(c, key, cands, what);
  TunePlans plans;
  return Tuner::global().choose(
      &c, key, cands,
      [&](const TuneCandidate& t) { return time_launches(c, s, [&] { launch(t); }, plan_of(plans, t)); }, model);
}
inline std::string device_key(const Communicator& c) {
  std::string n = c.props().name;
  for (auto& ch : n)
    if (ch == ' ' || ch == '|') ch = '_';
  return n + "_" + std::to_string(c.sm_count()) + "sm";
}

}  // namespace weave::runtime
