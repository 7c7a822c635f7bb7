// CPU tests: tile scheduler coverage, TMA descriptor parameters for partial tiles, LCSC grid
// planning and config validation, GEMM shape validation and tile choice. No GPU needed.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "check/error_of.hpp"
#include "gemm/gemm.hpp"
#include "gemm/scheduler.hpp"
#include "gemm/swapped_wide.hpp"
#include "gemm/wide.hpp"
#include "weave/lcsc.cuh"
#include "weave/tile/swizzle.hpp"
#include "weave/tile/tma.hpp"

using namespace weave;

namespace {
using check::error_of;
}  // namespace

// Every tile is visited exactly once when blocks b = 0..P-1 walk t = b, b+P, ... for many
// shapes, group sizes and grid sizes (including grids that do not divide the tile count).
TEST(TileScheduler, CoversEveryTileOnce) {
  const int sizes_m[] = {1, 2, 3, 7, 8, 9, 16, 33, 64, 127, 256};
  const int sizes_n[] = {1, 2, 5, 8, 13, 32, 65};
  const int groups[] = {1, 2, 3, 8, 16, 300};
  const int sms[] = {1, 7, 100, 114, 124, 128, 132, 1000};
  for (int tm : sizes_m)
    for (int tn : sizes_n)
      for (int gm : groups)
        for (int sm : sms) {
          const int tiles = tm * tn;
          const lcsc::Plan p = lcsc::make_plan(tiles, sm, {}, 0, 1);
          ASSERT_GE(p.compute_blocks, 1);
          ASSERT_LE(p.compute_blocks, sm);
          std::vector<int> seen(tiles, 0);
          for (int b = 0; b < p.compute_blocks; ++b)
            for (int t = b; t < tiles; t += p.compute_blocks) {
              const gemm::TileCoord c = gemm::grouped_tile(t, tm, tn, gm);
              ASSERT_GE(c.m, 0);
              ASSERT_LT(c.m, tm);
              ASSERT_GE(c.n, 0);
              ASSERT_LT(c.n, tn);
              ++seen[c.m * tn + c.n];
            }
          for (int i = 0; i < tiles; ++i) ASSERT_EQ(seen[i], 1) << tm << "x" << tn << " g" << gm << " sm" << sm;
        }
}

// Consecutive tiles stay inside a group of rows: that is what makes the order L2-friendly.
TEST(TileScheduler, GroupsRows) {
  for (int t = 0; t < 8 * 32; ++t) EXPECT_LT(gemm::grouped_tile(t, 64, 32, 8).m, 8);
  EXPECT_EQ(gemm::grouped_tile(8 * 32, 64, 32, 8).m, 8);
}

// Cluster launches: every tile once over the work items and the ranks of each cluster, a
// cluster's CTAs on consecutive rows of one column (they share B's panel), and past the last row
// only the odd row count's spare CTA (m == tiles_m). Cluster 1 is grouped_tile itself.
template <int Cluster>
void check_clustered(int tm, int tn, int gm) {
  SCOPED_TRACE(std::to_string(tm) + "x" + std::to_string(tn) + " g" + std::to_string(gm) + " c" +
               std::to_string(Cluster));
  const struct {
    int tiles_m, tiles_n, group_m;
  } g{tm, tn, gm};
  std::vector<int> seen(tm * tn, 0);
  for (int w = 0; w < gemm::clustered_work<Cluster>(g); ++w) {
    const gemm::TileCoord first = gemm::clustered_tile<Cluster>(g, w, [] { return 0; });
    if (Cluster == 1) {
      const gemm::TileCoord t = gemm::grouped_tile(w, tm, tn, gm);
      ASSERT_TRUE(t.m == first.m && t.n == first.n);
    }
    for (int r = 0; r < Cluster; ++r) {
      const gemm::TileCoord c = gemm::clustered_tile<Cluster>(g, w, [r] { return r; });
      ASSERT_EQ(c.n, first.n);
      ASSERT_EQ(c.m, first.m + r);
      ASSERT_TRUE(c.n >= 0 && c.n < tn && c.m >= 0 && c.m <= tm);
      if (c.m == tm) {
        ASSERT_TRUE(tm % Cluster != 0 && r == Cluster - 1);
        continue;
      }
      ++seen[c.m * tn + c.n];
    }
  }
  for (int i = 0; i < tm * tn; ++i) ASSERT_EQ(seen[i], 1) << "tile " << i;
}
TEST(TileScheduler, ClusteredCoversEveryTileOnce) {
  for (int tm : {1, 2, 3, 7, 8, 9, 33})
    for (int tn : {1, 2, 5, 13})
      for (int gm : {1, 2, 3, 8, 16}) {
        check_clustered<1>(tm, tn, gm);
        check_clustered<2>(tm, tn, gm);
      }
}

