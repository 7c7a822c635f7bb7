// CPU tests of the fp8 quantiser's pure parts (kernels/gemm_fp8/quantize.hpp): shape, type and
// mode validation, scale array sizes against the GEMM's, the floor's byte count, the scale rule;
// and the GPU test's host reference (quantize_ref.hpp) against known codes and against cuda_fp8.h's
// own host conversion (round to nearest even, satfinite) over every bf16 value times several
// scales and a million random floats, so that the reference the GPU test trusts is itself checked.
// No GPU needed.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "check/error_of.hpp"
#include "gemm_fp8/quantize.hpp"
#include "quantize_ref.hpp"

using namespace weave;
using gemm_fp8::Blocks;
using gemm_fp8::Fp8;

namespace {
using check::error_of;
bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint8_t cuda_host_fp8(float v, bool e5m2) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3));
}
}  // namespace

TEST(QuantizeCpu, ValidateShapeAndType) {
  using gemm_fp8::validate_quantize;
  EXPECT_EQ(error_of([] { validate_quantize(1, 16, Fp8::E4M3, false); }), "");
  EXPECT_EQ(error_of([] { validate_quantize(1001, 4112, Fp8::E5M2, false); }), "");  // any rows without Qt
  EXPECT_EQ(error_of([] { validate_quantize(1040, 528, Fp8::E4M3, true); }), "");
  EXPECT_TRUE(has(error_of([] { validate_quantize(128, 100, Fp8::E4M3, false); }), "cols = 100 is not a multiple of 16"));
  EXPECT_TRUE(has(error_of([] { validate_quantize(128, 8, Fp8::E4M3, true); }), "cols = 8 is not a multiple of 16"));
  EXPECT_TRUE(has(error_of([] { validate_quantize(1000, 128, Fp8::E4M3, true); }),
                  "rows = 1000 is not a multiple of 16, which the transposed copy needs"));
  EXPECT_TRUE(has(error_of([] { validate_quantize(0, 128, Fp8::E4M3, false); }), "must be positive"));
  EXPECT_TRUE(has(error_of([] { validate_quantize(16, -16, Fp8::E4M3, false); }), "must be positive"));
  EXPECT_TRUE(has(error_of([] { validate_quantize(16, 16, static_cast<Fp8>(5), false); }), "unknown fp8 type"));
}

TEST(QuantizeCpu, ValidateBlocks) {
  using gemm_fp8::validate_blocks;
  for (Blocks q : {Blocks::Row128, Blocks::Block128}) {
    EXPECT_EQ(error_of([&] { validate_blocks(q, Blocks::None, false); }), "");
    for (Blocks t : {Blocks::Row128, Blocks::Block128}) EXPECT_EQ(error_of([&] { validate_blocks(q, t, true); }), "");
    EXPECT_TRUE(has(error_of([&] { validate_blocks(q, Blocks::None, true); }), "qt is given but qt_blocks is none"));
    EXPECT_TRUE(has(error_of([&] { validate_blocks(q, Blocks::Row128, false); }), "qt_blocks is not none but qt is null"));
  }
  EXPECT_TRUE(has(error_of([] { validate_blocks(Blocks::None, Blocks::None, false); }), "q_blocks is none"));
  EXPECT_TRUE(has(error_of([] { validate_blocks(static_cast<Blocks>(9), Blocks::None, false); }), "unknown Blocks"));
}

// The scale arrays are exactly what gemm_block_scaled reads for the copy as A (Row128) or B (Block128).
TEST(QuantizeCpu, ScaleCountsMatchTheGemm) {
  for (auto [r, c] : {std::pair{1, 16}, {1000, 784}, {128, 128}, {129, 4112}, {8192, 4096}, {4096, 14336}}) {
    EXPECT_EQ(gemm_fp8::quantize_scale_count(Blocks::Row128, r, c), gemm_fp8::block_scale_a_count(r, c));
    EXPECT_EQ(gemm_fp8::quantize_scale_count(Blocks::Block128, r, c), gemm_fp8::block_scale_b_count(r, c));
    EXPECT_EQ(gemm_fp8::quantize_scale_count(Blocks::None, r, c), 0u);
  }
  EXPECT_EQ(gemm_fp8::quantize_scale_count(Blocks::Row128, 1000, 784), 7u * 1000);
  EXPECT_EQ(gemm_fp8::quantize_scale_count(Blocks::Row128, 784, 1000), 8u * 784);  // Qt of X 1000 x 784
  EXPECT_EQ(gemm_fp8::quantize_scale_count(Blocks::Block128, 1000, 784), 8u * 7);
  EXPECT_EQ(gemm_fp8::quantize_scale_count(Blocks::Block128, 784, 1000), 7u * 8);
}

