// GEMM + reduce-scatter (README.md): out_r = rows shard(M, W, r) of sum over ranks of A_q * B_q.
#pragma once
#include <cuda_fp8.h>

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
  // GEMM boundaries), 6 Adaptive (InterSm's reductions by blocks that choose their role at run
  // time; num_comm_sms = 0; bf16 only; never the tuner's own pick); -1 with num_comm_sms < 0: the
  // tuner picks (README.md).
  LaunchInfo run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, const Options& o = {},
                 cudaStream_t s = nullptr);
  // fp8 (e4m3) inputs with per-tensor scales: this rank's partial is scale_a * scale_b * A * B^T
  // (fp32 accumulation, scaled before its one bf16 rounding; each rank's own scales), and the
  // partials are reduced in bf16 as above. B is N x K (an nn.Linear weight; the only layout fp8
  // wgmma reads: Options::b is not consulted). scale_a, scale_b: device pointers to one float
  // each, read by the kernel. K a multiple of 16. Variant 3 (one GEMM per owner, accumulating)
  // is not offered: the fp8 GEMM has no accumulating epilogue.
  LaunchInfo run(const __nv_fp8_e4m3* A, const __nv_fp8_e4m3* B, const float* scale_a, const float* scale_b,
                 bf16* out, int M, int N, int K, const Options& o = {}, cudaStream_t s = nullptr);
  static size_t out_elems(int M, int N, int W) { return size_t(shard(M, W, 0).size) * N; }
  // The adaptive split's statistics for M x N x K (zeros before its first v6 call); waits for the
  // device (a copy from it).
  AdaptiveStats adaptive_stats(int M, int N, int K) const;

 private:
  LaunchInfo run_inputs(const Inputs& in, bf16* out, int M, int N, int K, const Options& o, cudaStream_t s);
  LaunchInfo launch(const Inputs& in, bf16* out, int M, int N, int K, RsVariant variant, int ncomm, cudaStream_t s);
  void launch_shard_gemms(const Inputs& in, bf16* out, int M, int N, int K, cudaStream_t s);
  void launch_copy_engine(const Inputs& in, bf16* out, int M, int N, int K, cudaStream_t s);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::tp
