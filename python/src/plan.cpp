#include "plan.hpp"

#include <string>

#include "ops.hpp"

namespace weave::py::plan {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

void check_dtype(const char* op, const std::string& name, const Spec& t, std::initializer_list<Dtype> allowed) {
  for (Dtype d : allowed)
    if (t.dtype == d) return;
  std::string list;
  for (Dtype d : allowed) list += (list.empty() ? "" : ", ") + std::string(torch_name(d));
  fail(op, name + " has dtype " + t.dtype_name + "; weave takes " + list + " here");
}

void check_contiguous(const char* op, const std::string& name, const Spec& t) {
  if (!t.contiguous())
    fail(op, name + " is not contiguous (shape " + shape_str(t.sizes) + ", strides " + shape_str(t.strides) +
                 "); pass " + name + ".contiguous() (one copy)");
}

void check_ndim(const char* op, const std::string& name, const Spec& t, int64_t ndim) {
  if (t.dim() != ndim) fail(op, name + " must have " + str(ndim) + " dimensions, got shape " + shape_str(t.sizes));
}

int64_t norm_dim(const char* op, int64_t dim, int64_t ndim) {
  if (!(-ndim <= dim && dim < ndim)) fail(op, "dim " + str(dim) + " is out of range for " + str(ndim) + " dimensions");
  return ((dim % ndim) + ndim) % ndim;
}

int64_t shard_rows(int64_t n, int world, int rank) { return weave::py::shard(n, world, rank).size; }

// t.movedim(dim, 0), which must be contiguous (symm_mem's convention: rows along dim).
Spec moved(const char* op, const std::string& name, const Spec& t, int64_t dim) {
  Spec m = dim ? t.moved_to_front(dim) : t;
  if (!m.contiguous()) {
    const std::string d = str(dim);
    fail(op, name + ".movedim(" + d + ", 0) is not contiguous (shape " + shape_str(t.sizes) + ", strides " +
                 shape_str(t.strides) + "); lay " + name + " out with dim " + d + " outermost, e.g. " + name +
                 ".movedim(" + d + ", 0).contiguous().movedim(0, " + d + ") (one copy)");
  }
  return m;
}

// Whether B (K x N) is the transpose of a contiguous N x K matrix (true), or contiguous (false).
bool b_layout(const char* op, const std::string& name, const Spec& B, int64_t K) {
  check_dtype(op, name, B, {Dtype::bf16});
  check_ndim(op, name, B, 2);
  if (K < 1 || B.sizes[1] < 1)
    fail(op, "A has K = " + str(K) + " columns and " + name + " N = " + str(B.sizes[1]) + "; both must be positive");
  if (B.sizes[0] != K) fail(op, name + " has " + str(B.sizes[0]) + " rows but A has K = " + str(K) + " columns");
  if (B.contiguous()) return false;
  if (B.transposed().contiguous()) return true;
  fail(op, name + " is neither contiguous (K x N) nor the transpose of a contiguous N x K matrix (strides " +
               shape_str(B.strides) + "); pass " + name + ".contiguous() (one copy)");
}

// Every given tensor on ref's device (the kernels read them all there; a host scale or count would
// be read through a host pointer on the device).
void check_device(const char* op, const Spec& ref, const std::string& name, const Spec* t) {
  if (t && t->device != ref.device) fail(op, name + " is on " + t->device + " but the other operands are on " + ref.device);
}

void check_collective(const char* op, const Spec& x) {
  check_dtype(op, "x", x, {Dtype::bf16, Dtype::fp16, Dtype::fp32});
  check_contiguous(op, "x", x);
}

// The C++ shape (at most 3 dims: before, along, after `dim`, sizes of 1 dropped) and its dim. A
// size of 0 stays: the tensor is empty, and so must the collective be.
void collapse(const Shape& shape, int64_t dim, ShardPlan& p) {
  long long before = 1, after = 1;
  for (int64_t i = 0; i < dim; ++i) before *= shape[i];
  for (size_t i = dim + 1; i < shape.size(); ++i) after *= shape[i];
  p.full.clear();
  if (before != 1) p.full.push_back(before);
  p.full.push_back(shape[dim]);
  if (after != 1) p.full.push_back(after);
  p.cdim = before != 1 ? 1 : 0;
}

// An fp32 scale tensor: one value (shape empty) or exactly `shape`, contiguous.
void check_scale(const char* op, const std::string& name, const Spec& s, const Shape* shape) {
  check_dtype(op, name, s, {Dtype::fp32});
  if (!shape) {
    if (s.numel() != 1 || s.dim() > 1)
      fail(op, name + " must be one fp32 value (shape () or (1,)) for per-tensor scaling, got shape " +
                   shape_str(s.sizes));
  } else if (s.sizes != *shape) {
    fail(op, name + " has shape " + shape_str(s.sizes) + "; block scaling needs " + shape_str(*shape) +
                 " (gemm_fp8.hpp's layout)");
  }
  check_contiguous(op, name, s);
}

}  // namespace

