// The heap's sub-allocator: deterministic offsets, alignment, coalescing, exhaustion errors.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "weave/common/error.hpp"
#include "weave/runtime/allocator.hpp"

using weave::runtime::OffsetAllocator;

TEST(OffsetAllocator, AlignsAndDoesNotOverlap) {
  OffsetAllocator a(1 << 20);
  std::vector<std::pair<size_t, size_t>> live;
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 200; ++i) {
    size_t bytes = 1 + rng() % 3000, align = size_t(1) << (rng() % 11);
    size_t off = a.alloc(bytes, align);
    EXPECT_EQ(off % align, 0u);
    EXPECT_LE(off + bytes, a.capacity());
    for (auto& [o, b] : live) EXPECT_TRUE(off + bytes <= o || o + b <= off) << "overlap";
    EXPECT_TRUE(a.contains(off, bytes));
    live.push_back({off, bytes});
    if (rng() % 3 == 0) {
      size_t k = rng() % live.size();
      a.free(live[k].first);
      EXPECT_FALSE(a.contains(live[k].first, 1));
      live.erase(live.begin() + k);
    }
  }
}

TEST(OffsetAllocator, SameCallsSameOffsets) {
  // Two "ranks" doing the same sequence get identical offsets: the basis of collective-free alloc.
  OffsetAllocator a(1 << 24), b(1 << 24);
  std::mt19937 rng(12345);
  std::vector<size_t> la, lb;
  for (int i = 0; i < 500; ++i) {
    if (!la.empty() && rng() % 4 == 0) {
      size_t k = rng() % la.size();
      a.free(la[k]);
      b.free(lb[k]);
      la.erase(la.begin() + k);
      lb.erase(lb.begin() + k);
    } else {
      size_t bytes = 1 + rng() % 100000;
      la.push_back(a.alloc(bytes, 256));
      lb.push_back(b.alloc(bytes, 256));
      ASSERT_EQ(la.back(), lb.back());
    }
  }
}

TEST(OffsetAllocator, CoalescesToFullCapacity) {
  OffsetAllocator a(4096);
  size_t x = a.alloc(1000, 16), y = a.alloc(1000, 16), z = a.alloc(1000, 16);
  a.free(y);
  a.free(x);
  a.free(z);
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.largest_free(), 4096u);
  EXPECT_EQ(a.alloc(4096, 1), 0u);
}

TEST(OffsetAllocator, ClearErrors) {
  OffsetAllocator a(4096);
  EXPECT_THROW(a.alloc(0, 16), weave::Error);
  EXPECT_THROW(a.alloc(16, 3), weave::Error);
  EXPECT_THROW(a.free(123), weave::Error);
  a.alloc(4000, 16);
  try {
    a.alloc(200, 16);
    FAIL() << "no exhaustion error";
  } catch (const weave::Error& e) {
    EXPECT_NE(std::string(e.what()).find("heap exhausted"), std::string::npos) << e.what();
  }
}

// What Communicator::release checks before it takes a pointer: a live allocation's start.
TEST(OffsetAllocator, KnowsItsLiveStarts) {
  OffsetAllocator a(4096);
  const size_t x = a.alloc(512, 256), y = a.alloc(256, 256);
  EXPECT_TRUE(a.is_start(x));
  EXPECT_TRUE(a.is_start(y));
  EXPECT_FALSE(a.is_start(x + 256));  // inside x
  EXPECT_FALSE(a.is_start(3000));     // free space
  a.free(x);
  EXPECT_FALSE(a.is_start(x));
}

// What the automatic choices ask before they take heap (LL128 / push scratch, ag_gemm v9, gemm_rs
// v4): fits() agrees with alloc() on a fragmented heap, where the free total is no answer.
TEST(OffsetAllocator, FitsIsWhatAllocDoes) {
  OffsetAllocator a(8192);
  std::vector<size_t> pieces;
  for (int i = 0; i < 8; ++i) pieces.push_back(a.alloc(1024, 256));
  for (int i = 0; i < 8; i += 2) a.free(pieces[i]);  // 4 KiB free, in four 1 KiB ranges
  EXPECT_EQ(a.capacity() - a.used(), 4096u);
  EXPECT_FALSE(a.fits(2048, 256));
  EXPECT_THROW(a.alloc(2048, 256), weave::Error);
  EXPECT_TRUE(a.fits(1024, 256));
  // Random use: fits() answers exactly whether alloc() then succeeds.
  OffsetAllocator b(1 << 16);
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::vector<size_t> live;
  for (int i = 0; i < 2000; ++i) {
    const size_t bytes = 1 + rng() % 9000, align = size_t(1) << (rng() % 10);
    const bool fits = b.fits(bytes, align);
    bool got = true;
    try {
      live.push_back(b.alloc(bytes, align));
    } catch (const weave::Error&) {
      got = false;
    }
    ASSERT_EQ(fits, got) << "step " << i << ": " << bytes << " bytes at alignment " << align;
    if (!live.empty() && rng() % 2) {
      const size_t k = rng() % live.size();
      b.free(live[k]);
      live.erase(live.begin() + k);
    }
  }
}
