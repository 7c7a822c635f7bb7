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

  // Collective. A: M x K (this rank's K slice of the activations), B: K x N row-major, both any
  // device memory; out: symmetric (heap or registered) with room for out_elems(M, N, W) elements;
  // receives this rank's rows (shard(M, W, rank).size x N, row-major). The output is overwritten,
  // never accumulated: nothing is assumed about its previous contents. Options::variant: 0 =
  // owner first, 1 = zero first (README.md), -1 = the tuner picks; num_comm_sms must be <= 0.
  LaunchInfo run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, const Options& o = {},
                 cudaStream_t s = nullptr);
  static size_t out_elems(int M, int N, int W) { return size_t(shard(M, W, 0).size) * N; }

 private:
  LaunchInfo launch(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, int variant, cudaStream_t s);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::tp
