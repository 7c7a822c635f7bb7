// The fp8 quantiser (gemm_fp8/quantize.hpp) against its host reference (quantize_ref.hpp: its own
// float -> fp8 rounding, checked on the CPU against cuda_fp8.h's), code for code: every byte of Q and
// Qt equal (NaN codes only need to be NaN, zeros only zero), every scale and amax bit for bit. Fresh
// random bf16 inputs per case (WEAVE_TEST_SEED replays them): uniform, spanning 2^-40 .. 2^12 with
// bf16 subnormals and zeros, rows and column blocks of very different magnitudes, and +-Inf / NaN.
// Outputs are poisoned first (each byte with the complement of the byte it must receive, scales
// with NaN) and surrounded by guards that must stay untouched. Every mode, with and without Qt,
// e4m3 and e5m2, ragged rows. End to end: X and W (or dY) quantised here, multiplied by gemm_fp8
// (per tensor and block-scaled; forward, dgrad through W's Qt, wgrad through dY's and X's Qt) and
// compared with the float32 GEMM of the dequantised operands under the GEMM's own bound
// (check/gemm_fp8_ref.hpp), and with the bf16 product of the unquantised inputs (relative
// Frobenius error at most 0.1, or 0.2 with an e5m2 operand: rounding two fp8 operands gives ~0.035
// / ~0.056 (rms relative rounding error ~0.025 for e4m3, ~0.05 for e5m2); a wrong scale layout or a
// scale used the wrong way round is O(1)).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "check/device_buffer.hpp"
#include "check/error_of.hpp"
#include "check/gemm_fp8_ref.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm_fp8/gemm_fp8.hpp"
#include "gemm_fp8/quantize.hpp"
#include "check/host_copy.hpp"
#include "quantize_ref.hpp"

using namespace weave;
using bf16 = __nv_bfloat16;
using gemm_fp8::Blocks;
using gemm_fp8::Fp8;
using quantize_ref::Kind;

namespace {

template <class T>
using DevBuf = check::DeviceBuffer<T>;
using check::case_seed;

using check::to_device;
using check::to_host;

enum class Dist {
  Uniform,    // uniform in [-1, 1)
  Wide,       // |x| from 2^-40 to 2^12 in every block, 2 % bf16 subnormals, 1 % zeros (+-)
  RowScaled,  // uniform times 2^[-30, 30] per row and 2^[-10, 10] per 128-column block
  Specials,   // uniform with +-Inf and NaN at a few places, and +-0
};
const char* dist_name(Dist d) {
  return d == Dist::Uniform ? "uniform" : d == Dist::Wide ? "wide" : d == Dist::RowScaled ? "row-scaled" : "specials";
}

// rows x cols bf16 values (as floats, exactly representable).
std::vector<float> make_input(int rows, int cols, Dist d, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f), u01(0.f, 1.f);
  std::vector<float> x(size_t(rows) * cols);
  std::vector<int> col_exp((cols + 127) / 128);
  for (int& e : col_exp) e = int(g() % 21) - 10;
  for (int i = 0; i < rows; ++i) {
    const int row_exp = int(g() % 61) - 30;
    for (int j = 0; j < cols; ++j) {
      float v = u(g);
      if (d == Dist::Wide) {
        const float p = u01(g);
        const float sgn = g() & 1 ? -1.f : 1.f;
        if (p < 0.01f) v = sgn * 0.f;
        else if (p < 0.03f) v = sgn * std::ldexp(1.f + u01(g), -134 + int(g() % 7));  // bf16 subnormals
        else v = sgn * std::ldexp(1.f + u01(g), int(g() % 53) - 40);
      } else if (d == Dist::RowScaled) {
        v = std::ldexp(v, row_exp + col_exp[j / 128]);
      }
      x[size_t(i) * cols + j] = __bfloat162float(__float2bfloat16(v));
    }
  }
  if (d == Dist::Specials) {
    const size_t n = x.size();
    for (int k = 0; k < 3; ++k) {
      x[g() % n] = INFINITY;
      x[g() % n] = -INFINITY;
      x[g() % n] = NAN;
      x[g() % n] = -0.f;
    }
  }
  return x;
}
std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = __float2bfloat16(x[i]);  // exact: x holds bf16 values
  return b;
}