void fail(const std::string& op, const std::string& msg) { throw ArgError("weave." + op + ": " + msg); }

const char* torch_name(Dtype d) {
  switch (d) {
    case Dtype::bf16: return "torch.bfloat16";
    case Dtype::fp16: return "torch.float16";
    case Dtype::fp32: return "torch.float32";
    case Dtype::e4m3: return "torch.float8_e4m3fn";
    case Dtype::e5m2: return "torch.float8_e5m2";
    case Dtype::i32: return "torch.int32";
    default: return "?";
  }
}

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + str(s[i]);
  return r + (s.size() == 1 ? ",)" : ")");
}

int64_t Spec::numel() const {
  int64_t n = 1;
  for (int64_t d : sizes) n *= d;
  return n;
}

bool Spec::contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

Spec Spec::transposed() const {
  Spec t = *this;
  std::swap(t.sizes[0], t.sizes[1]);
  std::swap(t.strides[0], t.strides[1]);
  return t;
}

Spec Spec::moved_to_front(int64_t d) const {
  Spec t = *this;
  t.sizes.erase(t.sizes.begin() + d);
  t.strides.erase(t.strides.begin() + d);
  t.sizes.insert(t.sizes.begin(), sizes[d]);
  t.strides.insert(t.strides.begin(), strides[d]);
  return t;
}

Dtype dtype_from_name(const std::string& n) {
  for (Dtype d : {Dtype::bf16, Dtype::fp16, Dtype::fp32, Dtype::e4m3, Dtype::e5m2, Dtype::i32})
    if (n == torch_name(d)) return d;
  return Dtype::other;
}

void all_reduce(const Spec& x) { check_collective("all_reduce", x); }

ShardPlan all_gather(const Spec& x, int64_t dim, int64_t full_size, int rank, int world) {
  const char* op = "all_gather";
  check_collective(op, x);
  if (x.dim() == 0) fail(op, "x is a scalar");
  ShardPlan p;
  p.dim = norm_dim(op, dim, x.dim());
  const int64_t full = full_size < 0 ? world * x.sizes[p.dim] : full_size;
  const int64_t mine = shard_rows(full, world, rank);
  if (mine != x.sizes[p.dim])
    fail(op, "x has " + str(x.sizes[p.dim]) + " entries along dim " + str(p.dim) + ", but rank " + str(rank) +
                 "'s share of " + str(full) + " over " + str(world) + " ranks is " + str(mine));
  p.out = x.sizes;
  p.out[p.dim] = full;
  collapse(p.out, p.dim, p);
  return p;
}

ShardPlan reduce_scatter(const Spec& x, int64_t dim, int rank, int world) {
  const char* op = "reduce_scatter";
  check_collective(op, x);
  if (x.dim() == 0) fail(op, "x is a scalar");
  ShardPlan p;
  p.dim = norm_dim(op, dim, x.dim());
  p.out = x.sizes;
  p.out[p.dim] = shard_rows(x.sizes[p.dim], world, rank);
  collapse(x.sizes, p.dim, p);
  return p;
}

