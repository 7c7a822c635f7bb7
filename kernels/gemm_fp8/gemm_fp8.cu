// Host side of the fp8 GEMMs: validation, tile choice, launch. The kernel instantiations (3 type
// pairs x (3 per-tensor tiles + 1 block-scaled); the 128 x w tiles in wide_fp8.cu) live here so
// that users compile none of them.
#include <cstdint>

#include "gemm/plan.hpp"
#include "gemm_fp8/gemm_fp8.hpp"
#include "gemm_fp8/gemm_fp8_kernel.cuh"
#include "gemm_fp8/run.cuh"
#include "gemm_fp8/swapped_fp8.hpp"
#include "gemm_fp8/wide_fp8.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/lcsc.cuh"
#include "weave/tile/tma.hpp"

namespace weave::gemm_fp8 {

namespace {

using tile::fp8e4m3;
using tile::fp8e5m2;
using detail::run;

// 3 x 48 KB + 64 KB = 208 KB, as the bf16 GEMM's big tile (the same bytes per stage: 128 fp8 of K
// per row instead of 64 bf16). 6 x 32 KB + 32 KB = 224 KB for the 128 x 128 tiles.
template <class TA, class TB>
using Big = GemmFp8Kernel<TA, TB, 256, 3>;
template <class TA, class TB>
using Small = GemmFp8Kernel<TA, TB, 128, 6>;
// 5 x 32 KB + 32 KB = 192 KB (measured with 5 stages; 6 would fit).
template <class TA, class TB>
using Block = GemmFp8BlockPipeKernel<TA, TB, 5>;
// 4 x 40 KB + a 48 KB staging tile = 208 KB.
template <class TA, class TB>
using Block192 = GemmFp8BlockKernel<TA, TB, 4, 192>;
// The same with B's scales loaded per lane (block_lane_scales).
template <class TA, class TB>
using BlockLane = GemmFp8BlockPipeKernel<TA, TB, 5, true>;
template <class TA, class TB>
using Block192Lane = GemmFp8BlockKernel<TA, TB, 4, 192, true>;
static_assert(lcsc::shared_bytes<Block192<fp8e4m3, fp8e4m3>>() <= 232448, "227 KB");
// The 128x256 tile in 2-CTA clusters (its shared memory is Big's).
template <class TA, class TB>
using Pair = GemmFp8PairKernel<TA, TB>;
static_assert(lcsc::shared_bytes<gemm::SplitKKernel<Pair<fp8e4m3, fp8e4m3>>>() <= 232448, "227 KB");
// 8 x 24 KB + a 16 KB staging tile = 208 KB, as the bf16 GEMM's 64x128 tile.
template <class TA, class TB>
using Narrow = GemmFp8Kernel<TA, TB, 128, 8, 64>;
static_assert(lcsc::shared_bytes<Narrow<fp8e4m3, fp8e4m3>>() <= 232448, "227 KB");

// One kernel template per type pair, picked at run time.
template <template <class, class> class Kern>
lcsc::Plan dispatch(Fp8 ta, Fp8 tb, const void* A, const void* B, __nv_bfloat16* C, int M, int N, int K,
                    const float* sa, const float* sb, const Options& opt, int group_m, cudaStream_t stream,
                    Launch split = {}) {
  if (ta == Fp8::E4M3 && tb == Fp8::E4M3)
    return run<Kern<fp8e4m3, fp8e4m3>>(A, B, C, M, N, K, sa, sb, opt, group_m, stream, split);
  if (ta == Fp8::E5M2 && tb == Fp8::E4M3)
    return run<Kern<fp8e5m2, fp8e4m3>>(A, B, C, M, N, K, sa, sb, opt, group_m, stream, split);
  return run<Kern<fp8e4m3, fp8e5m2>>(A, B, C, M, N, K, sa, sb, opt, group_m, stream, split);
}

void check_aligned(const char* name, const void* p, size_t align) {
  WEAVE_CHECK(is_aligned(p, align), "gemm_fp8: ", name, " (", p, ") is not ", align,
              "-byte aligned", align == 16 ? " (TMA needs 16-byte aligned base addresses)" : "");
}

// Everything both entry points check before a launch; `sa_bytes` / `sb_bytes` are what the
// scale arrays must hold.
void validate_call(const void* A, Fp8 ta, const void* B, Fp8 tb, const __nv_bfloat16* C, int M, int N, int K,
                   const float* sa, const float* sb, size_t sa_bytes, size_t sb_bytes) {
  validate_shape(M, N, K);
  validate_types(ta, tb);
  WEAVE_CHECK(A && B && C, "gemm_fp8: null pointer (A ", A, ", B ", B, ", C ", static_cast<const void*>(C), ")");
  WEAVE_CHECK(sa && sb, "gemm_fp8: null scale pointer (scale_a ", static_cast<const void*>(sa), ", scale_b ",
              static_cast<const void*>(sb), "); scales are device pointers, 1.0 must be passed as a float");
  check_aligned("A", A, 16);
  check_aligned("B", B, 16);
  check_aligned("C", C, 16);
  check_aligned("scale_a", sa, 4);
  check_aligned("scale_b", sb, 4);
  check_extent("gemm_fp8", "A", A, size_t(M) * K);
  check_extent("gemm_fp8", "B", B, size_t(N) * K);
  check_extent("gemm_fp8", "C", C, size_t(M) * N * sizeof(__nv_bfloat16));
  check_extent("gemm_fp8", "scale_a", sa, sa_bytes);
  check_extent("gemm_fp8", "scale_b", sb, sb_bytes);
}

}  // namespace

void validate_shape(int M, int N, int K) {
  WEAVE_CHECK(M >= 1 && N >= 1 && K >= 1, "gemm_fp8: M, N, K must be positive, got ", M, " x ", N, " x ", K);
  WEAVE_CHECK(K % 16 == 0, "gemm_fp8: K = ", K,
              " is not a multiple of 16 (TMA needs 16-byte row pitches: a row of A or B is K bytes)");
  WEAVE_CHECK(N % 8 == 0, "gemm_fp8: N = ", N,
              " is not a multiple of 8 (TMA needs 16-byte row pitches: a row of the bf16 C is 2N bytes)");
}

void validate_types(Fp8 a, Fp8 b) {
  WEAVE_CHECK((a == Fp8::E4M3 || a == Fp8::E5M2) && (b == Fp8::E4M3 || b == Fp8::E5M2),
              "gemm_fp8: unknown fp8 type code (A ", static_cast<int>(a), ", B ", static_cast<int>(b), ")");
  WEAVE_CHECK(!(a == Fp8::E5M2 && b == Fp8::E5M2),
              "gemm_fp8: e5m2 x e5m2 is not supported (e4m3 x e4m3, e5m2 x e4m3 and e4m3 x e5m2 are; cuBLASLt "
              "has no e5m2 x e5m2 kernel either)");
}

const char* tile_name(Tile t) {
  switch (t) {
    case Tile::M128N256: return "128x256";
    case Tile::M128N128: return "128x128";
    case Tile::Swapped: return "swapped";
    case Tile::M128Nw: return "128xw";
    case Tile::M64N128: return "64x128";
    case Tile::M128N192: return "128x192";
    case Tile::SwappedW: return "sw128xw";
    case Tile::M128N256C2: return "128x256c2";
    default: return "auto";
  }
}

std::string launch_name(const Launch& l) {
  if (l.tile == Tile::SwappedW) return gemm::launch_label(("sw128x" + std::to_string(l.width)).c_str(), 0, l.splits);
  return gemm::launch_label(tile_name(l.tile), l.tile == Tile::M128Nw ? l.width : 0, l.splits);
}
const char* type_name(Fp8 t) { return t == Fp8::E5M2 ? "e5m2" : "e4m3"; }
// The forward pair and the gradients' (dY in e5m2 times e4m3 weights): B e4m3.
bool wide_pair(Fp8, Fp8 tb) { return tb == Fp8::E4M3; }

Launch plan_launch(int M, int N, int K, int sm_count, const Options& opt, bool wide, int pair_clusters) {
  const bool split_ok = opt.split_k != 1;
  if (opt.tile == Tile::Swapped) {
    WEAVE_CHECK(M <= gemm::swapped::kMaxTokens && opt.lcsc.num_comm_sms == 0, "gemm_fp8: the swapped tile takes M <= ",
                gemm::swapped::kMaxTokens, " and no communicator SMs; got M = ", M, ", num_comm_sms = ",
                opt.lcsc.num_comm_sms);
    return {Tile::Swapped, 1, sm_count};
  }
  if (opt.tile == Tile::M128Nw)
    WEAVE_CHECK(wide && gemm::is_wide_width(opt.tile_n),
                "gemm_fp8: the 128 x w tile takes an e4m3 B (A e4m3 or e5m2) and tile_n one of ",
                gemm::wide_widths_text(), "; got tile_n = ", opt.tile_n, wide ? "" : " and an e5m2 B");
  if (opt.tile == Tile::SwappedW)
    WEAVE_CHECK(wide && gemm::is_swapped_width(opt.tile_n),
                "gemm_fp8: the swapped 128 x w tile takes an e4m3 B (A e4m3 or e5m2) and tile_n one of ",
                gemm::swapped_widths_text(), "; got tile_n = ", opt.tile_n, wide ? "" : " and an e5m2 B");
  if (opt.tile == Tile::M128N256C2)
    WEAVE_CHECK(pair_clusters > 0 && opt.lcsc.num_comm_sms % 2 == 0,
                "gemm_fp8: the 128x256 cluster tile needs 2-CTA clusters (an even num_comm_sms "
                "on a device that holds them); got ", pair_clusters, " clusters, num_comm_sms = ",
                opt.lcsc.num_comm_sms);
  if (opt.tile != Tile::Auto) {
    const bool splits = opt.tile == Tile::M128N256 || opt.tile == Tile::M128Nw || opt.tile == Tile::M64N128 ||
                        opt.tile == Tile::SwappedW || opt.tile == Tile::M128N256C2;
    const bool has_width = opt.tile == Tile::M128Nw || opt.tile == Tile::SwappedW;
    return {opt.tile, splits && opt.split_k > 1 ? opt.split_k : 1,
            opt.tile == Tile::M128N256C2 ? pair_clusters : sm_count, has_width ? opt.tile_n : 0};
  }
  gemm::PlanInputs in;
  in.M = M, in.N = N, in.K = k_blocks(K) * 64;
  in.aligned = K % 128 == 0;  // A's and B's rows are K bytes
  in.sm_count = sm_count;
  in.pair_clusters = opt.lcsc.num_comm_sms % 2 == 0 ? pair_clusters : 0;
  in.wide_pair = false;      // no 128x320 cluster tile
  in.swapped_pairs = false;  // the swapped tiles in single CTAs
  in.mid = false;
  in.wide = wide;
  in.narrow = true;
  in.split_k = split_ok;
  in.swapped = opt.lcsc.num_comm_sms == 0 && opt.split_k <= 1;
  in.swapped_wide = in.swapped_tiles = wide;  // single CTAs: pair_clusters is 0
  const gemm::Choice c = gemm::plan_gemm(in);
  if (c.tile == gemm::Tile::Swapped) return {Tile::Swapped, 1, sm_count};
  if (c.tile == gemm::Tile::M128N128) return {Tile::M128N128, 1, sm_count};
  if (c.tile == gemm::Tile::M128Nw) return {Tile::M128Nw, opt.split_k > 1 ? opt.split_k : 1, sm_count, c.width};
  if (c.tile == gemm::Tile::SwappedW)
    return {Tile::SwappedW, opt.split_k > 1 ? opt.split_k : c.splits, sm_count, c.width};
  if (c.tile == gemm::Tile::M64N128) return {Tile::M64N128, opt.split_k > 1 ? opt.split_k : c.splits, sm_count};
  if (c.tile == gemm::Tile::M128N256C2)
    return {Tile::M128N256C2, opt.split_k > 1 ? opt.split_k : c.splits, in.pair_clusters};
  return {Tile::M128N256, opt.split_k > 1 ? opt.split_k : c.splits, sm_count};
}

namespace {
// choose_launch for a shape already validated (gemm() validates it with everything else).
Launch launch_for(int M, int N, int K, const Options& opt, Fp8 ta, Fp8 tb) {
  WEAVE_CHECK(opt.split_k >= 0, "gemm_fp8: split_k = ", opt.split_k, " must be >= 0 (0: the planner decides, 1: never)");
  lcsc::Config wide = opt.lcsc;
  wide.balance_waves = false;
  // The compute blocks of a full machine (the SM count less the communicator blocks).
  const int blocks = lcsc::plan_for<Big<fp8e4m3, fp8e4m3>>(1LL << 40, wide).compute_blocks;
  const int pairs =
      opt.lcsc.num_comm_sms % 2 == 0 ? lcsc::plan_for<Pair<fp8e4m3, fp8e4m3>>(1LL << 40, wide).compute_blocks / 2 : 0;
  return plan_launch(M, N, K, blocks, opt, wide_pair(ta, tb), pairs);
}
}  // namespace

Launch choose_launch(int M, int N, int K, const Options& opt, Fp8 ta, Fp8 tb) {
  validate_shape(M, N, K);
  validate_types(ta, tb);
  return launch_for(M, N, K, opt, ta, tb);
}

// The bf16 GEMM's rule (16 tile rows for short tiles, 8 for long ones) with K in bytes: an fp8
// tile of K runs about as long as a bf16 tile of K / 2 and reads as many operand bytes. Not yet
// tuned on a GPU.
int default_group_m(Tile t, int K) { return t == Tile::M128N128 || t == Tile::M128N192 || K <= 4096 ? 16 : 8; }

lcsc::Plan gemm(const void* A, Fp8 ta, const void* B, Fp8 tb, __nv_bfloat16* C, int M, int N, int K,
                const float* scale_a, const float* scale_b, const Options& opt, cudaStream_t stream) {
  validate_call(A, ta, B, tb, C, M, N, K, scale_a, scale_b, sizeof(float), sizeof(float));
  WEAVE_CHECK(opt.tile != Tile::M128N192, "gemm_fp8: the 128x192 tile is gemm_block_scaled's; per-tensor scales take "
              "auto, 128x256, 128x256c2, 128x128, 64x128, 128 x w or swapped");
  WEAVE_CHECK(opt.tile == Tile::Auto || opt.tile == Tile::M128N256 || opt.tile == Tile::M128N128 ||
                  opt.tile == Tile::Swapped || opt.tile == Tile::M128Nw || opt.tile == Tile::M64N128 ||
                  opt.tile == Tile::SwappedW || opt.tile == Tile::M128N256C2,
              "gemm_fp8: unknown tile ", static_cast<int>(opt.tile));
  const Launch l = launch_for(M, N, K, opt, ta, tb);  // the shape was validated above
  if (l.tile == Tile::Swapped) return launch_swapped(ta, tb, A, B, C, M, N, K, scale_a, scale_b, l.workers, stream);
  const int group_m = opt.group_m > 0 ? opt.group_m : default_group_m(l.tile, K);
  if (l.tile == Tile::M128Nw) return detail::run_wide(ta, A, B, C, M, N, K, scale_a, scale_b, opt, group_m, stream, l);
  if (l.tile == Tile::SwappedW)
    return detail::run_swapped_wide(ta, A, B, C, M, N, K, scale_a, scale_b, opt, group_m, stream, l);
  if (l.tile == Tile::M64N128)
    return dispatch<Narrow>(ta, tb, A, B, C, M, N, K, scale_a, scale_b, opt, group_m, stream, l);
  if (l.tile == Tile::M128N256)
    return dispatch<Big>(ta, tb, A, B, C, M, N, K, scale_a, scale_b, opt, group_m, stream, l);
  if (l.tile == Tile::M128N256C2)
    return dispatch<Pair>(ta, tb, A, B, C, M, N, K, scale_a, scale_b, opt, group_m, stream, l);
  return dispatch<Small>(ta, tb, A, B, C, M, N, K, scale_a, scale_b, opt, group_m, stream);
}

Launch plan_block_launch(int M, int N, int K, int sm_count, const Options& opt) {
  WEAVE_CHECK(opt.tile == Tile::Auto || opt.tile == Tile::M128N128 || opt.tile == Tile::M128N192,
              "gemm_fp8: block scales run on the 128x192 and 128x128 tiles only (a 64 x 256 consumer would need 2 x "
              "128 accumulator registers per thread), got ", tile_name(opt.tile));
  WEAVE_CHECK(sm_count >= 1, "gemm_fp8: ", sm_count, " compute blocks");
  WEAVE_CHECK(opt.split_k >= 0, "gemm_fp8: split_k = ", opt.split_k, " must be >= 0 (0: the planner decides, 1: never)");
  const int iters = k_blocks(K), tm = gemm::ceil_div(M, 128);
  // Cost in 128x128 K-block iterations of one SM.
  const auto cost_of = [&](Tile t) {
    const bool wide = t == Tile::M128N192;
    const int items = tm * gemm::ceil_div(N, wide ? 192 : 128);
    return gemm::split_choice(items, iters, sm_count, M <= 64, wide ? kBlock192Cost : 1.0, opt.split_k == 0);
  };
  const auto launch = [&](Tile t, const gemm::SplitChoice& c) {
    return Launch{t, opt.split_k > 1 ? opt.split_k : c.splits, sm_count};
  };
  if (opt.tile != Tile::Auto) return launch(opt.tile, cost_of(opt.tile));
  const gemm::SplitChoice c128 = cost_of(Tile::M128N128), c192 = cost_of(Tile::M128N192);
  return c192.cost <= c128.cost ? launch(Tile::M128N192, c192) : launch(Tile::M128N128, c128);
}

namespace {
// choose_block_launch for a shape already validated (gemm_block_scaled() validates it with the rest).
Launch block_launch_for(int M, int N, int K, const Options& opt) {
  const int blocks = lcsc::plan_for<Block192<fp8e4m3, fp8e4m3>>(1LL << 40, opt.lcsc).compute_blocks;
  return plan_block_launch(M, N, K, blocks, opt);
}
}  // namespace

bool block_lane_scales(int M, int K, long long l2_bytes, const Options& opt) {
  WEAVE_CHECK(opt.lane_scales >= 0 && opt.lane_scales <= 2, "gemm_fp8: lane_scales = ", opt.lane_scales,
              " (0: auto, 1: never, 2: always)");
  if (opt.lane_scales != 0) return opt.lane_scales == 2;
  return 2 * static_cast<long long>(block_scale_a_count(M, K) * sizeof(float)) >= l2_bytes;
}

Launch choose_block_launch(int M, int N, int K, const Options& opt) {
  validate_shape(M, N, K);
  return block_launch_for(M, N, K, opt);
}

lcsc::Plan gemm_block_scaled(const void* A, Fp8 ta, const void* B, Fp8 tb, __nv_bfloat16* C, int M, int N, int K,
                             const float* scale_a, const float* scale_b, const Options& opt, cudaStream_t stream) {
  validate_call(A, ta, B, tb, C, M, N, K, scale_a, scale_b, block_scale_a_count(M, K) * sizeof(float),
                block_scale_b_count(N, K) * sizeof(float));
  const Launch l = block_launch_for(M, N, K, opt);  // the shape was validated above
  const int group_m = opt.group_m > 0 ? opt.group_m : default_group_m(l.tile, K);
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  const bool lane = block_lane_scales(M, K, lcsc::device_info(dev).l2_bytes, opt);
  if (l.tile == Tile::M128N192)
    return lane ? dispatch<Block192Lane>(ta, tb, A, B, C, M, N, K, scale_a, scale_b, opt, group_m, stream, l)
                : dispatch<Block192>(ta, tb, A, B, C, M, N, K, scale_a, scale_b, opt, group_m, stream, l);
  return lane ? dispatch<BlockLane>(ta, tb, A, B, C, M, N, K, scale_a, scale_b, opt, group_m, stream, l)
              : dispatch<Block>(ta, tb, A, B, C, M, N, K, scale_a, scale_b, opt, group_m, stream, l);
}

}  // namespace weave::gemm_fp8
