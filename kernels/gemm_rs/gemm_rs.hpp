// GEMM + reduce-scatter (README.md): out_r = rows shard(M, W, r) of sum over ranks of A_q * B_q.
#pragma once
#include <memory>

#include "tp_common/host.hpp"

namespace weave::tp {

class GemmRS {
 public:
  explicit GemmRS(runtime::Communicator& c);
  ~GemmRS();
  GemmRS(const GemmRS&) = delete;
  GemmRS& operator=(const GemmRS&) = delete;

  // Collective. A: M x K (this rank's K slice of the activations), B: K x N row-major (or N x K
  // with Options::b = NK: an nn.Linear weight), both any
  // device memory; out: symmetric (heap or registered) with room for out_elems(M, N, W) elements;
  // receives this rank's rows (shard(M, W, rank).size x N, row-major). The output is overwritten,
  // never accumulated: nothing is assumed about its previous contents. Options::variant
  // (RsVariant, tp_common/variants.hpp): 0 OwnerFirst and 1 ZeroFirst (intra-SM), 2 InterSm
  // (num_comm_sms communicator SMs reduce from an internal M x N symmetric scratch;
  // num_comm_sms > 0 alone selects it), 3 ShardGemms (one plain GEMM per owner chained across
  // ranks, each adding into the owner's output), 4 CopyEngine (plain local GEMMs whose partials
  // the copy engine moves to their owners, summed there; needs (W - 1) x shard rows x N of free
  // symmetric heap), 5 Chain (ShardGemms' chain as one kernel: per-tile readiness instead of
  // GEMM boundaries); -1 with num_comm_sms < 0: the tuner picks (README.md).
  LaunchInfo run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, const Options& o = {},
                 cudaStream_t s = nullptr);
  static size_t out_elems(int M, int N, int W) { return size_t(shard(M, W, 0).size) * N; }

 private:
  LaunchInfo launch(const bf16* A, const bf16* B, gemm::BLayout bl, bf16* out, int M, int N, int K, RsVariant variant,
                    int ncomm, cudaStream_t s);
  void launch_shard_gemms(const bf16* A, const bf16* B, gemm::BLayout bl, bf16* out, int M, int N, int K,
                          cudaStream_t s);
  void launch_copy_engine(const bf16* A, const bf16* B, gemm::BLayout bl, bf16* out, int M, int N, int K,
                          cudaStream_t s);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::tp
