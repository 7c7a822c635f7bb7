// Host pieces shared by the tensor-parallel fused kernels: options, the cross-rank argument
// check (only when the arguments change), TMA maps on 128-row tiles, the tuner path.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gemm/layout.hpp"
#include "tp_common/adaptive_stats.hpp"
#include "tp_common/schedule.hpp"
#include "tp_common/tune_model.hpp"
#include "tp_common/variants.hpp"
#include "weave/common/error.hpp"
#include "weave/runtime/call.hpp"  // local_problem, CallOrder
#include "weave/runtime/communicator.hpp"
#include "weave/runtime/tuner.hpp"
#include "weave/runtime/tuner_launch.hpp"
#include "weave/tile/tma.hpp"

namespace weave::tp {

using bf16 = __nv_bfloat16;

struct Options {
  // < 0: the tuner picks (cached per kernel, shape, world and device); >= 0 fixes the number of
  // communicator SMs (0 = an intra-SM variant; > 0 an inter-SM one).
  int num_comm_sms = -1;
  // Which variant (-1: the tuner picks with num_comm_sms < 0, else the default for the count):
  // the number of one of the kernel's variants (tp_common/variants.hpp, e.g.
  // to_int(RsVariant::ZeroFirst); the numbers are the ones the tuner cache and weave-bench keep).
  // ag_gemm (AgVariant): 0 CommTmaPush, 1 CommRegisterPush (num_comm_sms > 0, 0 the default for
  // > 0); 2 AuxTmaPush (the default for 0), 3..6 AuxRegisterPush1/2/4/8, 7 CopyEngine,
  // 8 CopyEngineShardGemms, 9 AllGatherGemm, 10 Adaptive (bf16; opt-in: never the tuner's own
  // pick) (num_comm_sms = 0).
  // gemm_rs (RsVariant): 0 OwnerFirst (the default for 0), 1 ZeroFirst, 2 InterSm (num_comm_sms
  // > 0, the default for > 0), 3 ShardGemms, 4 CopyEngine, 5 Chain, 6 Adaptive (bf16,
  // num_comm_sms = 0; opt-in: never the tuner's own pick).
  // gemm_ar (ArVariant): 0 InterSm (num_comm_sms > 0, the default for > 0), 1 IntraSm
  // (num_comm_sms = 0, the default for 0), 2 Adaptive (num_comm_sms = 0; opt-in: never the
  // tuner's own pick).
  int variant = -1;
  // B's layout: K x N row-major (KN), or N x K row-major (NK: an nn.Linear weight, read in place
  // rather than transposed into K x N first).
  gemm::BLayout b = gemm::BLayout::KN;
};

// What the last launch used (for benchmarks and tests).
struct LaunchInfo {
  int num_comm_sms = 0;
  int compute_blocks = 0;
  bool tuned = false;  // the choice came from the tuner (cache or search)
  int variant = 0;  // the number of the kernel's variant that ran (tp_common/variants.hpp)
};

// A rows x cols row-major bf16 matrix read or written in 128 x 64 boxes with the 128-byte
// swizzle (the GEMM's operand and output staging layout). rows may be 0 (an empty shard): the
// map then covers one row that no tile ever touches.
inline CUtensorMap map_128x64(const bf16* p, long long rows, long long cols, long long ld) {
  return tile::encode(tile::tma_2d(p, rows > 0 ? rows : 1, cols, ld, kBM, 64, tile::Swizzle::B128));
}
// B as the TP kernels' GEMM (BN = kBN columns per tile) reads it: K x N row-major in 64 x 64
// boxes (KN), or N x K row-major in kBN-row boxes of 64 K (NK).
inline CUtensorMap map_b(const bf16* p, long long K, long long N, gemm::BLayout l) {
  if (l == gemm::BLayout::NK) return tile::encode(tile::tma_2d(p, N, K, K, kBN, 64, tile::Swizzle::B128));
  return tile::encode(tile::tma_2d(p, K, N, N, 64, 64, tile::Swizzle::B128));
}
// An fp8 rows x K row-major operand in boxes of box_rows x 128 bytes of K (TMA has no fp8 type:
// bytes, which are exact): A in 128-row boxes, B (N x K) in kBN-row ones.
inline CUtensorMap map_fp8(const void* p, long long rows, long long K, uint32_t box_rows) {
  return tile::encode(tile::tma_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p, rows > 0 ? rows : 1, K, K, box_rows, 128,
                                   tile::Swizzle::B128));
}

