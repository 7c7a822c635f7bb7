// SwiGLU on grouped rows (kernels/moe/swiglu.hpp) on one GPU, against a float64 reference on the
// CPU of the same bf16 inputs: H[r, f] = silu(G[r, f]) * G[r, F + f] (gate = first F columns).
// Bound per element: |h - r| <= 2^-8 |r| + (2^-20 + |g| 2^-23) |r| + 2^-126. The kernel computes
// in fp32 and rounds once to bf16 (round to nearest: at most half an ulp at 8 significand bits,
// 2^-8 relative). The fp32 steps: __expf(x) = ex2.approx(x log2 e), whose argument rounding alone
// is |x| 1.45 2^-24 in the exponent, i.e. ~|x| 2^-24 relative in e^-g (what silu of a negative g
// inherits), plus ex2.approx's and __fdividef's few ulp and one product: (2^-20 + |g| 2^-23)
// covers them with a 2x margin. 2^-126 covers results below fp32's normal range. A swapped
// gate / up half, a wrong column or row offset, or a missing silu is off by O(|r|).
// The output is poisoned (0xffff, NaN) first; rows at or past the device-side row count must still
// be poison. Cases: the issue's F (1536, 2048, 14336) and small F, row counts 0, 1, partial,
// the whole capacity, past the capacity (clamped), negative (nothing), and a null count (all
// rows); gate values up to +-80 (e^80 ~ 5.5e34: exp far into its range, but not past 2^126,
// where __fdividef returns 0: silu of a gate below about -87 is 0 by design, swiglu.hpp).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check/device_buffer.hpp"
#include "check/seed.hpp"
#include "moe/low_latency.hpp"
#include "moe/swiglu.hpp"
#include "weave/common/error.hpp"

using namespace weave;
using bf16 = __nv_bfloat16;

namespace {

uint16_t bits(bf16 v) {
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return b;
}

// One launch on R_cap rows of width F with the device count `count` (INT_MIN: null pointer).
void run_case(int R_cap, int F, int count, uint64_t stream_id) {
  SCOPED_TRACE("R_cap " + std::to_string(R_cap) + " F " + std::to_string(F) + " count " + std::to_string(count));
  std::mt19937_64 rng(check::derive(check::test_seed(), 0x5319, stream_id));
  std::uniform_real_distribution<float> ug(-8.f, 8.f), uu(-4.f, 4.f), tail(-80.f, 80.f);
  std::vector<bf16> g(static_cast<size_t>(R_cap) * 2 * F);
  for (int r = 0; r < R_cap; ++r)
    for (int c = 0; c < 2 * F; ++c) {
      float v = c < F ? ug(rng) : uu(rng);
      if (c < F && (rng() % 64) == 0) v = tail(rng);  // far into exp(-g)'s range
      g[static_cast<size_t>(r) * 2 * F + c] = __float2bfloat16_rn(v);
    }
  check::DeviceBuffer<bf16> dg(g.size()), dh(static_cast<size_t>(R_cap) * F);
  check::DeviceBuffer<int> dcount(1);
  WEAVE_CUDA_CHECK(cudaMemcpy(dg.p, g.data(), g.size() * 2, cudaMemcpyHostToDevice));
  WEAVE_CUDA_CHECK(cudaMemset(dh.p, 0xff, std::max<size_t>(dh.n, 1) * 2));
  const bool null_count = count == INT32_MIN;
  if (!null_count) WEAVE_CUDA_CHECK(cudaMemcpy(dcount.p, &count, sizeof count, cudaMemcpyHostToDevice));
  moe::swiglu(dg.p, dh.p, null_count ? nullptr : dcount.p, R_cap, F, nullptr);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<bf16> h(dh.n);
  WEAVE_CUDA_CHECK(cudaMemcpy(h.data(), dh.p, h.size() * 2, cudaMemcpyDeviceToHost));
  const int rows = null_count ? R_cap : std::min(std::max(count, 0), R_cap);
  long long over = 0, touched = 0;
  double worst = 0;
  std::string worst_at;
  for (int r = 0; r < R_cap; ++r)
    for (int f = 0; f < F; ++f) {
      const bf16 got = h[static_cast<size_t>(r) * F + f];
      if (r >= rows) {
        touched += bits(got) != 0xffffu;
        continue;
      }
      const double gv = __bfloat162float(g[static_cast<size_t>(r) * 2 * F + f]);
      const double uv = __bfloat162float(g[static_cast<size_t>(r) * 2 * F + F + f]);
      const double ref = gv / (1.0 + std::exp(-gv)) * uv;
      const double x = __bfloat162float(got);
      const double bound = std::ldexp(std::fabs(ref), -8) +
                           (std::ldexp(1.0, -20) + std::fabs(gv) * std::ldexp(1.0, -23)) * std::fabs(ref) +
                           std::ldexp(1.0, -126);
      const double ratio = std::isfinite(x) ? std::fabs(x - ref) / bound : INFINITY;
      over += ratio > 1;
      if (ratio > worst) {
        worst = ratio;
        worst_at = "row " + std::to_string(r) + " col " + std::to_string(f) + ": " + std::to_string(x) + " vs " +
                   std::to_string(ref) + " (gate " + std::to_string(gv) + ", up " + std::to_string(uv) + ")";
      }
    }
  EXPECT_EQ(over, 0) << over << " outputs past the bound, worst ratio " << worst << " at " << worst_at;
  EXPECT_EQ(touched, 0) << touched << " elements at or past row " << rows << " were written";
}

}  // namespace

