// The operators' argument rules and output shapes, in one place: the CUDA kernels (torch_ops.cpp)
// check the real tensors with them and the package's fake implementations (weave/_ops.py, what
// torch.compile traces) call them through weave._C on the traced tensors' shapes. No torch here: a
// tensor is described by a Spec. A broken rule throws ArgError ("weave.<op>: ..."), which Python
// sees as ValueError.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace weave::py::plan {

struct ArgError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Element types the rules name; `other` is any dtype no operator takes (its name is kept for messages).
enum class Dtype : int { bf16, fp16, fp32, e4m3, e5m2, i32, other };

// What the rules read of a tensor. dtype_name and device are torch's spellings ("torch.bfloat16",
// "cuda:0"), so messages read as they would in Python.
struct Spec {
  std::vector<int64_t> sizes, strides;
  Dtype dtype = Dtype::other;
  std::string dtype_name, device;

  int64_t dim() const { return static_cast<int64_t>(sizes.size()); }
  int64_t numel() const;
  bool contiguous() const;  // torch's rule: sizes of 1 skipped, an empty tensor always contiguous
  Spec transposed() const;  // .t() of a 2-D spec
  Spec moved_to_front(int64_t d) const;  // .movedim(d, 0)
};

Dtype dtype_from_name(const std::string& torch_name);  // "torch.bfloat16" -> bf16, unknown -> other
const char* torch_name(Dtype d);                        // bf16 -> "torch.bfloat16" (other: "?")

using Shape = std::vector<int64_t>;

// Collectives: bf16, fp16 or fp32, contiguous.
struct ShardPlan {
  Shape out;                     // the output's shape
  int64_t dim = 0;               // the normalized dimension
  std::vector<long long> full;   // the C++ shape (before, along, after dim; sizes of 1 dropped)
  int cdim = 0;                  // dim in `full`
};
void all_reduce(const Spec& x);
ShardPlan all_gather(const Spec& x, int64_t dim, int64_t full_size, int rank, int world);
ShardPlan reduce_scatter(const Spec& x, int64_t dim, int rank, int world);
struct AllToAllPlan {
  Shape out;
  int64_t S = 0, H = 0;  // the whole sequence and the heads of the (B, S, H, D) layout
  bool seq_to_head = true;
};
AllToAllPlan all_to_all(const Spec& x, const std::string& direction, int64_t seq_len, int rank, int world);

// Tensor parallel (bf16, and fp8 below).
struct AgGemmPlan {
  Shape gathered;         // the gathered A, gather_dim moved to the front
  int64_t dim = 0;        // gather_dim, normalized
  std::vector<bool> nks;  // Bs[i] is the transpose of a contiguous N x K matrix
};
AgGemmPlan all_gather_matmul(const Spec& A, const std::vector<Spec>& Bs, int64_t gather_dim, int world);
struct GemmRsPlan {
  Shape out;  // this rank's output, scatter_dim moved to the front
  int64_t dim = 0;
  bool nk = false;
};
GemmRsPlan matmul_reduce_scatter(const Spec& A, const Spec& B, const std::string& reduce_op, int64_t scatter_dim,
                                 int rank, int world);
// fp8 (e4m3, per-tensor scales: one fp32 value each, on the device) with a bf16 output: Bs / B the
// transpose of a contiguous N x K matrix, K % 16 == 0, N % 8 == 0; out_dtype nullopt or bf16.
AgGemmPlan all_gather_scaled_matmul(const Spec& A, const std::vector<Spec>& Bs, const Spec& A_scale,
                                    const std::vector<Spec>& B_scales, int64_t gather_dim, int world,
                                    std::optional<Dtype> out_dtype, const std::string& out_dtype_name = "");
GemmRsPlan scaled_matmul_reduce_scatter(const Spec& A, const Spec& B, const Spec& A_scale, const Spec& B_scale,
                                        const std::string& reduce_op, int64_t scatter_dim, int rank, int world,
                                        std::optional<Dtype> out_dtype, const std::string& out_dtype_name = "");
struct GemmArPlan {
  Shape out;
  bool nk = false;
};
GemmArPlan matmul_all_reduce(const Spec& A, const Spec& B);

// Single GPU.
struct MatmulPlan {
  Shape out;
  bool km = false, nk = false;  // A is K x M transposed; B is N x K transposed
  int bias_type = 0;            // gemm::BiasType: 0 none, 1 bf16, 2 fp32
  bool f32 = false;             // fp32 output
};
// out_dtype: nullopt (bf16), bf16 or fp32.
MatmulPlan matmul(const Spec& A, const Spec& B, const std::optional<Spec>& bias, std::optional<Dtype> out_dtype,
                  const std::string& out_dtype_name = "", const char* op = "matmul");
MatmulPlan matmul_out(const Spec& A, const Spec& B, const std::optional<Spec>& bias, const Spec& out);
struct ScaledMmPlan {
  int64_t M = 0, N = 0, K = 0;
  bool block = false;
};
ScaledMmPlan scaled_mm(const Spec& A, const Spec& B, const Spec& scale_a, const Spec& scale_b,
                       std::optional<Dtype> out_dtype, const std::string& out_dtype_name = "");
struct GroupedPlan {
  int64_t cap = 0, E = 0, N = 0, K = 0;
  bool kn = false;  // w stored E x K x N
};
GroupedPlan grouped_mm(const Spec& x, const Spec& w, const Spec& counts, int64_t capacity_rows);
struct AttentionPlan {
  int64_t B = 0, L = 0, Hq = 0, Hkv = 0, D = 0;
};
AttentionPlan attention(const char* op, const Spec& q, const Spec& k, const Spec& v);
// The whole sequence of a sequence-parallel call, checked against this rank's rows.
int64_t ring_seq(const Spec& q, const std::string& sharding, int64_t seq_len, int rank, int world);
int64_t ulysses_seq(const Spec& q, int64_t seq_len, int rank, int world);

// The MoE layer (weave.MoeLayer, moe.py; its kernel is Python): the layer's sizes as it was made.
struct MoeSizes {
  int64_t hidden = 0, ffn = 0, topk = 0, local_experts = 0, max_tokens = 0, capacity = 0;
};
// dispatch and forward's tokens (x T x H bf16, topk_idx T x k int32): returns T.
int64_t moe_tokens(const char* op, const MoeSizes& m, const Spec& x, const Spec& topk_idx);
// topk_weights: T x k fp32.
void moe_weights(const char* op, const MoeSizes& m, const Spec& topk_weights, int64_t T);
// forward: the above, the experts' weights (w_up L x 2F x H, w_down L x H x F, bf16) on x's device.
int64_t moe_forward(const MoeSizes& m, const Spec& x, const Spec& topk_idx, const Spec& topk_weights, const Spec& w_up,
                    const Spec& w_down);
// combine's expert output rows y: capacity x H bf16.
void moe_expert_rows(const char* op, const MoeSizes& m, const Spec& y);

// Shared rule pieces.
[[noreturn]] void fail(const std::string& op, const std::string& msg);
std::string shape_str(const Shape& s);  // Python's tuple: (3,) or (2, 4)

}  // namespace weave::py::plan
