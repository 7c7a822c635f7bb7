// The CUDA kernels of torch.ops.weave.* (the schemas, CPU errors and fake implementations are
// registered by weave/_ops.py). Each checks its arguments with plan.hpp, allocates its outputs from
// torch's caching allocator, and calls weave on torch's current stream; an operator written in
// Python spent 17-60 us of host time per call on the same steps (docs/perf-notes.md). A broken
// argument rule raises ValueError; anything weave raises while running, RuntimeError. The same
// kernels are also bound as weave._C.eager_<op> (bind_eager_ops): weave's Python calls them directly
// where the dispatcher would do nothing but route to them (weave/_ops.py, run).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/utils/pybind.h>  // at::Tensor / dtype casters (libtorch_python)
#include <torch/library.h>

#include <cuda_runtime_api.h>

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm.hpp"
#include "ops.hpp"
#include "plan.hpp"
#include "torch_ops.hpp"
#include "weave/common/error.hpp"
#include "weave/runtime/call.hpp"  // capturing
#include "weave/runtime/device_copy.hpp"

namespace weave::py {
namespace {

using plan::Dtype;
using plan::Spec;

Dtype dtype_of(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return Dtype::bf16;
    case at::kHalf: return Dtype::fp16;
    case at::kFloat: return Dtype::fp32;
    case at::kFloat8_e4m3fn: return Dtype::e4m3;
    case at::kFloat8_e5m2: return Dtype::e5m2;
    case at::kInt: return Dtype::i32;
    default: return Dtype::other;
  }
}

// torch's Python spelling of a dtype, for messages (the rules' own names for the dtypes they take).
std::string dtype_name(at::ScalarType t) {
  if (const Dtype d = dtype_of(t); d != Dtype::other) return plan::torch_name(d);
  switch (t) {
    case at::kDouble: return "torch.float64";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kShort: return "torch.int16";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
  }
}

Spec spec_of(const at::Tensor& t) {
  Spec s;
  s.sizes.assign(t.sizes().begin(), t.sizes().end());
  s.strides.assign(t.strides().begin(), t.strides().end());
  s.dtype = dtype_of(t.scalar_type());
  s.dtype_name = dtype_name(t.scalar_type());
  s.device = t.device().str();
  return s;
}

std::optional<Spec> spec_of(const std::optional<at::Tensor>& t) {
  return t ? std::optional<Spec>(spec_of(*t)) : std::nullopt;
}

Ptr ptr(const at::Tensor& t) { return reinterpret_cast<Ptr>(t.data_ptr()); }

Dt coll_type(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? Dt::bf16 : t.scalar_type() == at::kHalf ? Dt::fp16 : Dt::fp32;
}

cudaStream_t stream_of(int device) { return c10::cuda::getCurrentCUDAStream(device).stream(); }

// Runs a kernel body; a broken argument rule (plan::ArgError, or an invalid_argument from weave)
// becomes the ValueError Python callers expect.
template <class F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    C10_THROW_ERROR(ValueError, e.what());
  }
}

// weave's kernels are built for sm_90a: another GPU is a clear error, once per device.
void require_hopper(const char* who, int device) {
  static std::once_flag once[64];
  static bool ok[64];
  static std::string why[64];
  if (device < 0 || device >= 64) return;
  std::call_once(once[device], [&] {
    int major = 0, minor = 0;
    set_device(device);
    WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    ok[device] = major == 9;
    why[device] = "GPU " + std::to_string(device) + " has compute capability " + std::to_string(major) + "." +
                  std::to_string(minor) + "; weave is built for Hopper (sm_90a) only";
  });
  if (!ok[device]) throw std::runtime_error(std::string(who) + ": " + why[device]);
}

// An output tensor from torch's caching allocator (poisoned for the tests, see comm.hpp).
at::Tensor empty(at::IntArrayRef shape, at::ScalarType t, const at::Tensor& like, cudaStream_t s) {
  at::Tensor o = at::empty(shape, like.options().dtype(t));
  if (poison() && o.numel()) WEAVE_CUDA_CHECK(cudaMemsetAsync(o.data_ptr(), 0xFF, o.nbytes(), s));
  return o;
}

// `bytes` from device pointer src into the contiguous tensor dst (a kernel: device_copy.hpp says
// why not cudaMemcpyAsync).
void copy_into(const at::Tensor& dst, Ptr src, size_t bytes, cudaStream_t s) {
  weave::runtime::device_copy(dst.data_ptr(), reinterpret_cast<const void*>(src), bytes, s);
}

