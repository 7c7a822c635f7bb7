// The shape sets of `weave-bench gemm --set core|models|tokens|drawn` and its --shapes list (defined in
// gemm.cu), for the other GEMM benches (gemm_fp8.cu) to run the same rows.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "gemm_drawn.hpp"

namespace weave::bench {

struct Args;

// {M, N, K, layout}: layout 1 = A M x K, B N x K ("nk", forward); 0 = B K x N ("kn", input
// gradient); 2 = A K x M and B K x N (weight gradient). Throws weave::Error for an unknown set.
std::vector<std::array<int, 4>> gemm_shape_rows(const std::string& set);
// --set drawn: draw_gemm_shapes (gemm_drawn.hpp) for --draw-seed (default: a fresh seed) and
// --draws (default 48, at most 10000); `seed` gets the seed used, which the benches print.
std::vector<DrawnGemm> drawn_shapes(const Args& args, uint64_t& seed);
// The shapes of --shapes "MxNxK,...", as {M, N, K}. Throws weave::Error naming a malformed item.
std::vector<std::array<int, 3>> parse_gemm_shapes(const std::string& list);
// --tile wNNN (the 128 x NNN tile): NNN; 0 when `tile` is not of that form; -1, after a message on
// stderr naming `suite` and the widths, when NNN is not one of gemm::kWideWidths.
int wide_tile_width(const std::string& tile, const char* suite);
// --tile swNNN, swNNNc1, swNNNc2 (the swapped 128 x NNN tile; c1 / c2 force its CTAs per cluster):
// {NNN, 0, 1 or 2}; {0, 0} when `tile` is not of that form ("swapped" is the decode tile); {-1, 0},
// after a message on stderr naming `suite` and the widths, for a width not in gemm::kSwappedWidths or
// another suffix.
struct SwappedTileArg {
  int width = 0, cluster = 0;
};
SwappedTileArg swapped_tile_arg(const std::string& tile, const char* suite);

}  // namespace weave::bench