AllToAllPlan all_to_all(const Spec& x, const std::string& direction, int64_t seq_len, int rank, int world) {
  const char* op = "all_to_all";
  check_collective(op, x);
  check_ndim(op, "x", x, 4);
  if (direction != "seq_to_head" && direction != "head_to_seq")
    fail(op, "direction must be 'seq_to_head' or 'head_to_seq', got '" + direction + "'");
  const int64_t B = x.sizes[0], L = x.sizes[1], H = x.sizes[2], D = x.sizes[3];
  AllToAllPlan p;
  p.seq_to_head = direction == "seq_to_head";
  if (p.seq_to_head) {  // (B, S/W, H, D) -> (B, S, H/W, D)
    const int64_t S = seq_len < 0 ? world * L : seq_len;
    const int64_t mine = shard_rows(S, world, rank);
    if (mine != L)
      fail(op, "x holds " + str(L) + " sequence rows, but rank " + str(rank) + "'s share of " + str(S) + " over " +
                   str(world) + " ranks is " + str(mine) + " (pass seq_len)");
    if (H % world) fail(op, str(H) + " heads do not divide among " + str(world) + " ranks");
    p.out = {B, S, H / world, D};
    p.S = S;
    p.H = H;
    return p;
  }
  if (seq_len >= 0 && seq_len != L)
    fail(op, "head_to_seq: x holds the whole sequence (" + str(L) + " rows) but seq_len = " + str(seq_len));
  p.out = {B, shard_rows(L, world, rank), H * world, D};
  p.S = L;
  p.H = H * world;
  return p;
}

namespace {

// all_gather_matmul's rules on A_shard (dtype checked by the caller) and the B layouts `b_rule`
// gives (name, B, K -> nk).
template <class BRule>
AgGemmPlan ag_rows(const char* op, const Spec& A, const std::vector<Spec>& Bs, int64_t gather_dim, int world,
                   BRule&& b_rule) {
  if (A.dim() < 2) fail(op, "A_shard must have at least 2 dimensions, got shape " + shape_str(A.sizes));
  if (Bs.empty()) fail(op, "Bs is empty");
  AgGemmPlan p;
  p.dim = norm_dim(op, gather_dim, A.dim());
  if (p.dim == A.dim() - 1) fail(op, "gathering along the last (K) dimension is not supported; weave gathers rows");
  const Spec m = moved(op, "A_shard", A, p.dim);
  const int64_t K = A.sizes.back();
  for (size_t i = 0; i < Bs.size(); ++i) p.nks.push_back(b_rule("Bs[" + std::to_string(i) + "]", Bs[i], K));
  p.gathered = m.sizes;
  p.gathered[0] *= world;
  return p;
}

// The fp8 TP operators' B: e4m3, the transpose of a contiguous N x K matrix (the only layout the
// fp8 GEMM reads), N a multiple of 8; K a multiple of 16.
bool fp8_weight(const char* op, const std::string& name, const Spec& B, int64_t K) {
  check_dtype(op, name, B, {Dtype::e4m3});
  check_ndim(op, name, B, 2);
  if (B.sizes[0] != K) fail(op, name + " has " + str(B.sizes[0]) + " rows but A has K = " + str(K) + " columns");
  if (K < 16 || K % 16) fail(op, "K = " + str(K) + " must be a positive multiple of 16 (16-byte rows of fp8)");
  if (B.sizes[1] < 8 || B.sizes[1] % 8)
    fail(op, name + " has N = " + str(B.sizes[1]) + "; it must be a positive multiple of 8 (16-byte rows of the bf16 output)");
  if (!B.transposed().contiguous())
    fail(op, name + " (K x N) must be the transpose of a contiguous N x K matrix (column-major, like "
                    "torch._scaled_mm's mat2: pass w.t() of an N x K w), got strides " + shape_str(B.strides));
  return true;
}

void check_out_bf16(const char* op, std::optional<Dtype> out_dtype, const std::string& name) {
  if (out_dtype && *out_dtype != Dtype::bf16) fail(op, "out_dtype " + name + ": weave's fp8 GEMM writes torch.bfloat16 only");
}

}  // namespace

