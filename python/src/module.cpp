// weave._C: the C++ API for the Python package. Its pybind11 half (this file) takes pointers, sizes
// and streams as Python ints; the torch operators' CUDA kernels are its other half (torch_ops.cpp),
// and the operators' argument rules (plan.hpp) are bound here for the fake implementations. Symmetric tensors leave as DLPack capsules (torch.from_dlpack, no copy) whose
// deleter hands the memory back with Communicator::release. Calls that may wait (on the device,
// on peers) run without the GIL; one communicator's calls run one at a time (a mutex). Element
// types of the collectives are ints: 0 bf16, 1 fp16, 2 fp32 (weave::DType). MoE layers
// (MoeLayer: kernels/moe's exchange, scratch and gemm_combine; MoeLayer.low_latency: the
// low-latency decode mode) belong to one communicator and are made and closed collectively.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm.hpp"
#include "ops.hpp"
#include "plan.hpp"
#include "torch_ops.hpp"
#include "weave/common/gpus.hpp"
#include "weave/runtime/communicator.hpp"
#include "weave/runtime/tuner.hpp"

namespace py = pybind11;
using weave::py::Comm;
using weave::py::Dt;
using weave::py::Ptr;

namespace {

// DLPack (dlpack.h, v0.8 ABI): only what a producer of CUDA tensors needs.
struct DLDevice {
  int32_t device_type;  // kDLCUDA = 2
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;

// What a DLPack capsule owns: the shape, and what to do when the tensor dies. A symmetric tensor's
// `on_delete` holds a reference to the communicator, which therefore outlives its heap's tensors.
struct Owner {
  std::function<void()> on_delete;
  std::vector<int64_t> shape;
  DLManagedTensor managed{};
};

void delete_owner(DLManagedTensor* m) {
  Owner* o = static_cast<Owner*>(m->manager_ctx);
  if (o->on_delete) o->on_delete();
  delete o;
}

size_t checked_bytes(const std::vector<int64_t>& shape, int bits) {
  size_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw py::value_error("weave.empty: negative dimension in the shape");
    n *= size_t(d);
  }
  return std::max<size_t>(n * size_t(bits / 8), 1);
}

// A DLPack capsule ("dltensor") of the compact row-major tensor `shape` of (code, bits) at `data`.
py::capsule dlpack(void* data, DLDevice dev, const std::vector<int64_t>& shape, int code, int bits,
                   std::function<void()> on_delete) {
  auto* o = new Owner{std::move(on_delete), shape, {}};
  DLTensor& t = o->managed.dl_tensor;
  t.data = data;
  t.device = dev;
  t.ndim = static_cast<int32_t>(o->shape.size());
  t.dtype = {static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  t.shape = o->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  o->managed.manager_ctx = o;
  o->managed.deleter = delete_owner;
  // A capsule nobody consumed still owns the tensor; a consumer renames it "used_dltensor".
  return py::capsule(&o->managed, "dltensor", [](PyObject* cap) {
    if (PyCapsule_IsValid(cap, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
      m->deleter(m);
    }
  });
}

// Allocates `shape` of (code, bits) elements in the heap (collective) as a DLPack capsule.
py::capsule empty(const std::shared_ptr<Comm>& c, const std::vector<int64_t>& shape, int code, int bits) {
  const size_t bytes = checked_bytes(shape, bits);
  Ptr p;
  {
    py::gil_scoped_release nogil;
    p = c->alloc(bytes);
  }
  return dlpack(reinterpret_cast<void*>(p), {kDLCUDA, c->comm().device()}, shape, code, bits,
                [c, p] { c->defer_release(p); });
}

// The same capsule over host memory, for the CPU tests of the DLPack path: counts the deletions.
std::atomic<long> host_deleted{0};
py::capsule host_capsule(const std::vector<int64_t>& shape, int code, int bits) {
  void* p = std::calloc(checked_bytes(shape, bits), 1);
  return dlpack(p, {kDLCPU, 0}, shape, code, bits, [p] {
    std::free(p);
    ++host_deleted;
  });
}

// Runs f(Ops&) without the GIL, one call of this communicator at a time.
template <class F>
void locked(Comm& c, F&& f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lk(c.mu());
  f(c.ops());
}

// An MoE layer or low-latency object (weave::py::Moe) of one communicator. Its calls take the
// communicator's lock (they use its call agreement and signals, like every operator). close()
// destroys it (collective); a handle dropped without close() hands it to its communicator
// (Comm::adopt).
class MoeHandle {
 public:
  // make(runtime::Communicator&) -> std::unique_ptr<weave::py::Moe>, run without the GIL under the
  // communicator's lock (collective: it waits for every rank).
  template <class Make>
  MoeHandle(std::shared_ptr<Comm> c, Make&& make) : c_(std::move(c)) {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(c_->mu());
    m_ = make(c_->comm());
  }
  ~MoeHandle() {
    if (m_) c_->adopt(std::move(m_));
  }
  MoeHandle(const MoeHandle&) = delete;
  MoeHandle& operator=(const MoeHandle&) = delete;

  weave::py::Moe& moe() {
    if (!m_) throw std::runtime_error("weave: the MoE layer was closed");
    return *m_;
  }
  bool closed() const { return !m_; }
  void close() {
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(c_->mu());
    m_.reset();
  }
  // Runs f(Moe&) without the GIL under the communicator's lock.
  template <class F>
  void run(F&& f) {
    weave::py::Moe& m = moe();
    py::gil_scoped_release nogil;
    std::lock_guard<std::mutex> lk(c_->mu());
    f(m);
  }
  // A DLPack capsule of `shape` (code, bits) at p: a view of the layer's device memory, which keeps
  // the communicator (and so its heap mapping) alive, not the layer.
  py::capsule view(Ptr p, const std::vector<int64_t>& shape, int code, int bits) {
    std::shared_ptr<Comm> keep = c_;
    return dlpack(reinterpret_cast<void*>(p), {kDLCUDA, c_->comm().device()}, shape, code, bits,
                  [keep] {});
  }

 private:
  std::shared_ptr<Comm> c_;
  std::unique_ptr<weave::py::Moe> m_;
};


// The operators' argument rules for the fake implementations (weave/_ops.py): tensors as Specs
// made from the traced tensors' shapes; a broken rule raises ValueError (plan::ArgError).
void bind_plans(py::module_& m) {
  namespace plan = weave::py::plan;
  using plan::Spec;
  py::class_<Spec>(m, "Spec")
      .def(py::init([](std::vector<int64_t> sizes, std::vector<int64_t> strides, const std::string& dtype,
                       const std::string& device) {
             Spec s;
             s.sizes = std::move(sizes);
             s.strides = std::move(strides);
             s.dtype = plan::dtype_from_name(dtype);
             s.dtype_name = dtype;
             s.device = device;
             return s;
           }),
           py::arg("sizes"), py::arg("strides"), py::arg("dtype"), py::arg("device"));
  auto dt = [](const std::optional<std::string>& name) {
    return name ? std::optional<plan::Dtype>(plan::dtype_from_name(*name)) : std::nullopt;
  };
  m.def("plan_all_reduce", &plan::all_reduce);
  m.def("plan_all_gather", [](const Spec& x, int64_t dim, int64_t full, int rank, int world) {
    const auto p = plan::all_gather(x, dim, full, rank, world);
    return py::make_tuple(p.out, p.dim, p.full, p.cdim);  // the output, and the collective's shape and dim
  });
  m.def("plan_reduce_scatter", [](const Spec& x, int64_t dim, int rank, int world) {
    const auto p = plan::reduce_scatter(x, dim, rank, world);
    return py::make_tuple(p.out, p.dim, p.full, p.cdim);
  });
  m.def("plan_all_to_all", [](const Spec& x, const std::string& direction, int64_t seq_len, int rank, int world) {
    return plan::all_to_all(x, direction, seq_len, rank, world).out;
  });
  m.def("plan_all_gather_matmul", [](const Spec& A, const std::vector<Spec>& Bs, int64_t dim, int world) {
    const auto p = plan::all_gather_matmul(A, Bs, dim, world);
    return py::make_tuple(p.gathered, p.dim);
  });
  m.def("plan_matmul_reduce_scatter", [](const Spec& A, const Spec& B, const std::string& op, int64_t dim, int rank,
                                         int world) {
    const auto p = plan::matmul_reduce_scatter(A, B, op, dim, rank, world);
    return py::make_tuple(p.out, p.dim);
  });
  m.def("plan_all_gather_scaled_matmul", [dt](const Spec& A, const std::vector<Spec>& Bs, const Spec& sa,
                                              const std::vector<Spec>& sbs, int64_t dim, int world,
                                              const std::optional<std::string>& out_dtype) {
    const auto p = plan::all_gather_scaled_matmul(A, Bs, sa, sbs, dim, world, dt(out_dtype), out_dtype.value_or(""));
    return py::make_tuple(p.gathered, p.dim);
  });
  m.def("plan_scaled_matmul_reduce_scatter", [dt](const Spec& A, const Spec& B, const Spec& sa, const Spec& sb,
                                                  const std::string& op, int64_t dim, int rank, int world,
                                                  const std::optional<std::string>& out_dtype) {
    const auto p = plan::scaled_matmul_reduce_scatter(A, B, sa, sb, op, dim, rank, world, dt(out_dtype),
                                                      out_dtype.value_or(""));
    return py::make_tuple(p.out, p.dim);
  });
  m.def("plan_matmul_all_reduce", [](const Spec& A, const Spec& B) { return plan::matmul_all_reduce(A, B).out; });
  m.def("plan_matmul", [dt](const Spec& A, const Spec& B, const std::optional<Spec>& bias,
                            const std::optional<std::string>& out_dtype) {
    const auto p = plan::matmul(A, B, bias, dt(out_dtype), out_dtype.value_or(""));
    return py::make_tuple(p.out, p.f32);
  });
  m.def("plan_matmul_out", [](const Spec& A, const Spec& B, const std::optional<Spec>& bias, const Spec& out) {
    plan::matmul_out(A, B, bias, out);
  });
  m.def("plan_scaled_mm", [dt](const Spec& A, const Spec& B, const Spec& sa, const Spec& sb,
                               const std::optional<std::string>& out_dtype) {
    const auto p = plan::scaled_mm(A, B, sa, sb, dt(out_dtype), out_dtype.value_or(""));
    return py::make_tuple(p.M, p.N);
  });
  m.def("plan_grouped_mm", [](const Spec& x, const Spec& w, const Spec& counts, int64_t cap) {
    const auto p = plan::grouped_mm(x, w, counts, cap);
    return py::make_tuple(p.cap, p.N);
  });
  m.def("plan_attention", [](const std::string& op, const Spec& q, const Spec& k, const Spec& v) {
    const auto p = plan::attention(op.c_str(), q, k, v);
    return py::make_tuple(p.B, p.L, p.Hq);
  });
  m.def("plan_ring_seq", &plan::ring_seq);
  m.def("plan_ulysses_seq", &plan::ulysses_seq);
  using plan::MoeSizes;
  py::class_<MoeSizes>(m, "MoeSizes")
      .def(py::init([](int64_t hidden, int64_t ffn, int64_t topk, int64_t local_experts, int64_t max_tokens,
                       int64_t capacity) { return MoeSizes{hidden, ffn, topk, local_experts, max_tokens, capacity}; }),
           py::arg("hidden"), py::arg("ffn"), py::arg("topk"), py::arg("local_experts"), py::arg("max_tokens"),
           py::arg("capacity"));
  m.def("plan_moe_tokens", [](const std::string& op, const MoeSizes& s, const Spec& x, const Spec& idx) {
    return plan::moe_tokens(op.c_str(), s, x, idx);
  });
  m.def("plan_moe_weights", [](const std::string& op, const MoeSizes& s, const Spec& w, int64_t T) {
    plan::moe_weights(op.c_str(), s, w, T);
  });
  m.def("plan_moe_forward", &plan::moe_forward);
  m.def("plan_moe_expert_rows", [](const std::string& op, const MoeSizes& s, const Spec& y) {
    plan::moe_expert_rows(op.c_str(), s, y);
  });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "weave's C++ API for the Python package (and, registered on import, torch.ops.weave's CUDA kernels)";
  bind_plans(m);
  weave::py::bind_eager_ops(m);

  m.def("_register_group", &weave::py::register_comm, py::arg("group"), py::arg("comm"),
        "the torch operators' communicator of a process group (held weakly: the package owns it)");
  m.def("_set_group_resolver", [](py::function f) {
        // Called (with the GIL) for a group no communicator is registered under; kept for the process.
        static py::function* resolver = nullptr;
        if (!resolver) resolver = new py::function();
        *resolver = std::move(f);
        weave::py::set_comm_resolver([](const std::string& group) {
          py::gil_scoped_acquire gil;
          try {
            (*resolver)(group);
          } catch (py::error_already_set& e) {  // leaves through torch's dispatcher, not pybind11
            throw std::runtime_error(e.what());
          }
        });
      }, py::arg("resolve"), "resolve(group_name): makes and registers the group's communicator");
  m.def("_set_poison", &weave::py::set_poison, py::arg("on"),
        "tests: the torch operators' outputs and staging buffers start as 0xFF bytes (NaN)");
  m.def("_poison", &weave::py::poison);

  m.def(
      "gpu_count",
      [] {
        const weave::GpuCount g = weave::count_gpus();
        return py::make_tuple(g.count, g.error, g.why);
      },
      "(visible GPUs, whether CUDA failed with a driver loaded, the CUDA error) in weave's CUDA runtime");

  // weave.tune's handles on the process's tuner (runtime/tuner.hpp).
  m.def("tuner_mode", [] { return std::string(weave::runtime::mode_name(weave::runtime::Tuner::global().mode())); });
  m.def(
      "set_tuner_mode",
      [](const std::string& mode) {
        if (mode != "model" && mode != "search")
          throw py::value_error("tuner mode must be 'model' or 'search', got '" + mode + "'");
        weave::runtime::Tuner::global().set_mode(mode == "search" ? weave::runtime::TuneMode::search
                                                                   : weave::runtime::TuneMode::model);
      },
      py::arg("mode"));
  m.def("tuner_budget_s", [] { return weave::runtime::Tuner::global().budget_s(); });
  m.def("set_tuner_budget_s", [](double s) { weave::runtime::Tuner::global().set_budget_s(s); });
  m.def("tuner_searches", [] { return weave::runtime::Tuner::global().searches(); });
  m.def("tuner_path", [] { return weave::runtime::Tuner::global().path(); });
  m.def("shard", [](long long n, int world, int rank) {
    const weave::py::Rows r = weave::py::shard(n, world, rank);
    return py::make_tuple(r.begin, r.size);
  }, "(begin, size) of rank's share of n over world ranks: the first n % world ranks get one more");
  m.def("ring_local_rows", &weave::py::ring_local_rows, py::arg("S"), py::arg("world"), py::arg("zigzag"),
        py::arg("rank"));
  m.def("ring_chunk", [](long long S, int world, bool zigzag, int rank, int i) {
    const weave::py::Rows r = weave::py::ring_chunk(S, world, zigzag, rank, i);
    return py::make_tuple(r.begin, r.size);
  });
  m.def("ring_chunks_per_rank", &weave::py::ring_chunks_per_rank);
  m.def("ulysses_rows", [](long long S, int world, int rank) {
    const weave::py::Rows r = weave::py::ulysses_rows(S, world, rank);
    return py::make_tuple(r.begin, r.size);
  });
  m.def("_host_capsule", &host_capsule, py::arg("shape"), py::arg("code"), py::arg("bits"),
        "tests: a DLPack capsule over zeroed host memory, freed when the tensor dies");
  m.def("_host_capsules_deleted", [] { return host_deleted.load(); });
  m.def("gemm_rs_out_elems", &weave::py::Ops::gemm_rs_out_elems);
  m.def("ulysses_out_elems", &weave::py::Ops::ulysses_out_elems);

  m.def("gemm", &weave::py::gemm, py::call_guard<py::gil_scoped_release>(), py::arg("device"), py::arg("A"),
        py::arg("B"), py::arg("C"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("b_nk"), py::arg("stream"),
        py::arg("a_km") = false, py::arg("bias") = 0, py::arg("bias_type") = 0, py::arg("out_f32") = false,
        py::arg("accumulate") = false);
  m.def("gemm_fp8", &weave::py::gemm_fp8, py::call_guard<py::gil_scoped_release>(), py::arg("device"),
        py::arg("A"), py::arg("a_type"), py::arg("B"), py::arg("b_type"), py::arg("C"), py::arg("M"), py::arg("N"),
        py::arg("K"), py::arg("scale_a"), py::arg("scale_b"), py::arg("block_scaled"), py::arg("stream"));
  m.def("fp8_block_scale_a_count", &weave::py::fp8_block_scale_a_count, py::arg("M"), py::arg("K"));
  m.def("fp8_block_scale_b_count", &weave::py::fp8_block_scale_b_count, py::arg("N"), py::arg("K"));
  m.def("grouped_gemm", &weave::py::grouped_gemm, py::call_guard<py::gil_scoped_release>(), py::arg("device"),
        py::arg("X"), py::arg("W"), py::arg("Y"), py::arg("counts"), py::arg("E"), py::arg("N"), py::arg("K"),
        py::arg("R_cap"), py::arg("w_kn"), py::arg("stream"));
  m.def("grouped_gemm_status", [](int device, Ptr stream) {
        weave::py::GroupedStatus s;
        {
          py::gil_scoped_release nogil;  // synchronises the stream
          s = weave::py::grouped_gemm_status(device, stream);
        }
        return py::make_tuple(s.error, s.expert, s.count, s.rows, s.capacity, s.message);
      }, py::arg("device"), py::arg("stream"),
      "(error, expert, count, rows, capacity, message) of the first grouped_gemm launch on `device` that refused "
      "its counts since the last read (error 0: none); synchronises `stream` and clears the status");
  m.def("moe_receive_capacity", &weave::py::moe_receive_capacity, py::arg("T"), py::arg("k"), py::arg("world"),
        py::arg("experts"), py::arg("slack"),
        "kernels/moe/layout.hpp's receive_capacity: rows per rank for balanced routing (clamped to the worst case)");
  m.def("moe_worst_case_rows", &weave::py::moe_worst_case_rows, py::arg("T"), py::arg("k"), py::arg("world"),
        py::arg("experts"), "kernels/moe/layout.hpp's worst_case_rows: W T min(k, E / W)");
  m.def("attention", &weave::py::attention, py::call_guard<py::gil_scoped_release>(), py::arg("device"),
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("B"), py::arg("S"),
        py::arg("Hq"), py::arg("Hkv"), py::arg("D"), py::arg("causal"), py::arg("scale"), py::arg("stream"));

  py::class_<MoeHandle>(m, "MoeLayer")
      .def(py::init([](const std::shared_ptr<Comm>& c, int E, int H, int F, int k, int max_tokens, int capacity,
                       bool fused, bool output_buffer) {
             return std::make_unique<MoeHandle>(c, [&](weave::runtime::Communicator& rc) {
               return std::make_unique<weave::py::Moe>(rc, E, H, F, k, max_tokens, capacity, fused, output_buffer);
             });
           }),
           py::arg("comm"), py::arg("experts"), py::arg("hidden"), py::arg("ffn"), py::arg("topk"),
           py::arg("max_tokens"), py::arg("capacity"), py::arg("fused"), py::arg("output_buffer"),
           "collective: the exchange, the layer's scratch and (fused) the gemm_combine of one layer shape")
      .def_static("low_latency", [](const std::shared_ptr<Comm>& c, int E, int H, int F, int k, int max_tokens) {
             return std::make_unique<MoeHandle>(c, [&](weave::runtime::Communicator& rc) {
               return weave::py::Moe::low_latency(rc, E, H, F, k, max_tokens);
             });
           },
           py::arg("comm"), py::arg("experts"), py::arg("hidden"), py::arg("ffn"), py::arg("topk"),
           py::arg("max_tokens"),
           "collective: the low-latency (decode) mode's object (moe::MoeLowLatency) and, with ffn > 0, the decode "
           "forward's scratch; the same methods run its dispatch, combine, decode forward and check")
      .def_property_readonly("row_stride", [](MoeHandle& h) { return h.moe().row_stride(); },
                             "low-latency: S = W x max_tokens (the receive buffer is L x S x H); a layer: 0")
      .def_property_readonly("closed", &MoeHandle::closed)
      .def("close", &MoeHandle::close, "collective: frees the layer's buffers")
      .def("forward", [](MoeHandle& h, Ptr x, Ptr idx, Ptr w, int T, Ptr up, Ptr down, Ptr out, Ptr s) {
             h.run([&](weave::py::Moe& m) { m.forward(x, idx, w, T, up, down, out, s); });
           }, py::arg("x"), py::arg("topk_idx"), py::arg("topk_weights"), py::arg("T"), py::arg("w_up"),
           py::arg("w_down"), py::arg("out"), py::arg("stream"))
      .def("dispatch", [](MoeHandle& h, Ptr x, Ptr idx, int T, Ptr s) {
             weave::py::MoeDispatched d;
             h.run([&](weave::py::Moe& m) { d = m.dispatch(x, idx, T, s); });
             return py::make_tuple(d.rows, d.counts, d.offsets);
           }, py::arg("x"), py::arg("topk_idx"), py::arg("T"), py::arg("stream"),
           "(rows, counts, offsets) device pointers of the exchange's buffers")
      .def("combine", [](MoeHandle& h, Ptr y, Ptr w, Ptr out, int T, Ptr s) {
             h.run([&](weave::py::Moe& m) { m.combine(y, w, out, T, s); });
           }, py::arg("y"), py::arg("topk_weights"), py::arg("out"), py::arg("T"), py::arg("stream"))
      .def("check", [](MoeHandle& h, Ptr s) { h.run([&](weave::py::Moe& m) { m.check(s); }); }, py::arg("stream"),
           "synchronises the stream; raises the first failed dispatch's reason since the last check")
      .def_property_readonly("expert_input", [](MoeHandle& h) { return h.moe().expert_input(); })
      .def_property_readonly("expert_output", [](MoeHandle& h) { return h.moe().expert_output(); })
      .def("view", &MoeHandle::view, py::arg("ptr"), py::arg("shape"), py::arg("code"), py::arg("bits"),
           "a DLPack capsule viewing the layer's device memory at ptr (not owning it)");

  py::class_<Comm, std::shared_ptr<Comm>>(m, "Communicator")
      .def(py::init([](int rank, int world, const std::string& job_id, const std::string& instance, int device,
                       size_t heap_bytes, int debug) {
             weave::runtime::LaunchInfo info;
             info.rank = info.local_rank = rank;
             info.world = info.local_world = world;
             info.job_id = job_id;
             info.launcher = "torch";
             weave::runtime::CommOptions opt;
             opt.heap_bytes = heap_bytes;
             opt.device = device;
             opt.instance = instance;
             opt.debug = debug;
             py::gil_scoped_release nogil;  // the bootstrap waits for every rank
             return std::make_shared<Comm>(info, opt);
           }),
           py::arg("rank"), py::arg("world"), py::arg("job_id"), py::arg("instance"), py::arg("device"),
           py::arg("heap_bytes") = 0, py::arg("debug") = -1)
      .def_property_readonly("rank", [](Comm& c) { return c.comm().rank(); })
      .def_property_readonly("world", [](Comm& c) { return c.comm().world(); })
      .def_property_readonly("device", [](Comm& c) { return c.comm().device(); })
      .def_property_readonly("heap_bytes", [](Comm& c) { return c.comm().heap_bytes(); })
      .def_property_readonly("heap_used", [](Comm& c) { return c.comm().heap_used(); })
      .def_property_readonly("pending_releases", &Comm::pending)
      .def("owns", &Comm::owns, py::arg("ptr"), py::arg("bytes"),
           "whether [ptr, ptr + bytes) lies in one live symmetric tensor of this communicator")
      .def("empty", &empty, py::arg("shape"), py::arg("code"), py::arg("bits"),
           "collective: a DLPack capsule of a new heap tensor; its memory is released when the tensor dies")
      .def("sync", [](Comm& c, Ptr stream) {
             locked(c, [&](weave::py::Ops&) { c.comm().sync(reinterpret_cast<cudaStream_t>(stream)); });
           }, py::arg("stream") = 0)
      .def("barrier", [](Comm& c) { locked(c, [&](weave::py::Ops&) { c.comm().barrier(); }); })
      .def("refuse_call", [](Comm& c, const std::string& op, const std::string& why, Ptr stream) {
             locked(c, [&](weave::py::Ops&) { c.refuse(op, why, reinterpret_cast<cudaStream_t>(stream)); });
           }, py::arg("op"), py::arg("why"), py::arg("stream"),
           "joins this rank's argument error `why` to the next call's cross-rank agreement (peers fail too)")
      .def("all_reduce_local", [](Comm& c, long long count, int t, bool aligned4) {
             bool r = false;
             locked(c, [&](weave::py::Ops& o) { r = o.all_reduce_local(count, Dt(t), aligned4); });
             return r;
           }, "whether an out-of-place all_reduce of `count` elements may take any device memory (LL, LL128)")
      .def("shard_local", [](Comm& c, bool gather, const std::vector<long long>& full, int dim, int t, bool aligned4) {
             bool r = false;
             locked(c, [&](weave::py::Ops& o) { r = o.shard_local(gather, full, dim, Dt(t), aligned4); });
             return r;
           }, "the same for an all_gather (gather) or reduce_scatter of shape `full` along dim")
      .def("all_reduce", [](Comm& c, Ptr in, Ptr out, long long count, int t, Ptr s) {
             locked(c, [&](weave::py::Ops& o) { o.all_reduce(in, out, count, Dt(t), s); });
           })
      .def("all_gather", [](Comm& c, Ptr in, Ptr out, const std::vector<long long>& full, int dim, int t, Ptr s) {
             locked(c, [&](weave::py::Ops& o) { o.all_gather(in, out, full, dim, Dt(t), s); });
           })
      .def("reduce_scatter", [](Comm& c, Ptr in, Ptr out, const std::vector<long long>& full, int dim, int t, Ptr s) {
             locked(c, [&](weave::py::Ops& o) { o.reduce_scatter(in, out, full, dim, Dt(t), s); });
           })
      .def("all_to_all", [](Comm& c, Ptr in, Ptr out, long long B, long long S, long long H, long long D, int t,
                            bool seq_to_head, Ptr s) {
             locked(c, [&](weave::py::Ops& o) { o.all_to_all(in, out, B, S, H, D, Dt(t), seq_to_head, s); });
           })
      .def("ag_gemm", [](Comm& c, Ptr a, Ptr ag, Ptr B, Ptr C, int M, int N, int K, Ptr s, int ncomm, int variant,
                         bool b_nk) {
             locked(c, [&](weave::py::Ops& o) { o.ag_gemm(a, ag, B, C, M, N, K, s, ncomm, variant, b_nk); });
           }, py::arg("a_shard"), py::arg("a_gathered"), py::arg("B"), py::arg("C"), py::arg("M"), py::arg("N"),
           py::arg("K"), py::arg("stream"), py::arg("num_comm_sms") = -1, py::arg("variant") = -1,
           py::arg("b_nk") = false)
      .def("gemm_rs", [](Comm& c, Ptr A, Ptr B, Ptr out, int M, int N, int K, Ptr s, int ncomm, int variant,
                         bool b_nk) {
             locked(c, [&](weave::py::Ops& o) { o.gemm_rs(A, B, out, M, N, K, s, ncomm, variant, b_nk); });
           }, py::arg("A"), py::arg("B"), py::arg("out"), py::arg("M"), py::arg("N"), py::arg("K"),
           py::arg("stream"), py::arg("num_comm_sms") = -1, py::arg("variant") = -1, py::arg("b_nk") = false)
      .def("gemm_ar", [](Comm& c, Ptr A, Ptr B, Ptr out, int M, int N, int K, Ptr s, int ncomm, int variant,
                         bool b_nk) {
             locked(c, [&](weave::py::Ops& o) { o.gemm_ar(A, B, out, M, N, K, s, ncomm, variant, b_nk); });
           }, py::arg("A"), py::arg("B"), py::arg("out"), py::arg("M"), py::arg("N"), py::arg("K"),
           py::arg("stream"), py::arg("num_comm_sms") = -1, py::arg("variant") = -1, py::arg("b_nk") = false)
      .def("ring_attention", [](Comm& c, Ptr q, Ptr k, Ptr v, Ptr out, Ptr lse, int B, long long S, int Hq, int Hkv,
                                int D, bool causal, float scale, bool zigzag, Ptr s) {
             locked(c, [&](weave::py::Ops& o) {
               o.ring_attention(q, k, v, out, lse, B, S, Hq, Hkv, D, causal, scale, zigzag, s);
             });
           })
      .def("ulysses_attention", [](Comm& c, Ptr q, Ptr k, Ptr v, Ptr out, int B, long long S, int Hq, int Hkv,
                                   int D, bool causal, float scale, Ptr s) {
             locked(c, [&](weave::py::Ops& o) { o.ulysses_attention(q, k, v, out, B, S, Hq, Hkv, D, causal, scale, s); });
           });
}
