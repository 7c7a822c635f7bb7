// Host side of the inter-node AllGather + GEMM: checks, the once-per-shape agreement, the maps,
// the call on the path, the launch.
#include "net_tp/net_ag_gemm.hpp"

#include <algorithm>
#include <string>

#include "net_tp/net_ag_gemm_kernel.cuh"
#include "tp_common/host.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/lcsc.cuh"
#include "weave/runtime/call.hpp"

namespace weave::net {

using weave::detail::concat;
using bf16 = __nv_bfloat16;

NetAgGemm::NetAgGemm(NetPath& path, NetTpOptions opts) : path_(path), opt_(opts) {
  WEAVE_CHECK(path_.gpu(), "net ag_gemm: the network path is in CPU mode (NetPathOptions::gpu = false)");
  const NetTopo t = path_.topo();
  WEAVE_CHECK(t.gpus == 1, "net ag_gemm: ", t.nodes, " nodes of ", t.gpus,
              " ranks: only one rank per node is built (the hierarchical form, NVLink inside the node, is not)");
  WEAVE_CHECK(t.nodes <= kMaxWorld, "net ag_gemm: ", t.nodes, " nodes; at most ", kMaxWorld,
              " are supported");
  WEAVE_CHECK(opt_.chunk_bytes >= 16 && opt_.chunk_bytes % 16 == 0, "net ag_gemm: chunk_bytes (", opt_.chunk_bytes,
              ") must be a positive multiple of 16");
  WEAVE_CHECK(opt_.send_blocks >= 1 && opt_.send_blocks <= 32 && opt_.recv_blocks >= 1 && opt_.recv_blocks <= 32,
              "net ag_gemm: send_blocks (", opt_.send_blocks, ") and recv_blocks (", opt_.recv_blocks,
              ") must be 1 to 32");
}

NetAgGemm::~NetAgGemm() {
  if (ready_) cudaFree(ready_);  // synchronises with the kernels that may still count
}

void NetAgGemm::finish(cudaStream_t stream) { path_.finish(stream); }

// This rank's own checks; any failure is a weave::Error naming the argument.
void NetAgGemm::check_call(const bf16* a_shard, const bf16* a_gathered, const bf16* B, const bf16* C, int M, int N,
                           int K) {
  const char* who = "net ag_gemm";
  const int nodes = path_.world();
  weave::tp::validate(who, M, N, K);
  WEAVE_CHECK(M >= nodes, who, ": M = ", M, " gives some node no rows (", nodes, " nodes)");
  const weave::tp::Range mine = weave::tp::shard(M, nodes, path_.rank());
  const size_t row = size_t(K) * sizeof(bf16);
  const struct {
    const char* name;
    const void* p;
    size_t bytes;
  } ops[] = {{"a_shard", a_shard, mine.size * row},
             {"a_gathered", a_gathered, M * row},
             {"B", B, size_t(N) * row},
             {"C", C, size_t(M) * N * sizeof(bf16)}};
  for (const auto& o : ops) {
    WEAVE_CHECK(o.p != nullptr, who, ": ", o.name, " is a null pointer");
    WEAVE_CHECK(is_aligned(o.p), who, ": ", o.name, " is not 16-byte aligned (TMA and the 16-byte copies need it)");
    check_extent(who, o.name, o.p, o.bytes);
  }
  const char* own = reinterpret_cast<const char*>(a_gathered) + mine.begin * row;
  const bool in_place = reinterpret_cast<const char*>(a_shard) == own;
  WEAVE_CHECK(in_place || !runtime::overlap(a_shard, mine.size * row, a_gathered, M * row), who,
              ": a_shard overlaps a_gathered without being this rank's rows of it (rows ", mine.begin, "..",
              mine.begin + mine.size - 1, ")");
  const tp_net::AgLayout A = tp_net::make_ag_layout(M, N, K, 2, nodes, weave::tp::default_group_m(K), opt_.chunk_bytes);
  WEAVE_CHECK(static_cast<unsigned long long>(tp_net::ag_send_needed(A)) <= path_.send_bytes(), who, ": a shard of ",
              tp_net::ag_send_needed(A), " bytes does not fit the path's send buffer of ", path_.send_bytes(),
              " (NetPathOptions::send_bytes)");
  WEAVE_CHECK(static_cast<unsigned long long>(tp_net::ag_recv_needed(A)) <= path_.slot_recv_bytes(), who, ": ",
              nodes - 1, " peer shards need ", tp_net::ag_recv_needed(A), " bytes per receive slot; the path has ",
              path_.slot_recv_bytes(), " (NetPathOptions::recv_bytes holds two slots)");
  WEAVE_CHECK(tp_net::ag_flags_needed(A) <= path_.slot_flags(), who, ": ", tp_net::ag_flags_needed(A),
              " arrival flags per call slot needed, the path has ", path_.slot_flags(),
              " (raise NetTpOptions::chunk_bytes or NetPathOptions::proxy.flags)");
  int sms = 0, dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  WEAVE_CHECK(opt_.send_blocks + opt_.recv_blocks < sms, who, ": ", opt_.send_blocks + opt_.recv_blocks,
              " send and receive blocks leave no compute SM (the device has ", sms, ")");
}

void NetAgGemm::run(const bf16* a_shard, bf16* a_gathered, const bf16* B, bf16* C, int M, int N, int K,
                    cudaStream_t stream) {
  path_.check();
  const int nodes = path_.world(), rank = path_.rank();
  const std::string problem = runtime::local_problem([&] { check_call(a_shard, a_gathered, B, C, M, N, K); });
  const std::vector<long long> key = {M,
                                      N,
                                      K,
                                      static_cast<long long>(opt_.b),
                                      opt_.chunk_bytes,
                                      opt_.send_blocks,
                                      opt_.recv_blocks};
  if (key != agreed_) {
    // Every rank meets a new shape here (calls are collective): one exchange of the arguments and
    // of each rank's verdict, so a mismatch or one rank's bad argument throws everywhere.
    std::vector<long long> mine = key;
    mine.push_back(problem.empty() ? 1 : 0);
    std::vector<long long> all(mine.size() * nodes);
    path_.bootstrap().all_gather(mine.data(), all.data(), mine.size() * sizeof(long long));
    for (int q = 0; q < nodes; ++q) {
      const long long* o = all.data() + q * mine.size();
      if (q == rank && !problem.empty()) throw Error(problem);
      WEAVE_CHECK(o[key.size()] == 1, "net ag_gemm: rank ", q, " rejected its arguments of this call (its error "
                  "says why)");
      WEAVE_CHECK(std::equal(key.begin(), key.end(), o), "net ag_gemm: rank ", q, " called with M, N, K = ", o[0], ", ",
                  o[1], ", ", o[2], " (B layout ", o[3], ", chunk ", o[4], ", blocks ", o[5], " + ", o[6],
                  "), this rank with ", M, ", ", N, ", ", K, " (", key[3], ", ", key[4], ", ", key[5], " + ", key[6], ")");
    }
    agreed_ = key;
  } else if (!problem.empty()) {
    // The peers agreed on this shape before and go on: release them with this rank's reason.
    path_.abort(problem);
    throw Error(problem);
  }

  const tp_net::AgLayout A = tp_net::make_ag_layout(M, N, K, 2, nodes, weave::tp::default_group_m(K), opt_.chunk_bytes);
  const weave::tp::Layout& L = A.L;
  if (L.row_tiles() > ready_count_) {
    if (ready_) WEAVE_CUDA_CHECK(cudaFree(ready_));
    ready_ = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&ready_, sizeof(unsigned long long) * L.row_tiles()));
    ready_count_ = L.row_tiles();
  }
  WEAVE_CUDA_CHECK(cudaMemsetAsync(ready_, 0, sizeof(unsigned long long) * L.row_tiles(), stream));

  const size_t row = size_t(K) * sizeof(bf16);
  const weave::tp::Range mine = weave::tp::shard(M, nodes, rank);
  char* const gathered = reinterpret_cast<char*>(a_gathered);
  tp_net::NetAgGlobalsT<gemm::GemmGlobals> g{};
  g.L = L;
  for (int q = 0; q < nodes; ++q) {
    const weave::tp::Range sq = weave::tp::shard(M, nodes, q);
    const bf16* src = q == rank ? a_shard : a_gathered + size_t(sq.begin) * K;
    g.asrc[q] = weave::tp::map_128x64(src, sq.size, K, K);
    g.cdst[q] = weave::tp::map_128x64(C + size_t(sq.begin) * N, sq.size, N, N);
  }
  g.shard = a_shard;
  g.copy_local = reinterpret_cast<const char*>(a_shard) != gathered + mine.begin * row;
  g.b = weave::tp::map_b(B, K, N, opt_.b);
  g.M = M, g.N = N, g.K = K;
  g.tiles_m = L.row_tiles(), g.tiles_n = L.tiles_n, g.group_m = L.group_m, g.accumulate = 0;
  g.rank = rank;
  g.push = weave::tp::kAgCopyEngine;  // the single-node pushes (aux role) stay idle
  g.slices = A.P;
  g.h = path_.handle();
  g.A = A;
  g.tile_ready = ready_;
  g.gathered = gathered;
  g.send_blocks = opt_.send_blocks;

  const NetPath::Call call = path_.begin_call(static_cast<uint64_t>(tp_net::ag_commands(A, rank)));
  g.call = call.index;
  g.commands_before = call.commands_before;
  g.recv_base = call.recv_offset;
  g.flag_base = call.flag_offset;
  lcsc::Config cfg;
  cfg.num_comm_sms = opt_.send_blocks + opt_.recv_blocks;
  try {
    if (opt_.b == gemm::BLayout::NK)
      lcsc::launch<tp_net::NetAgKernelNK>(g, cfg, stream);
    else
      lcsc::launch<tp_net::NetAgKernelKN>(g, cfg, stream);
  } catch (const Error& e) {
    // Numbered and counted but not launched: the peers would wait for this rank's rows.
    const std::string why = concat("net ag_gemm: launch failed on rank ", rank, ": ", e.what());
    path_.abort(why);
    throw Error(concat("weave: ", why));
  }
}

}  // namespace weave::net
