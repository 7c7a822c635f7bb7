// GEMM + reduce-scatter (README.md): out_r = rows shard(M, W, r) of sum over ranks of A_q * B_q.
#pragma once
#include <memory>

#include "tp_common/host.hpp"

namespace weave::tp {

// gemm_rs variant 3: one plain GEMM per owner, chained across ranks (gemm_rs.cu).
constexpr int kRsShardGemms = 3;
// gemm_rs variant 4: local GEMMs, the peers' partials moved by the copy engine, then a sum.
constexpr int kRsCopyEngine = 4;
// gemm_rs variant 5: variant 3's chain in one fused kernel (no GEMM boundary between the steps).
constexpr int kRsChain = 5;

class GemmRS {
 public:
  explicit GemmRS(runtime::Communicator& c);
  ~GemmRS();
  GemmRS(const GemmRS&) = delete;
  GemmRS& operator=(const GemmRS&) = delete;

  // Collective. A: M x K (this rank's K slice of the activations), B: K x N row-major, both any
  // device memory; out: symmetric (heap or registered) with room for out_elems(M, N, W) elements;
  // receives this rank's rows (shard(M, W, rank).size x N, row-major). The output is overwritten,
  // never accumulated: nothing is assumed about its previous contents. Options::variant: 0 =
  // owner first, 1 = zero first (intra-SM), 2 = inter-SM (num_comm_sms communicator SMs reduce
  // from an internal M x N symmetric scratch; num_comm_sms > 0 alone selects it), 3 = one plain
  // GEMM per owner chained across ranks (each adds into the owner's output), 4 = plain local
  // GEMMs whose partials the copy engine moves to their owners, summed there (needs (W - 1) x
  // shard rows x N of free symmetric heap), 5 = variant 3's chain as one kernel (per-tile readiness
  // instead of GEMM boundaries); -1 with num_comm_sms < 0: the tuner picks (README.md).
  LaunchInfo run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, const Options& o = {},
                 cudaStream_t s = nullptr);
  static size_t out_elems(int M, int N, int W) { return size_t(shard(M, W, 0).size) * N; }

 private:
  LaunchInfo launch(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, int variant, int ncomm,
                    cudaStream_t s);
  void launch_shard_gemms(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, cudaStream_t s);
  void launch_copy_engine(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, cudaStream_t s);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::tp