// A collective call: the group's communicator (every tensor on its device), torch's current
// stream, the communicator's lock, and whether the stream is capturing a graph. Its argument
// rules run through rules(): a rule this rank breaks (its shard's rows, a tensor on another
// device, any plan rule where the ranks' arguments differ) joins the cross-rank agreement as this
// rank's problem before it is raised, so that the peers, which passed their rules and went on to
// the operator's own agreement, fail with it instead of waiting for a rank that never comes (an
// agreed plan's peers have launched: the agreement stops their kernels through their abort words).
struct Call {
  std::shared_ptr<Comm> c;
  int device = 0;
  cudaStream_t s = nullptr;
  std::unique_lock<std::mutex> lock;
  bool capturing = false;
  const char* op;
  std::string device_problem;  // raised by the first rules()

  Call(const char* op_name, c10::string_view group, std::initializer_list<const at::Tensor*> tensors,
       at::TensorList more = {})
      : c(comm_for(std::string(group))), device(c->comm().device()), op(op_name) {
    auto check = [&](const at::Tensor& t) {
      if (t.get_device() != device && device_problem.empty())
        device_problem = "a tensor is on " + t.device().str() + " but the communicator of group '" +
                         std::string(group) + "' uses cuda:" + std::to_string(device);
    };
    for (const at::Tensor* t : tensors) check(*t);
    for (const at::Tensor& t : more) check(t);
    s = stream_of(device);
    lock = std::unique_lock<std::mutex>(c->mu());
    set_device(device);
    capturing = runtime::capturing(s);
  }
  Ops& ops() { return c->ops(); }
  Ptr staging(Comm::Which w, size_t bytes) { return c->staging(w, bytes, s, capturing); }

  // The operator's kernel object first (the same collective steps on every rank, arguments aside),
  // then its argument rules.
  template <class F>
  auto rules(Ops::Family family, F&& f) -> decltype(f()) {
    ops().prepare(family);
    try {
      if (!device_problem.empty()) plan::fail(op, device_problem);
      return f();
    } catch (const std::invalid_argument& e) {
      c->refuse(std::string("weave.") + op, e.what(), s);
      throw;
    }
  }
};

// A collective: when the call's algorithm reaches its buffers from this rank only (LL, LL128:
// `ask`, once per key; key's first element names the operator) x and a new output go to the
// kernel as they are; else x (itself if symmetric, else staged) in, the output staged, then copied
// out. Every step that may be collective (growing a staging buffer) must be taken alike on every
// rank: the staging buffers grow to `in_reserve` / `out_reserve` bytes, the largest any rank needs
// (ragged shards differ by a row), and the local-or-staged choice assumes an aligned x, which a
// misaligned view is copied to (its alignment is this rank's alone: the LL paths need 4 bytes).
template <class Ask, class Launch>
at::Tensor collective(Call& call, const at::Tensor& x_in, at::IntArrayRef out_shape, Comm::LocalKey key,
                      size_t in_reserve, size_t out_reserve, Ask&& ask, Launch&& launch) {
  const at::Tensor x = ptr(x_in) % 4 == 0 ? x_in : x_in.clone();
  std::get<3>(key) = int(coll_type(x));
  std::get<4>(key) = true;
  const bool local = call.c->local(key, [&] { return ask(true); });
  at::Tensor out = empty(out_shape, x.scalar_type(), x, call.s);
  if (local) {
    launch(ptr(x), ptr(out));
    return out;
  }
  const Ptr src = call.c->symmetric_input(ptr(x), x.nbytes(), in_reserve, call.s, call.capturing);
  const Ptr stage = call.c->staging(Comm::kOut, out.nbytes(), out_reserve, call.s, call.capturing);
  launch(src, stage);
  copy_into(out, stage, out.nbytes(), call.s);
  return out;
}

size_t bytes_of(const std::vector<long long>& full, size_t elt) {
  long long n = 1;
  for (long long d : full) n *= d;
  return size_t(n) * elt;
}
// Bytes of the largest shard of `full` along `cdim` (rank 0's: shards differ by at most one row).
size_t largest_shard_bytes(const std::vector<long long>& full, int cdim, int world, size_t elt) {
  const size_t all = bytes_of(full, elt);
  return all ? all / size_t(full[cdim]) * size_t(shard(full[cdim], world, 0).size) : 0;
}

