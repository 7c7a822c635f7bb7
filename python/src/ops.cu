// weave._C's calls into the kernels (ops.hpp): integers to typed pointers, the kernels' objects
// made at their first call.
#include "ops.hpp"

#include <cuda_runtime.h>

#include <climits>

#include "ag_gemm/ag_gemm.hpp"
#include "attention/attention.hpp"
#include "collectives/collectives.hpp"
#include "gemm/gemm.hpp"
#include "gemm_fp8/gemm_fp8.hpp"
#include "gemm_ar/gemm_ar.hpp"
#include "gemm_rs/gemm_rs.hpp"
#include "moe/exchange.hpp"
#include "moe/gemm_combine.hpp"
#include "moe/grouped_gemm.hpp"
#include "moe/layer.hpp"
#include "moe/layout.hpp"
#include "moe/low_latency.hpp"
#include "ring_attention/ring_attention.hpp"
#include "ulysses/ulysses.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/runtime/call.hpp"

namespace weave::py {

namespace {

using bf16 = __nv_bfloat16;

template <class T>
T* ptr(Ptr p) {
  return reinterpret_cast<T*>(p);
}
cudaStream_t stream_of(Ptr s) { return reinterpret_cast<cudaStream_t>(s); }
DType dtype_of(Dt t) { return static_cast<DType>(static_cast<int>(t)); }

coll::Shape shape_of(const std::vector<long long>& d) {
  WEAVE_CHECK(!d.empty() && d.size() <= 4, "a collective takes 1 to 4 dimensions, got ", d.size());
  coll::Shape s;
  s.ndim = static_cast<int>(d.size());
  for (size_t i = 0; i < d.size(); ++i) s.d[i] = d[i];
  return s;
}

tp::Options tp_options(int num_comm_sms, int variant, bool b_nk) {
  tp::Options o;
  o.num_comm_sms = num_comm_sms;
  o.variant = variant;
  o.b = b_nk ? gemm::BLayout::NK : gemm::BLayout::KN;
  return o;
}

// The kernel object made at its first use (its constructor is collective: every rank makes it at
// the same call, since every rank calls the same operator).
template <class T>
T& lazy(std::unique_ptr<T>& p, runtime::Communicator& c) {
  if (!p) p = std::make_unique<T>(c);
  return *p;
}

}  // namespace

void set_device(int device) {
  int cur = -1;
  WEAVE_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != device) WEAVE_CUDA_CHECK(cudaSetDevice(device));
}

void gemm(int device, Ptr A, Ptr B, Ptr C, int M, int N, int K, bool b_nk, Ptr stream, bool a_km, Ptr bias,
          int bias_type, bool out_f32, bool accumulate) {
  set_device(device);
  gemm::Options opt;
  opt.a_layout = a_km ? gemm::ALayout::KM : gemm::ALayout::MK;
  opt.bias_type = static_cast<gemm::BiasType>(bias_type);  // gemm::validate_args rejects unknown values
  opt.bias = reinterpret_cast<const void*>(bias);
  opt.accumulate = accumulate;
  const gemm::BLayout bl = b_nk ? gemm::BLayout::NK : gemm::BLayout::KN;
  if (out_f32)
    gemm::gemm(ptr<const bf16>(A), ptr<const bf16>(B), ptr<float>(C), M, N, K, bl, opt, stream_of(stream));
  else
    gemm::gemm(ptr<const bf16>(A), ptr<const bf16>(B), ptr<bf16>(C), M, N, K, bl, opt, stream_of(stream));
}

void gemm_fp8(int device, Ptr A, int a_type, Ptr B, int b_type, Ptr C, int M, int N, int K, Ptr scale_a,
              Ptr scale_b, bool block_scaled, Ptr stream) {
  set_device(device);
  WEAVE_CHECK((a_type == 0 || a_type == 1) && (b_type == 0 || b_type == 1), "gemm_fp8: unknown fp8 types ", a_type,
              ", ", b_type);
  const auto at = static_cast<gemm_fp8::Fp8>(a_type), bt = static_cast<gemm_fp8::Fp8>(b_type);
  const auto* sa = ptr<const float>(scale_a);
  const auto* sb = ptr<const float>(scale_b);
  if (block_scaled)
    gemm_fp8::gemm_block_scaled(ptr<const void>(A), at, ptr<const void>(B), bt, ptr<bf16>(C), M, N, K, sa, sb, {},
                                stream_of(stream));
  else
    gemm_fp8::gemm(ptr<const void>(A), at, ptr<const void>(B), bt, ptr<bf16>(C), M, N, K, sa, sb, {},
                   stream_of(stream));
}