AgGemmPlan all_gather_matmul(const Spec& A, const std::vector<Spec>& Bs, int64_t gather_dim, int world) {
  const char* op = "all_gather_matmul";
  check_dtype(op, "A_shard", A, {Dtype::bf16});
  return ag_rows(op, A, Bs, gather_dim, world,
                 [&](const std::string& name, const Spec& B, int64_t K) { return b_layout(op, name, B, K); });
}

AgGemmPlan all_gather_scaled_matmul(const Spec& A, const std::vector<Spec>& Bs, const Spec& A_scale,
                                    const std::vector<Spec>& B_scales, int64_t gather_dim, int world,
                                    std::optional<Dtype> out_dtype, const std::string& out_dtype_name) {
  const char* op = "all_gather_scaled_matmul";
  check_dtype(op, "A_shard", A, {Dtype::e4m3});
  AgGemmPlan p = ag_rows(op, A, Bs, gather_dim, world,
                         [&](const std::string& name, const Spec& B, int64_t K) { return fp8_weight(op, name, B, K); });
  if (B_scales.size() != Bs.size())
    fail(op, "B_scales has " + str(int64_t(B_scales.size())) + " scales for " + str(int64_t(Bs.size())) + " Bs");
  check_scale(op, "A_scale", A_scale, nullptr);
  check_device(op, A, "A_scale", &A_scale);
  for (size_t i = 0; i < Bs.size(); ++i) {
    const std::string n = "B_scales[" + std::to_string(i) + "]";
    check_scale(op, n, B_scales[i], nullptr);
    check_device(op, A, "Bs[" + std::to_string(i) + "]", &Bs[i]);
    check_device(op, A, n, &B_scales[i]);
  }
  check_out_bf16(op, out_dtype, out_dtype_name);
  return p;
}

namespace {

// matmul_reduce_scatter's rules on A (dtype checked by the caller) and B (`b_rule`: B, K -> nk).
template <class BRule>
GemmRsPlan rs_rows(const char* op, const Spec& A, const Spec& B, const std::string& reduce_op, int64_t scatter_dim,
                   int rank, int world, BRule&& b_rule) {
  if (A.dim() < 2) fail(op, "A must have at least 2 dimensions, got shape " + shape_str(A.sizes));
  if (reduce_op != "sum" && reduce_op != "avg") fail(op, "reduce_op must be 'sum' or 'avg', got '" + reduce_op + "'");
  GemmRsPlan p;
  p.dim = norm_dim(op, scatter_dim, A.dim());
  if (p.dim == A.dim() - 1) fail(op, "scattering along the last dimension is not supported; weave scatters rows");
  const Spec m = moved(op, "A", A, p.dim);
  const int64_t K = A.sizes.back();
  p.nk = b_rule(B, K);
  const int64_t d0 = m.sizes[0];
  const int64_t rest = d0 * K > 0 ? m.numel() / (d0 * K) : m.numel();
  if (rest > 1 && d0 % world)  // weave splits flattened rows: dim 0's split must keep rows whole
    fail(op, "the split dimension has " + str(d0) + " entries, not a multiple of the " + str(world) +
                 " ranks, and the rows it holds are " + str(rest) +
                 " wide; weave splits flattened rows, so this needs a multiple (or a 2-D operand)");
  p.out.push_back(shard_rows(d0, world, rank));
  for (int64_t i = 1; i + 1 < m.dim(); ++i) p.out.push_back(m.sizes[i]);
  p.out.push_back(B.sizes[1]);
  return p;
}

}  // namespace