Blocks blocks_of(Kind k) { return k == Kind::Row ? Blocks::Row128 : k == Kind::Block ? Blocks::Block128 : Blocks::None; }
const char* kind_name(Kind k) {
  return k == Kind::Tensor ? "tensor" : k == Kind::Row ? "1x128" : k == Kind::Block ? "128x128" : "none";
}

// A device output between two guards: [guard | data | guard], the guards a position-dependent
// pattern that must survive the call.
template <class T>
struct Guarded {
  static constexpr size_t kGuard = 4096 / sizeof(T);
  size_t n;
  DevBuf<T> buf;
  std::vector<T> init;
  explicit Guarded(size_t count) : n(count), buf(count + 2 * kGuard), init(count + 2 * kGuard) {}
  T* data() { return buf.p + kGuard; }
  static T guard_value(size_t i) {
    T v;
    uint8_t b[sizeof(T)];
    for (size_t k = 0; k < sizeof(T); ++k) b[k] = static_cast<uint8_t>(0x5a ^ ((i * sizeof(T) + k) * 131));
    std::memcpy(&v, b, sizeof(T));
    return v;
  }
  // Data poisoned with `poison(i)`, guards with the pattern.
  template <class P>
  void poison(P&& poison) {
    for (size_t i = 0; i < kGuard; ++i) init[i] = guard_value(i), init[kGuard + n + i] = guard_value(kGuard + n + i);
    for (size_t i = 0; i < n; ++i) init[kGuard + i] = poison(i);
    to_device(buf.p, init);
  }
  // The data; `guard_bad` counts guard elements that changed.
  std::vector<T> read(size_t& guard_bad) {
    std::vector<T> all = to_host(buf.p, buf.n);
    guard_bad = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      if (i == kGuard) i += n;
      if (i < all.size() && std::memcmp(&all[i], &init[i], sizeof(T)) != 0) ++guard_bad;
    }
    return std::vector<T>(all.begin() + kGuard, all.begin() + kGuard + n);
  }
};

float nan_bits() {
  const uint32_t u = 0xffffffffu;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Case {
  int rows, cols;
  Fp8 type = Fp8::E4M3;
  Kind qk = Kind::Tensor, tk = Kind::None;
  bool current = false;  // per tensor: current scaling (else the caller's scale)
  Dist dist = Dist::Uniform;
  bool amax = true;  // ask for amax (delayed and block modes)
  std::string name() const {
    return std::to_string(rows) + "x" + std::to_string(cols) + " " + gemm_fp8::type_name(type) + " Q " +
           kind_name(qk) + (qk == Kind::Tensor ? (current ? " (current)" : " (delayed)") : "") + ", Qt " +
           kind_name(tk) + ", " + dist_name(dist);
  }
};

// Compares fp8 codes; returns the count of differing ones and describes the first.
size_t compare_codes(const char* what, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, bool e5m2,
                     int ld, const std::vector<float>& x, bool transposed, int cols, std::string& first) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!quantize_ref::same_code(got[i], want[i], e5m2) && bad++ == 0) {
      const size_t r = i / ld, c = i % ld;
      const float xv = transposed ? x[c * cols + r] : x[r * cols + c];
      char b[256];
      std::snprintf(b, sizeof b, "%s[%zu, %zu] = 0x%02x, want 0x%02x (x = %.9g)", what, r, c, got[i], want[i], xv);
      first = b;
    }
  return bad;
}
size_t compare_floats(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                      std::string& first) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && bad++ == 0) {
      char b[192];
      std::snprintf(b, sizeof b, "%s[%zu] = %.9g, want %.9g", what, i, got[i], want[i]);
      first = b;
    }
  return bad;
}

