// What the multi-rank MoE tests share (test_moe_exchange_gpu, test_moe_layer_gpu,
// test_gemm_combine_gpu, test_dispatch_gemm_gpu): the communicator and stream, the unsplit options
// of the fused kernels' references, distinct expert draws, and one rank's inputs of a call
// (tokens, router ids and weights) regenerated from the job's seed by every rank, so that each can
// build the whole call's reference (the routings are routing.hpp's).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "../primitives/common.hpp"
#include "check/seed.hpp"
#include "moe/grouped_gemm.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::moe::test {

inline runtime::Communicator& comm() {
  auto& slot = wt::comm_slot();
  if (!slot) {
    runtime::CommOptions o;
    o.heap_bytes = size_t(512) << 20;
    slot = std::make_unique<runtime::Communicator>(o);
  }
  return *slot;
}

inline cudaStream_t stream() {
  static cudaStream_t s = [] {
    cudaStream_t x;
    WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
    return x;
  }();
  return s;
}

// The non-fused references of the fused kernels: those never split K, so their references must
// not either to match them bit for bit (the grouped GEMM's default, 0, may split).
inline const GroupedGemmOptions kUnsplit = [] {
  GroupedGemmOptions o;
  o.split_k = 1;
  return o;
}();

// k distinct experts drawn with probability `p` (uniform when empty) from experts [0, limit).
inline void draw_distinct(std::mt19937_64& rng, int limit, int k, const std::vector<double>& p, int* out) {
  std::vector<char> used(limit, 0);
  std::discrete_distribution<int> pick(p.begin(), p.end());
  std::uniform_int_distribution<int> uni(0, limit - 1);
  for (int j = 0; j < k; ++j) {
    int e = -1;
    for (int tries = 0; tries < 64 && e < 0; ++tries) {
      const int c = p.empty() ? uni(rng) : pick(rng);
      if (!used[c]) e = c;
    }
    for (int c = 0; e < 0 && c < limit; ++c)
      if (!used[c]) e = c;
    used[e] = 1;
    out[j] = e;
  }
}

struct RankInput {
  int T = 0;
  std::vector<int> idx;     // T x k expert ids
  std::vector<float> w;     // T x k router weights in [0.05, 1)
  std::vector<__nv_bfloat16> x;  // T x H tokens
};

// route(T, k, s, rng) -> T x k ids of rank s (the test's routing).
template <class Route>
RankInput make_rank_input(uint64_t seed, int T, int k, int H, int s, Route&& route) {
  RankInput in;
  in.T = T;
  std::mt19937_64 rng(check::derive(seed, 1, s));
  in.idx = route(T, k, s, rng);
  std::uniform_real_distribution<float> uw(0.05f, 1.f);
  in.w.resize(static_cast<size_t>(T) * k);
  for (float& v : in.w) v = uw(rng);
  in.x = wt::random_matrix<__nv_bfloat16>(check::derive(seed, 2, s), 0, static_cast<size_t>(T) * H);
  return in;
}

}  // namespace weave::moe::test
