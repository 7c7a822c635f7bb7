// Host side of the inter-node GEMM + ReduceScatter: checks, the once-per-shape agreement, the
// scratch for this rank's partial product, the maps, the call on the path.
#include <string>

#include "net_tp/host.hpp"
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
NetGemmRs::~NetGemmRs() {
  if (scratch_) cudaFree(scratch_);
}

void NetGemmRs::finish(cudaStream_t stream) { path_.finish(stream); }

void NetGemmRs::run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, cudaStream_t stream) {
  call(A, B, out, M, N, K, false, stream);
}

NetGemmAr::NetGemmAr(NetPath& path, NetTpOptions opts) : rs_(path, opts) {}
void NetGemmAr::run(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, cudaStream_t stream) {
  rs_.call(A, B, out, M, N, K, true, stream);
}
void NetGemmAr::finish(cudaStream_t stream) { rs_.finish(stream); }

void NetGemmRs::call(const bf16* A, const bf16* B, bf16* out, int M, int N, int K, bool ar, cudaStream_t stream) {
  const char* who = ar ? "net gemm_ar" : "net gemm_rs";
  path_.check();
  const int nodes = path_.world(), rank = path_.rank();
  const wtp::Range mine = wtp::shard(M, nodes, rank);
  const std::string problem = runtime::local_problem([&] {
    wtp::validate(who, M, N, K);
    WEAVE_CHECK(M >= nodes, who, ": M = ", M, " gives some node no rows (", nodes, " nodes)");
    check_buffers(who, {{"A", A, size_t(M) * K * sizeof(bf16)},
                                {"B", B, size_t(N) * K * sizeof(bf16)},
                                {"out", out, size_t(ar ? M : mine.size) * N * sizeof(bf16)}});
    const tp_net::UnitPlan U = tp_net::rs_plan(M, N, nodes, wtp::default_group_m(K), opt_.chunk_bytes);
    if (ar)
      tp_net::check_room(path_, opt_, who, tp_net::ar_send_needed(U), tp_net::ar_recv_needed(U),
                         tp_net::ar_flags_needed(U));
    else
      tp_net::check_room(path_, opt_, who, tp_net::rs_send_needed(U), tp_net::recv_needed(U), tp_net::flags_needed(U));
  });
  agree(path_, agreed_,
                {ar ? kOpGemmAr : kOpGemmRs, M, N, K, static_cast<long long>(opt_.b), opt_.chunk_bytes,
                 opt_.send_blocks, opt_.recv_blocks},
                problem, who);

  const size_t elems = size_t(M) * N;
  if (elems > scratch_elems_) {
    if (scratch_) WEAVE_CUDA_CHECK(cudaFree(scratch_));  // waits for the kernels that read it
    scratch_ = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&scratch_, elems * sizeof(bf16)));
    scratch_elems_ = elems;
  }
  const tp_net::UnitPlan U = tp_net::rs_plan(M, N, nodes, wtp::default_group_m(K), opt_.chunk_bytes);
  const wtp::Layout& L = U.L;
  tp_net::NetRsGlobalsT<gemm::GemmGlobals> g{};
  for (int q = 0; q < nodes; ++q) {
    const wtp::Range sq = wtp::shard(M, nodes, q);
    g.sc[q] = wtp::map_128x64(scratch_ + size_t(sq.begin) * N, sq.size, N, N);
  }
  g.a = wtp::map_128x64(A, M, K, K);
  g.b = wtp::map_b(B, K, N, opt_.b);
  g.M = M, g.N = N, g.K = K;
  g.tiles_m = L.row_tiles(), g.tiles_n = L.tiles_n, g.group_m = L.group_m, g.accumulate = 0;
  g.scratch = scratch_;
  g.out = out;
  g.tile_done = done_.zeroed(L.row_tiles(), stream);
  g.U = U;
  g.rank = rank;
  g.all_reduce = ar;
  const long long commands = ar ? tp_net::ar_commands(U, rank) : tp_net::rs_commands(U, rank);
  if (opt_.b == gemm::BLayout::NK)
    tp_net::launch_call<tp_net::NetRsKernelNK>(path_, g, commands, opt_, stream, who);
  else
    tp_net::launch_call<tp_net::NetRsKernelKN>(path_, g, commands, opt_, stream, who);
}

}  // namespace weave::net
