// Host side of the inter-node AllGather + GEMM: checks, the once-per-shape agreement, the maps,
// the call on the path.
#include <string>

#include "net_tp/host.hpp"
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
  const NetTopo t = path_.topo();
  const int local = path_.rank() % t.gpus;
  WEAVE_CHECK(node.world() == t.gpus && node.rank() == local, "net ag_gemm: the node communicator has rank ",
              node.rank(), " of ", node.world(), " but this rank is local rank ", local, " of a node of ", t.gpus,
              " ranks (make it over runtime::node_launch_info)");
  WEAVE_CHECK(node.device() == path_.device(), "net ag_gemm: the node communicator uses GPU ", node.device(),
              " but the network path GPU ", path_.device());
  if (t.gpus > 1) node_ = &node;
}

NetAgGemm::~NetAgGemm() = default;

void NetAgGemm::finish(cudaStream_t stream) {
  if (node_) {
    try {
      node_->sync(stream);  // names a timed-out NVLink wait; its failure also fails the path
    } catch (const Error& e) {
      path_.abort(e.what());
      throw;
    }
  }
  path_.finish(stream);
}

void NetAgGemm::run(const bf16* a_shard, bf16* a_gathered, const bf16* B, bf16* C, int M, int N, int K,
                    cudaStream_t stream) {
  if (node_) return run_node(a_shard, a_gathered, B, C, M, N, K, stream);
  const char* who = "net ag_gemm";
  path_.check();
  const int nodes = path_.world(), rank = path_.rank();
  const size_t row = size_t(K) * sizeof(bf16);
  const wtp::Range mine = wtp::shard(M, nodes, rank);
  const std::string problem = runtime::local_problem([&] {
    wtp::validate(who, M, N, K);
    WEAVE_CHECK(M >= nodes, who, ": M = ", M, " gives some node no rows (", nodes, " nodes)");
    check_buffers(who, {{"a_shard", a_shard, mine.size * row},
                                {"a_gathered", a_gathered, M * row},
                                {"B", B, size_t(N) * row},
                                {"C", C, size_t(M) * N * sizeof(bf16)}});
    const char* own = reinterpret_cast<const char*>(a_gathered) + mine.begin * row;
    WEAVE_CHECK(reinterpret_cast<const char*>(a_shard) == own ||
                    !runtime::overlap(a_shard, mine.size * row, a_gathered, M * row),
                who, ": a_shard overlaps a_gathered without being this rank's rows of it (rows ", mine.begin, "..",
                mine.begin + mine.size - 1, ")");
    const tp_net::UnitPlan U = tp_net::ag_plan(M, N, K, 2, nodes, wtp::default_group_m(K), opt_.chunk_bytes);
    tp_net::check_room(path_, opt_, who, tp_net::ag_send_needed(U), tp_net::recv_needed(U), tp_net::flags_needed(U));
  });
  agree(path_, agreed_,
                {kOpAgGemm, M, N, K, static_cast<long long>(opt_.b), opt_.chunk_bytes, opt_.send_blocks,
                 opt_.recv_blocks},
                problem, who);

  const tp_net::UnitPlan U = tp_net::ag_plan(M, N, K, 2, nodes, wtp::default_group_m(K), opt_.chunk_bytes);
  const wtp::Layout& L = U.L;
  tp_net::NetAgGlobalsT<gemm::GemmGlobals> g{};
  g.L = L;
  for (int q = 0; q < nodes; ++q) {
    const wtp::Range sq = wtp::shard(M, nodes, q);
    g.asrc[q] = wtp::map_128x64(q == rank ? a_shard : a_gathered + size_t(sq.begin) * K, sq.size, K, K);
    g.cdst[q] = wtp::map_128x64(C + size_t(sq.begin) * N, sq.size, N, N);
  }
  g.shard = a_shard;
  g.copy_local = a_shard != a_gathered + size_t(mine.begin) * K;
  g.b = wtp::map_b(B, K, N, opt_.b);
  g.M = M, g.N = N, g.K = K;
  g.tiles_m = L.row_tiles(), g.tiles_n = L.tiles_n, g.group_m = L.group_m, g.accumulate = 0;
  g.rank = rank;
  g.push = wtp::kAgCopyEngine;  // the single-node pushes (the aux role) stay idle
  g.slices = U.P;
  g.A = U;
  g.tile_ready = ready_.zeroed(L.row_tiles(), stream);
  g.gathered = reinterpret_cast<char*>(a_gathered);
  if (opt_.b == gemm::BLayout::NK)
    tp_net::launch_call<tp_net::NetAgKernelNK>(path_, g, tp_net::ag_commands(U, rank), opt_, stream, who);
  else
    tp_net::launch_call<tp_net::NetAgKernelKN>(path_, g, tp_net::ag_commands(U, rank), opt_, stream, who);
}