GemmRsPlan matmul_reduce_scatter(const Spec& A, const Spec& B, const std::string& reduce_op, int64_t scatter_dim,
                                 int rank, int world) {
  const char* op = "matmul_reduce_scatter";
  check_dtype(op, "A", A, {Dtype::bf16});
  return rs_rows(op, A, B, reduce_op, scatter_dim, rank, world,
                 [&](const Spec& b, int64_t K) { return b_layout(op, "B", b, K); });
}

GemmRsPlan scaled_matmul_reduce_scatter(const Spec& A, const Spec& B, const Spec& A_scale, const Spec& B_scale,
                                        const std::string& reduce_op, int64_t scatter_dim, int rank, int world,
                                        std::optional<Dtype> out_dtype, const std::string& out_dtype_name) {
  const char* op = "scaled_matmul_reduce_scatter";
  check_dtype(op, "A", A, {Dtype::e4m3});
  GemmRsPlan p = rs_rows(op, A, B, reduce_op, scatter_dim, rank, world,
                         [&](const Spec& b, int64_t K) { return fp8_weight(op, "B", b, K); });
  check_scale(op, "A_scale", A_scale, nullptr);
  check_scale(op, "B_scale", B_scale, nullptr);
  check_device(op, A, "B", &B);
  check_device(op, A, "A_scale", &A_scale);
  check_device(op, A, "B_scale", &B_scale);
  check_out_bf16(op, out_dtype, out_dtype_name);
  return p;
}

GemmArPlan matmul_all_reduce(const Spec& A, const Spec& B) {
  const char* op = "matmul_all_reduce";
  check_dtype(op, "A", A, {Dtype::bf16});
  check_contiguous(op, "A", A);
  if (A.dim() < 1) fail(op, "A is a scalar");
  GemmArPlan p;
  p.nk = b_layout(op, "B", B, A.sizes.back());
  p.out.assign(A.sizes.begin(), A.sizes.end() - 1);
  p.out.push_back(B.sizes[1]);
  return p;
}

MatmulPlan matmul(const Spec& A, const Spec& B, const std::optional<Spec>& bias, std::optional<Dtype> out_dtype,
                  const std::string& out_dtype_name, const char* op) {
  check_dtype(op, "A", A, {Dtype::bf16});
  if (A.dim() < 1) fail(op, "A is a scalar");
  MatmulPlan p;
  // Contiguous wins where both hold (a single row or column): the layouts then read the same bytes.
  if (!A.contiguous()) {
    if (A.dim() == 2 && A.transposed().contiguous())
      p.km = true;
    else
      fail(op, "A is neither contiguous (M x K) nor the transpose of a contiguous K x M matrix (shape " +
                   shape_str(A.sizes) + ", strides " + shape_str(A.strides) + "); pass A.contiguous() (one copy)");
  }
  p.nk = b_layout(op, "B", B, A.sizes.back());
  const int64_t N = B.sizes[1];
  if (p.km && A.sizes[0] % 8)  // gemm::ALayout::KM: A's rows in memory are M long; TMA needs 16-byte pitches
    fail(op, "A given as the transpose of a contiguous K x M matrix needs M % 8 == 0, got M = " + str(A.sizes[0]) +
                 "; pass A.contiguous() (one copy)");
  if (bias) {
    check_dtype(op, "bias", *bias, {Dtype::bf16, Dtype::fp32});
    if (bias->dim() != 1 || bias->sizes[0] != N)
      fail(op, "bias must hold N = " + str(N) + " values (shape (" + str(N) + ",)), got shape " +
                   shape_str(bias->sizes));
    check_contiguous(op, "bias", *bias);
    p.bias_type = bias->dtype == Dtype::bf16 ? 1 : 2;
  }
  if (out_dtype && *out_dtype != Dtype::bf16 && *out_dtype != Dtype::fp32)
    fail(op, "out_dtype " + out_dtype_name + ": weave's GEMM writes torch.bfloat16 or torch.float32");
  check_device(op, A, "B", &B);
  check_device(op, A, "bias", bias ? &*bias : nullptr);
  p.out.assign(A.sizes.begin(), A.sizes.end() - 1);
  p.out.push_back(N);
  p.f32 = out_dtype && *out_dtype == Dtype::fp32;
  return p;
}

