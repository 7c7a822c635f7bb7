// The calls weave._C makes into the kernels, with device pointers and streams as integers (the
// Python package passes tensor.data_ptr() and torch.cuda.current_stream().cuda_stream). Compiled
// by nvcc (ops.cu: the kernels' headers include device code); module.cpp binds it with pybind11.
// Every entry first makes `device` this thread's current device in weave's CUDA runtime (weave
// links its own, static, runtime: torch's current device is not weave's).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weave/runtime/communicator.hpp"

namespace weave::py {

using Ptr = std::uintptr_t;

// Element types as the package names them (weave::DType's numbers).
enum class Dt : int { bf16 = 0, fp16 = 1, fp32 = 2 };

void set_device(int device);

// Single GPU, bf16 inputs (gemm::gemm). C (M x N) = A * B (+ bias), or C += that (accumulate).
// A M x K row-major (a_km = false) or K x M row-major (a_km = true: dY of a weight gradient
// dY^T X; M % 8 == 0). B K x N row-major (b_nk = false) or N x K row-major (b_nk = true: an
// nn.Linear weight). bias: 0 or N values of bias_type (gemm::BiasType: 0 none, 1 bf16, 2 fp32).
// C bf16, or fp32 with out_f32.
void gemm(int device, Ptr A, Ptr B, Ptr C, int M, int N, int K, bool b_nk, Ptr stream, bool a_km = false,
          Ptr bias = 0, int bias_type = 0, bool out_f32 = false, bool accumulate = false);

// Single GPU fp8 (gemm_fp8::gemm / gemm_block_scaled): C (M x N bf16) = A (M x K) * B^T with B
// N x K row-major; a_type / b_type gemm_fp8::Fp8 (0 e4m3, 1 e5m2); scales device pointers to
// fp32 (per-tensor: one float each; block_scaled: the documented ceil(K/128) x M and
// ceil(N/128) x ceil(K/128) arrays).
void gemm_fp8(int device, Ptr A, int a_type, Ptr B, int b_type, Ptr C, int M, int N, int K, Ptr scale_a,
              Ptr scale_b, bool block_scaled, Ptr stream);
// Floats of the block scales (gemm_fp8::block_scale_a_count / _b_count).
long long fp8_block_scale_a_count(int M, int K);
long long fp8_block_scale_b_count(int N, int K);

// The MoE grouped GEMM (moe::grouped_gemm): Y[rows of e] = X[rows of e] * W[e]^T (w_kn: W[e]).
// X R_cap x K, W E x N x K (E x K x N with w_kn), Y R_cap x N, bf16; counts E int32 on the device.
void grouped_gemm(int device, Ptr X, Ptr W, Ptr Y, Ptr counts, int E, int N, int K, int R_cap, bool w_kn,
                  Ptr stream);
// moe::take_status of `device`'s own status words (synchronises `stream`, clears them).
struct GroupedStatus {
  int error = 0, expert = -1, count = 0, rows = 0, capacity = 0;
  std::string message;
};
GroupedStatus grouped_gemm_status(int device, Ptr stream);
// Expert-parallel MoE (kernels/moe): layout.hpp's receive_capacity and worst_case_rows.
long long moe_receive_capacity(int T, int k, int world, int experts, double slack);
long long moe_worst_case_rows(int T, int k, int world, int experts);

// One MoE object on a communicator, made and destroyed collectively (every rank, same arguments);
// every call is collective and runs on `stream`. Either a layer shape: the exchange
// (moe::MoeExchange), the layer's scratch (moe::MoeLayerScratch, F) and, with `fused`,
// moe::MoeGemmCombine; or (Moe::low_latency) the low-latency decode mode: moe::MoeLowLatency and,
// with F > 0, the decode forward's scratch. The same calls serve both (the comments say how).
struct MoeDispatched {
  // The grouped buffer (capacity x H bf16), the L counts and L + 1 offsets (int32): device memory
  // the exchange owns and the next dispatch overwrites (the same addresses at every call).
  // Low-latency: the receive buffer (L x S x H, expert l's rows from row l S), the L counts,
  // offsets 0 (expert l's region starts at l S).
  Ptr rows = 0, counts = 0, offsets = 0;
};
class Moe {
 public:
  Moe(runtime::Communicator& c, int experts, int hidden, int ffn, int topk, int max_tokens, int capacity, bool fused,
      bool output_buffer);
  // The low-latency mode (kernels/moe/low_latency.hpp; max_tokens <= 256): moe::MoeLowLatency of
  // (E, H, k, max_tokens) and, with ffn > 0 (a multiple of 8), the decode forward's scratch, L S
  // (3F + H) bf16 of cudaMalloc (S = row_stride = W max_tokens): the up projection's output, SwiGLU's
  // and the down projection's in the fixed-stride layout.
  static std::unique_ptr<Moe> low_latency(runtime::Communicator& c, int experts, int hidden, int ffn, int topk,
                                          int max_tokens);
  ~Moe();
  Moe(const Moe&) = delete;
  Moe& operator=(const Moe&) = delete;

