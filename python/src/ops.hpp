// The calls weave._C makes into the kernels, with device pointers and streams as integers (the
// Python package passes tensor.data_ptr() and torch.cuda.current_stream().cuda_stream). Compiled
// by nvcc (ops.cu: the kernels' headers include device code); module.cpp binds it with pybind11.
// Every entry first makes `device` this thread's current device in weave's CUDA runtime (weave
// links its own, static, runtime: torch's current device is not weave's).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "weave/runtime/communicator.hpp"

namespace weave::py {

using Ptr = std::uintptr_t;

// Element types as the package names them (weave::DType's numbers).
enum class Dt : int { bf16 = 0, fp16 = 1, fp32 = 2 };

void set_device(int device);

// Single GPU, bf16. C (M x N) = A (M x K) * B, B K x N row-major (b_nk = false) or N x K row-major
// (b_nk = true: an nn.Linear weight).
void gemm(int device, Ptr A, Ptr B, Ptr C, int M, int N, int K, bool b_nk, Ptr stream);
// q (B, S, Hq, D), k and v (B, S, Hkv, D), o (B, S, Hq, D) bf16; lse (B, Hq, S) fp32 or 0.
void attention(int device, Ptr q, Ptr k, Ptr v, Ptr o, Ptr lse, int B, int S, int Hq, int Hkv, int D, bool causal,
               float scale, Ptr stream);

// Pure shape rules (the package's fake implementations use them, so shapes never drift).
struct Rows {
  long long begin, size;
};
Rows shard(long long n, int world, int rank);                                   // coll::shard
long long ring_local_rows(long long S, int world, bool zigzag, int rank);      // sp::local_rows
Rows ring_chunk(long long S, int world, bool zigzag, int rank, int i);          // sp::chunk_range
int ring_chunks_per_rank(bool zigzag);
Rows ulysses_rows(long long S, int world, int rank);                            // sp::ulysses_shard

// The collective kernels of one communicator, each made (collectively) at its first call.
class Ops {
 public:
  explicit Ops(runtime::Communicator& c);
  ~Ops();
  Ops(const Ops&) = delete;
  Ops& operator=(const Ops&) = delete;

  // Collectives (coll::Collectives): in and out in the symmetric heap. shape: 1-4 dims.
  void all_reduce(Ptr in, Ptr out, long long count, Dt t, Ptr stream);
  void all_gather(Ptr in, Ptr out, const std::vector<long long>& full, int dim, Dt t, Ptr stream);
  void reduce_scatter(Ptr in, Ptr out, const std::vector<long long>& full, int dim, Dt t, Ptr stream);
  void all_to_all(Ptr in, Ptr out, long long B, long long S, long long H, long long D, Dt t, bool seq_to_head,
                  Ptr stream);

  // Tensor parallel (bf16, B K x N row-major). ag_gemm: a_gathered symmetric (M x K); gemm_rs:
  // out symmetric (gemm_rs_out_elems); gemm_ar: out symmetric (M x N). num_comm_sms and
  // variant < 0: the tuner picks (tp::Options).
  void ag_gemm(Ptr a_shard, Ptr a_gathered, Ptr B, Ptr C, int M, int N, int K, Ptr stream, int num_comm_sms = -1,
               int variant = -1);
  void gemm_rs(Ptr A, Ptr B, Ptr out, int M, int N, int K, Ptr stream, int num_comm_sms = -1, int variant = -1);
  void gemm_ar(Ptr A, Ptr B, Ptr out, int M, int N, int K, Ptr stream, int num_comm_sms = -1, int variant = -1);
  static long long gemm_rs_out_elems(int M, int N, int world);

  // Sequence parallel (bf16). ring: everything local; ulysses: o symmetric with room for
  // ulysses_out_elems.
  void ring_attention(Ptr q, Ptr k, Ptr v, Ptr o, Ptr lse, int B, long long S, int Hq, int Hkv, int D, bool causal,
                      float scale, bool zigzag, Ptr stream);
  void ulysses_attention(Ptr q, Ptr k, Ptr v, Ptr o, int B, long long S, int Hq, int Hkv, int D, bool causal,
                         float scale, Ptr stream);
  static long long ulysses_out_elems(int B, long long S, int Hq, int D, int world);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::py
