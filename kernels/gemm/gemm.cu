// Host side of the GEMM: shape validation, tile choice, tensor maps, launch. The four kernel
// instantiations (2 tiles x 2 B layouts) live here so that users compile none of them.
#include "gemm/gemm.hpp"
#include "gemm/gemm_kernel.cuh"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/lcsc.cuh"
#include "weave/tile/tma.hpp"

namespace weave::gemm {

namespace {

// 3 stages x 48 KB + a 64 KB staging tile = 208 KB; 5 x 32 KB + 32 KB = 192 KB.
template <BLayout L>
using Big = GemmKernel<256, L, 3>;
template <BLayout L>
using Small = GemmKernel<128, L, 5>;
// 4 x 48 KB + a 32 KB half-tile staging buffer = 224 KB.
template <BLayout L>
using Deep = GemmKernel<256, L, 4, 2>;
// Big in clusters of 2 along M with B multicast.
template <BLayout L>
using Pair = GemmKernel<256, L, 3, 1, 2>;

template <class Kern>
lcsc::Plan run(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K, BLayout bl,
               const Options& opt, int group_m, cudaStream_t stream) {
  using tile::Swizzle;
  GemmGlobals g{};
  g.a = tile::encode(tile::tma_2d(A, M, K, K, Kern::BM, 64, Swizzle::B128));
  if (bl == BLayout::NK)
    g.b = tile::encode(tile::tma_2d(B, N, K, K, Kern::kBRowsPerCta, 64, Swizzle::B128));
  else
    g.b = tile::encode(tile::tma_2d(B, K, N, N, 64, 64, Swizzle::B128));
  g.c = tile::encode(tile::tma_2d(static_cast<const __nv_bfloat16*>(C), M, N, N, Kern::BM, 64, Swizzle::B128));
  g.M = M;
  g.N = N;
  g.K = K;
  g.tiles_m = ceil_div(M, Kern::BM);
  g.tiles_n = ceil_div(N, Kern::BN);
  g.group_m = group_m;
  g.accumulate = opt.accumulate ? 1 : 0;
  return lcsc::launch<Kern>(g, opt.lcsc, stream);
}

}  // namespace

void validate_shape(int M, int N, int K) {
  WEAVE_CHECK(M >= 1 && N >= 1 && K >= 1, "gemm: M, N, K must be positive, got ", M, " x ", N, " x ", K);
  WEAVE_CHECK(K % 8 == 0, "gemm: K = ", K, " is not a multiple of 8 (TMA needs 16-byte row pitches)");
  WEAVE_CHECK(N % 8 == 0, "gemm: N = ", N, " is not a multiple of 8 (TMA needs 16-byte row pitches)");
}

const char* tile_name(Tile t) {
  switch (t) {
    case Tile::M128N256: return "128x256";
    case Tile::M128N128: return "128x128";
    case Tile::M128N256S4: return "128x256s4";
    case Tile::M128N256C2: return "128x256c2";
    default: return "auto";
  }
}

// Short K means short tiles: more of them run at once per unit time, and a taller raster group
// (16 tile rows) measured 2-4% faster at K = 1024 and 2048; long K prefers 8 (perf-notes.md).
int default_group_m(Tile t, int K) { return t == Tile::M128N128 || K <= 2048 ? 16 : 8; }

// The big tile wins whenever it fills the machine about as well as the small one: it moves
// fewer bytes per FLOP. The small tile covers shapes whose 128x256 tiles leave much of the last
// wave (or the whole machine) idle.
Tile choose_tile(int M, int N, int K, int sm_count) {
  (void)K;
  auto fill = [&](int bm, int bn) {
    const long long tiles = static_cast<long long>(ceil_div(M, bm)) * ceil_div(N, bn);
    const long long waves = (tiles + sm_count - 1) / sm_count;
    return static_cast<double>(tiles) / static_cast<double>(waves * sm_count);
  };
  const double big = fill(128, 256), small = fill(128, 128);
  return small > big + 0.08 ? Tile::M128N128 : Tile::M128N256;
}

lcsc::Plan gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N, int K, BLayout bl,
                const Options& opt, cudaStream_t stream) {
  validate_shape(M, N, K);
  WEAVE_CHECK(A && B && C, "gemm: null pointer");
  const size_t e = sizeof(__nv_bfloat16);
  check_extent("gemm", "A", A, size_t(M) * K * e);
  check_extent("gemm", "B", B, size_t(K) * N * e);
  check_extent("gemm", "C", C, size_t(M) * N * e);
  Tile t = opt.tile;
  if (t == Tile::Auto) {
    int dev = 0;
    WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
    t = choose_tile(M, N, K, lcsc::device_info(dev).sm_count);
  }
  const int group_m = opt.group_m > 0 ? opt.group_m : default_group_m(t, K);
  const bool nk = bl == BLayout::NK;
  if (t == Tile::M128N256C2)
    return nk ? run<Pair<BLayout::NK>>(A, B, C, M, N, K, bl, opt, group_m, stream)
              : run<Pair<BLayout::KN>>(A, B, C, M, N, K, bl, opt, group_m, stream);
  if (t == Tile::M128N256S4)
    return nk ? run<Deep<BLayout::NK>>(A, B, C, M, N, K, bl, opt, group_m, stream)
              : run<Deep<BLayout::KN>>(A, B, C, M, N, K, bl, opt, group_m, stream);
  if (t == Tile::M128N256)
    return nk ? run<Big<BLayout::NK>>(A, B, C, M, N, K, bl, opt, group_m, stream)
              : run<Big<BLayout::KN>>(A, B, C, M, N, K, bl, opt, group_m, stream);
  return nk ? run<Small<BLayout::NK>>(A, B, C, M, N, K, bl, opt, group_m, stream)
            : run<Small<BLayout::KN>>(A, B, C, M, N, K, bl, opt, group_m, stream);
}

}  // namespace weave::gemm
