// AllGather + GEMM (README.md): C = gather_rows(A_q) * B on every rank, and the gathered A.
#pragma once
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
  // engine pushes; 8 with one plain GEMM per shard), 9 AllGatherGemm (all_gather, then one GEMM);
  // 2..9 with num_comm_sms = 0; -1 with num_comm_sms < 0: the tuner picks (README.md).
  LaunchInfo run(const bf16* a_shard, bf16* a_gathered, const bf16* B, bf16* C, int M, int N, int K,
                 const Options& o = {}, cudaStream_t s = nullptr);
  // The search space of the tuner for this shape (communicator SM counts).
  static std::vector<int> comm_sms_candidates(int M, int K, int W, int sm_count);

 private:
  LaunchInfo launch(const bf16* a_shard, bf16* a_gathered, const bf16* B, gemm::BLayout bl, bf16* C, int M, int N,
                    int K, int ncomm, AgVariant variant, cudaStream_t s);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::tp
