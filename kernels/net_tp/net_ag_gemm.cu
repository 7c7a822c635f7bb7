// Host side of the inter-node AllGather + GEMM: checks, the once-per-shape agreement, the maps,
// the call on the path.
#include <string>

#include "net_tp/host.hpp"
#include "net_tp/net_ag_adaptive_kernel.cuh"
#include "net_tp/net_ag_gemm_hier_kernel.cuh"
#include "net_tp/net_ag_gemm_kernel.cuh"
#include "net_tp/net_tp.hpp"
#include "tp_common/host.hpp"
#include "weave/runtime/call.hpp"

namespace weave::net {

using bf16 = __nv_bfloat16;
namespace wtp = weave::tp;

NetAgGemm::NetAgGemm(NetPath& path, NetTpOptions opts) : path_(path), opt_(opts) {
  tp_net::check_object(path_, opt_, "net ag_gemm");
}

NetAgGemm::NetAgGemm(NetPath& path, runtime::Communicator& node, NetTpOptions opts) : path_(path), opt_(opts) {
  tp_net::check_object(path_, opt_, "net ag_gemm", true);
  node_ = node_of(path_, node, "net ag_gemm");
}

NetAgGemm::~NetAgGemm() {
  if (ledger_) cudaFree(ledger_);  // after the kernels that use it (cudaFree waits for the device)
}

void NetAgGemm::finish(cudaStream_t stream) { finish_on(path_, node_, stream); }

wtp::AdaptiveStats NetAgGemm::adaptive_stats() const {
  if (!ledger_) return {};
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  return wtp::read_adaptive_stats(ledger_);
}

namespace {

// The globals both forms share: the tiling, the per-owner maps (own rows read from a_shard), B,
// the shape, the idle single-node push, the unit plan.
template <class Gl>
void fill_common(Gl& g, const tp_net::UnitPlan& U, const bf16* a_shard, bf16* a_gathered, const bf16* B, bf16* C,
                 int M, int N, int K, int rank, gemm::BLayout bl) {
  const wtp::Layout& L = U.L;
  g.L = L;
  for (int q = 0; q < L.W; ++q) {
    const wtp::Range sq = wtp::shard(M, L.W, q);
    g.asrc[q] = wtp::map_128x64(q == rank ? a_shard : a_gathered + size_t(sq.begin) * K, sq.size, K, K);
    g.cdst[q] = wtp::map_128x64(C + size_t(sq.begin) * N, sq.size, N, N);
  }
  g.shard = a_shard;
  g.copy_local = a_shard != a_gathered + size_t(wtp::shard(M, L.W, rank).begin) * K;
  g.b = wtp::map_b(B, K, N, bl);
  g.M = M, g.N = N, g.K = K;
  g.tiles_m = L.row_tiles(), g.tiles_n = L.tiles_n, g.group_m = L.group_m, g.accumulate = 0;
  g.rank = rank;
  g.push = wtp::kAgCopyEngine;  // the single-node pushes (the aux role) stay idle
  g.slices = U.P;
  g.A = U;
}

// The adaptive split's cycles per communication task before one is measured (the figures of
// net_gemm_rs.cu's prior): a unit's bytes over mapped host memory at ~2 B per cycle per block and
// over device memory at 16, averaged over the call's tasks (layout.hpp's ag_comm_task). A send
// reads its unit from device memory and writes it into the send buffer (and into the own rows of
// the gathered A when the input lies elsewhere); a receive reads the receive buffer and writes the
// gathered A.
float ag_comm_prior(const tp_net::UnitPlan& U, int rank, bool copy_local) {
  const double unit = double(U.row_bytes) * wtp::kBM / U.P;
  const double sends = tp_net::units(U, rank), recvs = double(tp_net::step_units(U, rank, true));
  const double host = sends + recvs, dev = sends * (copy_local ? 2 : 1) + recvs;
  return static_cast<float>(unit * (host / 2 + dev / 16) / (sends + recvs));
}

}  // namespace

// G = 1: the kernel of net_ag_gemm_kernel.cuh, readiness in device counters of this object. G > 1:
// the hierarchical kernel (net_ag_gemm_hier_kernel.cuh) on the node communicator's signal sets,
// the gathered A in its heap.
void NetAgGemm::run(const bf16* a_shard, bf16* a_gathered, const bf16* B, bf16* C, int M, int N, int K,
                    cudaStream_t stream) {
  const char* who = "net ag_gemm";
  path_.check();
  const int W = path_.world(), rank = path_.rank(), G = node_ ? node_->world() : 1;
  const int extra = G > 1 ? opt_.push_blocks : 0;
  const size_t row = size_t(K) * sizeof(bf16);
  const wtp::Range mine = wtp::shard(M, W, rank);
  const std::string problem = runtime::local_problem([&] {
    wtp::validate(who, M, N, K);
    WEAVE_CHECK(M >= W, who, ": M = ", M, " gives some rank no rows (", W, " ranks)");
    check_buffers(who, {{"a_shard", a_shard, mine.size * row},
                        {"a_gathered", a_gathered, M * row},
                        {"B", B, size_t(N) * row},
                        {"C", C, size_t(M) * N * sizeof(bf16)}});
    if (G > 1)
      check_in_node_heap(*node_, a_gathered, M * row, who, "a_gathered", "the node peers write into it");
    const char* own = reinterpret_cast<const char*>(a_gathered) + mine.begin * row;
    WEAVE_CHECK(reinterpret_cast<const char*>(a_shard) == own ||
                    !runtime::overlap(a_shard, mine.size * row, a_gathered, M * row),
                who, ": a_shard overlaps a_gathered without being this rank's rows of it (rows ", mine.begin, "..",
                mine.begin + mine.size - 1, ")");
    const tp_net::UnitPlan U = tp_net::ag_plan(M, N, K, 2, W, wtp::default_group_m(K), opt_.chunk_bytes, G);
    tp_net::check_room(path_, opt_, who, tp_net::ag_send_needed(U), tp_net::recv_needed(U), tp_net::flags_needed(U),
                       extra);
  });
  // With node peers, a_gathered's place too: they write into it at this rank's place (a new place is
  // a new key, agreed once).
  const AgreedCall agreed_call = agree(path_, agreed_,
        {kOpAgGemm, M, N, K, static_cast<long long>(opt_.b), opt_.chunk_bytes, opt_.send_blocks, opt_.recv_blocks,
         extra, opt_.adaptive, G, G > 1 ? node_->buffer_place(a_gathered) : 0},
        problem, who,
        "M, N, K, B layout, chunk, send blocks, receive blocks, push blocks, adaptive split, ranks per node, "
        "a_gathered's place");

  const tp_net::UnitPlan U = tp_net::ag_plan(M, N, K, 2, W, wtp::default_group_m(K), opt_.chunk_bytes, G);
  const long long commands = tp_net::ag_commands(U, rank);
  if (G == 1) {
    tp_net::NetAgGlobalsT<gemm::GemmGlobals> g{};
    fill_common(g, U, a_shard, a_gathered, B, C, M, N, K, rank, opt_.b);
    g.tile_ready = ready_.zeroed(U.L.row_tiles(), stream);
    g.gathered = reinterpret_cast<char*>(a_gathered);
    if (!opt_.adaptive) {
      tp_net::launch_for_b<tp_net::NetAgKernelNK, tp_net::NetAgKernelKN>(path_, g, commands, opt_, stream, who);
      return;
    }
    // The adaptive split: the same globals, the ledger (zeroed once; the last block out of each
    // launch zeroes its call counters) and the priors.
    tp_net::NetAgAdaptiveGlobalsT<gemm::GemmGlobals> ga{};
    static_cast<tp_net::NetAgGlobalsT<gemm::GemmGlobals>&>(ga) = g;
    if (!ledger_) {
      WEAVE_CUDA_CHECK(cudaMalloc(&ledger_, sizeof(wtp::sm_split::Ledger)));
      WEAVE_CUDA_CHECK(cudaMemsetAsync(ledger_, 0, sizeof(wtp::sm_split::Ledger), stream));
    }
    ga.set_split(static_cast<wtp::sm_split::Ledger*>(ledger_), wtp::adaptive_priors(K, 0).compute,
                 ag_comm_prior(U, rank, g.copy_local != 0));
    tp_net::launch_adaptive<tp_net::NetAgAdaptiveKernelNK, tp_net::NetAgAdaptiveKernelKN>(path_, ga, commands, opt_,
                                                                                          stream, who);
    return;
  }
  runtime::Communicator& node = *node_;
  // One set pair per (shape, P): every launch of a set signals P per row tile, so round * P holds.
  const std::vector<long long> key = {M, N, K, U.P};
  const std::vector<int> counts = {U.L.row_tiles(), 1};
  runtime::SignalSet& rd = sig_.get(node, key, counts, 0);
  runtime::SignalSet& ar = sig_.get(node, key, counts, 1);
  const runtime::PeerPtrs pp = node.peers(a_gathered, M * row);
  tp_net::NetHierAgGlobalsT<gemm::GemmGlobals> g{};
  fill_common(g, U, a_shard, a_gathered, B, C, M, N, K, rank, opt_.b);
  for (int d = 0; d < G; ++d) g.node_gathered[d] = static_cast<char*>(pp[d]);
  g.ready = rd.view();
  g.arrive = ar.view();
  g.ready_round = rd.next_round(stream, false);
  g.arrive_round = ar.next_round(stream, false);
  g.recv_blocks = opt_.recv_blocks;
  tp_net::launch_for_b<tp_net::NetHierAgKernelNK, tp_net::NetHierAgKernelKN>(path_, g, commands, opt_, stream, who,
                                                                              extra);
}

}  // namespace weave::net
