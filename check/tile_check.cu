#include <algorithm>
#include <cstdio>
#include <sstream>

#include "check/tile_check.hpp"
#include "weave/common/error.hpp"

namespace weave::check {

namespace {

struct TileResult {
  double worst;        // max ratio in the tile
  long long where;     // flat row * cols + col of the worst element (-1: empty tile)
  double got, want, bound;
  unsigned long long nonfinite;
};

__device__ inline double load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline double load(const float* p) { return *p; }

// One CTA per tile: a strided walk over the tile, then a block reduction of the worst ratio.
template <class T>
__global__ void tile_kernel(Mat<T> x, Mat<float> r, Mat<float> s, long long rows, long long cols, Bound b, int trows,
                            int tcols, long long tiles_c, TileResult* out) {
  const long long t = blockIdx.x;
  const long long r0 = (t / tiles_c) * trows, c0 = (t % tiles_c) * tcols;
  const long long r1 = min(rows, r0 + trows), c1 = min(cols, c0 + tcols);
  const long long w = c1 - c0, n = (r1 - r0) * w;
  double worst = -1;
  long long where = -1;
  unsigned long long bad = 0;
  for (long long e = threadIdx.x; e < n; e += blockDim.x) {
    const long long i = r0 + e / w, j = c0 + e % w;
    const double xv = load(x.p + i * x.ld + j), rv = r.p[i * r.ld + j], sv = s.p ? s.p[i * s.ld + j] : 0.0;
    if (!isfinite(xv) && isfinite(rv)) ++bad;
    const double q = element_ratio(xv, rv, sv, b.rel, b.scale, b.abs);
    if (q > worst) worst = q, where = i * cols + j;
  }
  __shared__ double sw[32];
  __shared__ long long swh[32];
  __shared__ unsigned long long sb[32];
  for (int o = 16; o > 0; o >>= 1) {
    const double ow = __shfl_xor_sync(0xffffffff, worst, o);
    const long long oh = __shfl_xor_sync(0xffffffff, where, o);
    if (ow > worst || (ow == worst && oh > where)) worst = ow, where = oh;
    bad += __shfl_xor_sync(0xffffffff, bad, o);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sw[warp] = worst, swh[warp] = where, sb[warp] = bad;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < int(blockDim.x >> 5); ++k) {
      if (sw[k] > worst || (sw[k] == worst && swh[k] > where)) worst = sw[k], where = swh[k];
      bad += sb[k];
    }
    TileResult res{worst < 0 ? 0 : worst, where, 0, 0, 0, bad};
    if (where >= 0) {
      const long long i = where / cols, j = where % cols;
      res.got = load(x.p + i * x.ld + j);
      res.want = r.p[i * r.ld + j];
      double bnd = 0;
      element_ratio(res.got, res.want, s.p ? s.p[i * s.ld + j] : 0.0, b.rel, b.scale, b.abs, &bnd);
      res.bound = bnd;
    }
    out[t] = res;
  }
}

template <class U>
__global__ void fill_bits_kernel(U* p, size_t n, U bits) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = bits;
}
template <class U>
void fill_bits(U* p, size_t n, U bits, cudaStream_t st) {
  if (n == 0) return;
  const size_t blocks = std::min<size_t>(4096, (n + 255) / 256);
  fill_bits_kernel<U><<<unsigned(blocks), 256, 0, st>>>(p, n, bits);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

template <class T>
Report run(Mat<T> x, Mat<float> r, Mat<float> s, long long rows, long long cols, Bound b, int trows, int tcols,
           cudaStream_t st) {
  WEAVE_CHECK(rows >= 0 && cols >= 0 && trows > 0 && tcols > 0, "check::compare: bad sizes ", rows, "x", cols,
              " tile ", trows, "x", tcols);
  WEAVE_CHECK(x.p && r.p, "check::compare: null output or reference");
  WEAVE_CHECK(x.ld >= cols && r.ld >= cols && (!s.p || s.ld >= cols), "check::compare: leading dimension < cols");
  Report rep;
  rep.rows = rows, rep.cols = cols, rep.tile_rows = trows, rep.tile_cols = tcols;
  const long long tr = (rows + trows - 1) / trows, tc = (cols + tcols - 1) / tcols;
  rep.tiles = tr * tc;
  if (rep.tiles == 0) return rep;
  TileResult* d = nullptr;
  WEAVE_CUDA_CHECK(cudaMallocAsync(&d, sizeof(TileResult) * rep.tiles, st));
  WEAVE_CHECK(rep.tiles < (1ll << 31), "check::compare: too many tiles");
  tile_kernel<T><<<unsigned(rep.tiles), 256, 0, st>>>(x, r, s, rows, cols, b, trows, tcols, tc, d);
  WEAVE_CUDA_CHECK(cudaGetLastError());
  std::vector<TileResult> h(size_t(rep.tiles));
  WEAVE_CUDA_CHECK(cudaMemcpyAsync(h.data(), d, sizeof(TileResult) * rep.tiles, cudaMemcpyDeviceToHost, st));
  WEAVE_CUDA_CHECK(cudaFreeAsync(d, st));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
  for (const TileResult& t : h) {
    rep.nonfinite += t.nonfinite;
    rep.bad_tiles += !(t.worst <= 1.0);
    if (t.where >= 0 && (rep.worst_row < 0 || t.worst > rep.worst)) {
      rep.worst = t.worst;
      rep.worst_row = t.where / cols, rep.worst_col = t.where % cols;
      rep.got = t.got, rep.want = t.want, rep.bound = t.bound;
    }
  }
  rep.ok = rep.bad_tiles == 0;
  return rep;
}

}  // namespace

std::string Report::str() const {
  std::ostringstream o;
  o.precision(4);
  if (tiles == 0) return "empty output";
  o << (ok ? "ok" : "WRONG") << ": worst |x-r|/bound " << worst;
  if (worst_row >= 0) {
    o << " in tile (" << worst_row / tile_rows << ", " << worst_col / tile_cols << ") at element (" << worst_row
      << ", " << worst_col << "): got " << got << ", want " << want << ", bound " << bound;
  }
  o << "; " << bad_tiles << " of " << tiles << " tiles (" << tile_rows << "x" << tile_cols << ") over the bound, "
    << nonfinite << " non-finite outputs, " << rows << "x" << cols;
  return o.str();
}

void poison(__nv_bfloat16* p, size_t n, cudaStream_t st) { fill_bits(reinterpret_cast<uint16_t*>(p), n, uint16_t(0xFFFF), st); }
void poison(float* p, size_t n, cudaStream_t st) { fill_bits(reinterpret_cast<uint32_t*>(p), n, 0xFFFFFFFFu, st); }

Report compare(Mat<__nv_bfloat16> x, Mat<float> r, Mat<float> s, long long rows, long long cols, Bound b, int tr,
               int tc, cudaStream_t st) {
  return run(x, r, s, rows, cols, b, tr, tc, st);
}
Report compare(Mat<float> x, Mat<float> r, Mat<float> s, long long rows, long long cols, Bound b, int tr, int tc,
               cudaStream_t st) {
  return run(x, r, s, rows, cols, b, tr, tc, st);
}

}  // namespace weave::check