// A TP call's inputs: bf16 (B K x N or N x K), or fp8 e4m3 with per-tensor scales (B N x K, the
// only layout fp8 wgmma reads; scale_a and scale_b point at one float each on the device and are
// read by the kernel, C = scale_a * scale_b * A * B in fp32, rounded once to bf16).
struct Inputs {
  const void* a = nullptr;  // ag_gemm: this rank's shard; gemm_rs: A
  const void* b = nullptr;
  gemm::BLayout bl = gemm::BLayout::KN;
  const float* scale_a = nullptr;  // fp8 only
  const float* scale_b = nullptr;
  bool fp8 = false;
  size_t elem() const { return fp8 ? 1 : sizeof(bf16); }  // bytes per input element
  size_t bytes(long long rows, long long cols) const { return size_t(rows) * size_t(cols) * elem(); }
  // A's rows from `row` on (A rows x K, row-major).
  const void* a_row(long long row, int K) const { return static_cast<const char*>(a) + size_t(row) * K * elem(); }
};
// The kernel name in the tuner's key: a call that restricts the variant (Options::variant >= 0)
// searches and caches apart from an unrestricted one, so that neither gets a cached choice the
// other excluded (a search over all variants must not answer a call that asked for variant 0);
// NK and KN calls too (their loads differ), and fp8 and bf16 ones.
inline std::string tune_name(const std::string& kernel, int variant, gemm::BLayout b = gemm::BLayout::KN,
                             bool fp8 = false) {
  return (variant < 0 ? kernel : kernel + ".v" + std::to_string(variant)) + (fp8 ? ".fp8" : b == gemm::BLayout::NK ? ".nk" : "");
}

// Options take part in the cross-rank check: ranks with different variants would feed different
// signal sets (hang, or a wait met early: a wrong answer), and one rank tuning while another does
// not would leave the tuner's collective search alone.
// The SM count is compared too: the schedules size their grids from it, and gemm_rs v1 counts
// the zeroing blocks of every rank from its own.
// The input type too: an fp8 rank and a bf16 rank would push and read different bytes.
inline std::vector<long long> checked_args(int M, int N, int K, const Options& o, int sm_count, bool fp8 = false) {
  return {M, N, K, o.num_comm_sms, o.variant, sm_count, static_cast<int>(o.b), fp8 ? 1 : 0};
}

inline int default_group_m(int K) { return K <= 2048 ? 16 : 8; }

// The adaptive SM split (gemm_ar v2, gemm_rs v6, ag_gemm v10; sm_split.hpp): its cost priors,
// cycles per task before the call measured one of each kind: a 128 x 256 x K tile at ~2700 dense
// bf16 FLOP per SM cycle (two thirds of a Hopper SM's 4096-FLOP-per-cycle dense bf16 peak), and a
// reduction moving `remote_tiles` 64 KiB tiles over NVLink at ~16 B per cycle per block (one
// block's share when several reduce). Only the first choices use them.
struct AdaptivePriors {
  float compute = 0, comm = 0;
};
inline AdaptivePriors adaptive_priors(int K, int remote_tiles) {
  return {static_cast<float>(2.0 * kBM * kBN * K / 2700.0),
          static_cast<float>(double(remote_tiles) * kBM * kBN * sizeof(bf16) / 16.0)};
}
// ag_gemm v10: a push unit (`unit_bytes` of the shard: a row tile's bytes over P) stored to
// `copies` destinations (the W - 1 peers, and the own gathered A when the input is not in place)
// at the same ~16 B per cycle per block.
inline AdaptivePriors ag_adaptive_priors(int K, long long unit_bytes, int copies) {
  return {adaptive_priors(K, 0).compute, static_cast<float>(double(unit_bytes) * (copies > 0 ? copies : 1) / 16.0)};
}

