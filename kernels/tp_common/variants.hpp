// The TP kernels' schedule variants, by name. Options::variant, LaunchInfo::variant, the tuner's
// candidates and cache, weave-bench's --variant and its JSON keep the numbers (the enums' values,
// fixed: a cached choice names its variant by number); the host code compares names. The kernels
// receive the number (a field of their globals) and dispatch on it by name too (to_int below).
#pragma once
#include <string_view>

namespace weave::tp {

// ag_gemm (ag_gemm/README.md): who moves the shard to the peers.
enum class AgVariant : int {
  CommTmaPush = 0,       // communicator blocks, one thread each, TMA bulk copies
  CommRegisterPush = 1,  // communicator blocks, all threads, 16-byte register copies
  AuxTmaPush = 2,        // the idle producer warps of every compute block, TMA bulk copies
  AuxRegisterPush1 = 3,  // 3..6: 16-byte register copies by those warps of every 2^(v-3)-th
  AuxRegisterPush2 = 4,  //   compute block (every block, every 2nd, 4th, 8th)
  AuxRegisterPush4 = 5,
  AuxRegisterPush8 = 6,
  CopyEngine = 7,        // the copy engine pushes, the fused kernel waits for its counters
  CopyEngineShardGemms = 8,  // the copy engine pushes, one plain GEMM per shard (host only)
  AllGatherGemm = 9,     // all_gather, then one plain GEMM (no overlap; host only)
  Adaptive = 10,         // CommTmaPush / CommRegisterPush's units, each block choosing at run time whether it
                         // computes or pushes next (bf16; num_comm_sms = 0; opt-in)
};
constexpr int kAgVariants = 11;

// gemm_rs (gemm_rs/README.md): how the partials reach their owners.
enum class RsVariant : int {
  OwnerFirst = 0,  // intra-SM: own tiles first (plain stores), then reduce-adds into the owners
  ZeroFirst = 1,   // intra-SM: the aux warps zero the own output, every contribution a reduce-add
  InterSm = 2,     // communicator SMs reduce from a symmetric scratch (num_comm_sms > 0)
  ShardGemms = 3,  // one plain GEMM per owner, chained across ranks (host only)
  CopyEngine = 4,  // plain local GEMMs, the copy engine moves the partials, then a sum (host only)
  Chain = 5,       // ShardGemms' chain as one fused kernel
  Adaptive = 6,    // InterSm's tasks, each block choosing its role at run time (bf16; num_comm_sms = 0; opt-in)
};
constexpr int kRsVariants = 7;

// gemm_ar (gemm_ar/README.md): who reduces.
enum class ArVariant : int {
  InterSm = 0,  // communicator SMs reduce (num_comm_sms > 0; bit-identical on every rank)
  IntraSm = 1,  // the storers reduce-add into every peer (num_comm_sms = 0)
  Adaptive = 2,  // InterSm's tasks, each block choosing its role at run time (num_comm_sms = 0; opt-in)
};
constexpr int kArVariants = 3;

// Variants a CUDA graph can capture: the fused kernels, whose waits read device rounds
// (SignalSet::next_round; the adaptive splits' ledgers zero themselves at each launch's end). The
// copy-engine variants wait and write with host-fixed values (cuStreamWaitValue64 / WriteValue64
// and one-thread waits on host-computed counts), and ag_gemm v9 and gemm_rs v3 go through calls
// whose rounds are host-only (the all_gather, the chain's one-thread waits).
constexpr bool capturable(AgVariant v) { return static_cast<int>(v) <= 6 || v == AgVariant::Adaptive; }
constexpr bool capturable(RsVariant v) {
  return v == RsVariant::OwnerFirst || v == RsVariant::ZeroFirst || v == RsVariant::InterSm || v == RsVariant::Chain ||
         v == RsVariant::Adaptive;
}
constexpr bool capturable(ArVariant) { return true; }
constexpr const char* capture_rule() {
  return "under capture: ag_gemm 0..6, 10, gemm_rs 0, 1, 2, 5, 6, gemm_ar 0, 1, 2; pass Options::variant, or make the "
         "eager calls of the shape, whose tuned choice the capture reuses, pick one of them";
}

constexpr int to_int(AgVariant v) { return static_cast<int>(v); }
constexpr int to_int(RsVariant v) { return static_cast<int>(v); }
constexpr int to_int(ArVariant v) { return static_cast<int>(v); }

// Short names for tables and messages ("?" for a number that is no variant of the kernel).
constexpr const char* variant_name(AgVariant v) {
  switch (v) {
    case AgVariant::CommTmaPush: return "comm TMA push";
    case AgVariant::CommRegisterPush: return "comm register push";
    case AgVariant::AuxTmaPush: return "aux TMA push";
    case AgVariant::AuxRegisterPush1: return "aux register push, every block";
    case AgVariant::AuxRegisterPush2: return "aux register push, every 2nd block";
    case AgVariant::AuxRegisterPush4: return "aux register push, every 4th block";
    case AgVariant::AuxRegisterPush8: return "aux register push, every 8th block";
    case AgVariant::CopyEngine: return "copy engine";
    case AgVariant::CopyEngineShardGemms: return "copy engine, one GEMM per shard";
    case AgVariant::AllGatherGemm: return "all_gather, then GEMM";
    case AgVariant::Adaptive: return "adaptive split";
  }
  return "?";
}
constexpr const char* variant_name(RsVariant v) {
  switch (v) {
    case RsVariant::OwnerFirst: return "owner first";
    case RsVariant::ZeroFirst: return "zero first";
    case RsVariant::InterSm: return "inter-SM";
    case RsVariant::ShardGemms: return "one GEMM per owner";
    case RsVariant::CopyEngine: return "copy engine";
    case RsVariant::Chain: return "chained owners, one kernel";
    case RsVariant::Adaptive: return "adaptive split";
  }
  return "?";
}
constexpr const char* variant_name(ArVariant v) {
  switch (v) {
    case ArVariant::InterSm: return "inter-SM";
    case ArVariant::IntraSm: return "intra-SM";
    case ArVariant::Adaptive: return "adaptive split";
  }
  return "?";
}

// A variant number of kernel `kernel` ("ag_gemm", "gemm_rs", "gemm_ar") by name; "" for an
// unknown kernel, "?" for a number that is not one of its variants.
inline const char* variant_name(std::string_view kernel, int v) {
  if (kernel == "ag_gemm") return v >= 0 && v < kAgVariants ? variant_name(static_cast<AgVariant>(v)) : "?";
  if (kernel == "gemm_rs") return v >= 0 && v < kRsVariants ? variant_name(static_cast<RsVariant>(v)) : "?";
  if (kernel == "gemm_ar") return v >= 0 && v < kArVariants ? variant_name(static_cast<ArVariant>(v)) : "?";
  return "";
}

}  // namespace weave::tp