long long fp8_block_scale_a_count(int M, int K) {
  return static_cast<long long>(gemm_fp8::block_scale_a_count(M, K));
}
long long fp8_block_scale_b_count(int N, int K) {
  return static_cast<long long>(gemm_fp8::block_scale_b_count(N, K));
}

void grouped_gemm(int device, Ptr X, Ptr W, Ptr Y, Ptr counts, int E, int N, int K, int R_cap, bool w_kn,
                  Ptr stream) {
  set_device(device);
  moe::GroupedGemmOptions opt;
  opt.layout = w_kn ? gemm::BLayout::KN : gemm::BLayout::NK;
  moe::grouped_gemm(ptr<const bf16>(X), ptr<const bf16>(W), ptr<bf16>(Y), ptr<const int>(counts), E, N, K, R_cap,
                    stream_of(stream), opt);
}

GroupedStatus grouped_gemm_status(int device, Ptr stream) {
  set_device(device);
  const moe::GroupedStatus s = moe::take_status(stream_of(stream));
  GroupedStatus r;
  r.error = s.error;
  r.expert = s.expert;
  r.count = s.count;
  r.rows = s.rows;
  r.capacity = s.capacity;
  if (s.any()) r.message = s.message();
  return r;
}

long long moe_receive_capacity(int T, int k, int world, int experts, double slack) {
  WEAVE_CHECK(T >= 0 && k >= 1 && world >= 1 && experts >= 1 && experts % world == 0 && slack > 0,
              "moe capacity: needs T >= 0, k >= 1, experts a positive multiple of world, slack > 0");
  // receive_capacity returns an int: past INT_MAX rows (the worst case bounds it) it would wrap.
  WEAVE_CHECK(moe::worst_case_rows(T, k, moe::Geometry{world, experts}) <= INT_MAX,
              "moe capacity: the worst case (", moe::worst_case_rows(T, k, moe::Geometry{world, experts}),
              " rows) does not fit in int32; pass a capacity");
  return moe::receive_capacity(T, k, moe::Geometry{world, experts}, slack);
}

long long moe_worst_case_rows(int T, int k, int world, int experts) {
  WEAVE_CHECK(T >= 0 && k >= 1 && world >= 1 && experts >= 1 && experts % world == 0,
              "moe worst case: needs T >= 0, k >= 1, experts a positive multiple of world");
  return moe::worst_case_rows(T, k, moe::Geometry{world, experts});
}

// Members in construction order: destroyed scratch, combine, then the exchange (which the
// combine must not outlive). Destruction is collective (symmetric frees, signal-set quiesces).
// A low-latency object has `ll` (and, with ffn > 0, `scratch`) and none of the layer's members.
struct Moe::Impl {
  runtime::Communicator& c;
  bool fused;
  std::unique_ptr<moe::MoeExchange> ex;
  std::unique_ptr<moe::MoeGemmCombine> gc;
  std::unique_ptr<moe::MoeLayerScratch> sc;
  std::unique_ptr<moe::MoeLowLatency> ll;
  std::unique_ptr<moe::MoeLowLatencyScratch> ll_scratch;  // the decode layer's (ffn > 0)
  Impl(runtime::Communicator& cc, bool f) : c(cc), fused(f) {}
};