// One operand of a TP call: its bytes follow from the shape. `symmetric`: peers reach it (in the
// symmetric heap or registered on every rank), not only this rank.
struct Operand {
  const char* name;
  const void* p;
  size_t bytes = 0;
  bool symmetric = false;
};

// Every operand is read or written by TMA: non-null, 16-byte aligned, and (with `c`) as long as
// the shape says: in one heap allocation, registered buffer or device allocation
// (Communicator::check_buffer), and a symmetric one where peers find it (Communicator::peers).
// Part of a call's own checks (check_tp_call), so a pointer bad on one rank only is rejected on
// every rank before any launch, not a TMA-map failure or an out-of-bounds access after its peers
// launched, nor an error of peers() on that rank alone after the agreement.
inline void check_operands(const char* who, std::initializer_list<Operand> ops,
                           const runtime::Communicator* c = nullptr) {
  for (const Operand& o : ops) {
    WEAVE_CHECK(o.p != nullptr, who, ": ", o.name, " is a null pointer");
    WEAVE_CHECK(reinterpret_cast<uintptr_t>(o.p) % 16 == 0, who, ": ", o.name,
                " is not 16-byte aligned (TMA needs it)");
    if (c) c->check_buffer(who, o.name, o.p, o.bytes);
    if (c && o.symmetric) c->peers(o.p, o.bytes);
  }
}

// An fp8 call's per-tensor scales: one float each, device memory the kernel reads.
inline void check_scales(const char* who, const Inputs& in, const runtime::Communicator& c) {
  for (const Operand& o : {Operand{"scale_a", in.scale_a, sizeof(float)}, Operand{"scale_b", in.scale_b, sizeof(float)}}) {
    WEAVE_CHECK(o.p != nullptr, who, ": ", o.name, " is a null pointer (fp8 inputs need per-tensor scales)");
    WEAVE_CHECK(reinterpret_cast<uintptr_t>(o.p) % alignof(float) == 0, who, ": ", o.name, " is not 4-byte aligned");
    c.check_buffer(who, o.name, o.p, o.bytes);
  }
}

// Bytes of a rows x cols bf16 matrix.
inline size_t bf16_bytes(long long rows, long long cols) { return size_t(rows) * size_t(cols) * sizeof(bf16); }

// num_comm_sms as lcsc::make_plan accepts it, checked before a launch takes its signal rounds:
// make_plan throwing after next_round() would leave every later call of that shape waiting for
// a round that no kernel fed.
inline void check_comm_sms(const char* who, int num_comm_sms, int sm_count) {
  WEAVE_CHECK(num_comm_sms < sm_count, who, ": num_comm_sms = ", num_comm_sms, " leaves no compute SM (the device has ",
              sm_count, ")");
}

inline void validate(const char* who, int M, int N, int K, bool fp8 = false) {
  WEAVE_CHECK(M >= 1 && N >= 1 && K >= 1, who, ": M, N, K must be positive, got ", M, " x ", N, " x ", K);
  if (fp8) WEAVE_CHECK(K % 16 == 0, who, ": K = ", K, " is not a multiple of 16 (fp8: TMA needs 16-byte row pitches)");
  WEAVE_CHECK(K % 8 == 0, who, ": K = ", K, " is not a multiple of 8 (TMA needs 16-byte row pitches)");
  WEAVE_CHECK(N % 8 == 0, who, ": N = ", N, " is not a multiple of 8 (TMA needs 16-byte row pitches)");
}

