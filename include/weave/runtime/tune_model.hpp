// The tuner's cost model, its shared part: the rates a kernel family's model predicts with
// (kernels/tp_common/tune_model.hpp, kernels/ring_attention/tune_model.hpp) and the pick among the
// candidates a call offers. Pure host arithmetic, no CUDA call and no timing: a prediction follows
// from arguments every rank already agreed on (shape, world, SM count, candidates), so a first
// call of a shape costs no search. The rates were measured on 2 x H200 and are per SM or per link;
// an H100 SXM has the same SMs and NVLink (its HBM differs, which these picks barely see), so only
// the SM count comes from the device (device_rates: there is no default machine).
#pragma once
#include <vector>

#include "weave/runtime/tuner.hpp"

namespace weave::runtime {

struct DeviceRates {
  explicit DeviceRates(int sm_count) : sms(sm_count > 0 ? sm_count : 1) {}
  int sms;  // the device's, read by the caller from the runtime
  // Dense bf16 TFLOP/s of one SM in the fused kernels' 128 x 256 tiles: a GEMM alone of 2 waves
  // took 101.5 us at 4096 x 2048 x 4096 (5.29 per SM) and one of 32 waves 6318 us at 16384 x 8192
  // x 16384 (5.44; bench/results/2026-11-30-h200x2-session7-tp.jsonl:4, :10).
  double sm_tflops = 5.3;
  // Per direction, NVLink4 through NVSwitch: TMA stores from >= 8 SMs and register stores level
  // off there (/work/shared/HARDWARE.md:27).
  double link_GBps = 370;
  // One communicator block (one thread, bulk copies through a shared-memory ring), pushing to
  // peers: ag_gemm v0 with 4 of them moved its 16.8 MB shard in ~200 us (245.9 us in all, the
  // last tile's compute after it; session7-tp.jsonl:54), and ring attention's 4 communicators
  // moved 134 MB of K/V in ~1.65 ms (causal 8192, 1668 us in all; session9-c6-sp.log:18).
  double comm_sm_GBps = 20;
};

// The rates of a Hopper device with `sm_count` SMs.
inline DeviceRates device_rates(int sm_count) { return DeviceRates(sm_count); }

// The offered candidate of least cost(candidate), the first of equal ones: only ever one of
// `cands` (a default candidate for an empty list, which the tuner rejects before any use).
template <class Cost>
TuneCandidate cheapest(const std::vector<TuneCandidate>& cands, Cost&& cost) {
  TuneCandidate best{};
  double best_cost = 0;
  for (size_t i = 0; i < cands.size(); ++i) {
    const double c = cost(cands[i]);
    if (i == 0 || c < best_cost) best = cands[i], best_cost = c;
  }
  return best;
}

}  // namespace weave::runtime
