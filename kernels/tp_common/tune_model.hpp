// The cost model of the tensor-parallel kernels (ag_gemm, gemm_rs, gemm_ar): a predicted time per
// candidate (variant, num_comm_sms), from the shape, the world size, the input type and the
// device's rates (weave/runtime/tune_model.hpp), and the cheapest offered candidate. The tuner
// takes it on a shape's first call unless a search is asked for (tuner.hpp). Deliberately coarse:
// a few terms per variant family, each named after what costs; the constants are measured on
// 2 x H200 and cite their rows. How close its picks come to the measured best:
// tests/tp/test_tune_model_cpu.cu.
//
// Every fused variant is  max(compute, communication + what must follow the last byte) + a
// per-call cost, where
//  - compute is the persistent GEMM's whole waves of 128 x 256 tiles on the SMs it keeps
//    (communicator SMs are taken from it: at 4096 x 2048 x 4096, 256 tiles are 2 waves on 128
//    SMs and 3 on 124, which is why ag_gemm with 8 communicator SMs took 153.7 us against 101.5
//    for the GEMM alone, session7-tp.jsonl:56, :4; the aux-warp pushes and the copy engine take
//    no SM, the aux pushes slow the GEMM beside them);
//  - communication is the bytes this rank sends at the rate of whoever moves them (communicator
//    blocks, aux warps, the copy engine, reduce-adds), never above the link;
//  - the host-only variants chain plain GEMMs, one per shard, with the transfers between them
//    (ag_gemm v9: the whole all_gather, then one GEMM).
#pragma once
#include <algorithm>
#include <string_view>
#include <vector>

#include "tp_common/schedule.hpp"
#include "tp_common/variants.hpp"
#include "weave/runtime/tune_model.hpp"