TEST(QuantizeCpu, FloorBytes) {
  // 8192 x 4096 with Qt: 2 + 1 + 1 bytes per element, 134 MB (28 us at 4.8 TB/s).
  EXPECT_EQ(gemm_fp8::quantize_floor_bytes(8192, 4096, Blocks::None, Blocks::None, true), 4.0 * 8192 * 4096);
  EXPECT_EQ(gemm_fp8::quantize_floor_bytes(8192, 4096, Blocks::None, Blocks::None, false), 3.0 * 8192 * 4096);
  EXPECT_EQ(gemm_fp8::quantize_floor_bytes(256, 256, Blocks::Row128, Blocks::Block128, true),
            4.0 * 256 * 256 + 4.0 * (2 * 256 + 2 * 2));
}

// The library's rule (kernels and host) against the test's own restatement, on zero, subnormal,
// normal, huge and non-finite maxima.
TEST(QuantizeCpu, ScaleFromAmax) {
  EXPECT_EQ(gemm_fp8::fp8_max_finite(Fp8::E4M3), 448.f);
  EXPECT_EQ(gemm_fp8::fp8_max_finite(Fp8::E5M2), 57344.f);
  EXPECT_EQ(gemm_fp8::scale_from_amax(448.f, Fp8::E4M3), 1.f);
  EXPECT_EQ(gemm_fp8::scale_from_amax(57344.f, Fp8::E5M2), 1.f);
  EXPECT_EQ(gemm_fp8::scale_from_amax(0.f, Fp8::E4M3), 0x1p-126f);  // an all-zero block
  EXPECT_EQ(gemm_fp8::scale_from_amax(0x1p-130f, Fp8::E4M3), 0x1p-126f);
  EXPECT_EQ(gemm_fp8::scale_from_amax(INFINITY, Fp8::E4M3), INFINITY);
  EXPECT_EQ(gemm_fp8::scale_from_amax(NAN, Fp8::E5M2), 0x1p-126f);
  std::mt19937_64 g(1);
  for (int i = 0; i < 100000; ++i) {
    const float a = std::fabs(bits_float(static_cast<uint32_t>(g())));
    for (bool e5 : {false, true}) {
      const float want = quantize_ref::scale_of(a, e5), got = gemm_fp8::scale_from_amax(a, e5 ? Fp8::E5M2 : Fp8::E4M3);
      if (std::isnan(a)) continue;
      ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << "amax " << a << (e5 ? " e5m2" : " e4m3");
    }
  }
}

// Known codes: saturation (Inf included), NaN, ties to even in the subnormal and normal ranges,
// signed zeros, the largest values.
TEST(QuantizeCpu, ReferenceKnownCodes) {
  using quantize_ref::to_fp8;
  EXPECT_EQ(to_fp8(448.f, false), 0x7e);
  EXPECT_EQ(to_fp8(464.f, false), 0x7e);  // would round up to 480 (NaN's code): saturates
  EXPECT_EQ(to_fp8(1e30f, false), 0x7e);
  EXPECT_EQ(to_fp8(INFINITY, false), 0x7e);
  EXPECT_EQ(to_fp8(-INFINITY, false), 0xfe);
  EXPECT_EQ(to_fp8(-INFINITY, true), 0xfb);  // -57344
  EXPECT_EQ(to_fp8(61440.f, true), 0x7b);    // halfway to 65536 (Inf): saturates
  EXPECT_TRUE(quantize_ref::is_nan_code(to_fp8(NAN, false), false));
  EXPECT_TRUE(quantize_ref::is_nan_code(to_fp8(NAN, true), true));
  EXPECT_EQ(to_fp8(0x1p-9f, false), 0x01);        // e4m3's smallest subnormal
  EXPECT_EQ(to_fp8(0x1p-10f, false), 0x00);       // half of it: ties to even (zero)
  EXPECT_EQ(to_fp8(3 * 0x1p-10f, false), 0x02);   // 1.5 subnormal steps: ties to even (2)
  EXPECT_EQ(to_fp8(-0x1p-11f, false), 0x80);      // underflow keeps the sign
  EXPECT_EQ(to_fp8(-0.f, true), 0x80);
  EXPECT_EQ(to_fp8(1.0625f, false), 0x38);        // halfway 1 .. 1.125: even (1)
  EXPECT_EQ(to_fp8(1.1875f, false), 0x3a);        // halfway 1.125 .. 1.25: even (1.25)
  EXPECT_EQ(to_fp8(0x1p-16f, true), 0x01);        // e5m2's smallest subnormal
  EXPECT_EQ(to_fp8(1.25f, true), 0x3d);
  EXPECT_EQ(to_fp8(1.125f, true), 0x3c);          // halfway 1 .. 1.25: even (1)
}