MatmulPlan matmul_out(const Spec& A, const Spec& B, const std::optional<Spec>& bias, const Spec& out) {
  const char* op = "matmul_out";
  check_dtype(op, "out", out, {Dtype::bf16, Dtype::fp32});
  MatmulPlan p = matmul(A, B, bias, out.dtype, out.dtype_name, op);
  if (out.sizes != p.out)
    fail(op, "out has shape " + shape_str(out.sizes) + ", A @ B has " + shape_str(p.out));
  check_contiguous(op, "out", out);
  check_device(op, A, "out", &out);
  return p;
}


ScaledMmPlan scaled_mm(const Spec& A, const Spec& B, const Spec& scale_a, const Spec& scale_b,
                       std::optional<Dtype> out_dtype, const std::string& out_dtype_name) {
  const char* op = "scaled_mm";
  for (auto [name, t] : {std::pair<const char*, const Spec*>{"A", &A}, {"B", &B}}) {
    if (t->dtype != Dtype::e4m3 && t->dtype != Dtype::e5m2)
      fail(op, std::string(name) + " has dtype " + t->dtype_name +
                   "; weave's fp8 GEMM takes torch.float8_e4m3fn or torch.float8_e5m2");
    check_ndim(op, name, *t, 2);
  }
  if (A.dtype == Dtype::e5m2 && B.dtype == Dtype::e5m2)
    fail(op, "A and B are both float8_e5m2; the supported pairs are e4m3 x e4m3, e5m2 x e4m3 and e4m3 x e5m2");
  check_contiguous(op, "A", A);
  ScaledMmPlan p;
  p.M = A.sizes[0];
  p.K = A.sizes[1];
  if (B.sizes[0] != p.K) fail(op, "B has " + str(B.sizes[0]) + " rows but A has K = " + str(p.K) + " columns");
  p.N = B.sizes[1];
  if (!B.transposed().contiguous())
    fail(op, "B (K x N) must be the transpose of a contiguous N x K matrix (column-major, like "
             "torch._scaled_mm's mat2: pass w.t() of an N x K w), got strides " + shape_str(B.strides));
  if (p.K < 16 || p.K % 16) fail(op, "K = " + str(p.K) + " must be a positive multiple of 16 (16-byte rows of fp8)");
  if (p.N < 8 || p.N % 8)
    fail(op, "N = " + str(p.N) + " must be a positive multiple of 8 (16-byte rows of the bf16 output)");
  if (out_dtype && *out_dtype != Dtype::bf16)
    fail(op, "out_dtype " + out_dtype_name + ": weave's fp8 GEMM writes torch.bfloat16 only");
  p.block = scale_a.dim() == 2 || scale_b.dim() == 2;
  if (p.block) {
    const int64_t kb = (p.K + 127) / 128;
    const Shape sa{kb, p.M}, sb{(p.N + 127) / 128, kb};
    check_scale(op, "scale_a", scale_a, &sa);
    check_scale(op, "scale_b", scale_b, &sb);
  } else {
    check_scale(op, "scale_a", scale_a, nullptr);
    check_scale(op, "scale_b", scale_b, nullptr);
  }
  check_device(op, A, "B", &B);
  check_device(op, A, "scale_a", &scale_a);
  check_device(op, A, "scale_b", &scale_b);
  return p;
}

