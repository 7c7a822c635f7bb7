// GEMM + all-reduce (README.md): out = sum over ranks of A_q * B_q on every rank.
#pragma once
#include <memory>

#include "tp_common/host.hpp"

namespace weave::tp {


class GemmAR {
 public:
  explicit GemmAR(runtime::Communicator& c);
  ~GemmAR();
  GemmAR(const GemmAR&) = delete;
  GemmAR& operator=(const GemmAR&) = delete;

  // Collective. A: M x K, B: K x N row-major or N x K with Options::b = NK (any device memory);
  // out: symmetric M x N, receives
  // the sum (also the kernel's staging buffer: its previous contents do not matter).
  // Options::variant (ArVariant, tp_common/variants.hpp): 0 InterSm (communicator SMs reduce;
  // bit-identical on every rank), 1 IntraSm (storers reduce-add into every peer; num_comm_sms = 0;
  // bf16 adds at the destination, so with W > 2 ranks may differ in the last bit), 2 Adaptive
  // (InterSm's reductions by blocks that choose their role at run time; num_comm_sms = 0;
  // bit-identical on every rank; never the tuner's own pick); -1 with num_comm_sms < 0: tuner.
  LaunchInfo run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, const Options& o = {},
                 cudaStream_t s = nullptr);
  static std::vector<int> comm_sms_candidates(int M, int N, int W, int sm_count);
  // The adaptive split's statistics for M x N x K (zeros before its first v2 call); waits for the
  // device (a copy from it).
  AdaptiveStats adaptive_stats(int M, int N, int K) const;

 private:
  LaunchInfo launch(const bf16* A, const bf16* B, gemm::BLayout bl, bf16* out, int M, int N, int K, int ncomm,
                    ArVariant variant, cudaStream_t s);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::tp