// The reference against cuda_fp8.h's host conversion (the library's software path of the same
// cvt.rn.satfinite the kernels use): equal codes, NaN codes for NaN, over every bf16 value (every
// exponent, subnormals, Inf, NaN) times scales that move it across the fp8 range, and random floats.
TEST(QuantizeCpu, ReferenceMatchesCudaFp8HostConversion) {
  long long compared = 0, differ = 0;
  auto one = [&](float v, bool e5) {
    const uint8_t want = cuda_host_fp8(v, e5), got = quantize_ref::to_fp8(v, e5);
    ++compared;
    const bool ok = std::isnan(v) ? quantize_ref::is_nan_code(want, e5) && quantize_ref::is_nan_code(got, e5)
                                  : want == got;
    if (!ok && differ++ < 10)
      ADD_FAILURE() << (e5 ? "e5m2" : "e4m3") << " of " << v << " (bits 0x" << std::hex << [&] {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        return u;
      }() << "): reference 0x" << int(got) << ", cuda_fp8.h 0x" << int(want) << std::dec;
  };
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = bits_float(b << 16);
    for (float m : {1.f, 0x1p-20f, 0x1p-8f, 0x1p8f, 0x1p20f, 0x1p126f, 3.f / 7.f})
      for (bool e5 : {false, true}) one(x * m, e5);
  }
  std::mt19937_64 g(2);
  for (int i = 0; i < 1000000; ++i) {
    const float x = bits_float(static_cast<uint32_t>(g()));
    for (bool e5 : {false, true}) one(x, e5);
  }
  EXPECT_EQ(differ, 0) << "of " << compared;
}

// The whole reference on a small matrix: scale layouts, Qt = Q^T where the scales are shared.
TEST(QuantizeCpu, ReferenceLayouts) {
  using quantize_ref::Kind;
  const int rows = 160, cols = 272;  // 2 x 3 blocks, both cut short
  std::vector<float> x(size_t(rows) * cols);
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) x[size_t(i) * cols + j] = u(g) * std::ldexp(1.f, (i % 7) - (j / 128) * 3);
  const auto t = quantize_ref::quantize_all(x, rows, cols, false, Kind::Tensor, Kind::Tensor, 0.01f, false);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) ASSERT_EQ(t.qt[size_t(j) * rows + i], t.q[size_t(i) * cols + j]);
  const auto b = quantize_ref::quantize_all(x, rows, cols, false, Kind::Block, Kind::Block, 0, false);
  ASSERT_EQ(b.q_scales.size(), gemm_fp8::quantize_scale_count(Blocks::Block128, rows, cols));
  ASSERT_EQ(b.qt_scales.size(), gemm_fp8::quantize_scale_count(Blocks::Block128, cols, rows));
  for (int rb = 0; rb < 2; ++rb)
    for (int cb = 0; cb < 3; ++cb) EXPECT_EQ(b.q_scales[rb * 3 + cb], b.qt_scales[cb * 2 + rb]);
  EXPECT_TRUE(b.qt == [&] {
    std::vector<uint8_t> tq(b.q.size());
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) tq[size_t(j) * rows + i] = b.q[size_t(i) * cols + j];
    return tq;
  }());
  const auto r = quantize_ref::quantize_all(x, rows, cols, true, Kind::Row, Kind::Row, 0, false);
  ASSERT_EQ(r.q_scales.size(), gemm_fp8::quantize_scale_count(Blocks::Row128, rows, cols));
  ASSERT_EQ(r.qt_scales.size(), gemm_fp8::quantize_scale_count(Blocks::Row128, cols, rows));
  // Each row's largest |x| in a column block quantises to the format's largest value.
  for (int i = 0; i < rows; ++i) {
    float m = 0;
    int at = 0;
    for (int j = 128; j < 256; ++j)
      if (std::fabs(x[size_t(i) * cols + j]) > m) m = std::fabs(x[size_t(i) * cols + j]), at = j;
    EXPECT_EQ(r.q[size_t(i) * cols + at] & 0x7f, 0x7b) << "row " << i;
  }
}
