// The routings of the multi-rank MoE tests (test_moe_exchange_gpu, test_moe_layer_gpu,
// test_gemm_combine_gpu): every rank regenerates every rank's router output from the job's seed,
// so each can build the whole call's reference.
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common.hpp"
#include "moe/layout.hpp"

namespace weave::moe::test {

enum class Routing { balanced, dirichlet, all_to_one, same_rank, random_repeats, random, empty_experts };
inline const char* name(Routing r) {
  static const char* n[] = {"balanced",       "dirichlet", "all_to_one",   "same_rank",
                            "random_repeats", "random",    "empty_experts"};
  return n[static_cast<int>(r)];
}

// T x k expert ids of rank `rank`:
//   balanced        token t's slots on experts (t k + j + rank) mod E;
//   dirichlet       k distinct experts with popularity ~ Dirichlet(0.3) (a few hot experts);
//   all_to_one      slot 0 of every token on expert 0, the others distinct and random;
//   same_rank       every expert of the token on one rank (duplicated rows on the receiver);
//   random_repeats  ids drawn independently: a token may pick one expert twice;
//   random          k distinct experts, uniform;
//   empty_experts   k distinct experts, uniform over the first half only (the others get no rows).
inline std::vector<int> route(Routing kind, const Geometry& g, int T, int k, int rank, std::mt19937_64& rng) {
  const int E = g.experts, L = g.local_experts();
  std::vector<int> idx(static_cast<size_t>(T) * k);
  std::vector<double> pop;
  if (kind == Routing::dirichlet) {
    std::gamma_distribution<double> gam(0.3, 1.0);
    pop.resize(E);
    for (double& x : pop) x = gam(rng) + 1e-12;
  }
  for (int t = 0; t < T; ++t) {
    int* row = idx.data() + static_cast<size_t>(t) * k;
    switch (kind) {
      case Routing::balanced:
        for (int j = 0; j < k; ++j) row[j] = (t * k + j + rank) % E;
        break;
      case Routing::dirichlet:
        draw_distinct(rng, E, k, pop, row);
        break;
      case Routing::all_to_one:
        draw_distinct(rng, E, k, {}, row);
        for (int j = 1; j < k; ++j)
          if (row[j] == 0) row[j] = row[0];
        row[0] = 0;
        break;
      case Routing::same_rank: {
        const int r = static_cast<int>(rng() % g.world);
        std::vector<int> loc(L);
        draw_distinct(rng, L, std::min(k, L), {}, loc.data());
        for (int j = 0; j < k; ++j) row[j] = g.expert(r, loc[j % std::min(k, L)]);
        break;
      }
      case Routing::random_repeats:
        for (int j = 0; j < k; ++j) row[j] = static_cast<int>(rng() % E);
        break;
      case Routing::random:
        draw_distinct(rng, E, k, {}, row);
        break;
      case Routing::empty_experts:
        draw_distinct(rng, E / 2, k, {}, row);
        break;
    }
  }
  return idx;
}

inline RankInput make_input(uint64_t seed, Routing kind, const Geometry& g, int T, int k, int H, int s) {
  return make_rank_input(seed, T, k, H, s, [&](int t, int kk, int ss, std::mt19937_64& rng) {
    return route(kind, g, t, kk, ss, rng);
  });
}

}  // namespace weave::moe::test