Moe::Moe(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Moe> Moe::low_latency(runtime::Communicator& c, int experts, int hidden, int ffn, int topk,
                                      int max_tokens) {
  set_device(c.device());
  c.check_same("moe low-latency layer (F)", {ffn});
  WEAVE_CHECK(ffn >= 0 && ffn % 8 == 0, "moe low-latency: ffn = ", ffn,
              " must be a multiple of 8 (0: no decode forward)");  // the same F everywhere: every rank throws
  auto m = std::make_unique<Impl>(c, false);
  m->ll = std::make_unique<moe::MoeLowLatency>(c, moe::LowLatencyConfig{experts, hidden, topk, max_tokens});
  if (ffn > 0) m->ll_scratch = std::make_unique<moe::MoeLowLatencyScratch>(*m->ll, ffn);
  return std::unique_ptr<Moe>(new Moe(std::move(m)));
}

Moe::Moe(runtime::Communicator& c, int experts, int hidden, int ffn, int topk, int max_tokens, int capacity,
         bool fused, bool output_buffer)
    : impl_(std::make_unique<Impl>(c, fused)) {
  set_device(c.device());
  c.check_same("moe layer (F, fused)", {ffn, fused ? 1 : 0});
  moe::ExchangeConfig cf;
  cf.experts = experts;
  cf.hidden = hidden;
  cf.topk = topk;
  cf.max_tokens = max_tokens;
  cf.capacity = capacity;
  cf.output_buffer = output_buffer || !fused;  // the non-fused layer's down GEMM writes there
  impl_->ex = std::make_unique<moe::MoeExchange>(c, cf);
  if (fused) impl_->gc = std::make_unique<moe::MoeGemmCombine>(*impl_->ex);
  impl_->sc = std::make_unique<moe::MoeLayerScratch>(*impl_->ex, ffn);
}

Moe::~Moe() {
  if (impl_) cudaSetDevice(impl_->c.device());  // the members free memory on the layer's device
}

void Moe::forward(Ptr x, Ptr idx, Ptr w, int T, Ptr W_up, Ptr W_down, Ptr out, Ptr stream) {
  Impl& m = *impl_;
  set_device(m.c.device());
  const cudaStream_t s = stream_of(stream);
  if (m.ll) {
    // F is the same on every rank (checked when the object was made), so every rank throws here.
    WEAVE_CHECK(m.ll_scratch != nullptr,
                "moe low-latency forward: the object was made without ffn (no scratch for the layer)");
    moe::moe_low_latency_forward(*m.ll, *m.ll_scratch, ptr<const bf16>(x), ptr<const int>(idx), ptr<const float>(w), T,
                                 ptr<const bf16>(W_up), ptr<const bf16>(W_down), ptr<bf16>(out), s);
    return;
  }
  if (m.fused)
    moe::moe_layer_forward_fused(*m.ex, *m.gc, *m.sc, ptr<const bf16>(x), ptr<const int>(idx), ptr<const float>(w), T,
                                 ptr<const bf16>(W_up), ptr<const bf16>(W_down), ptr<bf16>(out), s);
  else
    moe::moe_layer_forward(*m.ex, *m.sc, ptr<const bf16>(x), ptr<const int>(idx), ptr<const float>(w), T,
                           ptr<const bf16>(W_up), ptr<const bf16>(W_down), ptr<bf16>(out), s);
}

MoeDispatched Moe::dispatch(Ptr x, Ptr idx, int T, Ptr stream) {
  set_device(impl_->c.device());
  MoeDispatched r;
  if (impl_->ll) {
    const moe::LowLatencyDispatched d =
        impl_->ll->dispatch(ptr<const bf16>(x), ptr<const int>(idx), T, stream_of(stream));
    r.rows = reinterpret_cast<Ptr>(d.rows);
    r.counts = reinterpret_cast<Ptr>(d.counts);
    return r;
  }
  const moe::Dispatched d = impl_->ex->dispatch(ptr<const bf16>(x), ptr<const int>(idx), T, stream_of(stream));
  r.rows = reinterpret_cast<Ptr>(d.rows);
  r.counts = reinterpret_cast<Ptr>(d.counts);
  r.offsets = reinterpret_cast<Ptr>(d.offsets);
  return r;
}

void Moe::combine(Ptr y, Ptr w, Ptr out, int T, Ptr stream) {
  set_device(impl_->c.device());
  if (impl_->ll)
    return impl_->ll->combine(ptr<const bf16>(y), ptr<const float>(w), ptr<bf16>(out), T, stream_of(stream));
  impl_->ex->combine(ptr<const bf16>(y), ptr<const float>(w), ptr<bf16>(out), T, stream_of(stream));
}

void Moe::check(Ptr stream) {
  set_device(impl_->c.device());
  if (impl_->ll) return impl_->ll->check(stream_of(stream));
  impl_->ex->check(stream_of(stream));
}

Ptr Moe::expert_input() const {
  return reinterpret_cast<Ptr>(impl_->ll ? impl_->ll->receive_buffer() : impl_->ex->expert_input());
}
Ptr Moe::expert_output() const { return impl_->ll ? 0 : reinterpret_cast<Ptr>(impl_->ex->expert_output()); }
int Moe::row_stride() const { return impl_->ll ? impl_->ll->row_stride() : 0; }

void attention(int device, Ptr q, Ptr k, Ptr v, Ptr o, Ptr lse, int B, int S, int Hq, int Hkv, int D, bool causal,
               float scale, Ptr stream) {
  set_device(device);
  attention::Options opt;
  opt.causal = causal;
  opt.softmax_scale = scale;
  attention::forward(ptr<const bf16>(q), ptr<const bf16>(k), ptr<const bf16>(v), ptr<bf16>(o), ptr<float>(lse),
                     attention::Shape{B, S, Hq, Hkv, D}, opt, stream_of(stream));
}

Rows shard(long long n, int world, int rank) {
  const coll::Range r = coll::shard(n, world, rank);
  return {r.begin, r.size};
}
long long ring_local_rows(long long S, int world, bool zigzag, int rank) {
  return sp::local_rows(S, world, zigzag ? sp::Sharding::Zigzag : sp::Sharding::Contiguous, rank);
}
Rows ring_chunk(long long S, int world, bool zigzag, int rank, int i) {
  const sp::ChunkRange r = sp::chunk_range(S, world, zigzag ? sp::Sharding::Zigzag : sp::Sharding::Contiguous, rank, i);
  return {r.begin, r.rows};
}
int ring_chunks_per_rank(bool zigzag) {
  return sp::chunks_per_rank(zigzag ? sp::Sharding::Zigzag : sp::Sharding::Contiguous);
}

Rows ulysses_rows(long long S, int world, int rank) {
  const sp::RowShard r = sp::ulysses_shard(S, world, rank);
  return {r.begin, r.rows};
}

struct Ops::Impl {
  runtime::Communicator& c;
  std::unique_ptr<coll::Collectives> coll;
  std::unique_ptr<tp::AgGemm> ag;
  std::unique_ptr<tp::GemmRS> rs;
  std::unique_ptr<tp::GemmAR> ar;
  std::unique_ptr<sp::RingAttention> ring;
  std::unique_ptr<sp::Ulysses> uly;
  explicit Impl(runtime::Communicator& cc) : c(cc) {}
  // The communicator's device, current for this thread, then the collectives object.
  coll::Collectives& collectives() {
    set_device(c.device());
    return lazy(coll, c);
  }
};

Ops::Ops(runtime::Communicator& c) : impl_(std::make_unique<Impl>(c)) {}

void Ops::prepare(Family f) {
  Impl& m = *impl_;
  set_device(m.c.device());
  switch (f) {
    case Family::collectives: m.collectives(); break;
    case Family::ag_gemm: lazy(m.ag, m.c); break;
    case Family::gemm_rs: lazy(m.rs, m.c); break;
    case Family::gemm_ar: lazy(m.ar, m.c); break;
    case Family::ring: lazy(m.ring, m.c); break;
    case Family::ulysses: lazy(m.uly, m.c); break;
  }
}
Ops::~Ops() = default;

bool Ops::all_reduce_local(long long count, Dt t, bool aligned4) {
  return coll::local_buffers(impl_->collectives().all_reduce_algo(size_t(count) * dtype_size(dtype_of(t)), false,
                                                                  aligned4));
}

bool Ops::shard_local(bool gather, const std::vector<long long>& full, int dim, Dt t, bool aligned4) {
  coll::Collectives& c = impl_->collectives();
  return coll::local_buffers(gather ? c.all_gather_algo(shape_of(full), dim, dtype_of(t), aligned4)
                                    : c.reduce_scatter_algo(shape_of(full), dim, dtype_of(t), aligned4));
}

void Ops::all_reduce(Ptr in, Ptr out, long long count, Dt t, Ptr stream) {
  impl_->collectives().all_reduce(ptr<const void>(in), ptr<void>(out), size_t(count), dtype_of(t), ReduceOp::sum,
                                  stream_of(stream));
}

void Ops::all_gather(Ptr in, Ptr out, const std::vector<long long>& full, int dim, Dt t, Ptr stream) {
  impl_->collectives().all_gather(ptr<const void>(in), ptr<void>(out), shape_of(full), dim, dtype_of(t),
                                  stream_of(stream));
}

void Ops::reduce_scatter(Ptr in, Ptr out, const std::vector<long long>& full, int dim, Dt t, Ptr stream) {
  impl_->collectives().reduce_scatter(ptr<const void>(in), ptr<void>(out), shape_of(full), dim, dtype_of(t),
                                      ReduceOp::sum, stream_of(stream));
}

void Ops::all_to_all(Ptr in, Ptr out, long long B, long long S, long long H, long long D, Dt t, bool seq_to_head,
                     Ptr stream) {
  coll::Collectives& c = impl_->collectives();
  if (seq_to_head)
    c.all_to_all_seq_to_head(ptr<const void>(in), ptr<void>(out), B, S, H, D, dtype_of(t), stream_of(stream));
  else
    c.all_to_all_head_to_seq(ptr<const void>(in), ptr<void>(out), B, S, H, D, dtype_of(t), stream_of(stream));
}

void Ops::ag_gemm(Ptr a_shard, Ptr a_gathered, Ptr B, Ptr C, int M, int N, int K, Ptr stream, int num_comm_sms,
                  int variant, bool b_nk) {
  set_device(impl_->c.device());
  lazy(impl_->ag, impl_->c)
      .run(ptr<const bf16>(a_shard), ptr<bf16>(a_gathered), ptr<const bf16>(B), ptr<bf16>(C), M, N, K,
           tp_options(num_comm_sms, variant, b_nk), stream_of(stream));
}

void Ops::gemm_rs(Ptr A, Ptr B, Ptr out, int M, int N, int K, Ptr stream, int num_comm_sms, int variant,
                  bool b_nk) {
  set_device(impl_->c.device());
  lazy(impl_->rs, impl_->c)
      .run(ptr<const bf16>(A), ptr<const bf16>(B), ptr<bf16>(out), M, N, K, tp_options(num_comm_sms, variant, b_nk),
           stream_of(stream));
}

void Ops::gemm_ar(Ptr A, Ptr B, Ptr out, int M, int N, int K, Ptr stream, int num_comm_sms, int variant,
                  bool b_nk) {
  set_device(impl_->c.device());
  lazy(impl_->ar, impl_->c)
      .run(ptr<const bf16>(A), ptr<const bf16>(B), ptr<bf16>(out), M, N, K, tp_options(num_comm_sms, variant, b_nk),
           stream_of(stream));
}

void Ops::ag_gemm_fp8(Ptr a_shard, Ptr a_gathered, Ptr B, Ptr scale_a, Ptr scale_b, Ptr C, int M, int N, int K,
                      Ptr stream, int num_comm_sms, int variant) {
  set_device(impl_->c.device());
  using fp8 = __nv_fp8_e4m3;
  lazy(impl_->ag, impl_->c)
      .run(ptr<const fp8>(a_shard), ptr<fp8>(a_gathered), ptr<const fp8>(B), ptr<const float>(scale_a),
           ptr<const float>(scale_b), ptr<bf16>(C), M, N, K, tp_options(num_comm_sms, variant, true),
           stream_of(stream));
}

void Ops::gemm_rs_fp8(Ptr A, Ptr B, Ptr scale_a, Ptr scale_b, Ptr out, int M, int N, int K, Ptr stream,
                      int num_comm_sms, int variant) {
  set_device(impl_->c.device());
  using fp8 = __nv_fp8_e4m3;
  lazy(impl_->rs, impl_->c)
      .run(ptr<const fp8>(A), ptr<const fp8>(B), ptr<const float>(scale_a), ptr<const float>(scale_b), ptr<bf16>(out),
           M, N, K, tp_options(num_comm_sms, variant, true), stream_of(stream));
}

long long Ops::gemm_rs_out_elems(int M, int N, int world) {
  return static_cast<long long>(tp::GemmRS::out_elems(M, N, world));
}

void Ops::ring_attention(Ptr q, Ptr k, Ptr v, Ptr o, Ptr lse, int B, long long S, int Hq, int Hkv, int D, bool causal,
                         float scale, bool zigzag, Ptr stream) {
  set_device(impl_->c.device());
  sp::RingOptions opt;
  opt.causal = causal;
  opt.softmax_scale = scale;
  opt.sharding = zigzag ? sp::Sharding::Zigzag : sp::Sharding::Contiguous;
  lazy(impl_->ring, impl_->c)
      .forward(ptr<const bf16>(q), ptr<const bf16>(k), ptr<const bf16>(v), ptr<bf16>(o), ptr<float>(lse),
               sp::RingShape{B, S, Hq, Hkv, D}, opt, stream_of(stream));
}

void Ops::ulysses_attention(Ptr q, Ptr k, Ptr v, Ptr o, int B, long long S, int Hq, int Hkv, int D, bool causal,
                            float scale, Ptr stream) {
  set_device(impl_->c.device());
  sp::UlyssesOptions opt;
  opt.causal = causal;
  opt.softmax_scale = scale;
  lazy(impl_->uly, impl_->c)
      .forward(ptr<const bf16>(q), ptr<const bf16>(k), ptr<const bf16>(v), ptr<bf16>(o),
               sp::UlyssesShape{B, S, Hq, Hkv, D}, opt, stream_of(stream));
}

long long Ops::ulysses_out_elems(int B, long long S, int Hq, int D, int world) {
  return static_cast<long long>(B) * ((S + world - 1) / world) * Hq * D;
}

}  // namespace weave::py
