// Host reference of the fp8 quantiser (kernels/gemm_fp8/quantize.hpp), sharing nothing with the
// kernels but the stated semantics: the float -> fp8 rounding is a binary search over the format's
// codes decoded by check::fp8_to_double (bit fields, not cuda_fp8.h), nearest value, ties to the
// even code, saturating; amax, scales and reciprocals in plain host float arithmetic (IEEE, round
// to nearest even, as the kernels' __fdiv_rn / __frcp_rn / __fmul_rn).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "check/gemm_fp8_ref.hpp"

namespace weave::quantize_ref {

// The largest finite code of the format's positive half and its NaN code.
inline uint8_t max_code(bool e5m2) { return e5m2 ? 0x7b : 0x7e; }  // 57344, 448
inline bool is_nan_code(uint8_t c, bool e5m2) {
  return e5m2 ? (c & 0x7f) > 0x7c : (c & 0x7f) == 0x7f;
}
inline bool is_zero_code(uint8_t c) { return (c & 0x7f) == 0; }
// Equal codes, or both NaN (any NaN code: the conversion's NaN is not specified further), or both
// zero (the sign of a zero is not checked: it does not change a GEMM).
inline bool same_code(uint8_t a, uint8_t b, bool e5m2) {
  return a == b || (is_nan_code(a, e5m2) && is_nan_code(b, e5m2)) || (is_zero_code(a) && is_zero_code(b));
}

// The values of the positive codes 0 .. 0x7f (decoded once).
inline const double* code_values(bool e5m2) {
  static const auto table = [] {
    std::vector<double> t(256);
    for (int c = 0; c < 128; ++c) t[c] = check::fp8_to_double(static_cast<uint8_t>(c), false);
    for (int c = 0; c < 128; ++c) t[128 + c] = check::fp8_to_double(static_cast<uint8_t>(c), true);
    return t;
  }();
  return table.data() + (e5m2 ? 128 : 0);
}

// Round to nearest, ties to even, saturating to +-max finite (+-Inf too), NaN -> 0x7f.
inline uint8_t to_fp8(float y, bool e5m2) {
  if (std::isnan(y)) return 0x7f;
  const uint8_t sign = std::signbit(y) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(y));
  const double* v = code_values(e5m2);
  const int top = max_code(e5m2);
  if (a >= v[top]) return sign | static_cast<uint8_t>(top);
  int lo = 0, hi = top;  // v[lo] <= a < v[hi]; codes 0 .. top are increasing
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (v[mid] <= a) lo = mid;
    else hi = mid;
  }
  const double dl = a - v[lo], dh = v[hi] - a;
  const int code = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | static_cast<uint8_t>(code);
}

// The scale rule restated: amax / max finite, at least 2^-126.
inline float scale_of(float amax, bool e5m2) {
  const float s = amax / (e5m2 ? 57344.f : 448.f);
  return s >= 0x1p-126f ? s : 0x1p-126f;
}
inline uint8_t quantize(float x, float scale, bool e5m2) {
  const float r = 1.0f / scale;
  const float y = x * r;
  return to_fp8(y, e5m2);
}

enum class Kind { None, Tensor, Row, Block };

struct Result {
  std::vector<uint8_t> q, qt;
  std::vector<float> q_scales, qt_scales;
  float amax = 0, scale = 0;  // scale: the per-tensor scale used (given, or derived when current)
};

// x: rows x cols values (bf16 values as floats). qk: Q's kind (Tensor, Row, Block); tk: Qt's
// (None for no Qt; Tensor with qk Tensor). Tensor: `scale` given, or derived from amax (current).
inline Result quantize_all(const std::vector<float>& x, int rows, int cols, bool e5m2, Kind qk, Kind tk, float scale,
                           bool current) {
  Result res;
  const int tr = (rows + 127) / 128, tc = (cols + 127) / 128;
  const auto at = [&](int i, int j) { return x[size_t(i) * cols + j]; };
  for (float v : x) res.amax = std::fmax(res.amax, std::fabs(v));  // fmax ignores NaN
  res.scale = qk == Kind::Tensor ? (current ? scale_of(res.amax, e5m2) : scale) : 0.f;
  // Block maxima: per (row, 128 columns), per (column, 128 rows), per 128 x 128 block.
  std::vector<float> row_max(size_t(rows) * tc, 0.f), col_max(size_t(tr) * cols, 0.f), blk_max(size_t(tr) * tc, 0.f);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      const float a = std::fabs(at(i, j));
      float& rm = row_max[size_t(j / 128) * rows + i];
      float& cm = col_max[size_t(i / 128) * cols + j];
      float& bm = blk_max[size_t(i / 128) * tc + j / 128];
      rm = std::fmax(rm, a), cm = std::fmax(cm, a), bm = std::fmax(bm, a);
    }
  const auto scale_at = [&](Kind k, bool transposed, int i, int j) {
    if (k == Kind::Tensor) return res.scale;
    if (k == Kind::Block) return scale_of(blk_max[size_t(i / 128) * tc + j / 128], e5m2);
    return transposed ? scale_of(col_max[size_t(i / 128) * cols + j], e5m2)
                      : scale_of(row_max[size_t(j / 128) * rows + i], e5m2);
  };
  res.q.resize(size_t(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) res.q[size_t(i) * cols + j] = quantize(at(i, j), scale_at(qk, false, i, j), e5m2);
  if (qk == Kind::Row) {
    res.q_scales.resize(size_t(tc) * rows);
    for (int cb = 0; cb < tc; ++cb)
      for (int i = 0; i < rows; ++i) res.q_scales[size_t(cb) * rows + i] = scale_of(row_max[size_t(cb) * rows + i], e5m2);
  } else if (qk == Kind::Block) {
    res.q_scales.resize(size_t(tr) * tc);  // gemm_block_scaled's scale_b of Q: row blocks x column blocks
    for (int rb = 0; rb < tr; ++rb)
      for (int cb = 0; cb < tc; ++cb) res.q_scales[size_t(rb) * tc + cb] = scale_of(blk_max[size_t(rb) * tc + cb], e5m2);
  }
  if (tk == Kind::None) return res;
  res.qt.resize(size_t(rows) * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) res.qt[size_t(j) * rows + i] = quantize(at(i, j), scale_at(tk, true, i, j), e5m2);
  if (tk == Kind::Row) {
    res.qt_scales.resize(size_t(tr) * cols);  // Qt's rows are X's columns: ceil(rows/128) x cols
    for (int rb = 0; rb < tr; ++rb)
      for (int j = 0; j < cols; ++j) res.qt_scales[size_t(rb) * cols + j] = scale_of(col_max[size_t(rb) * cols + j], e5m2);
  } else if (tk == Kind::Block) {
    res.qt_scales.resize(size_t(tc) * tr);  // Qt's scale_b: its row blocks (X's column blocks) first
    for (int cb = 0; cb < tc; ++cb)
      for (int rb = 0; rb < tr; ++rb) res.qt_scales[size_t(cb) * tr + rb] = scale_of(blk_max[size_t(rb) * tc + cb], e5m2);
  }
  return res;
}

}  // namespace weave::quantize_ref
