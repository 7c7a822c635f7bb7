// Building a pgl on the host: per-rank addresses from the communicator, one TMA descriptor per rank.
#pragma once
#include "weave/common/error.hpp"
#include "weave/pgl.cuh"
#include "weave/runtime/communicator.hpp"
#include "weave/tile/tma.hpp"

namespace weave::runtime {

// A rows x cols row-major view with pitch `ld` (elements) of the symmetric buffer at `ptr` (in the
// heap or registered), cut into tile_rows x tile_cols tiles. Validates everything TMA would
// reject, before any launch.
template <class T, int W = kMaxWorld>
pgl<T, W> make_pgl(const Communicator& c, T* ptr, int rows, int cols, long long ld, int tile_rows, int tile_cols) {
  WEAVE_CHECK(c.world() <= W, "pgl: world ", c.world(), " exceeds this view's maximum ", W);
  WEAVE_CHECK(rows > 0 && cols > 0 && tile_rows > 0 && tile_cols > 0, "pgl: bad shape ", rows, " x ", cols,
              " in tiles of ", tile_rows, " x ", tile_cols);
  // TMA's rules (alignment, pitch, box) are checked once, on this rank's address, before any
  // peer lookup: the same offsets hold on every rank.
  tile::tma_2d<T>(ptr, rows, cols, ld, tile_rows, tile_cols, tile::Swizzle::None);
  const size_t bytes = (size_t(rows - 1) * ld + cols) * sizeof(T);
  PeerPtrs pp = c.peers(ptr, bytes);
  pgl<T, W> p{};
  p.world = c.world();
  p.rank = c.rank();
  p.rows = rows;
  p.cols = cols;
  p.ld = ld;
  p.tile_rows = tile_rows;
  p.tile_cols = tile_cols;
  for (int r = 0; r < p.world; ++r) {
    p.ptr[r] = static_cast<T*>(pp[r]);
    p.tma[r] = tile::encode(tile::tma_2d<T>(static_cast<const T*>(pp[r]), rows, cols, ld, tile_rows, tile_cols,
                                            tile::Swizzle::None));
  }
  return p;
}

}  // namespace weave::runtime