// One quantiser call on fresh inputs, checked against the host reference.
void run_case(const Case& c) {
  SCOPED_TRACE(c.name());
  const bool e5 = c.type == Fp8::E5M2, trans = c.tk != Kind::None;
  const size_t n = size_t(c.rows) * c.cols;
  const std::vector<float> x = make_input(c.rows, c.cols, c.dist, case_seed(1));
  // The caller's scale (delayed): the tensor's own times 2^[-2, 2], so some values saturate.
  float given = 0;
  if (c.qk == Kind::Tensor && !c.current) {
    float amax = 0;  // of the finite values (a scale from an Inf would quantise everything to 0)
    for (float v : x)
      if (std::isfinite(v)) amax = std::fmax(amax, std::fabs(v));
    std::mt19937_64 g(case_seed(2));
    given = std::ldexp(std::max(quantize_ref::scale_of(amax, e5), 1e-30f), int(g() % 5) - 2);
  }
  const quantize_ref::Result want = quantize_ref::quantize_all(x, c.rows, c.cols, e5, c.qk, c.tk, given, c.current);

  DevBuf<bf16> dx(n);
  to_device(dx.p, to_bf16(x));
  Guarded<uint8_t> q(n), qt(trans ? n : 1);
  q.poison([&](size_t i) { return static_cast<uint8_t>(~want.q[i]); });
  if (trans) qt.poison([&](size_t i) { return static_cast<uint8_t>(~want.qt[i]); });
  const size_t nqs = gemm_fp8::quantize_scale_count(blocks_of(c.qk), c.rows, c.cols);
  const size_t nqts = gemm_fp8::quantize_scale_count(blocks_of(c.tk), c.cols, c.rows);
  Guarded<float> qs(std::max<size_t>(nqs, 1)), qts(std::max<size_t>(nqts, 1)), scalars(2);  // scale, amax
  qs.poison([](size_t) { return nan_bits(); });
  qts.poison([](size_t) { return nan_bits(); });
  scalars.poison([&](size_t i) { return i == 0 && c.qk == Kind::Tensor && !c.current ? given : nan_bits(); });
  float* const d_scale = scalars.data();
  float* const d_amax = c.amax || c.current ? scalars.data() + 1 : nullptr;
  void* const d_qt = trans ? qt.data() : nullptr;

  if (c.qk == Kind::Tensor && c.current)
    gemm_fp8::quantize_fp8_current(dx.p, c.rows, c.cols, c.type, q.data(), d_qt, d_scale, d_amax);
  else if (c.qk == Kind::Tensor)
    gemm_fp8::quantize_fp8(dx.p, c.rows, c.cols, c.type, q.data(), d_qt, d_scale, d_amax);
  else
    gemm_fp8::quantize_fp8_blocks(dx.p, c.rows, c.cols, c.type, q.data(), blocks_of(c.qk), qs.data(), d_qt,
                                  blocks_of(c.tk), trans ? qts.data() : nullptr, d_amax);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());

  size_t g_q = 0, g_qt = 0, g_qs = 0, g_qts = 0, g_sc = 0;
  std::string f_q, f_qt, f_qs, f_qts, f_sc;
  const size_t bad_q = compare_codes("Q", q.read(g_q), want.q, e5, c.cols, x, false, c.cols, f_q);
  const size_t bad_qt = trans ? compare_codes("Qt", qt.read(g_qt), want.qt, e5, c.rows, x, true, c.cols, f_qt) : 0;
  const std::vector<float> got_qs = qs.read(g_qs), got_qts = qts.read(g_qts), sc = scalars.read(g_sc);
  const size_t bad_qs = nqs ? compare_floats("q_scales", got_qs, want.q_scales, f_qs) : 0;
  const size_t bad_qts = nqts ? compare_floats("qt_scales", got_qts, want.qt_scales, f_qts) : 0;
  std::vector<float> sc_want = {c.qk == Kind::Tensor ? want.scale : nan_bits(), d_amax ? want.amax : nan_bits()};
  const size_t bad_sc = compare_floats("scale, amax", sc, sc_want, f_sc);
  std::printf("check quantize %s: Q %zu of %zu codes wrong, Qt %zu, scales %zu + %zu, scale/amax %zu, guards "
              "changed %zu\n",
              c.name().c_str(), bad_q, n, bad_qt, bad_qs, bad_qts, bad_sc, g_q + g_qt + g_qs + g_qts + g_sc);
  EXPECT_EQ(bad_q, 0u) << f_q;
  EXPECT_EQ(bad_qt, 0u) << f_qt;
  EXPECT_EQ(bad_qs, 0u) << f_qs;
  EXPECT_EQ(bad_qts, 0u) << f_qts;
  EXPECT_EQ(bad_sc, 0u) << f_sc;
  EXPECT_EQ(g_q + g_qt + g_qs + g_qts + g_sc, 0u) << "a write outside an output (guards: Q " << g_q << ", Qt "
                                                   << g_qt << ", q_scales " << g_qs << ", qt_scales " << g_qts
                                                   << ", scale/amax " << g_sc << ")";
}

