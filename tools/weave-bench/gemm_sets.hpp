// The shape sets of `weave-bench gemm --set core|models` (defined in gemm.cu), for the other GEMM
// benches (gemm_fp8.cu) to run the same rows.
#pragma once
#include <array>
#include <string>
#include <vector>

namespace weave::bench {

// {M, N, K, layout}: layout 1 = A M x K, B N x K ("nk", forward); 0 = B K x N ("kn", input
// gradient); 2 = A K x M and B K x N (weight gradient). Throws weave::Error for an unknown set.
std::vector<std::array<int, 4>> gemm_shape_rows(const std::string& set);

}  // namespace weave::bench