// all_gather_matmul's outputs, one per B (rows gathered along dim 0, N columns of `t`).
std::vector<at::Tensor> ag_outputs(const plan::AgGemmPlan& p, const at::Tensor& A, at::TensorList Bs,
                                   at::ScalarType t, cudaStream_t s) {
  std::vector<at::Tensor> outs;
  std::vector<int64_t> shape(p.gathered.begin(), p.gathered.end() - 1);
  for (const at::Tensor& B : Bs) {
    shape.push_back(B.size(1));
    outs.push_back(empty(shape, t, A, s));
    shape.pop_back();
  }
  return outs;
}

// all_gather_matmul's results: the gathered A copied out of the staging buffer (return_A), and
// every tensor moved back to the gather dimension.
std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> ag_result(const plan::AgGemmPlan& p,
                                                                          const at::Tensor& A, Ptr gathered,
                                                                          std::vector<at::Tensor> outs, bool return_A,
                                                                          cudaStream_t s) {
  std::optional<at::Tensor> a;
  if (return_A) {
    at::Tensor g = empty(p.gathered, A.scalar_type(), A, s);
    copy_into(g, gathered, g.nbytes(), s);
    a = p.dim ? g.movedim(0, p.dim) : g;
  }
  if (p.dim)
    for (at::Tensor& o : outs) o = o.movedim(0, p.dim);
  return std::make_tuple(std::move(a), std::move(outs));
}