// The start of every TP call: this rank's own checks (shape, operands, variant in 0..max_variant
// as `variants` describes them, num_comm_sms, then `more`), and the cross-rank check of the
// shape, options and input type, which every rank fails together when any rank found a problem.
template <class F>
void check_tp_call(runtime::Communicator& c, const char* who, int M, int N, int K, const Options& o,
                   std::initializer_list<Operand> ops, int max_variant,
                   const char* variants, cudaStream_t s, F&& more, bool fp8 = false) {
  const std::string problem = runtime::local_problem([&] {
    int dev = -1;  // the launches go to the current device: found here, not by a launch after the round
    WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
    WEAVE_CHECK(dev == c.device(), who, ": the current CUDA device is ", dev, " but the communicator's is ",
                c.device(), " (cudaSetDevice first)");
    validate(who, M, N, K, fp8);
    check_operands(who, ops, &c);
    WEAVE_CHECK(o.variant >= -1 && o.variant <= max_variant, who, ": variant ", o.variant, " is not ", variants);
    check_comm_sms(who, o.num_comm_sms, c.sm_count());
    more();
  });
  // The buffers peers write (symmetric operands): at the same place on every rank.
  std::vector<const void*> reached;
  for (const Operand& op : ops)
    if (op.symmetric) reached.push_back(op.p);
  c.agree_call(who, "M, N, K, num_comm_sms, variant, SM count, B layout, input type",
               checked_args(M, N, K, o, c.sm_count(), fp8), problem, s, reached);
}

}  // namespace weave::tp

namespace weave::tp {

// A TP call's tuner path: the cached choice over `cands` under the key (kernel and its variant
// restriction, M x N x K, world, device), else the cost model's pick (tp_common/tune_model.hpp) or
// in search mode the search, then the chosen launch. `launch(t)` enqueues one call with candidate
// t and returns its LaunchInfo. `capture_ready`: the object's keys whose capture fallback was
// prepared (below).
template <class F, class Capturable>
LaunchInfo tuned_launch(runtime::Communicator& c, const char* kernel, const Options& o, int M, int N, int K,
                        const std::vector<runtime::TuneCandidate>& cands, cudaStream_t s, Capturable&& capturable,
                        std::set<std::string>& capture_ready, F&& launch, bool fp8 = false) {
  const std::string key =
      runtime::tune_key(tune_name(kernel, o.variant, o.b, fp8), {M, N, K}, c.world(), runtime::device_key(c));
  if (runtime::capturing(s)) {
    // A choice is agreed with every rank (and a search times launches): under capture only a
    // choice made by an eager call of this shape can be used. If that choice cannot be captured
    // (the copy engine), the first capturable candidate the eager calls prepared (below) takes
    // its place. Every rank has the same agreed choice and the same prepared sets, so all pick
    // alike.
    const runtime::TuneResult r =
        runtime::captured_choice(c, key, cands, detail::concat(kernel, " (", M, " x ", N, " x ", K, ")"));
    std::vector<runtime::TuneCandidate> order{r.choice};
    for (const auto& t : cands)
      if (!(t.variant == r.choice.variant && t.num_comm_sms == r.choice.num_comm_sms)) order.push_back(t);
    for (const auto& t : order) {
      if (!capturable(t.variant)) continue;
      try {
        LaunchInfo li = launch(t);
        li.tuned = true;
        return li;
      } catch (const runtime::NotPrepared&) {
      }
    }
    throw Error(detail::concat(kernel, ": no capturable variant of ", M, " x ", N, " x ", K,
                               " was prepared by an eager call (the tuned choice, variant ", r.choice.variant,
                               ", cannot be captured); make an eager call with a capturable Options::variant first (",
                               capture_rule(), ")"));
  }
  const runtime::TuneResult r = runtime::tuned_choice(
      c, key, cands, s, kernel,
      [&] {
        return model::choose({model::family_of(kernel), M, N, K, c.world(), fp8}, cands,
                             runtime::device_rates(c.sm_count()));
      },
      launch);
  // A choice a graph cannot capture: the first capturable candidate also runs once, at this
  // object's first eager call of the shape, so that its signal sets exist when a capture of the
  // shape looks for a fallback (the model's pick, a bounded search or a choice from the cache file
  // may not have run it). It writes the same output, which the chosen launch then overwrites.
  if (!capturable(r.choice.variant) && capture_ready.insert(key).second)
    for (const auto& t : cands)
      if (capturable(t.variant)) {
        launch(t);
        break;
      }
  LaunchInfo li = launch(r.choice);
  li.tuned = true;
  return li;
}

}  // namespace weave::tp