TEST(LcscPlan, SplitIsExact) {
  for (int sm : {8, 78, 114, 132})
    for (int comm : {0, 1, 8, 16, 32})
      for (long long work : {0LL, 1LL, 5LL, 131LL, 132LL, 133LL, 2048LL, 100000LL}) {
        if (comm >= sm) continue;
        lcsc::Config c;
        c.num_comm_sms = comm;
        const lcsc::Plan p = lcsc::make_plan(work, sm, c, 1000, 2000);
        EXPECT_EQ(p.comm_blocks, comm);
        EXPECT_LE(p.grid(), sm);
        EXPECT_LE(p.compute_blocks, sm - comm);
        EXPECT_EQ(p.compute_blocks == 0, work == 0);
        if (work > 0) {
          // Balancing never adds a wave.
          const long long avail = std::min<long long>(work, sm - comm);
          EXPECT_EQ((work + p.compute_blocks - 1) / p.compute_blocks, (work + avail - 1) / avail);
        }
      }
  // 2048 tiles on 132 SMs: 16 waves either way, so 128 blocks do it with full waves.
  EXPECT_EQ(lcsc::make_plan(2048, 132, {}, 0, 1).compute_blocks, 128);
  lcsc::Config nob;
  nob.balance_waves = false;
  EXPECT_EQ(lcsc::make_plan(2048, 132, nob, 0, 1).compute_blocks, 132);
}

TEST(LcscPlan, Clusters) {
  lcsc::Config c;
  c.num_comm_sms = 8;
  // 1024 cluster work items, 132 SMs, clusters of 2, at most 66 clusters resident.
  const lcsc::Plan p = lcsc::make_plan(1024, 132, c, 0, 1, 2, 66);
  EXPECT_EQ(p.compute_blocks % 2, 0);
  EXPECT_EQ(p.comm_blocks, 8);
  EXPECT_LE(p.grid(), 132);
  // The occupancy limit on clusters wins over the SM count.
  EXPECT_LE(lcsc::make_plan(1024, 132, {}, 0, 1, 2, 60).compute_blocks, 120);
  c.num_comm_sms = 3;
  EXPECT_NE(error_of([&] { lcsc::make_plan(10, 132, c, 0, 1, 2, 66); }).find("multiple of the kernel's cluster size"),
            std::string::npos);
}

TEST(LcscPlan, RejectsBadConfigs) {
  lcsc::Config c;
  c.num_comm_sms = 132;
  EXPECT_NE(error_of([&] { lcsc::make_plan(10, 132, c, 0, 1); }).find("num_comm_sms"), std::string::npos);
  c.num_comm_sms = -1;
  EXPECT_NE(error_of([&] { lcsc::make_plan(10, 132, c, 0, 1); }).find("num_comm_sms"), std::string::npos);
  EXPECT_NE(error_of([&] { lcsc::make_plan(10, 132, {}, 300000, 232448); }).find("shared memory"), std::string::npos);
  EXPECT_EQ(error_of([&] { lcsc::make_plan(10, 132, {}, 232448, 232448); }), "");
}

// Tensor-map parameters for the GEMM's operands with ragged shapes: the map spans the true
// extent (the hardware zero-fills boxes hanging over it), boxes stay at the tile size.
TEST(TmaParams, PartialTiles) {
  alignas(16) static tile::bf16 buf[8];
  const tile::TmaParams a = tile::tma_2d(buf, 1000, 520, 520, 128, 64, tile::Swizzle::B128);
  EXPECT_EQ(a.rank, 2u);
  EXPECT_EQ(a.dims[0], 520u);
  EXPECT_EQ(a.dims[1], 1000u);
  EXPECT_EQ(a.strides[0], 1040u);
  EXPECT_EQ(a.box[0], 64u);
  EXPECT_EQ(a.box[1], 128u);
  EXPECT_EQ(a.box_bytes(), 128u * 64 * 2);  // what expect_tx must announce, even for a partial box
  EXPECT_EQ(a.type, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
  const tile::TmaParams c = tile::tma_2d(buf, 1000, 776, 776, 128, 64, tile::Swizzle::B128);
  EXPECT_EQ(c.dims[0], 776u);
  EXPECT_EQ((c.dims[0] + c.box[0] - 1) / c.box[0], 13u);  // 12 full column boxes + one of 8
  // Rules TMA enforces, reported before the driver is asked.
  EXPECT_NE(error_of([&] { tile::tma_2d(buf, 10, 12, 12, 8, 8, tile::Swizzle::None); }).find("multiple of 16 bytes"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tile::tma_2d(buf, 10, 128, 128, 8, 128, tile::Swizzle::B128); }).find("swizzle"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tile::tma_2d(buf, 10, 64, 64, 512, 64, tile::Swizzle::B128); }).find("[1, 256]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { tile::tma_2d(buf + 1, 10, 64, 64, 8, 64, tile::Swizzle::B128); }).find("aligned"),
            std::string::npos);
}

