// Host side of the GEMM: shape validation, tile choice, tensor maps, launch. The kernel
// instantiations live here so that users compile none of them: the three main tiles (128x256,
// 128x128, 64x128) x 2 A layouts x 2 B layouts x 3 epilogues (bf16, bf16 + bias, fp32 with
// optional bias), and the two experimental tiles x 2 B layouts with the defaults only.
#include <iterator>
#include <type_traits>

#include "gemm/gemm.hpp"
#include "gemm/gemm_kernel.cuh"
#include "gemm/plan.hpp"
#include "gemm/run.cuh"
#include "gemm/swapped.hpp"
#include "gemm/swapped_wide.hpp"
#include "gemm/wide.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/lcsc.cuh"
#include "weave/tile/tma.hpp"

namespace weave::gemm {

namespace {

// The default epilogue (A M x K, a bf16 output, no bias): the only one with the cluster tile,
// split-K and the swapped tiles (the instantiations that exist).
bool default_epilogue(const Options& opt, bool f32_out) {
  return opt.a_layout == ALayout::MK && !f32_out && opt.bias_type == BiasType::None;
}

// The epilogue the 2-CTA cluster tile is built for: a bf16 output without bias, A either layout
// (each CTA loads its own A rows; the pair shares B).
bool pair_epilogue(const Options& opt, bool f32_out) { return !f32_out && opt.bias_type == BiasType::None; }

// The planner's cluster tile: that epilogue, and the communicator blocks in whole clusters.
bool clusters_allowed(const Options& opt, bool f32_out) {
  return pair_epilogue(opt, f32_out) && opt.lcsc.num_comm_sms % 2 == 0;
}

// The 2-CTA cluster tiles (the planner's workers for them are clusters, not blocks).
bool pair_tile(Tile t) { return t == Tile::M128N256C2 || t == Tile::M128N320C2; }

bool operands_aligned(int M, int N, int K, BLayout bl, const Options& opt) {
  return pitch_aligned(opt.a_layout == ALayout::KM ? M : K) && pitch_aligned(bl == BLayout::NK ? K : N);
}

}  // namespace

// The planner's part of launch_choice, for opt.tile Auto (pair_clusters: what the device holds,
// used only where clusters_allowed).
Launch plan_launch(int M, int N, int K, BLayout bl, int sm_count, int pair_clusters, const Options& opt,
                   bool f32_out) {
  const bool plain = default_epilogue(opt, f32_out);
  const bool mid_ok = opt.a_layout == ALayout::MK && !f32_out;
  PlanInputs in;
  in.M = M, in.N = N, in.K = K;
  in.aligned = operands_aligned(M, N, K, bl, opt);
  in.sm_count = sm_count;
  in.pair_clusters = clusters_allowed(opt, f32_out) ? pair_clusters : 0;
  in.mid = mid_ok;
  in.wide = mid_ok && bl == BLayout::NK;
  in.split_k = plain && opt.split_k != 1;
  in.swapped = bl == BLayout::NK && opt.a_layout == ALayout::MK && opt.lcsc.num_comm_sms == 0 && opt.split_k <= 1;
  // The swapped 128 x w tiles read the weights either way round (an input gradient's K x N as an
  // M-major A); the 256 x w one only N x K.
  in.swapped_wide = in.swapped_tiles = in.swapped_splits = plain;
  in.swapped256 = plain && bl == BLayout::NK;
  const Choice c = plan_gemm(in);
  int splits = c.splits;
  if (plain && opt.split_k > 1 && c.tile != Tile::M128N128 && c.tile != Tile::SwappedW256) splits = opt.split_k;
  return {c.tile, splits, c.workers, c.width, c.cluster};
}

namespace {

using bf16 = __nv_bfloat16;
using detail::run;

// 3 stages x 48 KB + a 64 KB staging tile = 208 KB; 5 x 32 KB + 32 KB = 192 KB.
template <BLayout L>
using Big = GemmKernel<256, L, 3>;
// With any A layout and epilogue. An fp32 output needs twice the staging bytes: the big tile
// stages it in two halves of 128 columns (64 KB: 208 KB in all, as bf16), the small one whole
// (5 x 32 KB + 64 KB = 224 KB, under the 227 KB limit).
template <BLayout L, ALayout A, class OutT, bool Bias>
using BigE = GemmKernel<256, L, 3, std::is_same_v<OutT, float> ? 2 : 1, 1, A, OutT, Bias>;
template <BLayout L, ALayout A, class OutT, bool Bias>
using SmallE = GemmKernel<128, L, 5, 1, 1, A, OutT, Bias>;
// Decode: 8 stages of 24 KB (A 64 x 64, B 128 x 64) + 16 KB of bf16 staging (208 KB) or 32 KB of
// fp32 (224 KB). Memory-bound shapes want many bytes in flight per SM.
template <BLayout L, ALayout A, class OutT, bool Bias>
using DecodeE = GemmKernel<128, L, 8, 1, 1, A, OutT, Bias, 64>;
static_assert(std::is_same_v<BigE<BLayout::NK, ALayout::MK, bf16, false>, Big<BLayout::NK>>,
              "the default epilogue is the default kernel");
static_assert(lcsc::shared_bytes<SmallE<BLayout::KN, ALayout::KM, float, true>>() <= 232448, "227 KB");
static_assert(lcsc::shared_bytes<BigE<BLayout::KN, ALayout::KM, float, true>>() <= 232448, "227 KB");
static_assert(lcsc::shared_bytes<DecodeE<BLayout::KN, ALayout::KM, float, true>>() <= 232448, "227 KB");
// 4 x 40 KB + a 48 KB staging tile = 208 KB; A M x K and a bf16 output only (an fp32 staging
// tile would leave room for 3 stages).
template <BLayout L, ALayout A, class OutT, bool Bias>
using MidE = GemmKernel<192, L, 4, 1, 1, A, OutT, Bias>;
static_assert(lcsc::shared_bytes<MidE<BLayout::KN, ALayout::MK, bf16, true>>() <= 232448, "227 KB");
// 4 x 48 KB + a 32 KB half-tile staging buffer = 224 KB.
template <BLayout L>
using Deep = GemmKernel<256, L, 4, 2>;
// Big in clusters of 2 along M with B multicast; A either layout.
template <BLayout L, ALayout A = ALayout::MK>
using Pair = GemmKernel<256, L, 3, 1, 2, A>;
// 320 columns: 3 x 56 KB + a 48 KB staging part (192 of the 320 columns) = 216 KB.
template <BLayout L, ALayout A = ALayout::MK>
using WidePair = GemmKernel<320, L, 3, 2, 2, A>;
static_assert(lcsc::shared_bytes<WidePair<BLayout::KN, ALayout::KM>>() <= 232448, "227 KB");

// A cluster tile (Pair or WidePair) in the A and B layouts asked for; the split applies where the
// kernel has one (run.cuh, kSplittable).
template <template <BLayout, ALayout> class Kern>
lcsc::Plan run_pair(const bf16* A, const bf16* B, bf16* C, int M, int N, int K, BLayout bl, const Options& opt,
                    int group_m, cudaStream_t stream, Launch split) {
  const bool nk = bl == BLayout::NK;
  if (opt.a_layout == ALayout::KM)
    return nk ? run<Kern<BLayout::NK, ALayout::KM>>(A, B, C, M, N, K, opt, group_m, stream, split)
              : run<Kern<BLayout::KN, ALayout::KM>>(A, B, C, M, N, K, opt, group_m, stream, split);
  return nk ? run<Kern<BLayout::NK, ALayout::MK>>(A, B, C, M, N, K, opt, group_m, stream, split)
            : run<Kern<BLayout::KN, ALayout::MK>>(A, B, C, M, N, K, opt, group_m, stream, split);
}

// The two main tiles with any layout pair and epilogue.
template <template <BLayout, ALayout, class, bool> class Kern, class OutT, bool Bias>
lcsc::Plan run_layouts(const bf16* A, const bf16* B, OutT* C, int M, int N, int K, BLayout bl, const Options& opt,
                       int group_m, cudaStream_t stream, Launch split = {}) {
  const bool nk = bl == BLayout::NK;
  if (opt.a_layout == ALayout::KM)
    return nk ? run<Kern<BLayout::NK, ALayout::KM, OutT, Bias>>(A, B, C, M, N, K, opt, group_m, stream)
              : run<Kern<BLayout::KN, ALayout::KM, OutT, Bias>>(A, B, C, M, N, K, opt, group_m, stream);
  return nk ? run<Kern<BLayout::NK, ALayout::MK, OutT, Bias>>(A, B, C, M, N, K, opt, group_m, stream, split)
            : run<Kern<BLayout::KN, ALayout::MK, OutT, Bias>>(A, B, C, M, N, K, opt, group_m, stream, split);
}

// The tile and the split: opt's tile when given (split then only when opt.split_k > 1), else
// plan_gemm's choice for this device. Only the default epilogue (A M x K, bf16 output, no bias)
// may take the cluster tile or split-K (the instantiations that exist).
Launch launch_choice(int M, int N, int K, BLayout bl, const Options& opt, bool f32_out) {
  const bool plain = default_epilogue(opt, f32_out);
  lcsc::Config wide = opt.lcsc;
  wide.balance_waves = false;
  const int blocks = lcsc::plan_for<Big<BLayout::NK>>(1LL << 40, wide).compute_blocks;
  const int pairs =
      clusters_allowed(opt, f32_out) ? lcsc::plan_for<Pair<BLayout::NK>>(1LL << 40, wide).compute_blocks / 2 : 0;
  if (opt.tile == Tile::Swapped) {
    WEAVE_CHECK(bl == BLayout::NK && opt.a_layout == ALayout::MK && M <= swapped::kMaxTokens &&
                    opt.lcsc.num_comm_sms == 0,
                "gemm: the swapped tile takes A as M x K with M <= ", swapped::kMaxTokens,
                ", B as N x K and no communicator SMs; got M = ", M, bl == BLayout::NK ? "" : ", B as K x N",
                opt.a_layout == ALayout::MK ? "" : ", A as K x M", ", num_comm_sms = ", opt.lcsc.num_comm_sms);
    return {Tile::Swapped, 1, blocks};
  }
  if (opt.tile == Tile::M128Nw)
    WEAVE_CHECK(bl == BLayout::NK, "gemm: the 128 x w tile takes B as N x K (a K x N tile is read in 64-column boxes)");
  const bool aligned = operands_aligned(M, N, K, bl, opt);
  if (opt.tile == Tile::SwappedW) {  // clusters on a misaligned pitch, as the planner would run it
    // (its width and epilogue: validate_tile, which every caller ran)
    WEAVE_CHECK(opt.tile_cluster >= 0 && opt.tile_cluster <= 4 && opt.tile_cluster != 3 &&
                    (opt.tile_cluster < 2 || pairs > 0),
                "gemm: tile_cluster must be 0, 1, 2 or 4 (2, 4: with num_comm_sms a multiple of it on a device "
                "with clusters); got ", opt.tile_cluster, " (num_comm_sms = ", opt.lcsc.num_comm_sms, ")");
    WEAVE_CHECK(opt.tile_cluster != 4 || (swapped_width_quads(opt.tile_n) && bl == BLayout::NK &&
                                          opt.lcsc.num_comm_sms % 4 == 0),
                "gemm: the swapped 128 x w tile in 4-CTA clusters needs a width that is a multiple of 32, B as "
                "N x K and num_comm_sms a multiple of 4; got width ", opt.tile_n,
                bl == BLayout::NK ? "" : ", B as K x N", ", num_comm_sms = ", opt.lcsc.num_comm_sms);
    WEAVE_CHECK(opt.tile_cluster != 2 || swapped_width_clusters(opt.tile_n), "gemm: the swapped 128 x ",
                opt.tile_n, " tile runs in single CTAs only (2-CTA clusters need a width that is a multiple of 16)");
    const int cluster = opt.tile_cluster > 0                                        ? opt.tile_cluster
                        : !aligned && pairs > 0 && swapped_width_clusters(opt.tile_n) ? 2
                                                                                      : 1;
    const int workers = cluster == 2 ? pairs : cluster == 4 ? detail::swapped_quad_clusters(wide) : blocks;
    return {opt.tile, plain && opt.split_k > 1 ? opt.split_k : 1, workers, opt.tile_n, cluster};
  }
  if (opt.tile == Tile::SwappedW256) {
    WEAVE_CHECK(bl == BLayout::NK && opt.tile_cluster >= 0 && opt.tile_cluster <= 1 && opt.split_k <= 1,
                "gemm: the swapped 256 x w tile takes B as N x K, single CTAs (tile_cluster 0 or 1) and no split-K; got ",
                bl == BLayout::NK ? "" : "B as K x N, ", "tile_cluster = ", opt.tile_cluster, ", split_k = ", opt.split_k);
    return {opt.tile, 1, blocks, opt.tile_n, 1};
  }
  if (opt.tile != Tile::Auto) {
    const bool splittable = plain && (opt.tile == Tile::M128N256 || opt.tile == Tile::M128N256C2 ||
                                      opt.tile == Tile::M64N128 || opt.tile == Tile::M128N192 ||
                                      opt.tile == Tile::M128N128 || opt.tile == Tile::M128Nw);
    return {opt.tile, splittable && opt.split_k > 1 ? opt.split_k : 1,
            pair_tile(opt.tile) ? pairs : blocks,
            opt.tile == Tile::M128Nw ? opt.tile_n : 0};
  }
  return plan_launch(M, N, K, bl, blocks, pairs, opt, f32_out);
}

template <class OutT>
lcsc::Plan dispatch(const bf16* A, const bf16* B, OutT* C, int M, int N, int K, BLayout bl, const Options& opt,
                    cudaStream_t stream) {
  constexpr bool f32 = std::is_same_v<OutT, float>;
  validate_args(A, B, C, M, N, K, opt, f32);
  const size_t e = sizeof(bf16);
  check_extent("gemm", "A", A, size_t(M) * K * e);
  check_extent("gemm", "B", B, size_t(K) * N * e);
  check_extent("gemm", "C", C, size_t(M) * N * sizeof(OutT));
  if (opt.bias_type != BiasType::None)
    check_extent("gemm", "bias", opt.bias, size_t(N) * (opt.bias_type == BiasType::F32 ? 4 : 2));
  const Launch l = launch_choice(M, N, K, bl, opt, f32);
  const Tile t = l.tile;
  if (t == Tile::Swapped) {
    swapped::Params p{A, B, C, opt.bias, opt.bias_type == BiasType::F32 ? 1 : 0, opt.accumulate ? 1 : 0, M, N, K};
    return swapped::launch(p, f32, l.workers, stream);
  }
  const int group_m = opt.group_m > 0 ? opt.group_m : default_group_m(t, K);
  if constexpr (f32) {
    if (t == Tile::M128N256) return run_layouts<BigE, float, true>(A, B, C, M, N, K, bl, opt, group_m, stream);
    if (t == Tile::M64N128) return run_layouts<DecodeE, float, true>(A, B, C, M, N, K, bl, opt, group_m, stream);
    return run_layouts<SmallE, float, true>(A, B, C, M, N, K, bl, opt, group_m, stream);
  } else {
    // validate_args let M128N256S4 through only with the defaults, the cluster tiles with a bf16 output
    // without bias.
    const bool nk = bl == BLayout::NK;
    if (t == Tile::M128N256C2) return run_pair<Pair>(A, B, C, M, N, K, bl, opt, group_m, stream, l);
    if (t == Tile::M128N320C2) return run_pair<WidePair>(A, B, C, M, N, K, bl, opt, group_m, stream, l);
    if (t == Tile::M128N256S4)
      return nk ? run<Deep<BLayout::NK>>(A, B, C, M, N, K, opt, group_m, stream)
                : run<Deep<BLayout::KN>>(A, B, C, M, N, K, opt, group_m, stream);
    const bool bias = opt.bias_type != BiasType::None;
    if (t == Tile::M128Nw) return detail::run_wide(A, B, C, M, N, K, opt, group_m, stream, l);
    if (t == Tile::SwappedW) return detail::run_swapped_wide(A, B, C, M, N, K, bl, opt, group_m, stream, l);
    if (t == Tile::SwappedW256) return detail::run_swapped_wide256(A, B, C, M, N, K, opt, group_m, stream, l);
    if (t == Tile::M128N192) {  // A M x K only (validate_args, launch_choice)
      if (bias)
        return nk ? run<MidE<BLayout::NK, ALayout::MK, bf16, true>>(A, B, C, M, N, K, opt, group_m, stream)
                  : run<MidE<BLayout::KN, ALayout::MK, bf16, true>>(A, B, C, M, N, K, opt, group_m, stream);
      return nk ? run<MidE<BLayout::NK, ALayout::MK, bf16, false>>(A, B, C, M, N, K, opt, group_m, stream, l)
                : run<MidE<BLayout::KN, ALayout::MK, bf16, false>>(A, B, C, M, N, K, opt, group_m, stream, l);
    }
    if (t == Tile::M64N128)
      return bias ? run_layouts<DecodeE, bf16, true>(A, B, C, M, N, K, bl, opt, group_m, stream)
                  : run_layouts<DecodeE, bf16, false>(A, B, C, M, N, K, bl, opt, group_m, stream, l);
    if (t == Tile::M128N256)
      return bias ? run_layouts<BigE, bf16, true>(A, B, C, M, N, K, bl, opt, group_m, stream)
                  : run_layouts<BigE, bf16, false>(A, B, C, M, N, K, bl, opt, group_m, stream, l);
    return bias ? run_layouts<SmallE, bf16, true>(A, B, C, M, N, K, bl, opt, group_m, stream)
                : run_layouts<SmallE, bf16, false>(A, B, C, M, N, K, bl, opt, group_m, stream, l);
  }
}

}  // namespace

void validate_shape(int M, int N, int K) {
  WEAVE_CHECK(M >= 1 && N >= 1 && K >= 1, "gemm: M, N, K must be positive, got ", M, " x ", N, " x ", K);
  WEAVE_CHECK(K % 8 == 0, "gemm: K = ", K, " is not a multiple of 8 (TMA needs 16-byte row pitches)");
  WEAVE_CHECK(N % 8 == 0, "gemm: N = ", N, " is not a multiple of 8 (TMA needs 16-byte row pitches)");
}

void validate_args(const void* A, const void* B, const void* C, int M, int N, int K, const Options& opt,
                   bool f32_out) {
  validate_shape(M, N, K);
  WEAVE_CHECK(opt.split_k >= 0, "gemm: split_k = ", opt.split_k, " must be >= 0 (0: the planner decides, 1: never)");
  WEAVE_CHECK(opt.a_layout == ALayout::MK || opt.a_layout == ALayout::KM, "gemm: unknown A layout ",
              static_cast<int>(opt.a_layout));
  WEAVE_CHECK(opt.a_layout == ALayout::MK || M % 8 == 0, "gemm: M = ", M,
              " is not a multiple of 8, which A stored K x M needs (TMA needs 16-byte row pitches)");
  WEAVE_CHECK(A && B && C, "gemm: null pointer");
  WEAVE_CHECK(is_aligned(A), "gemm: A (", A, ") is not 16-byte aligned, which TMA needs");
  WEAVE_CHECK(is_aligned(B), "gemm: B (", B, ") is not 16-byte aligned, which TMA needs");
  WEAVE_CHECK(is_aligned(C), "gemm: C (", C, ") is not 16-byte aligned, which TMA needs");
  switch (opt.bias_type) {
    case BiasType::None:
      WEAVE_CHECK(opt.bias == nullptr, "gemm: a bias pointer was given with bias_type None (set BF16 or F32)");
      break;
    case BiasType::BF16:
    case BiasType::F32:
      WEAVE_CHECK(opt.bias != nullptr, "gemm: bias_type ", opt.bias_type == BiasType::F32 ? "F32" : "BF16",
                  " needs a bias pointer (N values), got null");
      WEAVE_CHECK(is_aligned(opt.bias), "gemm: bias (", opt.bias, ") is not 16-byte aligned");
      break;
    default:
      WEAVE_CHECK(false, "gemm: unknown bias_type ", static_cast<int>(opt.bias_type));
  }
  validate_tile(opt, f32_out);
}

void validate_tile(const Options& opt, bool f32_out) {
  const bool defaults = default_epilogue(opt, f32_out);
  const int tv = static_cast<int>(opt.tile);
  WEAVE_CHECK(tv >= static_cast<int>(Tile::Auto) && tv <= static_cast<int>(Tile::M128N320C2), "gemm: unknown tile ",
              tv);
  if (opt.tile == Tile::SwappedW || opt.tile == Tile::SwappedW256) {
    const bool tall = opt.tile == Tile::SwappedW256;
    WEAVE_CHECK(defaults && (tall ? is_swapped256_width(opt.tile_n) : is_swapped_width(opt.tile_n)), "gemm: the swapped ",
                tall ? 256 : 128, " x w tile supports only A as M x K and a bf16 output without bias, with tile_n one of ",
                tall ? swapped256_widths_text() : swapped_widths_text(), "; got tile_n = ", opt.tile_n,
                opt.a_layout == ALayout::MK ? "" : ", A as K x M", f32_out ? ", an fp32 output" : "",
                opt.bias_type == BiasType::None ? "" : ", a bias");
  }
  WEAVE_CHECK(opt.tile != Tile::M128Nw || (opt.a_layout == ALayout::MK && !f32_out && is_wide_width(opt.tile_n)),
              "gemm: tile 128 x w supports only A as M x K and a bf16 output, with tile_n one of ",
              wide_widths_text(), "; got tile_n = ", opt.tile_n, opt.a_layout == ALayout::MK ? "" : ", A as K x M",
              f32_out ? ", an fp32 output" : "");
  WEAVE_CHECK(opt.tile != Tile::M128N192 || (opt.a_layout == ALayout::MK && !f32_out),
              "gemm: tile 128x192 supports only A as M x K and a bf16 output (use Auto, M128N256, M128N128 or M64N128)");
  WEAVE_CHECK(defaults || opt.tile != Tile::M128N256S4, "gemm: tile ", tile_name(opt.tile),
              " supports only A as M x K, a bf16 output and no bias (use Auto, M128N256, M128N128 or M64N128)");
  WEAVE_CHECK(!pair_tile(opt.tile) || pair_epilogue(opt, f32_out), "gemm: tile ",
              tile_name(opt.tile), " supports only a bf16 output without bias (use Auto, M128N256, M128N128 or M64N128)");
}

const char* tile_name(Tile t) {
  switch (t) {
    case Tile::M128N256: return "128x256";
    case Tile::M128N128: return "128x128";
    case Tile::M128N256S4: return "128x256s4";
    case Tile::M128N256C2: return "128x256c2";
    case Tile::M128N320C2: return "128x320c2";
    case Tile::M64N128: return "64x128";
    case Tile::M128N192: return "128x192";
    case Tile::Swapped: return "swapped";
    case Tile::M128Nw: return "128xw";
    case Tile::SwappedW: return "sw128xw";
    case Tile::SwappedW256: return "sw256xw";
    default: return "auto";
  }
}

std::string widths_text(const int* widths, size_t count) {
  std::string s;
  for (size_t i = 0; i < count; ++i) s += (s.empty() ? "" : ", ") + std::to_string(widths[i]);
  return s;
}
std::string wide_widths_text() { return widths_text(kWideWidths, std::size(kWideWidths)); }
std::string swapped_widths_text() { return widths_text(kSwappedWidths, std::size(kSwappedWidths)); }
std::string swapped256_widths_text() { return widths_text(kSwapped256Widths, std::size(kSwapped256Widths)); }

std::string launch_label(const char* tile, int width, int splits) {
  const std::string s = width > 0 ? "128x" + std::to_string(width) : tile;
  return splits > 1 ? s + "/k" + std::to_string(splits) : s;
}

std::string launch_name(const Launch& l) {
  if (l.tile == Tile::SwappedW) {
    const std::string cluster = l.cluster > 1 ? "c" + std::to_string(l.cluster) : "";
    return launch_label(("sw128x" + std::to_string(l.width) + cluster).c_str(), 0, l.splits);
  }
  if (l.tile == Tile::SwappedW256) return launch_label(("sw256x" + std::to_string(l.width)).c_str(), 0, l.splits);
  return launch_label(tile_name(l.tile), l.tile == Tile::M128Nw ? l.width : 0, l.splits);
}

// Short K means short tiles: more of them run at once per unit time, and a taller raster group
// (16 tile rows) measured 2-4% faster at K = 1024 and 2048; long K prefers 8 (perf-notes.md).
int default_group_m(Tile t, int K) { return t == Tile::M128N128 || K <= 2048 ? 16 : 8; }

Launch choose_launch(int M, int N, int K, BLayout bl, const Options& opt, bool f32_out) {
  validate_shape(M, N, K);
  validate_tile(opt, f32_out);
  return launch_choice(M, N, K, bl, opt, f32_out);
}

lcsc::Plan gemm(const bf16* A, const bf16* B, bf16* C, int M, int N, int K, BLayout bl, const Options& opt,
                cudaStream_t stream) {
  return dispatch(A, B, C, M, N, K, bl, opt, stream);
}
lcsc::Plan gemm(const bf16* A, const bf16* B, float* C, int M, int N, int K, BLayout bl, const Options& opt,
                cudaStream_t stream) {
  return dispatch(A, B, C, M, N, K, bl, opt, stream);
}

}  // namespace weave::gemm
