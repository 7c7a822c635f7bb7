// AllGather + GEMM (README.md): C = gather_rows(A_q) * B on every rank, and the gathered A.
#pragma once
#include <cuda_fp8.h>

#include <memory>

#include "tp_common/host.hpp"

namespace weave::tp {

class AgGemm {
 public:
  explicit AgGemm(runtime::Communicator& c);
  ~AgGemm();
  AgGemm(const AgGemm&) = delete;
  AgGemm& operator=(const AgGemm&) = delete;

  // Collective. M is the full row count; rank r holds rows shard(M, W, r) of A in `a_shard`
  // (shard rows x K, any device memory, or in place: a_gathered + shard.begin * K). `a_gathered`
  // (symmetric, M x K) receives all of A; B: K x N row-major, or N x K with Options::b = NK
  // (local); C: M x N (local).
  // Options::variant (AgVariant, tp_common/variants.hpp): 0 CommTmaPush, 1 CommRegisterPush
  // (num_comm_sms >= 1 communicator blocks push); 2 AuxTmaPush, 3..6 AuxRegisterPush1/2/4/8 (the
  // compute blocks' idle producer warps push), 7 CopyEngine, 8 CopyEngineShardGemms (the copy
  // engine pushes; 8 with one plain GEMM per shard), 9 AllGatherGemm (all_gather, then one GEMM),
  // 10 Adaptive (v0/v1's push units and the tiles, every block choosing at run time whether it
  // computes or pushes next; bf16 only; never the tuner's own pick); 2..10 with num_comm_sms = 0;
  // -1 with num_comm_sms < 0: the tuner picks (README.md).
  LaunchInfo run(const bf16* a_shard, bf16* a_gathered, const bf16* B, bf16* C, int M, int N, int K,
                 const Options& o = {}, cudaStream_t s = nullptr);
  // fp8 (e4m3) inputs with per-tensor scales: C = scale_a * scale_b * gather_rows(A_q) * B^T,
  // fp32 accumulation, rounded once to bf16. The gathered A travels as fp8 (half of bf16's
  // bytes). B is N x K (an nn.Linear weight; the only layout fp8 wgmma reads: Options::b is not
  // consulted). scale_a is the scale of the whole gathered A (one per-tensor scale: the same
  // value on every rank), scale_b B's; device pointers to one float each, read by the kernel (no
  // host synchronisation). K a multiple of 16. Every variant but 10 runs (8 and 9 with the fp8 GEMM;
  // 10, the adaptive split, is rejected).
  LaunchInfo run(const __nv_fp8_e4m3* a_shard, __nv_fp8_e4m3* a_gathered, const __nv_fp8_e4m3* B,
                 const float* scale_a, const float* scale_b, bf16* C, int M, int N, int K, const Options& o = {},
                 cudaStream_t s = nullptr);
  // The search space of the tuner for this shape (communicator SM counts).
  static std::vector<int> comm_sms_candidates(int M, int K, int W, int sm_count);
  // The adaptive split's statistics for M x N x K (zeros before its first v10 call): launches,
  // push units handed out while tiles were unclaimed, the most blocks pushing then. A blocking copy
  // on the legacy stream: synchronise the call's stream first (it does not wait for a
  // non-blocking stream's launches).
  AdaptiveStats adaptive_stats(int M, int N, int K) const;

 private:
  LaunchInfo run_inputs(const Inputs& in, void* a_gathered, bf16* C, int M, int N, int K, const Options& o,
                        cudaStream_t s);
  LaunchInfo launch(const Inputs& in, void* a_gathered, bf16* C, int M, int N, int K, int ncomm, AgVariant variant,
                    cudaStream_t s);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::tp
