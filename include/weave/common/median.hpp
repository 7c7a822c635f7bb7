// The median of a set of timing samples: the tuner and the benchmarks rank by it.
#pragma once
#include <algorithm>
#include <vector>

#include "weave/common/error.hpp"

namespace weave {

inline double median(std::vector<double> v) {
  WEAVE_CHECK(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace weave