GroupedPlan grouped_mm(const Spec& x, const Spec& w, const Spec& counts, int64_t capacity_rows) {
  const char* op = "grouped_mm";
  check_dtype(op, "x", x, {Dtype::bf16});
  check_dtype(op, "w", w, {Dtype::bf16});
  check_ndim(op, "x", x, 2);
  check_ndim(op, "w", w, 3);
  check_contiguous(op, "x", x);
  GroupedPlan p;
  p.E = w.sizes[0];
  p.N = w.sizes[1];
  p.K = w.sizes[2];
  if (x.sizes[1] != p.K)
    fail(op, "x has K = " + str(x.sizes[1]) + " columns but w is E x N x K = " + shape_str(w.sizes));
  if (!w.contiguous()) {
    Spec wt = w;  // w.transpose(1, 2)
    std::swap(wt.sizes[1], wt.sizes[2]);
    std::swap(wt.strides[1], wt.strides[2]);
    if (!wt.contiguous())
      fail(op, "w (E x N x K) is neither contiguous nor w.transpose(1, 2) of a contiguous E x K x N stack (strides " +
                   shape_str(w.strides) + "); pass w.contiguous() (one copy)");
    p.kn = true;
  }
  if (!(1 <= p.E && p.E <= 1024)) fail(op, "E = " + str(p.E) + " experts; the grouped GEMM takes 1 to 1024");
  for (auto [name, v] : {std::pair<const char*, int64_t>{"N", p.N}, {"K", p.K}})
    if (v < 8 || v % 8) fail(op, std::string(name) + " = " + str(v) + " must be a positive multiple of 8 (16-byte rows)");
  if (counts.dtype != Dtype::i32)
    fail(op, "counts has dtype " + counts.dtype_name + "; the grouped GEMM takes torch.int32");
  if (counts.dim() != 1 || counts.sizes[0] != p.E)
    fail(op, "counts must hold E = " + str(p.E) + " values (shape (" + str(p.E) + ",)), got shape " +
                 shape_str(counts.sizes));
  check_contiguous(op, "counts", counts);
  const int64_t rows = x.sizes[0];
  p.cap = capacity_rows < 0 ? rows : capacity_rows;
  if (!(1 <= p.cap && p.cap <= rows))
    fail(op, "capacity_rows = " + str(p.cap) + " must be in 1.." + str(rows) + " (x's rows)");
  check_device(op, x, "w", &w);
  check_device(op, x, "counts", &counts);
  return p;
}