// The kernels (namespace op: their names are the operators', which weave::py's C++ entry points share).
namespace op {

at::Tensor all_reduce(const at::Tensor& x, c10::string_view group) {
  return guarded([&] {
    Call call("all_reduce", group, {&x});
    call.rules(Ops::Family::collectives, [&] { plan::all_reduce(spec_of(x)); });
    const long long n = x.numel();
    const Dt t = coll_type(x);
    const size_t bytes = size_t(n) * x.element_size();
    return collective(call, x, x.sizes(), {0, {n}, 0, 0, false}, bytes, bytes,
                      [&](bool aligned) { return call.ops().all_reduce_local(n, t, aligned); },
                      [&](Ptr i, Ptr o) { call.ops().all_reduce(i, o, n, t, Ptr(call.s)); });
  });
}

at::Tensor all_gather(const at::Tensor& x, int64_t dim, int64_t full_size, c10::string_view group) {
  return guarded([&] {
    Call call("all_gather", group, {&x});
    const auto p = call.rules(Ops::Family::collectives, [&] {
      return plan::all_gather(spec_of(x), dim, full_size, call.c->comm().rank(), call.c->comm().world());
    });
    const Dt t = coll_type(x);
    const int W = call.c->comm().world();
    const size_t e = x.element_size();
    return collective(
        call, x, p.out, {1, p.full, p.cdim, 0, false}, largest_shard_bytes(p.full, p.cdim, W, e), bytes_of(p.full, e),
        [&](bool aligned) { return call.ops().shard_local(true, p.full, p.cdim, t, aligned); },
        [&](Ptr i, Ptr o) { call.ops().all_gather(i, o, p.full, p.cdim, t, Ptr(call.s)); });
  });
}

at::Tensor reduce_scatter(const at::Tensor& x, int64_t dim, c10::string_view group) {
  return guarded([&] {
    Call call("reduce_scatter", group, {&x});
    const auto p = call.rules(Ops::Family::collectives, [&] {
      return plan::reduce_scatter(spec_of(x), dim, call.c->comm().rank(), call.c->comm().world());
    });
    const Dt t = coll_type(x);
    const int W = call.c->comm().world();
    const size_t e = x.element_size();
    return collective(
        call, x, p.out, {2, p.full, p.cdim, 0, false}, bytes_of(p.full, e), largest_shard_bytes(p.full, p.cdim, W, e),
        [&](bool aligned) { return call.ops().shard_local(false, p.full, p.cdim, t, aligned); },
        [&](Ptr i, Ptr o) { call.ops().reduce_scatter(i, o, p.full, p.cdim, t, Ptr(call.s)); });
  });
}

at::Tensor all_to_all(const at::Tensor& x, c10::string_view direction, int64_t seq_len, c10::string_view group) {
  return guarded([&] {
    Call call("all_to_all", group, {&x});
    const auto p = call.rules(Ops::Family::collectives, [&] {
      return plan::all_to_all(spec_of(x), std::string(direction), seq_len, call.c->comm().rank(),
                              call.c->comm().world());
    });
    const long long B = x.size(0), D = x.size(3);
    const Dt t = coll_type(x);
    const int W = call.c->comm().world();
    const size_t e = x.element_size();
    const size_t seq = largest_shard_bytes({B, p.S, p.H * D}, 1, W, e), head = bytes_of({B, p.S, p.H / W, D}, e);
    return collective(call, x, p.out, {3, {}, 0, 0, false}, p.seq_to_head ? seq : head, p.seq_to_head ? head : seq,
                      [](bool) { return false; },  // always staged
                      [&](Ptr i, Ptr o) { call.ops().all_to_all(i, o, B, p.S, p.H, D, t, p.seq_to_head, Ptr(call.s)); });
  });
}

std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> all_gather_matmul(
    const at::Tensor& A, at::TensorList Bs, int64_t gather_dim, c10::string_view group, bool return_A) {
  return guarded([&] {
    Call call("all_gather_matmul", group, {&A}, Bs);
    std::vector<Spec> bs;
    for (const at::Tensor& B : Bs) bs.push_back(spec_of(B));
    const auto p = call.rules(Ops::Family::ag_gemm, [&] {
      return plan::all_gather_matmul(spec_of(A), bs, gather_dim, call.c->comm().world());
    });
    const int64_t K = p.gathered.back();
    const int64_t M = c10::multiply_integers(p.gathered) / K;
    const Ptr gathered = call.staging(Comm::kOut, size_t(M) * K * A.element_size());
    std::vector<at::Tensor> outs = ag_outputs(p, A, Bs, A.scalar_type(), call.s);
    call.ops().ag_gemm(ptr(A), gathered, ptr(Bs[0]), ptr(outs[0]), int(M), int(Bs[0].size(1)), int(K), Ptr(call.s),
                       -1, -1, p.nks[0]);
    for (size_t i = 1; i < Bs.size(); ++i)  // the gathered A is there: plain GEMMs
      gemm(call.device, gathered, ptr(Bs[i]), ptr(outs[i]), int(M), int(Bs[i].size(1)), int(K), p.nks[i],
           Ptr(call.s));
    return ag_result(p, A, gathered, std::move(outs), return_A, call.s);
  });
}

at::Tensor matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, c10::string_view reduce_op,
                                 int64_t scatter_dim, c10::string_view group) {
  return guarded([&] {
    Call call("matmul_reduce_scatter", group, {&A, &B});
    const int world = call.c->comm().world();
    const auto p = call.rules(Ops::Family::gemm_rs, [&] {
      return plan::matmul_reduce_scatter(spec_of(A), spec_of(B), std::string(reduce_op), scatter_dim,
                                         call.c->comm().rank(), world);
    });
    const int64_t K = A.size(-1), N = B.size(1), M = A.numel() / K;
    const Ptr stage = call.staging(Comm::kOut, size_t(Ops::gemm_rs_out_elems(int(M), int(N), world)) * A.element_size());
    call.ops().gemm_rs(ptr(A), ptr(B), stage, int(M), int(N), int(K), Ptr(call.s), -1, -1, p.nk);
    at::Tensor out = empty(p.out, A.scalar_type(), A, call.s);
    copy_into(out, stage, out.nbytes(), call.s);
    if (reduce_op == "avg") out.div_(world);
    return p.dim ? out.movedim(0, p.dim) : out;
  });
}

at::Tensor matmul_all_reduce(const at::Tensor& A, const at::Tensor& B, c10::string_view group) {
  return guarded([&] {
    Call call("matmul_all_reduce", group, {&A, &B});
    const auto p = call.rules(Ops::Family::gemm_ar, [&] { return plan::matmul_all_reduce(spec_of(A), spec_of(B)); });
    const int64_t K = A.size(-1), N = B.size(1);
    at::Tensor out = empty(p.out, A.scalar_type(), A, call.s);
    const Ptr stage = call.staging(Comm::kOut, out.nbytes());
    call.ops().gemm_ar(ptr(A), ptr(B), stage, int(A.numel() / K), int(N), int(K), Ptr(call.s), -1, -1, p.nk);
    copy_into(out, stage, out.nbytes(), call.s);
    return out;
  });
}

