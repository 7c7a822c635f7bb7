// runtime::device_copy's split of a copy among threads (copy_split.hpp), run on the CPU: every
// thread of a simulated grid in turn, in reverse order, over host buffers. For every source and
// destination offset within 32 bytes (common grids of 16 bytes down to 1), lengths 0..80 and ragged
// large ones, and grids of 1 to 4096 threads: the destination equals the source and nothing outside
// it is written. The split itself is a partition of the bytes (head, units, tail in order, units on
// the widest grid dst and src share), so no byte has two writers.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check/seed.hpp"
#include "weave/runtime/copy_split.hpp"

namespace {

using weave::runtime::copy_part;
using weave::runtime::copy_split;

constexpr size_t kGuard = 48;
constexpr unsigned char kPoison = 0xA5;

struct alignas(16) Vec16 {
  unsigned char b[16];
};

// Runs `threads` threads of copy_part (the last first) and checks the result against `src`.
void check(const std::vector<unsigned char>& src, size_t so, size_t dof, size_t bytes, size_t threads) {
  std::vector<unsigned char> dst_buf(bytes + dof + 2 * kGuard + 16, kPoison);
  // 16-aligned bases, so the offsets decide the grids.
  alignas(16) static unsigned char sbase[1 << 21];
  ASSERT_LE(so + bytes, sizeof sbase);
  std::memcpy(sbase, src.data(), so + bytes);
  unsigned char* const d0 = dst_buf.data() + ((16 - reinterpret_cast<uintptr_t>(dst_buf.data()) % 16) % 16);
  char* const dst = reinterpret_cast<char*>(d0 + kGuard + dof);
  for (size_t t = threads; t-- > 0;) copy_part<Vec16>(dst, reinterpret_cast<const char*>(sbase + so), bytes, t, threads);
  const std::string what = "src +" + std::to_string(so) + " dst +" + std::to_string(dof) + " " +
                           std::to_string(bytes) + " B, " + std::to_string(threads) + " threads";
  ASSERT_EQ(std::memcmp(dst, sbase + so, bytes), 0) << what;
  for (size_t i = 0; i < kGuard + dof; ++i) ASSERT_EQ(d0[i], kPoison) << what << ": byte " << i << " before the copy";
  for (size_t i = 0; i < kGuard; ++i)
    ASSERT_EQ(d0[kGuard + dof + bytes + i], kPoison) << what << ": byte " << i << " after the copy";
}

TEST(CopySplit, EveryOffsetLengthAndGrid) {
  std::mt19937_64 g(weave::check::case_seed(0));
  std::vector<unsigned char> src(1 << 21);
  for (auto& b : src) b = static_cast<unsigned char>(g() >> 56);
  for (size_t so = 0; so < 32; ++so)
    for (size_t dof = 0; dof < 32; ++dof)
      for (size_t bytes = 0; bytes <= 80; ++bytes)
        for (size_t threads : {size_t(1), size_t(3), size_t(16), size_t(1000)}) check(src, so, dof, bytes, threads);
  for (size_t bytes : {size_t(4095), size_t(65536 + 7), (size_t(1) << 20) + 33})
    for (auto [so, dof] : {std::pair<size_t, size_t>{0, 0}, {16, 32}, {5, 5}, {3, 9}})
      for (size_t threads : {size_t(1), size_t(255), size_t(4096)}) check(src, so, dof, bytes, threads);
}

// Where the split puts its units: on the widest grid (16, 8, 4, 2 or 1 bytes) that dst and src
// share, both aligned to it after the head, the head and the tail shorter than a unit.
TEST(CopySplit, UnitsOnTheWidestCommonGrid) {
  for (uintptr_t d = 0; d < 48; ++d)
    for (uintptr_t s = 0; s < 48; ++s)
      for (size_t bytes = 0; bytes < 100; ++bytes) {
        const auto c = copy_split(d, s, bytes);
        size_t want = 16;
        while (want > 1 && (d - s) % want != 0) want /= 2;
        ASSERT_EQ(c.grain, want) << "dst " << d << " src " << s;
        ASSERT_LE(c.head, bytes);
        ASSERT_EQ(c.tail, c.head + c.grain * c.units);
        ASSERT_LE(c.tail, bytes);
        if (c.units) {
          ASSERT_EQ((d + c.head) % c.grain, 0u);
          ASSERT_EQ((s + c.head) % c.grain, 0u);
          ASSERT_LT(c.head, c.grain);
          ASSERT_LT(bytes - c.tail, c.grain);
        } else {
          ASSERT_LT(bytes, 2 * c.grain);  // at most a head and a tail short of a unit each
        }
      }
}

}  // namespace