  // moe_layer_forward_fused (fused) or moe_layer_forward: x T x H bf16, idx T x k int32, w T x k
  // fp32, W_up L x 2F x H, W_down L x H x F bf16, out T x H bf16. Low-latency: the decode forward,
  // moe_low_latency_forward (kernels/moe/layer.hpp), on the same arguments.
  void forward(Ptr x, Ptr idx, Ptr w, int T, Ptr W_up, Ptr W_down, Ptr out, Ptr stream);
  // MoeExchange::dispatch / combine / check, or MoeLowLatency's (y then L x S x H bf16, any device
  // memory of this rank; dispatch and combine alternate).
  MoeDispatched dispatch(Ptr x, Ptr idx, int T, Ptr stream);
  void combine(Ptr y, Ptr w, Ptr out, int T, Ptr stream);
  void check(Ptr stream);
  Ptr expert_input() const;   // capacity x H bf16, symmetric; low-latency: the receive buffer, L x S x H
  Ptr expert_output() const;  // capacity x H bf16, symmetric; 0 without output_buffer (and low-latency)
  int row_stride() const;     // low-latency: S = W x max_tokens; a layer: 0

 private:
  struct Impl;
  explicit Moe(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

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

  // The kernel objects, made at their family's first call; making one is collective (signal sets,
  // scratch). prepare() makes it ahead of a call's argument rules, so that every rank has taken
  // those steps whether or not its own arguments pass (a rank that fails its rules meets its peers
  // at their next agreement, not in this object's construction).
  enum class Family { collectives, ag_gemm, gemm_rs, gemm_ar, ring, ulysses };
  void prepare(Family f);

  // Collectives (coll::Collectives): in and out in the symmetric heap, except where *_local says
  // the call's algorithm (out of place) reaches them from this rank only. shape: 1-4 dims.
  bool all_reduce_local(long long count, Dt t, bool aligned4);
  bool shard_local(bool gather, const std::vector<long long>& full, int dim, Dt t, bool aligned4);
  void all_reduce(Ptr in, Ptr out, long long count, Dt t, Ptr stream);
  void all_gather(Ptr in, Ptr out, const std::vector<long long>& full, int dim, Dt t, Ptr stream);
  void reduce_scatter(Ptr in, Ptr out, const std::vector<long long>& full, int dim, Dt t, Ptr stream);
  void all_to_all(Ptr in, Ptr out, long long B, long long S, long long H, long long D, Dt t, bool seq_to_head,
                  Ptr stream);

  // Tensor parallel (bf16, B K x N row-major, or N x K row-major with b_nk: an nn.Linear weight).
  // ag_gemm: a_gathered symmetric (M x K); gemm_rs: out symmetric (gemm_rs_out_elems); gemm_ar:
  // out symmetric (M x N). num_comm_sms and variant < 0: the tuner picks (tp::Options).
  void ag_gemm(Ptr a_shard, Ptr a_gathered, Ptr B, Ptr C, int M, int N, int K, Ptr stream, int num_comm_sms = -1,
               int variant = -1, bool b_nk = false);
  void gemm_rs(Ptr A, Ptr B, Ptr out, int M, int N, int K, Ptr stream, int num_comm_sms = -1, int variant = -1,
               bool b_nk = false);
  void gemm_ar(Ptr A, Ptr B, Ptr out, int M, int N, int K, Ptr stream, int num_comm_sms = -1, int variant = -1,
               bool b_nk = false);
  static long long gemm_rs_out_elems(int M, int N, int world);
  // fp8 (e4m3) with per-tensor scales (device pointers to one float each) and a bf16 output; B N x K
  // row-major (tp::AgGemm / tp::GemmRS's fp8 run): ag_gemm_fp8's scale_a is the whole gathered A's
  // (the same on every rank), gemm_rs_fp8's each rank's own. a_gathered (M x K fp8) and out
  // (gemm_rs_out_elems bf16) symmetric, as above.
  void ag_gemm_fp8(Ptr a_shard, Ptr a_gathered, Ptr B, Ptr scale_a, Ptr scale_b, Ptr C, int M, int N, int K,
                   Ptr stream, int num_comm_sms = -1, int variant = -1);
  void gemm_rs_fp8(Ptr A, Ptr B, Ptr scale_a, Ptr scale_b, Ptr out, int M, int N, int K, Ptr stream,
                   int num_comm_sms = -1, int variant = -1);

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