TEST(TmaParams, L2PromotionFromTheEnvironment) {
  constexpr auto k256 = CU_TENSOR_MAP_L2_PROMOTION_L2_256B, k128 = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  // auto (unset, empty or named): 128 only where the row pitch is off the 128-byte grid.
  for (const char* v : {static_cast<const char*>(nullptr), "", "auto"}) {
    const tile::L2Promotion p = tile::parse_l2_promotion(v);
    EXPECT_EQ(p.for_pitch(28672), k256);  // 14336 bf16
    EXPECT_EQ(p.for_pitch(0), k256);      // rank 1
    EXPECT_EQ(p.for_pitch(27664), k128);  // 13832 bf16: 16 past the grid
    EXPECT_EQ(p.for_pitch(8264), k128);   // 4132 bf16: 64 past
  }
  // A fixed value holds for every pitch.
  for (uint64_t pitch : {uint64_t{28672}, uint64_t{27664}}) {
    EXPECT_EQ(tile::parse_l2_promotion("256").for_pitch(pitch), k256);
    EXPECT_EQ(tile::parse_l2_promotion("128").for_pitch(pitch), k128);
    EXPECT_EQ(tile::parse_l2_promotion("64").for_pitch(pitch), CU_TENSOR_MAP_L2_PROMOTION_L2_64B);
    EXPECT_EQ(tile::parse_l2_promotion("none").for_pitch(pitch), CU_TENSOR_MAP_L2_PROMOTION_NONE);
  }
  EXPECT_NE(error_of([] { tile::parse_l2_promotion("512"); }).find("auto, none, 64, 128 or 256, got '512'"),
            std::string::npos);
}

TEST(Swizzle, Bijective128B) {
  // Within a 1024-byte atom the 128B swizzle permutes 16-byte chunks, row by row.
  std::vector<int> hit(64, 0);
  for (uint32_t r = 0; r < 8; ++r)
    for (uint32_t ch = 0; ch < 8; ++ch) {
      const uint32_t off = tile::swizzled_offset(tile::Swizzle::B128, r, ch * 16);
      EXPECT_EQ(off / 128, r);
      ++hit[off / 16];
    }
  for (int h : hit) EXPECT_EQ(h, 1);
  EXPECT_EQ(tile::swizzled_offset(tile::Swizzle::B128, 3, 0), 3u * 128 + 3 * 16);
  EXPECT_EQ(tile::swizzle_apply(tile::Swizzle::B64, 2 * 64), 2u * 64 + 16);  // row 2 of 64 B: bit 7 set
}

TEST(GemmShape, Validation) {
  EXPECT_EQ(error_of([] { gemm::validate_shape(1000, 776, 520); }), "");
  EXPECT_NE(error_of([] { gemm::validate_shape(128, 128, 100); }).find("K = 100 is not a multiple of 8"),
            std::string::npos);
  EXPECT_NE(error_of([] { gemm::validate_shape(128, 130, 128); }).find("N = 130"), std::string::npos);
  EXPECT_NE(error_of([] { gemm::validate_shape(0, 128, 128); }).find("positive"), std::string::npos);
}

