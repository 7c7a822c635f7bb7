// Host side of the inter-node GEMM + ReduceScatter / AllReduce (nodes of one or more ranks): checks,
// the once-per-shape agreement, the scratch for this rank's partial product, the maps, the call on
// the path.
#include <string>

#include "net_tp/host.hpp"
#include "net_tp/net_gemm_rs_adaptive.cuh"
#include "net_tp/net_gemm_rs_kernel.cuh"
#include "net_tp/net_tp.hpp"
#include "tp_common/host.hpp"
#include "weave/runtime/call.hpp"

namespace weave::net {

using bf16 = __nv_bfloat16;
namespace wtp = weave::tp;

NetGemmRs::NetGemmRs(NetPath& path, NetTpOptions opts) : path_(path), opt_(opts) {
  tp_net::check_object(path_, opt_, "net gemm_rs");
}
NetGemmRs::NetGemmRs(NetPath& path, runtime::Communicator& node, NetTpOptions opts) : path_(path), opt_(opts) {
  tp_net::check_object(path_, opt_, "net gemm_rs", true);
  node_ = node_of(path_, node, "net gemm_rs");
}
NetGemmRs::~NetGemmRs() {
  if (ledger_) cudaFree(ledger_);  // after the kernels that use it (cudaFree waits for the device)
  if (!scratch_) return;
  if (!node_) {
    cudaFree(scratch_);
    return;
  }
  (void)node_->quiesce();  // no node rank's kernel still reads it (never throws)
  try {
    node_->free(scratch_);
  } catch (const Error&) {  // a destructor must not throw; the heap goes with the communicator
  }
}

void NetGemmRs::finish(cudaStream_t stream) { finish_on(path_, node_, stream); }

wtp::AdaptiveStats NetGemmRs::adaptive_stats() const {
  if (!ledger_) return {};
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  return wtp::read_adaptive_stats(ledger_);
}

namespace {

// The adaptive split's cycles per communication task before one is measured: a task's bytes over
// mapped host memory at ~2 B per cycle per block (a block's 16-byte reads and writes across PCIe
// are latency-bound), over device memory at 16 (tp::adaptive_priors), averaged over the call's
// tasks (layout.hpp's rs_comm_task). A send writes its unit into the send buffer; a reduction
// reads every step's arrival and its own partial and writes the output (AR: and the stage); a
// gather reads an arrival and writes the output.
float comm_prior(const tp_net::UnitPlan& U, int rank, bool ar) {
  const double unit = double(U.row_bytes) * wtp::kBM / U.P;
  const double sends = double(tp_net::step_units(U, rank, false)), own = tp_net::units(U, rank),
               gathers = ar ? double(tp_net::step_units(U, rank, true)) : 0;
  const double host = sends + own * (tp_net::steps(U) + (ar ? 1 : 0)) + gathers;
  const double dev = sends + own * 2 + gathers;
  return static_cast<float>(unit * (host / 2 + dev / 16) / (sends + own + gathers));
}

}  // namespace

void NetGemmRs::run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, cudaStream_t stream) {
  call(A, B, out, M, N, K, false, stream);
}

NetGemmAr::NetGemmAr(NetPath& path, NetTpOptions opts) : rs_(path, opts) {}
NetGemmAr::NetGemmAr(NetPath& path, runtime::Communicator& node, NetTpOptions opts) : rs_(path, node, opts) {}
void NetGemmAr::run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, cudaStream_t stream) {
  rs_.call(A, B, out, M, N, K, true, stream);
}
void NetGemmAr::finish(cudaStream_t stream) { rs_.finish(stream); }

// This rank's partial product, at least `elems` long: device memory at G = 1, the node's heap at
// G > 1 (every node rank grows it at the same call: the shapes are agreed; the old one goes back
// once no node rank's kernel reads it).
bf16* NetGemmRs::scratch(size_t elems) {
  if (elems <= scratch_elems_) return scratch_;
  if (node_) {
    if (scratch_) {
      WEAVE_CHECK(node_->quiesce(), "net gemm_rs: the node communicator failed while its scratch was in use");
      node_->free(scratch_);
      scratch_ = nullptr;
    }
    scratch_ = static_cast<bf16*>(node_->alloc(elems * sizeof(bf16)));
  } else {
    if (scratch_) WEAVE_CUDA_CHECK(cudaFree(scratch_));  // waits for the kernels that read it
    scratch_ = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&scratch_, elems * sizeof(bf16)));
  }
  scratch_elems_ = elems;
  return scratch_;
}

