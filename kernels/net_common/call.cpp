#include "net_common/call.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "weave/common/extent.hpp"
#include "weave/config.hpp"
#include "weave/runtime/env.hpp"

namespace weave::net {

DeviceCounters::~DeviceCounters() {
  if (p_) cudaFree(p_);  // synchronises with the kernels that may still count
}

unsigned long long* DeviceCounters::zeroed(int n, cudaStream_t stream) {
  if (n > n_) {
    if (p_) WEAVE_CUDA_CHECK(cudaFree(p_));
    p_ = nullptr;
    WEAVE_CUDA_CHECK(cudaMalloc(&p_, sizeof(unsigned long long) * n));
    n_ = n;
  }
  WEAVE_CUDA_CHECK(cudaMemsetAsync(p_, 0, sizeof(unsigned long long) * n, stream));
  return p_;
}

void check_path(const NetPath& path, int send_blocks, int recv_blocks, const char* who, bool any_g) {
  WEAVE_CHECK(path.gpu(), who, ": the network path is in CPU mode (NetPathOptions::gpu = false)");
  const NetTopo t = path.topo();
  WEAVE_CHECK(any_g || t.gpus == 1, who, ": ", t.nodes, " nodes of ", t.gpus,
              " ranks: this constructor takes one rank per node; the hierarchical form takes the node's communicator "
              "too (path, node, opts)");
  WEAVE_CHECK(t.nodes * t.gpus <= kMaxWorld, who, ": ", t.nodes, " x ", t.gpus, " ranks; at most ", kMaxWorld,
              " are supported");
  WEAVE_CHECK(send_blocks >= 1 && send_blocks <= 32 && recv_blocks >= 1 && recv_blocks <= 32, who, ": send_blocks (",
              send_blocks, ") and recv_blocks (", recv_blocks, ") must be 1 to 32");
}

void check_buffers(const char* who, std::initializer_list<Buffer> bufs) {
  for (const Buffer& b : bufs) {
    WEAVE_CHECK(b.p != nullptr, who, ": ", b.name, " is a null pointer");
    WEAVE_CHECK(is_aligned(b.p), who, ": ", b.name, " is not 16-byte aligned (TMA and the 16-byte copies need it)");
    check_extent(who, b.name, b.p, b.bytes);
  }
}

void check_room(const NetPath& path, const char* who, long long send_needed, long long recv_needed,
                long long flags_needed, int comm_blocks, const char* flags_hint) {
  WEAVE_CHECK(static_cast<unsigned long long>(send_needed) <= path.send_bytes(), who, ": the call stages ",
              send_needed, " bytes; the path's send buffer has ", path.send_bytes(), " (NetPathOptions::send_bytes)");
  WEAVE_CHECK(static_cast<unsigned long long>(recv_needed) <= path.slot_recv_bytes(), who, ": the call receives ",
              recv_needed, " bytes per receive slot; the path has ", path.slot_recv_bytes(),
              " (NetPathOptions::recv_bytes holds two slots)");
  WEAVE_CHECK(flags_needed <= path.slot_flags(), who, ": ", flags_needed,
              " arrival flags per call slot needed, the path has ", path.slot_flags(), " (", flags_hint, ")");
  int sms = 0, dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  WEAVE_CHECK(comm_blocks < sms, who, ": ", comm_blocks, " send and receive blocks leave no compute SM (the device has ",
              sms, ")");
}

const char* op_name(long long op) {
  switch (op) {
    case kOpAgGemm: return "ag_gemm";
    case kOpGemmRs: return "gemm_rs";
    case kOpGemmAr: return "gemm_ar";
    case kOpRingAttention: return "ring_attention";
    case kOpAllGather: return "all_gather";
    case kOpReduceScatter: return "reduce_scatter";
    case kOpAllReduce: return "all_reduce";
  }
  return "another operator";
}

void agree(NetPath& path, std::vector<long long>& agreed, const std::vector<long long>& key,
           const std::string& problem, const char* who, const char* what) {
  static const bool debug = env::get_bool("WEAVE_DEBUG");
  if (key == agreed && !debug) {
    if (problem.empty()) return;
    path.abort(problem);  // the peers agreed on this shape before and go on: release them
    throw Error(problem);
  }
  const int nodes = path.world(), rank = path.rank();
  std::vector<long long> mine = key;
  mine.push_back(problem.empty() ? 1 : 0);
  std::vector<long long> all(mine.size() * nodes);
  path.bootstrap().all_gather(mine.data(), all.data(), mine.size() * sizeof(long long));
  if (!problem.empty()) throw Error(problem);
  for (int q = 0; q < nodes; ++q) {
    const long long* o = all.data() + q * mine.size();
    WEAVE_CHECK(o[key.size()] == 1, who, ": rank ", q, " rejected its arguments of this call (its error says why)");
    if (std::equal(key.begin(), key.end(), o)) continue;
    std::string theirs = op_name(o[0]), ours = op_name(key[0]);
    for (size_t i = 1; i < key.size(); ++i) {
      theirs += ", " + std::to_string(o[i]);
      ours += ", " + std::to_string(key[i]);
    }
    WEAVE_CHECK(false, who, ": rank ", q, " called with (operator, ", what, ") = (", theirs, "), rank ", rank, " with (",
                ours, ")");
  }
  agreed = key;
}

}  // namespace weave::net