std::optional<Dtype> dtype_opt(std::optional<at::ScalarType> t) {
  return t ? std::optional<Dtype>(dtype_of(*t)) : std::nullopt;
}

void gemm_call(const at::Tensor& A, const at::Tensor& B, const std::optional<at::Tensor>& bias, const at::Tensor& C,
               const plan::MatmulPlan& p, bool accumulate) {
  const int64_t K = A.size(-1), N = B.size(1);
  const int dev = A.get_device();
  gemm(dev, ptr(A), ptr(B), ptr(C), int(A.numel() / K), int(N), int(K), p.nk, Ptr(stream_of(dev)), p.km,
       bias ? ptr(*bias) : 0, p.bias_type, p.f32, accumulate);
}

at::Tensor matmul(const at::Tensor& A, const at::Tensor& B, const std::optional<at::Tensor>& bias,
                  std::optional<at::ScalarType> out_dtype) {
  return guarded([&] {
    const auto p = plan::matmul(spec_of(A), spec_of(B), spec_of(bias), dtype_opt(out_dtype),
                                out_dtype ? dtype_name(*out_dtype) : "");
    require_hopper("weave.matmul", A.get_device());
    at::Tensor out = empty(p.out, p.f32 ? at::kFloat : at::kBFloat16, A, stream_of(A.get_device()));
    if (out.numel()) gemm_call(A, B, bias, out, p, false);
    return out;
  });
}

void matmul_out(const at::Tensor& A, const at::Tensor& B, const std::optional<at::Tensor>& bias, bool accumulate,
                const at::Tensor& out) {
  guarded([&] {
    const auto p = plan::matmul_out(spec_of(A), spec_of(B), spec_of(bias), spec_of(out));
    require_hopper("weave.matmul", A.get_device());
    if (out.numel()) gemm_call(A, B, bias, out, p, accumulate);
  });
}

at::Tensor scaled_mm(const at::Tensor& A, const at::Tensor& B, const at::Tensor& scale_a, const at::Tensor& scale_b,
                     std::optional<at::ScalarType> out_dtype) {
  return guarded([&] {
    const auto p = plan::scaled_mm(spec_of(A), spec_of(B), spec_of(scale_a), spec_of(scale_b), dtype_opt(out_dtype),
                                   out_dtype ? dtype_name(*out_dtype) : "");
    const int dev = A.get_device();
    require_hopper("weave.scaled_mm", dev);
    const cudaStream_t s = stream_of(dev);
    at::Tensor out = empty({p.M, p.N}, at::kBFloat16, A, s);
    if (p.M == 0) return out;
    auto fp8 = [](const at::Tensor& t) { return t.scalar_type() == at::kFloat8_e5m2 ? 1 : 0; };  // gemm_fp8::Fp8
    gemm_fp8(dev, ptr(A), fp8(A), ptr(B), fp8(B), ptr(out), int(p.M), int(p.N), int(p.K), ptr(scale_a), ptr(scale_b),
             p.block, Ptr(s));
    return out;
  });
}

// all_gather_matmul with fp8 (e4m3) operands and per-tensor scales, bf16 outputs: the gathered A
// travels as fp8; Bs[0] by the fused kernel, the others by the fp8 GEMM on the gathered rows.
std::tuple<std::optional<at::Tensor>, std::vector<at::Tensor>> all_gather_scaled_matmul(
    const at::Tensor& A, at::TensorList Bs, const at::Tensor& A_scale, at::TensorList B_scales, int64_t gather_dim,
    c10::string_view group, std::optional<at::ScalarType> out_dtype, bool return_A) {
  return guarded([&] {
    Call call("all_gather_scaled_matmul", group, {&A, &A_scale}, Bs);
    std::vector<Spec> bs, ss;
    for (const at::Tensor& B : Bs) bs.push_back(spec_of(B));
    for (const at::Tensor& S : B_scales) ss.push_back(spec_of(S));
    const auto p = call.rules(Ops::Family::ag_gemm, [&] {
      return plan::all_gather_scaled_matmul(spec_of(A), bs, spec_of(A_scale), ss, gather_dim, call.c->comm().world(),
                                            dtype_opt(out_dtype), out_dtype ? dtype_name(*out_dtype) : "");
    });
    const int64_t K = p.gathered.back();
    const int64_t M = c10::multiply_integers(p.gathered) / K;
    const Ptr gathered = call.staging(Comm::kOut, size_t(M) * K * A.element_size());
    std::vector<at::Tensor> outs = ag_outputs(p, A, Bs, at::kBFloat16, call.s);
    call.ops().ag_gemm_fp8(ptr(A), gathered, ptr(Bs[0]), ptr(A_scale), ptr(B_scales[0]), ptr(outs[0]), int(M),
                           int(Bs[0].size(1)), int(K), Ptr(call.s));
    for (size_t i = 1; i < Bs.size(); ++i)  // the gathered A is there: the fp8 GEMM
      gemm_fp8(call.device, gathered, 0, ptr(Bs[i]), 0, ptr(outs[i]), int(M), int(Bs[i].size(1)), int(K),
               ptr(A_scale), ptr(B_scales[i]), false, Ptr(call.s));
    return ag_result(p, A, gathered, std::move(outs), return_A, call.s);
  });
}