TEST(Swiglu, SmallWidths) {
  run_case(64, 8, 64, 1);
  run_case(100, 24, 77, 2);
  run_case(333, 128, 201, 3);
}
TEST(Swiglu, IssueWidths) {
  run_case(1000, 2048, 777, 4);   // DeepSeek-like F
  run_case(513, 1536, 513, 5);    // Qwen-like, the whole capacity
  run_case(129, 14336, 100, 6);   // Mixtral-like
}
TEST(Swiglu, RowCounts) {
  run_case(200, 64, 0, 7);          // nothing dispatched
  run_case(200, 64, 1, 8);          // one row
  run_case(200, 64, 5000, 9);       // past the capacity: clamped to it
  run_case(200, 64, -3, 10);        // negative: nothing
  run_case(200, 64, INT32_MIN, 11); // null count: every row
}
// More rows than the grid has warps: the grid-stride loop must cover them all.
TEST(Swiglu, ManyRows) {
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int warps = moe::swiglu_blocks(1 << 30, 64, sms) * 8;
  run_case(3 * warps + 17, 16, 3 * warps + 5, 12);
}
TEST(Swiglu, ArgumentErrors) {
  check::DeviceBuffer<bf16> a(1024), b(1024);
  EXPECT_THROW(moe::swiglu(a.p, b.p, nullptr, 4, 12, nullptr), Error);  // F not a multiple of 8
  EXPECT_THROW(moe::swiglu(a.p, b.p, nullptr, 4, 0, nullptr), Error);
  EXPECT_THROW(moe::swiglu(a.p + 1, b.p, nullptr, 4, 8, nullptr), Error);  // misaligned
  EXPECT_THROW(moe::swiglu(a.p, b.p, nullptr, -1, 8, nullptr), Error);
}
// Buffers shorter than the capacity's rows (or the one count, or the L counts) are rejected before
// any launch, naming the buffer: the kernel may touch every row up to the capacity. `end` is the
// end of a 1 MiB allocation (the driver reports such an allocation's size exactly).
TEST(Swiglu, ShortBuffers) {
  check::DeviceBuffer<bf16> a(1 << 19), b(1 << 19);
  bf16* const end = a.p + (1 << 19);
  auto expect_error = [](const char* what, const char* needle, auto&& f) {
    try {
      f();
      ADD_FAILURE() << what << ": accepted, expected weave::Error mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << what << ": " << e.what();
    }
  };
  int* counts = reinterpret_cast<int*>(b.p);
  const int* last_two_bytes = reinterpret_cast<const int*>(end - 1);
  // 2 rows x 8 columns: G 64 bytes (32 left), Hout 32 bytes (16 left), rows one int (2 bytes left).
  expect_error("short G", "G needs", [&] { moe::swiglu(end - 16, b.p, nullptr, 2, 8, nullptr); });
  expect_error("short Hout", "Hout needs", [&] { moe::swiglu(b.p, end - 8, nullptr, 2, 8, nullptr); });
  expect_error("short rows", "rows needs", [&] { moe::swiglu(b.p, a.p, last_two_bytes, 2, 8, nullptr); });
  expect_error("null G", "null pointer", [&] { moe::swiglu(nullptr, b.p, nullptr, 2, 8, nullptr); });
  // swiglu_strided: L = 2 experts of row_stride 1, the same sizes; counts L ints (8 bytes, 4 left).
  expect_error("strided, short G", "G needs", [&] { moe::swiglu_strided(end - 16, b.p, counts, 2, 1, 8, nullptr); });
  expect_error("strided, short Hout", "Hout needs",
               [&] { moe::swiglu_strided(b.p, end - 8, counts, 2, 1, 8, nullptr); });
  expect_error("strided, short counts", "counts needs",
               [&] { moe::swiglu_strided(b.p, a.p, reinterpret_cast<const int*>(end) - 1, 2, 1, 8, nullptr); });
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());  // nothing launched, nothing failed
}
TEST(SwigluCpu, GridSize) {
  EXPECT_EQ(moe::swiglu_blocks(0, 64, 132), 1);
  EXPECT_EQ(moe::swiglu_blocks(8, 64, 132), 1);
  EXPECT_EQ(moe::swiglu_blocks(9, 64, 132), 2);
  EXPECT_EQ(moe::swiglu_blocks(1 << 20, 64, 132), 8 * 132);
}