// G = 1: readiness in device counters of this object. G > 1: on the node communicator's signal
// sets, the partial products in its heap (net_gemm_rs_kernel.cuh).
void NetGemmRs::call(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, bool ar, cudaStream_t stream) {
  const char* who = ar ? "net gemm_ar" : "net gemm_rs";
  path_.check();
  const int W = path_.world(), rank = path_.rank(), G = node_ ? node_->world() : 1;
  const wtp::Range mine = wtp::shard(M, W, rank);
  const std::string problem = runtime::local_problem([&] {
    wtp::validate(who, M, N, K);
    WEAVE_CHECK(M >= W, who, ": M = ", M, " gives some rank no rows (", W, " ranks)");
    check_buffers(who, {{"A", A, size_t(M) * K * sizeof(bf16)},
                        {"B", B, size_t(N) * K * sizeof(bf16)},
                        {"out", out, size_t(ar ? M : mine.size) * N * sizeof(bf16)}});
    if (G > 1 && ar)
      check_in_node_heap(*node_, out, size_t(M) * N * sizeof(bf16), who, "out",
                         "the node peers write the rows they reduced or received into it");
    const tp_net::UnitPlan U = tp_net::rs_plan(M, N, W, wtp::default_group_m(K), opt_.chunk_bytes, G);
    if (ar)
      tp_net::check_room(path_, opt_, who, tp_net::ar_send_needed(U), tp_net::ar_recv_needed(U),
                         tp_net::ar_flags_needed(U));
    else
      tp_net::check_room(path_, opt_, who, tp_net::rs_send_needed(U), tp_net::recv_needed(U), tp_net::flags_needed(U));
  });
  // GEMM+AR with node peers: out's place too (they write into it at this rank's place; a new place
  // is a new key, agreed once).
  const AgreedCall agreed_call = agree(path_, agreed_,
        {ar ? kOpGemmAr : kOpGemmRs, M, N, K, static_cast<long long>(opt_.b), opt_.chunk_bytes, opt_.send_blocks,
         opt_.recv_blocks, opt_.adaptive, G, G > 1 && ar ? node_->buffer_place(out) : 0},
        problem, who, "M, N, K, B layout, chunk, send blocks, receive blocks, adaptive split, ranks per node, out's place");

  bf16* const part = scratch(size_t(M) * N);
  const tp_net::UnitPlan U = tp_net::rs_plan(M, N, W, wtp::default_group_m(K), opt_.chunk_bytes, G);
  const wtp::Layout& L = U.L;
  tp_net::NetRsGlobalsT<gemm::GemmGlobals> g{};
  for (int q = 0; q < W; ++q) {
    const wtp::Range sq = wtp::shard(M, W, q);
    g.sc[q] = wtp::map_128x64(part + size_t(sq.begin) * N, sq.size, N, N);
  }
  g.a = wtp::map_128x64(A, M, K, K);
  g.b = wtp::map_b(B, K, N, opt_.b);
  g.M = M, g.N = N, g.K = K;
  g.tiles_m = L.row_tiles(), g.tiles_n = L.tiles_n, g.group_m = L.group_m, g.accumulate = 0;
  g.scratch = part;
  g.out = out;
  g.U = U;
  g.rank = rank;
  g.all_reduce = ar;
  const long long commands = ar ? tp_net::ar_commands(U, rank) : tp_net::rs_commands(U, rank);
  if (G == 1 && opt_.adaptive) {
    tp_net::NetRsAdaptiveGlobalsT<gemm::GemmGlobals> ga{};
    static_cast<tp_net::NetRsGlobalsT<gemm::GemmGlobals>&>(ga) = g;
    ga.tile_done = done_.zeroed(L.row_tiles(), stream);
    if (!ledger_) {
      WEAVE_CUDA_CHECK(cudaMalloc(&ledger_, sizeof(wtp::sm_split::Ledger)));
      WEAVE_CUDA_CHECK(cudaMemsetAsync(ledger_, 0, sizeof(wtp::sm_split::Ledger), stream));
    }
    ga.set_split(static_cast<wtp::sm_split::Ledger*>(ledger_), wtp::adaptive_priors(K, 0).compute,
                 comm_prior(U, rank, ar));
    tp_net::launch_adaptive<tp_net::NetRsAdaptiveKernelNK, tp_net::NetRsAdaptiveKernelKN>(path_, ga, commands, opt_,
                                                                                          stream, who);
    return;
  }
  if (G == 1) {
    g.tile_done = done_.zeroed(L.row_tiles(), stream);
    tp_net::launch_for_b<tp_net::NetRsKernelNK, tp_net::NetRsKernelKN>(path_, g, commands, opt_, stream, who);
    return;
  }
  runtime::Communicator& node = *node_;
  // Sets per (shape, P, operator): every launch signals G x tiles_n per row tile on its collector
  // (ready), once per rank (arrive) and, AR only, P per row tile of another local index (landed).
  const std::vector<long long> key = {M, N, U.P, ar};
  std::vector<int> counts = {L.row_tiles(), 1};
  if (ar) counts.push_back(L.row_tiles());
  runtime::SignalSet& rd = sig_.get(node, key, counts, 0);
  runtime::SignalSet& av = sig_.get(node, key, counts, 1);
  const runtime::PeerPtrs ps = node.peers(part, size_t(M) * N * sizeof(bf16));
  for (int d = 0; d < G; ++d) g.node_scratch[d] = static_cast<const char*>(ps[d]);
  g.ready = rd.view();
  g.arrive = av.view();
  g.ready_round = rd.next_round(stream, false);
  g.arrive_round = av.next_round(stream, false);
  if (ar) {
    runtime::SignalSet& ld = sig_.get(node, key, counts, 2);
    const runtime::PeerPtrs po = node.peers(out, size_t(M) * N * sizeof(bf16));
    for (int d = 0; d < G; ++d) g.node_out[d] = static_cast<char*>(po[d]);
    g.landed = ld.view();
    g.landed_round = ld.next_round(stream, false);
  }
  tp_net::launch_for_b<tp_net::NetHierRsKernelNK, tp_net::NetHierRsKernelKN>(path_, g, commands, opt_, stream, who);
}

}  // namespace weave::net