// matmul_reduce_scatter with fp8 (e4m3) operands, each rank's own per-tensor scales, bf16 output.
at::Tensor scaled_matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, const at::Tensor& A_scale,
                                        const at::Tensor& B_scale, c10::string_view reduce_op, int64_t scatter_dim,
                                        c10::string_view group, std::optional<at::ScalarType> out_dtype) {
  return guarded([&] {
    Call call("scaled_matmul_reduce_scatter", group, {&A, &B, &A_scale, &B_scale});
    const int world = call.c->comm().world();
    const auto p = call.rules(Ops::Family::gemm_rs, [&] {
      return plan::scaled_matmul_reduce_scatter(spec_of(A), spec_of(B), spec_of(A_scale), spec_of(B_scale),
                                                std::string(reduce_op), scatter_dim, call.c->comm().rank(), world,
                                                dtype_opt(out_dtype), out_dtype ? dtype_name(*out_dtype) : "");
    });
    const int64_t K = A.size(-1), N = B.size(1), M = A.numel() / K;
    const Ptr stage = call.staging(Comm::kOut, size_t(Ops::gemm_rs_out_elems(int(M), int(N), world)) * sizeof(uint16_t));
    call.ops().gemm_rs_fp8(ptr(A), ptr(B), ptr(A_scale), ptr(B_scale), stage, int(M), int(N), int(K), Ptr(call.s));
    at::Tensor out = empty(p.out, at::kBFloat16, A, call.s);
    copy_into(out, stage, out.nbytes(), call.s);
    if (reduce_op == "avg") out.div_(world);
    return p.dim ? out.movedim(0, p.dim) : out;
  });
}

at::Tensor grouped_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts, int64_t capacity_rows) {
  return guarded([&] {
    const auto p = plan::grouped_mm(spec_of(x), spec_of(w), spec_of(counts), capacity_rows);
    const int dev = x.get_device();
    require_hopper("weave.grouped_mm", dev);
    const cudaStream_t s = stream_of(dev);
    at::Tensor out = empty({p.cap, p.N}, at::kBFloat16, x, s);
    grouped_gemm(dev, ptr(x), ptr(w), ptr(out), ptr(counts), int(p.E), int(p.N), int(p.K), int(p.cap), p.kn, Ptr(s));
    return out;
  });
}

float scale_or_default(std::optional<double> scale) { return scale ? float(*scale) : 0.f; }  // 0: 1/sqrt(D)

std::tuple<at::Tensor, at::Tensor> attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             bool causal, std::optional<double> scale) {
  return guarded([&] {
    const auto p = plan::attention("attention", spec_of(q), spec_of(k), spec_of(v));
    const int dev = q.get_device();
    require_hopper("weave.attention", dev);
    const cudaStream_t s = stream_of(dev);
    at::Tensor o = empty(q.sizes(), q.scalar_type(), q, s);
    at::Tensor lse = empty({p.B, p.Hq, p.L}, at::kFloat, q, s);
    weave::py::attention(dev, ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse), int(p.B), int(p.L), int(p.Hq), int(p.Hkv),
                         int(p.D), causal, scale_or_default(scale), Ptr(s));
    return std::make_tuple(o, lse);
  });
}

