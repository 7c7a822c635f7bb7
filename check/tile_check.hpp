// Per-element, per-tile comparison of an output against an independent reference.
//
// Every element gets its own error bound, scaled by its own magnitude and by the magnitude of
// the sum that produced it:
//
//   |x - r| <= rel * |r| + scale * s + abs
//
// r is the reference (float32 or better), s the element's scale: for a dot product
// sqrt(sum_k a_k^2 b_k^2), the size of the rounding noise a correct kernel adds when it rounds
// partial sums or operands (bf16 rounding is at most 2^-8 relative). A whole-output norm hides a
// tile that misses one K step or one rank's contribution; this bound does not, because the
// missing part of a sum is of the order of s itself.
//
// The result is reported per tile (tile_rows x tile_cols): the worst tile, how many tiles break
// the bound, and the worst element with its value, reference and bound. A non-finite output
// where the reference is finite (or the reverse) breaks the bound, so poisoned (NaN) elements
// that were never written fail.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace weave::check {

struct Bound {
  double rel = 0;    // times |r|
  double scale = 0;  // times s
  double abs = 0;    // absolute floor
};

// bf16 rounds to 8 significant bits: at most 2^-8 relative per rounding.
inline constexpr double kBf16Round = 1.0 / 256;

struct Report {
  bool ok = true;
  long long rows = 0, cols = 0, tiles = 0, bad_tiles = 0, nonfinite = 0;
  double worst = 0;               // max over elements of |x - r| / bound (inf for a non-finite mismatch)
  long long worst_row = -1, worst_col = -1;
  double got = 0, want = 0, bound = 0;
  int tile_rows = 0, tile_cols = 0;
  std::string str() const;  // one line: the worst tile, its element, the counts
};

// Elementwise layout of a matrix on the device: rows x cols, leading dimension ld (elements).
template <class T>
struct Mat {
  const T* p = nullptr;
  long long ld = 0;
};

// Fills n elements with NaN (bf16 0xFFFF, fp32 0xFFFFFFFF) before a checked call: an element the
// kernel never writes then breaks the bound.
void poison(__nv_bfloat16* p, size_t n, cudaStream_t stream = nullptr);
void poison(float* p, size_t n, cudaStream_t stream = nullptr);

// Device comparison; x bf16 or float, r and s float (s may be null: scale term 0). Synchronises
// `stream` and returns the report.
Report compare(Mat<__nv_bfloat16> x, Mat<float> r, Mat<float> s, long long rows, long long cols, Bound b,
               int tile_rows = 128, int tile_cols = 128, cudaStream_t stream = nullptr);
Report compare(Mat<float> x, Mat<float> r, Mat<float> s, long long rows, long long cols, Bound b,
               int tile_rows = 128, int tile_cols = 128, cudaStream_t stream = nullptr);

// Host comparison for references computed on the CPU: x(i, j), r(i, j), s(i, j) callables
// returning double.
template <class X, class R, class S>
Report compare_host(long long rows, long long cols, X x, R r, S s, Bound b, int tile_rows = 128,
                    int tile_cols = 128);

// ---------------------------------------------------------------------------------------------
// One element's ratio |x - r| / bound; infinite when exactly one of x, r is non-finite or both
// are but differ in kind (NaN against Inf, or Infs of different sign).
#if defined(__CUDA_ARCH__)
#define WEAVE_CHECK_MATH_NS
#else
#define WEAVE_CHECK_MATH_NS std::
#endif
__host__ __device__ inline double element_ratio(double x, double r, double s, double rel, double scale, double abs,
                                                double* bound_out = nullptr) {
  const double bnd = rel * WEAVE_CHECK_MATH_NS fabs(r) + scale * s + abs;
  if (bound_out) *bound_out = bnd;
  const bool fx = WEAVE_CHECK_MATH_NS isfinite(x), fr = WEAVE_CHECK_MATH_NS isfinite(r);
  if (!fx || !fr) {
    if (fx != fr) return INFINITY;
    if (WEAVE_CHECK_MATH_NS isnan(x) != WEAVE_CHECK_MATH_NS isnan(r)) return INFINITY;
    if (!WEAVE_CHECK_MATH_NS isnan(x) && x != r) return INFINITY;
    return 0;
  }
  const double d = WEAVE_CHECK_MATH_NS fabs(x - r);
  if (d == 0) return 0;
  return bnd > 0 ? d / bnd : INFINITY;
}
#undef WEAVE_CHECK_MATH_NS

template <class X, class R, class S>
Report compare_host(long long rows, long long cols, X x, R r, S s, Bound b, int tile_rows, int tile_cols) {
  Report rep;
  rep.rows = rows, rep.cols = cols, rep.tile_rows = tile_rows, rep.tile_cols = tile_cols;
  const long long tr = (rows + tile_rows - 1) / tile_rows, tc = (cols + tile_cols - 1) / tile_cols;
  rep.tiles = tr * tc;
  std::vector<double> tile_worst(size_t(rep.tiles), 0.0);
  for (long long i = 0; i < rows; ++i)
    for (long long j = 0; j < cols; ++j) {
      const double xv = x(i, j), rv = r(i, j), sv = s(i, j);
      if (!std::isfinite(xv) && std::isfinite(rv)) ++rep.nonfinite;
      double bnd = 0;
      const double q = element_ratio(xv, rv, sv, b.rel, b.scale, b.abs, &bnd);
      double& tw = tile_worst[size_t((i / tile_rows) * tc + j / tile_cols)];
      tw = std::max(tw, q);
      if (q > rep.worst || rep.worst_row < 0) {
        rep.worst = q;
        rep.worst_row = i, rep.worst_col = j, rep.got = xv, rep.want = rv, rep.bound = bnd;
      }
    }
  for (double w : tile_worst) rep.bad_tiles += !(w <= 1.0);
  rep.ok = rep.bad_tiles == 0;
  return rep;
}

}  // namespace weave::check