struct Shape {
  int rows, cols;
};
// Rows multiples of 16 (a transposed copy is possible), not of 128, down to one 16 x 16 block,
// skinny both ways; and rows that are not multiples of 16 (Q only).
const Shape kTransposable[] = {{16, 16},   {144, 272}, {1040, 528}, {2064, 1040}, {48, 4096},
                               {4096, 48}, {128, 128}, {1008, 784}};
const Shape kQOnly[] = {{1, 16}, {1000, 784}, {129, 528}, {7, 4112}, {255, 1040}};

}  // namespace

// Per tensor, the caller's scale (delayed: some values saturate, amax returned) and current
// scaling (amax first), with and without Qt, e4m3 and e5m2.
TEST(Quantize, PerTensor) {
  for (Fp8 t : {Fp8::E4M3, Fp8::E5M2})
    for (bool current : {false, true})
      for (Dist d : {Dist::Uniform, Dist::Wide}) {
        for (Shape s : kTransposable)
          for (bool trans : {false, true}) {
            Case c{s.rows, s.cols, t, Kind::Tensor, trans ? Kind::Tensor : Kind::None, current, d};
            c.amax = trans;  // delayed scaling without asking for amax too
            run_case(c);
          }
        for (Shape s : kQOnly) run_case({s.rows, s.cols, t, Kind::Tensor, Kind::None, current, d});
      }
}

// Block scales: every supported combination of Q's and Qt's kinds, both types, ragged shapes, rows
// and column blocks of very different magnitudes, and values spanning 2^-40 .. 2^12 in every block.
TEST(Quantize, BlockScales) {
  const std::pair<Kind, Kind> combos[] = {{Kind::Row, Kind::None},   {Kind::Block, Kind::None},
                                          {Kind::Row, Kind::Row},    {Kind::Row, Kind::Block},
                                          {Kind::Block, Kind::Block}, {Kind::Block, Kind::Row}};
  for (Fp8 t : {Fp8::E4M3, Fp8::E5M2})
    for (auto [qk, tk] : combos)
      for (Dist d : {Dist::RowScaled, Dist::Wide}) {
        for (Shape s : kTransposable) run_case({s.rows, s.cols, t, qk, tk, false, d, s.rows % 32 == 0});
        if (tk == Kind::None)
          for (Shape s : kQOnly) run_case({s.rows, s.cols, t, qk, tk, false, d});
      }
}

// +-Inf and NaN inputs in every mode: NaN stays NaN, Inf saturates with a per-tensor scale, a block
// holding an Inf gets scale Inf (its finite values 0, its Infs NaN), amax Inf.
TEST(Quantize, NonFiniteInputs) {
  for (Fp8 t : {Fp8::E4M3, Fp8::E5M2}) {
    run_case({1040, 528, t, Kind::Tensor, Kind::Tensor, false, Dist::Specials});
    run_case({1000, 528, t, Kind::Tensor, Kind::None, false, Dist::Specials});
    run_case({1040, 528, t, Kind::Tensor, Kind::Tensor, true, Dist::Specials});
    run_case({1040, 528, t, Kind::Row, Kind::Row, false, Dist::Specials});
    run_case({1040, 528, t, Kind::Row, Kind::Block, false, Dist::Specials});
    run_case({1040, 528, t, Kind::Block, Kind::Block, false, Dist::Specials});
    run_case({1000, 528, t, Kind::Block, Kind::None, false, Dist::Specials});
  }
}