AttentionPlan attention(const char* op, const Spec& q, const Spec& k, const Spec& v) {
  for (auto [name, t] : {std::pair<const char*, const Spec*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    check_dtype(op, name, *t, {Dtype::bf16});
    check_contiguous(op, name, *t);
    check_ndim(op, name, *t, 4);
  }
  AttentionPlan p{q.sizes[0], q.sizes[1], q.sizes[2], k.sizes[2], q.sizes[3]};
  if (k.sizes != v.sizes) fail(op, "k " + shape_str(k.sizes) + " and v " + shape_str(v.sizes) + " differ");
  if (k.sizes[0] != p.B || k.sizes[1] != p.L || k.sizes[3] != p.D)
    fail(op, "q " + shape_str(q.sizes) + " and k " + shape_str(k.sizes) +
                 " differ in batch, sequence or head dim (layout (B, S, H, D))");
  if (p.D != 64 && p.D != 128) fail(op, "head dim " + str(p.D) + " is not 64 or 128");
  if (p.Hq % p.Hkv)
    fail(op, str(p.Hq) + " query heads are not a multiple of " + str(p.Hkv) + " key/value heads");
  return p;
}

int64_t ring_seq(const Spec& q, const std::string& sharding, int64_t seq_len, int rank, int world) {
  const char* op = "ring_attention";
  if (sharding != "zigzag" && sharding != "contiguous")
    fail(op, "sharding must be 'zigzag' or 'contiguous', got '" + sharding + "'");
  const int64_t L = q.sizes[1];
  const int64_t S = seq_len < 0 ? world * L : seq_len;
  const int64_t mine = weave::py::ring_local_rows(S, world, sharding == "zigzag", rank);
  if (mine != L)
    fail(op, "q holds " + str(L) + " sequence rows, but rank " + str(rank) + " holds " + str(mine) + " of " + str(S) +
                 " with " + sharding + " sharding over " + str(world) + " ranks (pass seq_len)");
  return S;
}

int64_t ulysses_seq(const Spec& q, int64_t seq_len, int rank, int world) {
  const char* op = "ulysses_attention";
  const int64_t L = q.sizes[1];
  const int64_t S = seq_len < 0 ? world * L : seq_len;
  const int64_t mine = weave::py::ulysses_rows(S, world, rank).size;
  if (mine != L)
    fail(op, "q holds " + str(L) + " sequence rows, but rank " + str(rank) + "'s share of " + str(S) + " over " +
                 str(world) + " ranks is " + str(mine) + " (pass seq_len)");
  if (q.sizes[2] % world) fail(op, str(q.sizes[2]) + " query heads do not divide among " + str(world) + " ranks");
  return S;
}

// ---- the MoE layer (messages as moe.py's checks had them)

int64_t moe_tokens(const char* op, const MoeSizes& m, const Spec& x, const Spec& topk_idx) {
  check_dtype(op, "x", x, {Dtype::bf16});
  check_ndim(op, "x", x, 2);
  const int64_t T = x.sizes[0], H = x.sizes[1];
  if (H != m.hidden) fail(op, "x has " + str(H) + " columns but the layer's hidden size is " + str(m.hidden));
  if (T > m.max_tokens)
    fail(op, "x has T = " + str(T) + " tokens, more than the layer's max_tokens = " + str(m.max_tokens));
  check_contiguous(op, "x", x);
  check_dtype(op, "topk_idx", topk_idx, {Dtype::i32});
  if (topk_idx.sizes != Shape{T, m.topk})
    fail(op, "topk_idx must be (T, k) = " + shape_str({T, m.topk}) + ", got " + shape_str(topk_idx.sizes));
  check_contiguous(op, "topk_idx", topk_idx);
  check_device(op, x, "topk_idx", &topk_idx);
  return T;
}

void moe_weights(const char* op, const MoeSizes& m, const Spec& w, int64_t T) {
  check_dtype(op, "topk_weights", w, {Dtype::fp32});
  if (w.sizes != Shape{T, m.topk})
    fail(op, "topk_weights must be (T, k) = " + shape_str({T, m.topk}) + ", got " + shape_str(w.sizes));
  check_contiguous(op, "topk_weights", w);
}

int64_t moe_forward(const MoeSizes& m, const Spec& x, const Spec& topk_idx, const Spec& topk_weights, const Spec& w_up,
                    const Spec& w_down) {
  const char* op = "MoeLayer.forward";
  const int64_t T = moe_tokens(op, m, x, topk_idx);
  moe_weights(op, m, topk_weights, T);
  const int64_t L = m.local_experts, H = m.hidden, F = m.ffn;
  const struct {
    const char* name;
    const Spec& w;
    Shape shape;
    const char* what;
  } weights[] = {{"w_up", w_up, {L, 2 * F, H}, "(L, 2F, H): gate rows then up rows"},
                 {"w_down", w_down, {L, H, F}, "(L, H, F)"}};
  for (const auto& e : weights) {
    check_dtype(op, e.name, e.w, {Dtype::bf16});
    if (e.w.sizes != e.shape)
      fail(op, std::string(e.name) + " must be " + e.what + " = " + shape_str(e.shape) + " for this rank's " + str(L) +
                   " experts, got " + shape_str(e.w.sizes));
    check_contiguous(op, e.name, e.w);
  }
  check_device(op, x, "topk_weights", &topk_weights);
  check_device(op, x, "w_up", &w_up);
  check_device(op, x, "w_down", &w_down);
  return T;
}

void moe_expert_rows(const char* op, const MoeSizes& m, const Spec& y) {
  check_dtype(op, "y", y, {Dtype::bf16});
  if (y.sizes != Shape{m.capacity, m.hidden})
    fail(op, "y must be capacity x H = " + shape_str({m.capacity, m.hidden}) + ", got " + shape_str(y.sizes));
  check_contiguous(op, "y", y);
}

}  // namespace weave::py::plan