namespace weave::tp::model {

enum class Family { ag_gemm, gemm_rs, gemm_ar };

// The family of a TP kernel's name in the tuner's key ("ag_gemm", "gemm_rs", "gemm_ar").
inline Family family_of(std::string_view kernel) {
  return kernel == "gemm_rs" ? Family::gemm_rs : kernel == "gemm_ar" ? Family::gemm_ar : Family::ag_gemm;
}

struct Problem {
  Family family = Family::ag_gemm;
  int M = 0, N = 0, K = 0, W = 1;
  bool fp8 = false;  // fp8 inputs: twice the tensor rate, half of A's bytes (partials stay bf16)
};

// fp8 over bf16 GEMM rate: 1204 / 1287 / 1336 TFLOP/s fp8 against 677-700 bf16 at world 1
// (kernels/ag_gemm/README.md:31; bench/results/2026-11-30-h200x2-session7-tp.jsonl:4, :7, :10).
inline constexpr double kFp8Speedup = 1.85;
// A fused call's own cost beyond its GEMM and transfer: launch, the arrival handshake with every
// peer, the first readiness waits. At 2048 x 1024 x 2048 every fused ag_gemm variant took
// 47.6-48.6 us (docs/perf-notes.md:3186), 8 us above this model without it.
inline constexpr double kFusedCallUs = 8;
// A plain GEMM launch beyond the fluid rate: 14.4 us at 2048 x 1024 x 2048 against 12.3
// (session7-tp.jsonl:1).
inline constexpr double kPlainGemmUs = 2;
// The aux warps' pushes (ag_gemm v2..v6): one pusher (64 threads of a compute block) moves
// ~4.3 GB/s: v5 (33 pushers) took 167.7 us and v6 (17) 260 us for a 16.8 MB shard at 4096, the
// compute being 101.5 (session7-tp.jsonl:49, :50).
inline constexpr double kAuxPusherGBps = 4.3;
// What those pushes cost the GEMM beside them, as a fraction of its time: 7596 / 6901 / 6559 /
// 6603 / 6546 us for v2 / v3 / v4 / v5 / v6 against 6318 alone at 16384 (session7-tp.jsonl:64-68,
// :10). v2's bulk copies go out beside the loader's TMA loads; v3's register pushers (one per
// compute block) run at the link's rate; v4-v6 trickle.
inline constexpr double kAuxGemmCost[5] = {0.20, 0.09, 0.04, 0.045, 0.035};
// The copy engine: 348 GB/s in 8 MiB pieces, and 6.97 us for a stream write into the peer
// answered by a stream wait (docs/perf-notes.md:3081-3083); v7 (the fused kernel waiting on the
// copies) pays ~40 us per call that the copy and the handshakes do not explain (perf-notes:3097).
inline constexpr double kCopyEngineGBps = 348;
inline constexpr double kCeHandshakeUs = 7;
inline constexpr double kCeFusedUs = 40;
// weave's all_gather (ag_gemm v9): 10.3 us for 1 MiB per rank, 31.8 for 8 MiB
// (bench/results/2026-11-30-h200x2-suite.log:28-29): 7.2 us + bytes at 341 GB/s.
inline constexpr double kAllGatherUs = 7.2;
inline constexpr double kAllGatherGBps = 341;
// TMA reduce-adds into a peer (gemm_rs v0/v1, gemm_ar v1): 325-335 GB/s from 16 blocks
// (/work/shared/HARDWARE.md:22), under the link's 370 for stores.
inline constexpr double kReduceAddGBps = 330;
// A communicator SM that reduces tiles over the ranks (gemm_ar v0, gemm_rs v2) moves ~5.5 GB/s
// of peer data: gemm_ar v0 at 4096 x 4096 x 2048 took 755.8 / 405.4 / 226.6 us with 4 / 8 / 16
// of them for 16.8 MB (session7-tp.jsonl:83-85; gemm_rs/README.md:49, "~5-6 GB/s").
inline constexpr double kReduceSmGBps = 5.5;
// Local HBM, read + write, for gemm_rs v4's sum and v1's zeroing (HARDWARE.md:18: 4.2 TB/s).
inline constexpr double kHbmGBps = 4200;

inline double bytes_us(double bytes, double GBps) { return GBps > 0 ? bytes / (GBps * 1e3) : 0; }

// One 128 x 256 output tile's K loop on one SM.
inline double tile_us(const Problem& p, const runtime::DeviceRates& r) {
  return 2.0 * kBM * kBN * p.K / (r.sm_tflops * (p.fp8 ? kFp8Speedup : 1) * 1e6);
}
// The fused kernels' persistent GEMM: whole waves of `tiles` on `sms` SMs.
inline double waves_us(long long tiles, int sms, double t_tile) {
  sms = std::max(sms, 1);
  return static_cast<double>((tiles + sms - 1) / sms) * t_tile;
}
// One plain GEMM over all rows x N x K: the planner fits its tiles to the SMs, so the fluid rate.
inline double plain_us(long long rows, const Problem& p, const runtime::DeviceRates& r) {
  return 2.0 * rows * p.N * p.K / (r.sms * r.sm_tflops * (p.fp8 ? kFp8Speedup : 1) * 1e6) + kPlainGemmUs;
}
// One of a chain of plain GEMMs over a shard's rows each (ag_gemm v8, gemm_rs v3, v4): every
// launch ends in its own partial wave ("v3 pays two GEMM tails and a kernel boundary",
// docs/perf-notes.md:3158), so whole waves of the shard's tiles.
inline double shard_gemm_us(long long rows, const Problem& p, const runtime::DeviceRates& r) {
  const long long tiles = (rows + kBM - 1) / kBM * ((p.N + kBN - 1) / kBN);
  return waves_us(tiles, r.sms, tile_us(p, r)) + kPlainGemmUs;
}
// The compute blocks of a persistent launch: as many as keep its wave count (lcsc balances them).
inline int blocks(long long tiles, int sms) {
  sms = std::max(sms, 1);
  if (tiles <= 0) return 1;
  const long long waves = (tiles + sms - 1) / sms;
  return static_cast<int>((tiles + waves - 1) / waves);
}
// A fused kernel whose communication runs beside its GEMM and must be over before the last
// tile that reads (or adds) its bytes: that tile's K loop follows the last byte.
inline double fused_us(double compute, double comm, double t_tile) {
  return std::max(compute, comm + t_tile) + kFusedCallUs;
}

// Communicator SMs that reduce tiles over the ranks (gemm_ar v0, gemm_rs v2): the bytes at their
// rate beside the GEMM, but a tile is reduced only once every rank computed it, so the last
// wave's tiles (this rank's 1/W of them, spread over the n reducers) are reduced after it.
inline double reduced_us(long long tiles, double peer_bytes, const Problem& p, int n, const runtime::DeviceRates& r) {
  n = std::max(n, 1);
  const double t = tile_us(p, r), compute = waves_us(tiles, r.sms - n, t);
  const int per_wave = blocks(tiles, r.sms - n);
  const long long last = tiles - (tiles - 1) / per_wave * per_wave, mine = (last + p.W - 1) / p.W;
  const double tile_reduce = bytes_us((p.W - 1) * double(kBM) * kBN * 2, kReduceSmGBps);
  return std::max(compute + static_cast<double>((mine + n - 1) / n) * tile_reduce,
                  bytes_us(peer_bytes, std::min(r.link_GBps, n * kReduceSmGBps)) + t) +
         kFusedCallUs;
}

// ag_gemm (AgVariant): this rank's shard goes to W - 1 peers.
inline double ag_gemm_us(const Problem& p, const runtime::TuneCandidate& c, const runtime::DeviceRates& r) {
  const Layout L = make_layout(p.M, p.N, p.W, 8);
  const long long shard_rows = shard(p.M, p.W, 0).size;
  const double shard_bytes = static_cast<double>(shard_rows) * p.K * (p.fp8 ? 1 : 2);
  const double push = (p.W - 1) * shard_bytes, t = tile_us(p, r);
  const double all = waves_us(L.work(), r.sms, t);
  switch (static_cast<AgVariant>(c.variant)) {
    case AgVariant::CommTmaPush:
    case AgVariant::CommRegisterPush:
      return fused_us(waves_us(L.work(), r.sms - c.num_comm_sms, t),
                      bytes_us(push, std::min(r.link_GBps, c.num_comm_sms * r.comm_sm_GBps)), t);
    case AgVariant::AuxTmaPush:
    case AgVariant::AuxRegisterPush1:
    case AgVariant::AuxRegisterPush2:
    case AgVariant::AuxRegisterPush4:
    case AgVariant::AuxRegisterPush8: {
      const int v = c.variant - to_int(AgVariant::AuxTmaPush);
      const int every = v <= 1 ? 1 : 1 << (v - 1);  // v2, v3: every block; v4..v6: every 2nd, 4th, 8th
      const int pushers = (blocks(L.work(), r.sms) + every - 1) / every;
      return fused_us(all * (1 + kAuxGemmCost[v]), bytes_us(push, std::min(r.link_GBps, pushers * kAuxPusherGBps)),
                      t);
    }
    case AgVariant::CopyEngine:
      return fused_us(all, 2 * kCeHandshakeUs + bytes_us(push, std::min(r.link_GBps, kCopyEngineGBps)), t) +
             kCeFusedUs;
    case AgVariant::CopyEngineShardGemms: {
      // The own rows' GEMM while the copies run, then each peer's GEMM once its shard landed.
      const double one = shard_gemm_us(shard_rows, p, r), per_shard = bytes_us(shard_bytes, std::min(r.link_GBps, kCopyEngineGBps));
      double end = one;
      for (int k = 1; k < p.W; ++k) end = std::max(end, 2 * kCeHandshakeUs + k * per_shard) + one;
      return end;
    }
    case AgVariant::AllGatherGemm:  // no overlap: the whole transfer, then one GEMM
      return kAllGatherUs + bytes_us(push, kAllGatherGBps) + plain_us(p.M, p, r);
    case AgVariant::Adaptive:  // offered only when named (alone): nothing to rank it against
      return all;
  }
  return all;
}

// gemm_rs (RsVariant): W - 1 partials of this rank's rows go to their owners.
inline double gemm_rs_us(const Problem& p, const runtime::TuneCandidate& c, const runtime::DeviceRates& r) {
  const Layout L = make_layout(p.M, p.N, p.W, 8);
  const long long shard_rows = shard(p.M, p.W, 0).size;
  const double part_bytes = static_cast<double>(shard_rows) * p.N * 2, t = tile_us(p, r);
  const double out = (p.W - 1) * part_bytes, all = waves_us(L.work(), r.sms, t);
  const double own = all / p.W;  // the own shard's share of the waves
  switch (static_cast<RsVariant>(c.variant)) {
    case RsVariant::OwnerFirst:  // own tiles first: the adds to owners crowd into the rest
      return fused_us(all, own + bytes_us(out, std::min(r.link_GBps, kReduceAddGBps)), t);
    case RsVariant::ZeroFirst:  // zero the own output, then adds spread over the whole kernel
      return fused_us(all, bytes_us(out, std::min(r.link_GBps, kReduceAddGBps)), t) + bytes_us(part_bytes, kHbmGBps);
    case RsVariant::Chain:  // peers' tiles first, plain-stored; the own adds wait for those stores
      return fused_us(all, bytes_us(out, r.link_GBps), t);
    case RsVariant::InterSm:
      return reduced_us(L.work(), out, p, c.num_comm_sms, r);
    case RsVariant::ShardGemms: {  // plain GEMMs chained across ranks, each writing its owner's rows
      const double one = std::max(shard_gemm_us(shard_rows, p, r), bytes_us(part_bytes, r.link_GBps));
      return p.W * one + (p.W - 1) * kCeHandshakeUs;
    }
    case RsVariant::CopyEngine: {  // the peers' GEMMs, copies beside the own one, then a sum
      const double mine = shard_gemm_us(shard_rows, p, r), peers = (p.W - 1) * mine;
      const double landed = peers + 2 * kCeHandshakeUs + bytes_us(out, std::min(r.link_GBps, kCopyEngineGBps));
      return std::max(peers + mine, landed) + bytes_us((p.W + 1) * part_bytes, kHbmGBps) + kPlainGemmUs;
    }
    case RsVariant::Adaptive:
      return all;
  }
  return all;
}

// gemm_ar (ArVariant): every rank ends with the sum of all partials.
inline double gemm_ar_us(const Problem& p, const runtime::TuneCandidate& c, const runtime::DeviceRates& r) {
  const ArLayout L = make_ar_layout(p.M, p.N, p.W, 8);
  const double full = static_cast<double>(p.M) * p.N * 2, t = tile_us(p, r);
  switch (static_cast<ArVariant>(c.variant)) {
    case ArVariant::IntraSm:  // each tile reduce-added into every peer: (W - 1) full outputs out
      return fused_us(waves_us(L.work(), r.sms, t), bytes_us((p.W - 1) * full, std::min(r.link_GBps, kReduceAddGBps)), t);
    case ArVariant::InterSm:  // the owner's communicators reduce its 1/W of the tiles over the ranks
      return reduced_us(L.work(), (p.W - 1) * full / p.W, p, c.num_comm_sms, r);
    case ArVariant::Adaptive:
      return waves_us(L.work(), r.sms, t);
  }
  return waves_us(L.work(), r.sms, t);
}

inline double predicted_us(const Problem& p, const runtime::TuneCandidate& c, const runtime::DeviceRates& r) {
  switch (p.family) {
    case Family::ag_gemm: return ag_gemm_us(p, c, r);
    case Family::gemm_rs: return gemm_rs_us(p, c, r);
    case Family::gemm_ar: return gemm_ar_us(p, c, r);
  }
  return 0;
}

// The model's pick among the offered candidates (only ever one of them).
inline runtime::TuneCandidate choose(const Problem& p, const std::vector<runtime::TuneCandidate>& cands,
                                     const runtime::DeviceRates& r) {
  return runtime::cheapest(cands, [&](const runtime::TuneCandidate& c) { return predicted_us(p, c, r); });
}

}  // namespace weave::tp::model