// Everything gemm rejects before touching the device, with addresses that are never dereferenced.
TEST(GemmShape, ArgumentValidation) {
  const void* p = reinterpret_cast<const void*>(uintptr_t(0x10000));
  const void* odd = reinterpret_cast<const void*>(uintptr_t(0x10008));
  gemm::Options o;
  EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 1000, 776, 520, o, false); }), "");
  EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 1001, 776, 520, o, true); }), "");
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 100, o, false); }).find("K = 100"),
            std::string::npos);
  // A stored K x M: M is its row pitch.
  o.a_layout = gemm::ALayout::KM;
  EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 1000, 776, 520, o, false); }), "");
  EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 8, 8, 8, o, true); }), "");
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 1001, 776, 520, o, false); })
                .find("M = 1001 is not a multiple of 8, which A stored K x M needs"),
            std::string::npos);
  o.a_layout = static_cast<gemm::ALayout>(7);
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("unknown A layout"),
            std::string::npos);
  // Pointers: null, and 16-byte alignment of each operand, named.
  o = {};
  EXPECT_NE(error_of([&] { gemm::validate_args(nullptr, p, p, 128, 128, 128, o, false); }).find("null pointer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gemm::validate_args(odd, p, p, 128, 128, 128, o, false); }).find("A ("), std::string::npos);
  EXPECT_NE(error_of([&] { gemm::validate_args(p, odd, p, 128, 128, 128, o, false); }).find("B ("), std::string::npos);
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, odd, 128, 128, 128, o, true); }).find("C ("), std::string::npos);
  // Bias: a type needs a pointer, a pointer needs a type, and it is 16-byte aligned.
  o.bias_type = gemm::BiasType::BF16;
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("needs a bias pointer"),
            std::string::npos);
  o.bias = p;
  EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }), "");
  o.bias_type = gemm::BiasType::F32;
  EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, true); }), "");
  o.bias = odd;
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, true); }).find("bias ("), std::string::npos);
  o.bias_type = gemm::BiasType::None;
  o.bias = p;
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("bias_type None"),
            std::string::npos);
  // The experimental 4-stage tile takes only the defaults; the cluster tiles a bf16 output without
  // bias, A either layout.
  for (gemm::Tile t : {gemm::Tile::M128N256S4, gemm::Tile::M128N256C2, gemm::Tile::M128N320C2}) {
    o = {};
    o.tile = t;
    EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }), "");
    EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, true); }).find("supports only"),
              std::string::npos);
    o.a_layout = gemm::ALayout::KM;
    const std::string km = error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); });
    if (t != gemm::Tile::M128N256S4) EXPECT_EQ(km, "");
    else EXPECT_NE(km.find("supports only"), std::string::npos);
    o.a_layout = gemm::ALayout::MK;
    o.bias_type = gemm::BiasType::BF16;
    o.bias = p;
    EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("supports only"),
              std::string::npos);
  }
  // The 128x192 tile: A M x K and a bf16 output, with or without bias.
  o = {};
  o.tile = gemm::Tile::M128N192;
  o.bias_type = gemm::BiasType::F32;
  o.bias = p;
  EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }), "");
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, true); }).find("supports only"),
            std::string::npos);
  o.a_layout = gemm::ALayout::KM;
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("supports only"),
            std::string::npos);
  // The 128 x w tile: a width of kWideWidths, A M x K, a bf16 output (bias allowed).
  o = {};
  o.tile = gemm::Tile::M128Nw;
  for (int w : {0, 64, 100, 128, 192, 224, 256}) {
    o.tile_n = w;
    EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("tile_n = " + std::to_string(w)),
              std::string::npos) << w;
  }
  for (int w : gemm::kWideWidths) {
    o.tile_n = w;
    EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }), "") << w;
  }
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, true); }).find("an fp32 output"),
            std::string::npos);
  o.a_layout = gemm::ALayout::KM;
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("A as K x M"),
            std::string::npos);
  for (gemm::Tile t : {gemm::Tile::Auto, gemm::Tile::M128N256, gemm::Tile::M128N128, gemm::Tile::M64N128}) {
    o = {};
    o.tile = t;
    o.a_layout = gemm::ALayout::KM;
    o.bias_type = gemm::BiasType::F32;
    o.bias = p;
    EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, true); }), "");
  }
}

// The run-time width reaches the instantiation of that width (every width of kWideWidths, and of
// kSwappedWidths for the swapped tile), and any other is an error naming the caller and the widths.
TEST(GemmShape, WithWidth) {
  for (int w : gemm::kWideWidths)
    EXPECT_EQ(gemm::detail::with_width(w, "gemm", [](auto c) { return decltype(c)::value; }), w);
  EXPECT_NE(error_of([] { gemm::detail::with_width(100, "gemm_fp8", [](auto c) { return decltype(c)::value; }); })
                .find("gemm_fp8: no 128 x 100 tile (widths: 96, 112"),
            std::string::npos);
  for (int w : gemm::kSwappedWidths)
    EXPECT_EQ(gemm::detail::with_width<gemm::kSwappedWidths>(w, "gemm", [](auto c) { return decltype(c)::value; }), w);
  EXPECT_NE(error_of([] {
              gemm::detail::with_width<gemm::kSwappedWidths>(116, "gemm", [](auto c) { return decltype(c)::value; });
            }).find("gemm: no 128 x 116 tile (widths: 32, 64"),
            std::string::npos);
}