// Back-to-back calls of the same shapes and modes, fresh inputs and freshly poisoned outputs each,
// every call checked.
TEST(Quantize, RepeatedCalls) {
  for (int rep = 0; rep < 3; ++rep) {
    run_case({2064, 1040, Fp8::E4M3, Kind::Row, Kind::Block, false, Dist::RowScaled});
    run_case({2064, 1040, Fp8::E5M2, Kind::Tensor, Kind::Tensor, true, Dist::Uniform});
  }
}

// ---- end to end: quantise, then gemm_fp8 ----------------------------------------------------------

namespace {

using check::fp8_gemm_ref;
using check::gemm_ref;

// One quantised operand: the fp8 copy the GEMM reads (Q or Qt) and its scales (one float per
// tensor, or the copy's block scales).
struct Operand {
  DevBuf<uint8_t> q, qt;
  DevBuf<float> qs, qts, scale, amax;
  Operand(int rows, int cols, bool trans, Kind qk, Kind tk)
      : q(size_t(rows) * cols), qt(trans ? size_t(rows) * cols : 1),
        qs(std::max<size_t>(gemm_fp8::quantize_scale_count(blocks_of(qk), rows, cols), 1)),
        qts(std::max<size_t>(gemm_fp8::quantize_scale_count(blocks_of(tk), cols, rows), 1)), scale(1), amax(1) {}
};

// x (rows x cols bf16) quantised: per tensor (current scaling) when `block` is false, else Q with
// qk and Qt with tk.
std::unique_ptr<Operand> quantise(const bf16* x, int rows, int cols, Fp8 t, bool trans, bool block, Kind qk, Kind tk) {
  auto o = std::make_unique<Operand>(rows, cols, trans, block ? qk : Kind::Tensor, block && trans ? tk : Kind::None);
  WEAVE_CUDA_CHECK(cudaMemset(o->q.p, 0xff, o->q.n));  // NaN codes: a byte never written makes the GEMM's output NaN
  WEAVE_CUDA_CHECK(cudaMemset(o->qt.p, 0xff, o->qt.n));
  if (!block) gemm_fp8::quantize_fp8_current(x, rows, cols, t, o->q.p, trans ? o->qt.p : nullptr, o->scale.p, o->amax.p);
  else
    gemm_fp8::quantize_fp8_blocks(x, rows, cols, t, o->q.p, blocks_of(qk), o->qs.p, trans ? o->qt.p : nullptr,
                                  trans ? blocks_of(tk) : Blocks::None, trans ? o->qts.p : nullptr);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  return o;
}

// d (rows x cols) = uniform values with rows 2^[-3, 3] apart: the per-row scales differ from the
// block and tensor ones.
void fill_input(bf16* d, int rows, int cols, uint64_t seed) {
  std::vector<float> x = make_input(rows, cols, Dist::Uniform, seed);
  std::mt19937_64 g(seed + 1);
  for (int i = 0; i < rows; ++i) {
    const int e = int(g() % 7) - 3;
    for (int j = 0; j < cols; ++j) x[size_t(i) * cols + j] = std::ldexp(x[size_t(i) * cols + j], e);
  }
  to_device(d, to_bf16(x));
}

// C (M x N bf16) from gemm_fp8 on A (M x K) and B (N x K) against (1) the float32 GEMM of the
// dequantised A and B under the GEMM's bound, (2) the bf16 product `bf16_r` (M x N float) of the
// unquantised inputs, relative Frobenius error at most `frob`.
void check_gemm(const std::string& name, const uint8_t* A, Fp8 ta, const float* sa, const uint8_t* B, Fp8 tb,
                const float* sb, bool block, int M, int N, int K, const float* bf16_r, double frob) {
  DevBuf<bf16> C(size_t(M) * N);
  DevBuf<float> r(size_t(M) * N), s(size_t(M) * N);
  check::poison(C.p, C.n);
  if (block) gemm_fp8::gemm_block_scaled(A, ta, B, tb, C.p, M, N, K, sa, sb);
  else gemm_fp8::gemm(A, ta, B, tb, C.p, M, N, K, sa, sb);
  const bool e5a = ta == Fp8::E5M2, e5b = tb == Fp8::E5M2;
  if (block) fp8_gemm_ref().run_block(A, e5a, B, e5b, M, N, K, sa, sb, r.p, s.p);
  else fp8_gemm_ref().run(A, e5a, B, e5b, M, N, K, sa, sb, r.p, s.p);
  check::sqrt_inplace(s.p, s.n);
  const check::Bound b = block ? check::fp8_promoted_bound() : check::fp8_tensor_core_bound(K);
  const check::Report rep = check::compare({C.p, N}, {r.p, N}, {s.p, N}, M, N, b);
  const std::vector<bf16> c = to_host(C.p, C.n);
  const std::vector<float> x = to_host(bf16_r, size_t(M) * N);
  double num = 0, den = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    const double d = double(__bfloat162float(c[i])) - x[i];
    num += d * d, den += double(x[i]) * x[i];
  }
  const double rel = std::sqrt(num / den);
  std::printf("check quantize -> gemm_fp8 %s: against the dequantised operands %s; against the bf16 product "
              "relative Frobenius error %.4f (at most %.2f)\n",
              name.c_str(), rep.str().c_str(), rel, frob);
  EXPECT_TRUE(rep.ok) << name << ": " << rep.str();
  EXPECT_LE(rel, frob) << name << ": the quantised GEMM is far from the bf16 product";
}

}  // namespace

