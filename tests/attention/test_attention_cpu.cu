// Attention host logic without a GPU: input validation (the errors users see before any
// launch), the causal key-block count and the FLOP convention.
#include <gtest/gtest.h>

#include <cstdint>

#include "attention/attention.hpp"
#include "weave/common/error.hpp"

using namespace weave;
using attention::Shape;

namespace {
alignas(16) char buf[64];
const void* p = buf;
}  // namespace

TEST(AttentionCpu, AcceptsValidShapes) {
  EXPECT_NO_THROW(attention::validate(Shape{2, 77, 8, 2, 128}, p, p, p, p, p));
  EXPECT_NO_THROW(attention::validate(Shape{1, 1, 1, 1, 64}, p, p, p, p, nullptr));
}

TEST(AttentionCpu, RejectsBadInput) {
  EXPECT_THROW(attention::validate(Shape{1, 64, 4, 4, 96}, p, p, p, p, p), Error);   // D
  EXPECT_THROW(attention::validate(Shape{1, 64, 4, 4, 256}, p, p, p, p, p), Error);  // D
  EXPECT_THROW(attention::validate(Shape{1, 64, 6, 4, 64}, p, p, p, p, p), Error);   // GQA ratio
  EXPECT_THROW(attention::validate(Shape{0, 64, 4, 4, 64}, p, p, p, p, p), Error);   // B
  EXPECT_THROW(attention::validate(Shape{1, 0, 4, 4, 64}, p, p, p, p, p), Error);    // S
  EXPECT_THROW(attention::validate(Shape{1, 64, 4, 4, 64}, nullptr, p, p, p, p), Error);
  EXPECT_THROW(attention::validate(Shape{1, 64, 4, 4, 64}, buf + 8, p, p, p, p), Error);  // misaligned Q
  EXPECT_THROW(attention::validate(Shape{1, 64, 4, 4, 64}, p, p, p, buf + 2, p), Error);  // misaligned O
  EXPECT_THROW(attention::validate(Shape{1, 64, 4, 4, 64}, p, p, p, p, buf + 2), Error);  // misaligned LSE
  try {
    attention::validate(Shape{1, 64, 6, 4, 64}, p, p, p, p, p);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of Hkv"), std::string::npos) << e.what();
  }
}

TEST(AttentionCpu, KeyBlocks) {
  EXPECT_EQ(attention::num_kv_blocks(4096, 0, false), 32);
  EXPECT_EQ(attention::num_kv_blocks(4096, 0, true), 1);
  EXPECT_EQ(attention::num_kv_blocks(4096, 31, true), 32);
  EXPECT_EQ(attention::num_kv_blocks(300, 2, true), 3);  // rows 256..299: keys up to 299
  EXPECT_EQ(attention::num_kv_blocks(300, 1, true), 2);
  EXPECT_EQ(attention::num_kv_blocks(1, 0, false), 1);
}

TEST(AttentionCpu, Flops) {
  const Shape s{4, 4096, 16, 16, 128};
  EXPECT_DOUBLE_EQ(attention::flops(s, false), 4.0 * 4 * 4096.0 * 4096 * 16 * 128);
  EXPECT_DOUBLE_EQ(attention::flops(s, true), 2.0 * 4 * 4096.0 * 4096 * 16 * 128);
}

TEST(AttentionCpu, AutoSchedule) {
  using Sch = attention::Options::Schedule;
  EXPECT_EQ(attention::auto_schedule(Shape{16, 4096, 16, 16, 128}, false), Sch::Persistent);
  EXPECT_EQ(attention::auto_schedule(Shape{16, 4096, 16, 16, 128}, true), Sch::Persistent);
  EXPECT_EQ(attention::auto_schedule(Shape{8, 8192, 16, 16, 128}, false), Sch::Persistent);
  EXPECT_EQ(attention::auto_schedule(Shape{8, 8192, 16, 16, 128}, true), Sch::Persistent);
  EXPECT_EQ(attention::auto_schedule(Shape{4, 16384, 16, 16, 128}, false), Sch::PerTile);
  EXPECT_EQ(attention::auto_schedule(Shape{16, 4096, 16, 16, 64}, false), Sch::PerTile);
}
