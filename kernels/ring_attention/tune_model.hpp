// The cost model of the sequence-parallel attention kernels (ring attention and Ulysses, one
// gathered kernel: gathered_attention/): the tuner's candidates differ only in the number of
// communicator CTAs, one thread each, that push this rank's rows to the ranks that need them and
// then join the compute. The tuner takes the model's pick on a shape's first call unless a search
// is asked for (weave/runtime/tuner.hpp); tests/tp/test_tune_model_cpu.cu compares it with the
// searches measured on 2 x H200.
//
// A count n costs  max(attention + the SM time the pushes take from it, the pushes' own time).
// The first term does not depend on n (n SMs for bytes / (n x rate) each), so while the compute
// bounds the call every count predicts the same; the larger count ends its pushes sooner, which
// leaves the first tiles less to wait for (a margin the model does not resolve), so equal
// predictions go to the larger count. With too few communicators the pushes bound the call: at
// causal 8192 ring attention took 1668 us with 4 of them and 1190 with 8
// (bench/results/2026-11-30-h200x2-session9-c6-sp.log:18, :16).
#pragma once
#include <algorithm>
#include <vector>

#include "ulysses/schedule.hpp"
#include "weave/runtime/tune_model.hpp"

namespace weave::sp::model {

enum class Family { ring, ulysses };

struct Problem {
  Family family = Family::ring;
  long long B = 1, S = 1;  // S: the whole sequence
  int Hq = 1, Hkv = 1, D = 128, W = 1;
  bool causal = false;
};

// The attention kernel's rate on one GPU, D = 128: 562-627 TFLOP/s for weave's kernel on one
// H200 (bench/results/2026-11-30-h200x2-session9-c6-report.txt, "1-GPU weave"), cuDNN 616-657
// (/work/shared/HARDWARE.md).
inline constexpr double kAttentionTflops = 600;

// This rank's share of the attention (fwd: 4 B Sq Sk H D, half of it causal).
inline double attention_us(const Problem& p) {
  const long long rows = (p.S + p.W - 1) / p.W;
  // ring: its query rows against every key; Ulysses: its Hq / W heads over the whole sequence
  const double flops = p.family == Family::ring ? 4.0 * p.B * rows * p.S * p.Hq * p.D
                                                : 4.0 * p.B * p.S * p.S * (p.Hq / p.W) * p.D;
  return flops * (p.causal ? 0.5 : 1.0) / (kAttentionTflops * 1e6);
}

// Bytes the communicators push (`link`: the part that crosses NVLink).
inline double pushed_bytes(const Problem& p, bool link) {
  const double row = static_cast<double>((p.S + p.W - 1) / p.W) * p.B * p.D * 2;  // one head of the shard
  if (p.family == Family::ring) return (p.W - 1) * row * 2 * p.Hkv;  // K and V to every peer
  // Ulysses: Q restricted to each destination's heads and K/V to its kv heads, itself included.
  // (Shapes the kernel rejects, heads not divisible, are costed as if every kv head went once.)
  const bool grouped = p.Hkv > 0 && p.Hq % p.Hkv == 0 && p.Hq % p.W == 0;
  double heads = 0, mine = 0;
  for (int d = 0; d < p.W; ++d) {
    const int h = p.Hq / p.W + 2 * (grouped ? uly::kv_count(p.Hq, p.Hkv, p.W, d) : (p.Hkv + p.W - 1) / p.W);
    heads += h;
    if (d == 0) mine = h;  // rank 0's own part stays local; the others' count alike
  }
  return row * (link ? heads - mine : heads);
}

inline double predicted_us(const Problem& p, int num_comm_sms, const runtime::DeviceRates& r) {
  const int n = std::max(num_comm_sms, 1);
  // SM time of the pushes: their bytes at the communicators' rate, or n SMs held while the link
  // bounds them; the first does not depend on n, so compute-bound counts tie exactly.
  const double sm_us = std::max(pushed_bytes(p, false) / (r.comm_sm_GBps * 1e3),
                                n * pushed_bytes(p, true) / (r.link_GBps * 1e3));
  return std::max(attention_us(p) + sm_us / r.sms, sm_us / n);
}

// The model's pick among the offered candidates (only ever one of them).
inline runtime::TuneCandidate choose(const Problem& p, const std::vector<runtime::TuneCandidate>& cands,
                                     const runtime::DeviceRates& r) {
  std::vector<runtime::TuneCandidate> most_first = cands;  // equal predictions: the larger count
  std::stable_sort(most_first.begin(), most_first.end(),
                   [](const runtime::TuneCandidate& a, const runtime::TuneCandidate& b) { return a.num_comm_sms > b.num_comm_sms; });
  return runtime::cheapest(most_first, [&](const runtime::TuneCandidate& c) { return predicted_us(p, c.num_comm_sms, r); });
}

}  // namespace weave::sp::model