// A linear layer's three GEMMs from bf16 tensors quantised here (X M x K_in, W N_out x K_in, dY
// M x N_out), per tensor (current scaling, e4m3 X / W, e5m2 dY) and with block scales (X Q 1x128 and
// Qt 128x128, W Q and Qt 128x128, dY Q and Qt 1x128), on ragged shapes (N_out, K_in multiples of 16
// but not of 128; M not a multiple of 128).
TEST(Quantize, GemmEndToEnd) {
  struct Layer {
    int M, Nout, Kin;
  };
  for (Layer L : {Layer{1008, 784, 528}, Layer{2048, 1040, 2064}})
    for (bool block : {false, true}) {
      const std::string how = std::string(block ? "block scales" : "per tensor") + ", M " + std::to_string(L.M) +
                              ", N_out " + std::to_string(L.Nout) + ", K_in " + std::to_string(L.Kin);
      SCOPED_TRACE(how);
      DevBuf<bf16> X(size_t(L.M) * L.Kin), W(size_t(L.Nout) * L.Kin), dY(size_t(L.M) * L.Nout);
      fill_input(X.p, L.M, L.Kin, case_seed(1));
      fill_input(W.p, L.Nout, L.Kin, case_seed(2));
      fill_input(dY.p, L.M, L.Nout, case_seed(3));
      const auto qx = quantise(X.p, L.M, L.Kin, Fp8::E4M3, true, block, Kind::Row, Kind::Block);
      const auto qw = quantise(W.p, L.Nout, L.Kin, Fp8::E4M3, true, block, Kind::Block, Kind::Block);
      const auto qdy = quantise(dY.p, L.M, L.Nout, Fp8::E5M2, true, block, Kind::Row, Kind::Row);
      const auto sc = [&](const Operand& o, bool transposed) -> const float* {
        return block ? (transposed ? o.qts.p : o.qs.p) : o.scale.p;
      };
      {  // forward Y = X W^T: M x N_out, K = K_in
        DevBuf<float> r(size_t(L.M) * L.Nout);
        gemm_ref().run(X.p, W.p, L.M, L.Nout, L.Kin, gemm::BLayout::NK, r.p, nullptr);
        check_gemm("forward, " + how, qx->q.p, Fp8::E4M3, sc(*qx, false), qw->q.p, Fp8::E4M3, sc(*qw, false), block,
                   L.M, L.Nout, L.Kin, r.p, 0.1);
      }
      {  // dgrad dX = dY W: M x K_in, K = N_out; B = W's Qt (K_in x N_out)
        DevBuf<float> r(size_t(L.M) * L.Kin);
        gemm_ref().run(dY.p, W.p, L.M, L.Kin, L.Nout, gemm::BLayout::KN, r.p, nullptr);
        check_gemm("dgrad, " + how, qdy->q.p, Fp8::E5M2, sc(*qdy, false), qw->qt.p, Fp8::E4M3, sc(*qw, true), block,
                   L.M, L.Kin, L.Nout, r.p, 0.2);
      }
      {  // wgrad dW = dY^T X: N_out x K_in, K = M; A = dY's Qt (N_out x M), B = X's Qt (K_in x M)
        DevBuf<float> r(size_t(L.Nout) * L.Kin);
        gemm_ref().run(dY.p, X.p, L.Nout, L.Kin, L.M, gemm::ALayout::KM, gemm::BLayout::KN, r.p, nullptr);
        check_gemm("wgrad, " + how, qdy->qt.p, Fp8::E5M2, sc(*qdy, true), qx->qt.p, Fp8::E4M3, sc(*qx, true), block,
                   L.Nout, L.Kin, L.M, r.p, 0.2);
      }
    }
}