// The swapped 128 x w tile: a width of kSwappedWidths, A M x K, a bf16 output, no bias; its stages
// fill the shared memory (every width's kernel is also checked against 227 KB at compile time).
TEST(GemmShape, SwappedWideTileArgs) {
  const void* p = reinterpret_cast<const void*>(uintptr_t(0x10000));
  gemm::Options o;
  o.tile = gemm::Tile::SwappedW;
  for (int w : gemm::kSwappedWidths) {
    o.tile_n = w;
    EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }), "") << w;
    EXPECT_GE(gemm::detail::swapped_wide_stages(w), 3) << w;
  }
  EXPECT_EQ(gemm::detail::swapped_wide_stages(96), 7);
  for (int w : {104, 112, 120, 128}) EXPECT_EQ(gemm::detail::swapped_wide_stages(w), 6) << w;
  EXPECT_EQ(gemm::detail::swapped_wide_stages(32), 10);
  for (int w : {0, 80, 100, 224}) {
    o.tile_n = w;
    EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("tile_n = " + std::to_string(w)),
              std::string::npos) << w;
  }
  o.tile_n = 96;
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, true); }).find("an fp32 output"),
            std::string::npos);
  o.bias_type = gemm::BiasType::F32, o.bias = p;
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("a bias"), std::string::npos);
  o = {};
  o.tile = gemm::Tile::SwappedW, o.tile_n = 96, o.a_layout = gemm::ALayout::KM;
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("A as K x M"),
            std::string::npos);
  EXPECT_EQ(gemm::launch_name({gemm::Tile::SwappedW, 2, 132, 96}), "sw128x96/k2");
  EXPECT_EQ(gemm::swapped_widths_text(), "32, 64, 96, 104, 112, 120, 128, 144, 160, 176, 192, 208");
}

// The swapped 256 x w tile: a width of kSwapped256Widths, A M x K, a bf16 output, no bias; 4 stages
// up to 128, 3 above (each kernel is also checked against 227 KB at compile time).
TEST(GemmShape, Swapped256TileArgs) {
  const void* p = reinterpret_cast<const void*>(uintptr_t(0x10000));
  gemm::Options o;
  o.tile = gemm::Tile::SwappedW256;
  for (int w : gemm::kSwapped256Widths) {
    o.tile_n = w;
    EXPECT_EQ(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }), "") << w;
    EXPECT_EQ(gemm::detail::swapped256_stages(w), w <= 128 ? 4 : 3) << w;
  }
  for (int w : {0, 88, 100, 192}) {
    o.tile_n = w;
    EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("tile_n = " + std::to_string(w)),
              std::string::npos) << w;
  }
  o.tile_n = 144;
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, true); }).find("an fp32 output"),
            std::string::npos);
  o.a_layout = gemm::ALayout::KM;
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("A as K x M"),
            std::string::npos);
}