std::tuple<at::Tensor, at::Tensor> ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  bool causal, std::optional<double> scale,
                                                  c10::string_view sharding, int64_t seq_len,
                                                  c10::string_view group) {
  return guarded([&] {
    Call call("ring_attention", group, {&q, &k, &v});
    const auto [p, S] = call.rules(Ops::Family::ring, [&] {
      return std::make_pair(plan::attention("ring_attention", spec_of(q), spec_of(k), spec_of(v)),
                            plan::ring_seq(spec_of(q), std::string(sharding), seq_len, call.c->comm().rank(),
                                           call.c->comm().world()));
    });
    at::Tensor o = empty(q.sizes(), q.scalar_type(), q, call.s);
    at::Tensor lse = empty({p.B, p.Hq, p.L}, at::kFloat, q, call.s);
    call.ops().ring_attention(ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse), int(p.B), S, int(p.Hq), int(p.Hkv), int(p.D),
                              causal, scale_or_default(scale), sharding == "zigzag", Ptr(call.s));
    return std::make_tuple(o, lse);
  });
}

at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                             std::optional<double> scale, int64_t seq_len, c10::string_view group) {
  return guarded([&] {
    Call call("ulysses_attention", group, {&q, &k, &v});
    const int world = call.c->comm().world();
    const auto [p, S] = call.rules(Ops::Family::ulysses, [&] {
      return std::make_pair(plan::attention("ulysses_attention", spec_of(q), spec_of(k), spec_of(v)),
                            plan::ulysses_seq(spec_of(q), seq_len, call.c->comm().rank(), world));
    });
    const Ptr stage = call.staging(
        Comm::kOut, size_t(Ops::ulysses_out_elems(int(p.B), S, int(p.Hq), int(p.D), world)) * q.element_size());
    call.ops().ulysses_attention(ptr(q), ptr(k), ptr(v), stage, int(p.B), S, int(p.Hq), int(p.Hkv), int(p.D), causal,
                                 scale_or_default(scale), Ptr(call.s));
    at::Tensor o = empty(q.sizes(), q.scalar_type(), q, call.s);
    copy_into(o, stage, o.nbytes(), call.s);
    return o;
  });
}

}  // namespace op
}  // namespace

