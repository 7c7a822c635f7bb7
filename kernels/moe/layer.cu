// The MoE layer forward (layer.hpp), non-fused and fused (dispatch_gemm instead of the dispatch and
// the up GEMM, gemm_combine instead of the down GEMM and combine): five or three steps in one
// stream, no host synchronisation.
// Why the order is safe without extra handshakes (exchange.hpp / README "Dispatch and combine"):
// - the dispatch's count exchange doubles as "the peer's previous call is over": a rank pushes
//   into a peer's grouped buffer only after that peer's count row for this call arrived, i.e.
//   after the peer's earlier up GEMM (stream order before its dispatch) stopped reading it;
// - combine returns (in stream order) only after every peer has read this rank's output buffer,
//   so the next call's down GEMM may overwrite it;
// - the GEMMs read the dispatch's device counts (L ints) and SwiGLU the device total
//   (offsets[L]); a failed dispatch leaves them zero, so nothing computes and combine writes NaN.
#include "moe/layer.hpp"

#include <initializer_list>

#include "moe/dispatch_gemm.hpp"
#include "moe/swiglu.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/runtime/call.hpp"

namespace weave::moe {

namespace {

// A forward may still be running on some stream of the scratch's device: wait for it there before
// handing the memory back, then leave the caller's device current again.
void free_on_device(int device, std::initializer_list<void*> ptrs) {
  int current = 0;
  cudaGetDevice(&current);
  cudaSetDevice(device);
  cudaDeviceSynchronize();
  for (void* p : ptrs) cudaFree(p);
  cudaSetDevice(current);
}

}  // namespace

MoeLayerScratch::MoeLayerScratch(const MoeExchange& ex, int ffn) : F_(ffn), cap_(ex.config().capacity) {
  WEAVE_CHECK(ffn > 0 && ffn % 8 == 0, "moe layer: F = ", ffn, " must be a positive multiple of 8");
  WEAVE_CUDA_CHECK(cudaGetDevice(&device_));
  device_status();  // the grouped GEMMs' status words, made here rather than in a graph capture
  WEAVE_CUDA_CHECK(cudaMalloc(&G_, static_cast<size_t>(cap_) * 2 * F_ * sizeof(__nv_bfloat16)));
  const cudaError_t e = cudaMalloc(&H_, static_cast<size_t>(cap_) * F_ * sizeof(__nv_bfloat16));
  if (e != cudaSuccess) {
    cudaFree(G_);
    WEAVE_CUDA_CHECK(e);
  }
}

MoeLayerScratch::~MoeLayerScratch() { free_on_device(device_, {G_, H_}); }

void moe_layer_forward(MoeExchange& ex, MoeLayerScratch& sc, const __nv_bfloat16* x, const int* topk_idx,
                       const float* topk_weights, int T, const __nv_bfloat16* W_up, const __nv_bfloat16* W_down,
                       __nv_bfloat16* out, cudaStream_t stream, const GroupedGemmOptions& gemm_opt) {
  const ExchangeConfig& cf = ex.config();
  const int F = sc.ffn(), H = cf.hidden, R = cf.capacity, L = cf.experts / ex.communicator().world();
  // Everything the GEMMs and SwiGLU would refuse, checked before the dispatch starts, and agreed
  // with every rank: a rank that threw between the dispatch and the combine would leave its peers
  // waiting for signals that never come.
  const std::string problem = runtime::local_problem([&] {
    WEAVE_CHECK(ex.expert_output() != nullptr,
                "moe layer: the exchange needs its output buffer (ExchangeConfig::output_buffer)");
    WEAVE_CHECK(sc.capacity() == R, "moe layer: scratch sized for ", sc.capacity(),
                " rows but the exchange's capacity is ", R);
    validate_grouped(ex.expert_input(), W_up, sc.up_output(), reinterpret_cast<const int*>(16), L, 2 * F, H, R);
    validate_grouped(sc.swiglu_output(), W_down, ex.expert_output(), reinterpret_cast<const int*>(16), L, H, F, R);
    check_extent("moe layer", "W_up", W_up, static_cast<size_t>(L) * 2 * F * H * sizeof(__nv_bfloat16));
    check_extent("moe layer", "W_down", W_down, static_cast<size_t>(L) * H * F * sizeof(__nv_bfloat16));
    validate_grouped_options(gemm_opt, L, R, ex.communicator().sm_count());
  });
  ex.communicator().agree_call("moe.layer", "E, H, k, F, capacity", {cf.experts, H, cf.topk, F, R}, problem, stream);
  // The fused layer's kernels never split K; unless a split is forced, neither do these GEMMs, so
  // that both layers round the same bits.
  GroupedGemmOptions o = gemm_opt;
  if (o.split_k == 0) o.split_k = 1;
  const Dispatched d = ex.dispatch(x, topk_idx, T, stream);
  // Up: G[rows of l] = X[rows of l] W_up[l]^T (N = 2F: gate, then up), counts on the device.
  grouped_gemm(d.rows, W_up, sc.up_output(), d.counts, L, 2 * F, H, R, stream, o);
  // H = silu(gate) * up on the rows the dispatch delivered: offsets[L] is their total.
  swiglu(sc.up_output(), sc.swiglu_output(), d.offsets + L, R, F, stream);
  // Down, into the symmetric output buffer that combine pulls from.
  grouped_gemm(sc.swiglu_output(), W_down, ex.expert_output(), d.counts, L, H, F, R, stream, o);
  ex.combine(ex.expert_output(), topk_weights, out, T, stream);
}

void moe_layer_forward_fused(MoeExchange& ex, MoeGemmCombine& gc, MoeLayerScratch& sc, const __nv_bfloat16* x,
                             const int* topk_idx, const float* topk_weights, int T, const __nv_bfloat16* W_up,
                             const __nv_bfloat16* W_down, __nv_bfloat16* out, cudaStream_t stream,
                             const GroupedGemmOptions& gemm_opt) {
  const ExchangeConfig& cf = ex.config();
  const int F = sc.ffn(), H = cf.hidden, R = cf.capacity, L = cf.experts / ex.communicator().world();
  // As the non-fused layer: everything dispatch_gemm, SwiGLU and gemm_combine would refuse, agreed
  // before the dispatch (their own agreements then find nothing).
  std::string problem = runtime::local_problem([&] {
    WEAVE_CHECK(&gc.exchange() == &ex, "moe layer (fused): the MoeGemmCombine was made on another exchange");
    WEAVE_CHECK(sc.capacity() == R, "moe layer (fused): scratch sized for ", sc.capacity(),
                " rows but the exchange's capacity is ", R);
  });
  if (problem.empty()) problem = dispatch_gemm_problem(ex, W_up, 2 * F, sc.up_output(), gemm_opt);
  if (problem.empty()) problem = gc.problem(nullptr, sc.swiglu_output(), W_down, F, topk_weights, out, T, gemm_opt);
  ex.communicator().agree_call("moe.layer_fused", "E, H, k, F, capacity", {cf.experts, H, cf.topk, F, R}, problem,
                               stream);
  const Dispatched d = dispatch_gemm(ex, x, topk_idx, T, W_up, 2 * F, sc.up_output(), stream, gemm_opt);
  swiglu(sc.up_output(), sc.swiglu_output(), d.offsets + L, R, F, stream);
  gc.run(d, sc.swiglu_output(), W_down, F, topk_weights, out, T, stream, gemm_opt);
}

MoeLowLatencyScratch::MoeLowLatencyScratch(const MoeLowLatency& ll, int ffn)
    : F_(ffn), R_(ll.local_experts() * ll.row_stride()), hidden_(ll.config().hidden) {
  WEAVE_CHECK(ffn > 0 && ffn % 8 == 0, "moe low-latency layer: F = ", ffn, " must be a positive multiple of 8");
  WEAVE_CUDA_CHECK(cudaGetDevice(&device_));
  device_status();  // as MoeLayerScratch
  const size_t rows = static_cast<size_t>(R_);
  WEAVE_CUDA_CHECK(cudaMalloc(&G_, rows * (3 * static_cast<size_t>(F_) + hidden_) * sizeof(__nv_bfloat16)));
  H_ = G_ + rows * 2 * F_;
  Y_ = H_ + rows * F_;
}

MoeLowLatencyScratch::~MoeLowLatencyScratch() { free_on_device(device_, {G_}); }

LowLatencyDispatched moe_low_latency_forward(MoeLowLatency& ll, MoeLowLatencyScratch& sc, const __nv_bfloat16* x,
                                             const int* topk_idx, const float* topk_weights, int T,
                                             const __nv_bfloat16* W_up, const __nv_bfloat16* W_down,
                                             __nv_bfloat16* out, cudaStream_t stream,
                                             const GroupedGemmOptions& gemm_opt) {
  const LowLatencyConfig& cf = ll.config();
  const int L = ll.local_experts(), S = ll.row_stride(), R = L * S, H = cf.hidden, F = sc.ffn();
  GroupedGemmOptions o = gemm_opt;
  o.row_stride = S;
  // As the other layers: everything the GEMMs and SwiGLU would refuse, agreed with every rank
  // before the dispatch (a rank that threw between the dispatch and its combine would leave its
  // peers waiting for signals that never come).
  const std::string problem = runtime::local_problem([&] {
    WEAVE_CHECK(sc.rows() == R && sc.hidden() == H, "moe low-latency layer: scratch sized for ", sc.rows(),
                " rows of hidden ", sc.hidden(), " but the layout has ", R, " of ", H);
    const int* counts = reinterpret_cast<const int*>(16);  // any aligned address: the counts' own check
    validate_grouped(ll.receive_buffer(), W_up, sc.up_output(), counts, L, 2 * F, H, R);
    validate_grouped(sc.swiglu_output(), W_down, sc.expert_output(), counts, L, H, F, R);
    validate_grouped_options(o, L, R, ll.communicator().sm_count());
    check_extent("moe low-latency layer", "W_up", W_up, static_cast<size_t>(L) * 2 * F * H * sizeof(__nv_bfloat16));
    check_extent("moe low-latency layer", "W_down", W_down, static_cast<size_t>(L) * H * F * sizeof(__nv_bfloat16));
  });
  ll.communicator().agree_call("moe.ll.layer", "E, H, k, F, max_tokens", {cf.experts, H, cf.topk, F, cf.max_tokens},
                               problem, stream);
  const LowLatencyDispatched d = ll.dispatch(x, topk_idx, T, stream);
  grouped_gemm(d.rows, W_up, sc.up_output(), d.counts, L, 2 * F, H, R, stream, o);
  swiglu_strided(sc.up_output(), sc.swiglu_output(), d.counts, L, S, F, stream);
  grouped_gemm(sc.swiglu_output(), W_down, sc.expert_output(), d.counts, L, H, F, R, stream, o);
  ll.combine(sc.expert_output(), topk_weights, out, T, stream);
  return d;
}

}  // namespace weave::moe