// G > 1: the hierarchical kernel (net_ag_gemm_hier_kernel.cuh) on the node communicator's
// signal sets and the gathered A in its heap.
void NetAgGemm::run_node(const bf16* a_shard, bf16* a_gathered, const bf16* B, bf16* C, int M, int N, int K,
                         cudaStream_t stream) {
  const char* who = "net ag_gemm";
  path_.check();
  runtime::Communicator& node = *node_;
  const int W = path_.world(), rank = path_.rank(), G = node.world();
  const size_t row = size_t(K) * sizeof(bf16);
  const wtp::Range mine = wtp::shard(M, W, rank);
  const std::string problem = runtime::local_problem([&] {
    wtp::validate(who, M, N, K);
    WEAVE_CHECK(M >= W, who, ": M = ", M, " gives some rank no rows (", W, " ranks)");
    check_buffers(who, {{"a_shard", a_shard, mine.size * row},
                        {"a_gathered", a_gathered, M * row},
                        {"B", B, size_t(N) * row},
                        {"C", C, size_t(M) * N * sizeof(bf16)}});
    try {
      (void)node.peers(a_gathered, M * row);
    } catch (const Error& e) {
      throw Error(detail::concat("weave: ", who, ": with ", G, " ranks per node a_gathered must lie in the node "
                                 "communicator's heap (the node peers write into it): ", e.what()));
    }
    const char* own = reinterpret_cast<const char*>(a_gathered) + mine.begin * row;
    WEAVE_CHECK(reinterpret_cast<const char*>(a_shard) == own ||
                    !runtime::overlap(a_shard, mine.size * row, a_gathered, M * row),
                who, ": a_shard overlaps a_gathered without being this rank's rows of it (rows ", mine.begin, "..",
                mine.begin + mine.size - 1, ")");
    const tp_net::UnitPlan U = tp_net::ag_plan(M, N, K, 2, W, wtp::default_group_m(K), opt_.chunk_bytes, G);
    tp_net::check_room(path_, opt_, who, tp_net::ag_send_needed(U), tp_net::recv_needed(U), tp_net::flags_needed(U),
                       opt_.push_blocks);
  });
  agree(path_, agreed_,
        {kOpAgGemm, M, N, K, static_cast<long long>(opt_.b), opt_.chunk_bytes, opt_.send_blocks, opt_.recv_blocks,
         opt_.push_blocks, G},
        problem, who);

  const tp_net::UnitPlan U = tp_net::ag_plan(M, N, K, 2, W, wtp::default_group_m(K), opt_.chunk_bytes, G);
  const wtp::Layout& L = U.L;
  // One set pair per (shape, P): every launch of a set signals P per row tile, so round * P holds.
  const std::vector<long long> key = {M, N, K, U.P};
  const std::vector<int> counts = {L.row_tiles(), 1};
  runtime::SignalSet& rd = sig_.get(node, key, counts, 0);
  runtime::SignalSet& ar = sig_.get(node, key, counts, 1);
  const runtime::PeerPtrs pp = node.peers(a_gathered, M * row);
  tp_net::NetHierAgGlobalsT<gemm::GemmGlobals> g{};
  g.L = L;
  for (int q = 0; q < W; ++q) {
    const wtp::Range sq = wtp::shard(M, W, q);
    g.asrc[q] = wtp::map_128x64(q == rank ? a_shard : a_gathered + size_t(sq.begin) * K, sq.size, K, K);
    g.cdst[q] = wtp::map_128x64(C + size_t(sq.begin) * N, sq.size, N, N);
  }
  for (int d = 0; d < G; ++d) g.node_gathered[d] = static_cast<char*>(pp[d]);
  g.shard = a_shard;
  g.copy_local = a_shard != a_gathered + size_t(mine.begin) * K;
  g.b = wtp::map_b(B, K, N, opt_.b);
  g.M = M, g.N = N, g.K = K;
  g.tiles_m = L.row_tiles(), g.tiles_n = L.tiles_n, g.group_m = L.group_m, g.accumulate = 0;
  g.rank = rank;
  g.push = wtp::kAgCopyEngine;  // the single-node pushes (the aux role) stay idle
  g.slices = U.P;
  g.ready = rd.view();
  g.arrive = ar.view();
  g.ready_round = rd.next_round(stream, false);
  g.arrive_round = ar.next_round(stream, false);
  g.A = U;
  g.gathered = reinterpret_cast<char*>(a_gathered);
  g.recv_blocks = opt_.recv_blocks;
  g.G = G, g.local = node.rank();
  if (opt_.b == gemm::BLayout::NK)
    tp_net::launch_call<tp_net::NetHierAgKernelNK>(path_, g, tp_net::ag_commands(U, rank), opt_, stream, who,
                                                   opt_.push_blocks);
  else
    tp_net::launch_call<tp_net::NetHierAgKernelKN>(path_, g, tp_net::ag_commands(U, rank), opt_, stream, who,
                                                   opt_.push_blocks);
}

}  // namespace weave::net