// plan_launch (no device) is the planner on the arguments gemm() passes it: the epilogue decides
// what may split or cluster, B as K x N the swapped 128 x w tile but not the 256 x w one,
// communicator SMs no swapped tile, an odd count of them no cluster tile.
TEST(GemmShape, PlanLaunch) {
  using gemm::BLayout;
  const gemm::Launch a = gemm::plan_launch(300, 5120, 13824, BLayout::NK, 132, 66);
  EXPECT_EQ(gemm::launch_name(a), "sw128x104");
  const gemm::Launch m = gemm::plan_launch(101, 14344, 4104, BLayout::NK, 132, 66);  // misaligned K: clusters
  EXPECT_EQ(m.tile, gemm::Tile::SwappedW);
  EXPECT_EQ(m.cluster, 2);
  EXPECT_EQ(m.width, 112);
  EXPECT_EQ(gemm::launch_name(gemm::plan_launch(300, 5120, 13824, BLayout::KN, 132, 66)), "sw128x104");
  EXPECT_EQ(gemm::launch_name(gemm::plan_launch(900, 11008, 4096, BLayout::NK, 132, 66)), "sw256x160");
  EXPECT_EQ(gemm::launch_name(gemm::plan_launch(900, 11008, 4096, BLayout::KN, 132, 66)), "sw128x160");
  gemm::Options o;
  o.bias_type = gemm::BiasType::F32;
  for (int M : {16, 300, 2047}) {  // with a bias: no split, no cluster, no swapped 128 x w tile (the
                                   // decode tile takes every epilogue)
    const gemm::Launch l = gemm::plan_launch(M, 5128, 13832, BLayout::NK, 132, 66, o);
    EXPECT_EQ(l.splits, 1) << M;
    EXPECT_NE(l.tile, gemm::Tile::M128N256C2) << M;
    EXPECT_NE(l.tile, gemm::Tile::M128N320C2) << M;
    EXPECT_NE(l.tile, gemm::Tile::SwappedW) << M;
    EXPECT_NE(l.tile, gemm::Tile::SwappedW256) << M;
  }
  o = {};
  o.lcsc.num_comm_sms = 8;
  EXPECT_NE(gemm::plan_launch(16, 14336, 4096, BLayout::NK, 124, 62, o).tile, gemm::Tile::Swapped);
  o.lcsc.num_comm_sms = 3;  // an odd communicator count leaves no whole clusters
  EXPECT_NE(gemm::plan_launch(2047, 5128, 13832, BLayout::NK, 129, 64, o).tile, gemm::Tile::M128N256C2);
  EXPECT_NE(gemm::plan_launch(8191, 28680, 8200, BLayout::NK, 129, 64, o).tile, gemm::Tile::M128N320C2);
  // A stored K x M (the weight gradient) on a pitch off the 128-byte grid: the cluster tile, as A M x K
  // takes it; on aligned pitches, with an fp32 output or a bias, not.
  o = {};
  o.a_layout = gemm::ALayout::KM;
  auto pair = [](gemm::Tile t) { return t == gemm::Tile::M128N256C2 || t == gemm::Tile::M128N320C2; };
  EXPECT_TRUE(pair(gemm::plan_launch(5128, 14344, 1264, BLayout::KN, 132, 66, o).tile));
  EXPECT_TRUE(pair(gemm::plan_launch(4152, 53256, 12816, BLayout::KN, 132, 66, o).tile));
  EXPECT_EQ(gemm::plan_launch(5120, 14336, 1264, BLayout::KN, 132, 66, o).tile, gemm::Tile::M128N256);
  EXPECT_FALSE(pair(gemm::plan_launch(5128, 14344, 1264, BLayout::KN, 132, 66, o, true).tile));
  o.bias_type = gemm::BiasType::BF16;
  EXPECT_FALSE(pair(gemm::plan_launch(5128, 14344, 1264, BLayout::KN, 132, 66, o).tile));
}

TEST(GemmShape, TileNames) {
  EXPECT_STREQ(gemm::tile_name(gemm::Tile::M64N128), "64x128");
  EXPECT_STREQ(gemm::tile_name(gemm::Tile::M128N256), "128x256");
  EXPECT_STREQ(gemm::tile_name(gemm::Tile::M128N192), "128x192");
  EXPECT_STREQ(gemm::tile_name(gemm::Tile::Swapped), "swapped");
  EXPECT_EQ(gemm::launch_name({gemm::Tile::M128Nw, 1, 132, 144}), "128x144");
  EXPECT_EQ(gemm::launch_name({gemm::Tile::M128N256, 3, 132, 0}), "128x256/k3");
  EXPECT_EQ(gemm::wide_widths_text(), "96, 112, 144, 160, 176, 208");
  EXPECT_STREQ(gemm::tile_name(gemm::Tile::SwappedW256), "sw256xw");
  EXPECT_EQ(gemm::launch_name({gemm::Tile::SwappedW256, 1, 132, 144}), "sw256x144");
  EXPECT_EQ(gemm::swapped256_widths_text(), "96, 104, 112, 120, 128, 144, 160, 176");
  EXPECT_STREQ(gemm::tile_name(gemm::Tile::M128N320C2), "128x320c2");
  gemm::Options o;
  o.tile = static_cast<gemm::Tile>(12);
  const void* p = reinterpret_cast<const void*>(uintptr_t(0x10000));
  EXPECT_NE(error_of([&] { gemm::validate_args(p, p, p, 128, 128, 128, o, false); }).find("unknown tile"),
            std::string::npos);
}