TEST(Quantize, RejectsBadInput) {
  const auto expect_error = [](const char* what, const std::string& needle, auto&& fn) {
    const std::string e = check::error_of(fn);
    EXPECT_NE(e, "") << what << " accepted";
    EXPECT_NE(e.find(needle), std::string::npos) << what << ": " << e;
  };
  DevBuf<uint8_t> big(4 << 20), small(4096);
  DevBuf<float> f(1 << 16), f1(1);
  const bf16* x = reinterpret_cast<const bf16*>(big.p);  // 2 MiB of x
  uint8_t* const q = big.p + (2 << 20);                    // 1 MiB each
  uint8_t* const qt = big.p + (3 << 20);
  const auto* xs = reinterpret_cast<const bf16*>(small.p);
  const Fp8 e4 = Fp8::E4M3;
  using gemm_fp8::quantize_fp8;
  using gemm_fp8::quantize_fp8_blocks;
  using gemm_fp8::quantize_fp8_current;
  // Shapes and types.
  expect_error("cols = 100", "cols = 100 is not a multiple of 16", [&] { quantize_fp8(x, 64, 100, e4, q, qt, f.p); });
  expect_error("rows = 1000 with Qt", "rows = 1000 is not a multiple of 16",
               [&] { quantize_fp8(x, 1000, 64, e4, q, qt, f.p); });
  EXPECT_EQ(check::error_of([&] { quantize_fp8(x, 1000, 64, e4, q, nullptr, f.p); }), "");  // without Qt: fine
  expect_error("rows = 0", "must be positive", [&] { quantize_fp8(x, 0, 64, e4, q, qt, f.p); });
  expect_error("bad type", "unknown fp8 type", [&] { quantize_fp8(x, 64, 64, static_cast<Fp8>(3), q, qt, f.p); });
  // Pointers.
  expect_error("null x", "null pointer", [&] { quantize_fp8(nullptr, 64, 64, e4, q, qt, f.p); });
  expect_error("null q", "null pointer", [&] { quantize_fp8(x, 64, 64, e4, nullptr, qt, f.p); });
  expect_error("null scale", "scale is a null pointer", [&] { quantize_fp8(x, 64, 64, e4, q, qt, nullptr); });
  expect_error("amax on the scale", "scale and amax are the same float",
               [&] { quantize_fp8(x, 64, 64, e4, q, qt, f.p, f.p); });
  expect_error("amax on the scale (current)", "scale and amax are the same float",
               [&] { quantize_fp8_current(x, 64, 64, e4, q, qt, f.p, f.p); });
  expect_error("null amax (current)", "amax is a null pointer",
               [&] { quantize_fp8_current(x, 64, 64, e4, q, qt, f.p, nullptr); });
  expect_error("misaligned x", "x (", [&] { quantize_fp8(x + 4, 64, 64, e4, q, qt, f.p); });
  expect_error("misaligned x (why)", "is not 16-byte aligned", [&] { quantize_fp8(x + 4, 64, 64, e4, q, qt, f.p); });
  expect_error("misaligned q", "q (", [&] { quantize_fp8(x, 64, 64, e4, q + 8, qt, f.p); });
  expect_error("misaligned qt", "qt (", [&] { quantize_fp8(x, 64, 64, e4, q, qt + 4, f.p); });
  expect_error("misaligned scale", "scale (", [&] {
    quantize_fp8(x, 64, 64, e4, q, qt, reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(f.p) + 2));
  });
  expect_error("q overlaps x", "overlaps x", [&] { quantize_fp8(x, 64, 64, e4, big.p + 4096, nullptr, f.p); });
  expect_error("qt overlaps q", "overlaps", [&] { quantize_fp8(x, 64, 64, e4, q, q + 2048, f.p); });
  // Short buffers (extent.hpp): x 2 bytes per element, Q and Qt 1, scales their counts.
  expect_error("short x", "x needs", [&] { quantize_fp8(xs, 64, 64, e4, q, qt, f.p); });  // 8 KB from 4 KB
  expect_error("short q", "q needs", [&] { quantize_fp8(x, 128, 64, e4, small.p, nullptr, f.p); });
  expect_error("short qt", "qt needs", [&] { quantize_fp8(x, 128, 64, e4, q, small.p, f.p); });
  expect_error("q past its allocation's end", "q needs",
               [&] { quantize_fp8(x, 16, 16, e4, big.p + (4 << 20) - 128, nullptr, f.p); });
  alignas(16) static bf16 host_x[256];
  expect_error("host x", "not in device memory", [&] { quantize_fp8(host_x, 16, 16, e4, q, nullptr, f.p); });
  // Block scales: arrays shorter than the copy's count, and mode combinations.
  const int R = 1024, C = 512;  // Row128: 4 x 1024 floats for Q, 8 x 512 for Qt; Block128: 8 x 4
  expect_error("short q_scales", "q_scales needs", [&] {
    quantize_fp8_blocks(x, R, C, e4, q, Blocks::Row128, f1.p, nullptr, Blocks::None, nullptr);
  });
  expect_error("short qt_scales", "qt_scales needs", [&] {
    quantize_fp8_blocks(x, R, C, e4, q, Blocks::Block128, f.p, qt, Blocks::Row128, f1.p);
  });
  expect_error("null q_scales", "q_scales is a null pointer", [&] {
    quantize_fp8_blocks(x, R, C, e4, q, Blocks::Row128, nullptr, nullptr, Blocks::None, nullptr);
  });
  expect_error("q_blocks none", "q_blocks is none", [&] {
    quantize_fp8_blocks(x, R, C, e4, q, Blocks::None, f.p, nullptr, Blocks::None, nullptr);
  });
  expect_error("qt without qt_blocks", "qt is given but qt_blocks is none", [&] {
    quantize_fp8_blocks(x, R, C, e4, q, Blocks::Row128, f.p, qt, Blocks::None, f.p + 8192);
  });
  expect_error("qt_blocks without qt", "qt_blocks is not none but qt is null", [&] {
    quantize_fp8_blocks(x, R, C, e4, q, Blocks::Row128, f.p, nullptr, Blocks::Block128, f.p + 8192);
  });
  EXPECT_EQ(check::error_of([&] {
              quantize_fp8_blocks(x, R, C, e4, q, Blocks::Row128, f.p, qt, Blocks::Row128, f.p + 8192);
            }),
            "");
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
}