void bind_eager_ops(pybind11::module_& m) {
  namespace py = pybind11;
  // The dispatcher would turn these into Python exceptions the same way.
  py::register_exception_translator([](std::exception_ptr e) {
    try {
      if (e) std::rethrow_exception(e);
    } catch (const c10::ValueError& x) {
      PyErr_SetString(PyExc_ValueError, x.what_without_backtrace());
    } catch (const c10::Error& x) {
      PyErr_SetString(PyExc_RuntimeError, x.what_without_backtrace());
    }
  });
  using Ts = std::vector<at::Tensor>;
  using OptT = std::optional<at::Tensor>;
  using OptD = std::optional<double>;
  const auto nogil = py::call_guard<py::gil_scoped_release>();
  m.def("eager_all_reduce", [](const at::Tensor& x, const std::string& g) { return op::all_reduce(x, g); }, nogil);
  m.def("eager_all_gather", [](const at::Tensor& x, int64_t dim, int64_t full, const std::string& g) {
    return op::all_gather(x, dim, full, g);
  }, nogil);
  m.def("eager_reduce_scatter", [](const at::Tensor& x, int64_t dim, const std::string& g) {
    return op::reduce_scatter(x, dim, g);
  }, nogil);
  m.def("eager_all_to_all", [](const at::Tensor& x, const std::string& dir, int64_t seq, const std::string& g) {
    return op::all_to_all(x, dir, seq, g);
  }, nogil);
  m.def("eager_all_gather_matmul", [](const at::Tensor& A, const Ts& Bs, int64_t dim, const std::string& g,
                                      bool return_A) { return op::all_gather_matmul(A, Bs, dim, g, return_A); },
        py::arg("A_shard"), py::arg("Bs"), py::arg("gather_dim"), py::arg("group"), py::arg("return_A") = true, nogil);
  m.def("eager_matmul_reduce_scatter", [](const at::Tensor& A, const at::Tensor& B, const std::string& op_name,
                                          int64_t dim, const std::string& g) {
    return op::matmul_reduce_scatter(A, B, op_name, dim, g);
  }, nogil);
  m.def("eager_all_gather_scaled_matmul",
        [](const at::Tensor& A, const Ts& Bs, const at::Tensor& sa, const Ts& sbs, int64_t dim, const std::string& g,
           std::optional<at::ScalarType> out_dtype, bool return_A) {
          return op::all_gather_scaled_matmul(A, Bs, sa, sbs, dim, g, out_dtype, return_A);
        },
        py::arg("A_shard"), py::arg("Bs"), py::arg("A_scale"), py::arg("B_scales"), py::arg("gather_dim"),
        py::arg("group"), py::arg("out_dtype") = py::none(), py::arg("return_A") = true, nogil);
  m.def("eager_scaled_matmul_reduce_scatter",
        [](const at::Tensor& A, const at::Tensor& B, const at::Tensor& sa, const at::Tensor& sb,
           const std::string& op_name, int64_t dim, const std::string& g, std::optional<at::ScalarType> out_dtype) {
          return op::scaled_matmul_reduce_scatter(A, B, sa, sb, op_name, dim, g, out_dtype);
        },
        py::arg("A"), py::arg("B"), py::arg("A_scale"), py::arg("B_scale"), py::arg("reduce_op"),
        py::arg("scatter_dim"), py::arg("group"), py::arg("out_dtype") = py::none(), nogil);
  m.def("eager_matmul_all_reduce", [](const at::Tensor& A, const at::Tensor& B, const std::string& g) {
    return op::matmul_all_reduce(A, B, g);
  }, nogil);
  m.def("eager_matmul", [](const at::Tensor& A, const at::Tensor& B, const OptT& bias,
                           std::optional<at::ScalarType> out_dtype) { return op::matmul(A, B, bias, out_dtype); },
        py::arg("A"), py::arg("B"), py::arg("bias") = py::none(), py::arg("out_dtype") = py::none(), nogil);
  m.def("eager_scaled_mm", [](const at::Tensor& A, const at::Tensor& B, const at::Tensor& sa, const at::Tensor& sb,
                              std::optional<at::ScalarType> out_dtype) { return op::scaled_mm(A, B, sa, sb, out_dtype); },
        py::arg("A"), py::arg("B"), py::arg("scale_a"), py::arg("scale_b"), py::arg("out_dtype") = py::none(), nogil);
  m.def("eager_grouped_mm", [](const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts, int64_t cap) {
    return op::grouped_mm(x, w, counts, cap);
  }, py::arg("x"), py::arg("w"), py::arg("counts"), py::arg("capacity_rows") = -1, nogil);
  m.def("eager_attention", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, OptD scale) {
    return op::attention(q, k, v, causal, scale);
  }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("scale") = py::none(), nogil);
  m.def("eager_ring_attention", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                   OptD scale, const std::string& sharding, int64_t seq, const std::string& g) {
    return op::ring_attention(q, k, v, causal, scale, sharding, seq, g);
  }, nogil);
  m.def("eager_ulysses_attention", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                      OptD scale, int64_t seq, const std::string& g) {
    return op::ulysses_attention(q, k, v, causal, scale, seq, g);
  }, nogil);
}

}  // namespace weave::py

TORCH_LIBRARY_IMPL(weave, CUDA, m) {
  namespace op = weave::py::op;
  m.impl("all_reduce", TORCH_FN(op::all_reduce));
  m.impl("all_gather", TORCH_FN(op::all_gather));
  m.impl("reduce_scatter", TORCH_FN(op::reduce_scatter));
  m.impl("all_to_all", TORCH_FN(op::all_to_all));
  m.impl("all_gather_matmul", TORCH_FN(op::all_gather_matmul));
  m.impl("matmul_reduce_scatter", TORCH_FN(op::matmul_reduce_scatter));
  m.impl("matmul_all_reduce", TORCH_FN(op::matmul_all_reduce));
  m.impl("matmul", TORCH_FN(op::matmul));
  m.impl("matmul_out", TORCH_FN(op::matmul_out));
  m.impl("scaled_mm", TORCH_FN(op::scaled_mm));
  m.impl("all_gather_scaled_matmul", TORCH_FN(op::all_gather_scaled_matmul));
  m.impl("scaled_matmul_reduce_scatter", TORCH_FN(op::scaled_matmul_reduce_scatter));
  m.impl("grouped_mm", TORCH_FN(op::grouped_mm));
  m.impl("attention", TORCH_FN(op::attention));
  m.impl("ring_attention", TORCH_FN(op::ring_attention));
  m.impl("ulysses_attention", TORCH_FN(op::ulysses_attention));
}
