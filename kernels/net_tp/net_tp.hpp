// Inter-node fused TP kernels over the network path, nodes of one or more ranks (README.md beside
// this file). Each is one persistent kernel: the GEMM's compute blocks beside network send and
// receive blocks, so that the transfers overlap the math at row-tile granularity.
//   NetAgGemm  AllGather + GEMM: C = A · Bᵀ (B as N x K, an nn.Linear weight) or A · B (B as
//              K x N) on every rank, A (M x K, bf16) sharded by rows over the W ranks (rank q holds
//              rows tp::shard(M, W, q)); the gathered A comes back too (for the backward pass).
//              Also hierarchical: nodes of G > 1 ranks, shards between rail peers over the
//              network and inside the node over NVLink, in the same kernel.
//   NetGemmRs  GEMM + ReduceScatter: rank q gets rows tp::shard(M, W, q) of sum over ranks of
//              A_r · B_r (each rank's A_r M x K_r and B_r: a row-parallel linear layer's halves).
//   NetGemmAr  GEMM + AllReduce: every rank gets the whole sum.
//              Both also hierarchical: the node's partial of a shard summed over NVLink on the
//              owner's rail peer, then sent over the network once, in the same kernel.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gemm/layout.hpp"
#include "tp_common/adaptive_stats.hpp"
#include "net_common/call.hpp"
#include "weave/net/net_path.hpp"
#include "weave/runtime/call.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::net {

struct NetTpOptions {
  long long chunk_bytes = 1 << 20;  // network unit: a 128-row tile in ceil(tile bytes / chunk) slices
  int send_blocks = 2;              // inter-node send blocks (SMs taken from the GEMM)
  int recv_blocks = 6;              // inter-node receive blocks
  int push_blocks = 2;              // NetAgGemm at G > 1: NVLink push blocks (own shard to the node);
                                    // NetGemmRs / NetGemmAr take none (their send and receive blocks
                                    // read the node's partials over NVLink themselves)
  gemm::BLayout b = gemm::BLayout::NK;
  // At one rank per node: the adaptive SM split (issue 22; mKernel section 3.2) instead of
  // send_blocks + recv_blocks fixed ones: every block computes or runs the network's send and
  // receive tasks as the split's policy decides at each task boundary (NetGemmRs / NetGemmAr:
  // net_gemm_rs_adaptive.cuh; NetAgGemm: net_ag_adaptive_kernel.cuh). Refused at G > 1.
  bool adaptive = false;
};

class NetAgGemm {
 public:
  // One rank per node (the path's G = 1), at most 8 nodes (kMaxWorld), the path in GPU mode. Not
  // collective.
  explicit NetAgGemm(NetPath& path, NetTpOptions opts = {});
  // Any G, nodes x G <= 8. `node` is this node's communicator (its G ranks, rank = this rank's
  // local index; Communicator(runtime::node_launch_info(...))), which must outlive this object; at
  // G > 1 a_gathered must lie in its heap (the node peers write into it).
  NetAgGemm(NetPath& path, runtime::Communicator& node, NetTpOptions opts = {});
  ~NetAgGemm();
  NetAgGemm(const NetAgGemm&) = delete;
  NetAgGemm& operator=(const NetAgGemm&) = delete;

  // Collective (every rank, same order, same M, N, K and options), stream-ordered on one path.
  // a_shard: this rank's rows (contiguous, device memory; may be its rows of a_gathered);
  // a_gathered: M x K; B: N x K or K x N (NetTpOptions::b); C: M x N. All 16-byte aligned device
  // memory as long as the shape says; K and N multiples of 8; M >= nodes.
  // Errors: a bad argument throws weave::Error before anything is queued; when only this rank's
  // arguments are bad, it also fails the path (NetPath::abort), so that no peer waits for this
  // rank's rows. A new shape is agreed with every rank once, through the path's calls' mailbox (a
  // mismatch throws on every rank); later calls of it are compared without waiting. Returns without waiting; finish() reports a failure of the transfer.
  void run(const __nv_bfloat16* a_shard, __nv_bfloat16* a_gathered, const __nv_bfloat16* B, __nv_bfloat16* C, int M,
           int N, int K, cudaStream_t stream);

  // Waits for `stream`, then throws the first failure: at G > 1 the node communicator's (a
  // timed-out NVLink wait; it also fails the path), then the path's (NetPath::finish).
  void finish(cudaStream_t stream);
  // The adaptive split's statistics over this object's adaptive calls on this rank (communication
  // tasks: sends and receives), zeros before the first; waits for the device.
  weave::tp::AdaptiveStats adaptive_stats() const;

 private:
  NetPath& path_;
  NetTpOptions opt_;
  runtime::Communicator* node_ = nullptr;  // G > 1
  AgreedKeys agreed_;  // keys every rank checked together (net_common/call.hpp)
  DeviceCounters ready_;                   // G = 1: units arrived per virtual row tile
  void* ledger_ = nullptr;  // the adaptive split's (tp_common/sm_ledger.cuh), zeroed once; device memory
  runtime::ShapeSignals sig_{"net.ag_gemm"};  // G > 1: ready and arrive sets on the node
};

class NetGemmRs {
 public:
  // As NetAgGemm's.
  explicit NetGemmRs(NetPath& path, NetTpOptions opts = {});
  // Any G, nodes x G <= 8, as NetAgGemm's. At G > 1 the scratch of this rank's partial product lies
  // in the node communicator's heap (the node peers read it): the destructor is then collective
  // over the node (it waits until no node rank has device work left, then frees it).
  NetGemmRs(NetPath& path, runtime::Communicator& node, NetTpOptions opts = {});
  ~NetGemmRs();
  NetGemmRs(const NetGemmRs&) = delete;
  NetGemmRs& operator=(const NetGemmRs&) = delete;

  // Collective, as NetAgGemm::run. A: M x K (this rank's K slice); B: N x K or K x N
  // (NetTpOptions::b); out: this rank's rows tp::shard(M, W, rank) x N (W = nodes x G ranks).
  // fp32 sums, in this order: the node ranks' partials (local index 0, 1, ..., G - 1), then the
  // other nodes' partials (nodes n + 1, n + 2, ...), the same on every rank. The partial products
  // are bf16 (the GEMM's output); at G > 1 a remote node's partial (the fp32 sum of its G ranks')
  // is rounded to bf16 once more to cross the network; the result is rounded once.
  // The object keeps an M x N bf16 scratch for this rank's partial product (grown on demand).
  void run(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* out, int M, int N, int K,
           cudaStream_t stream);
  // As NetAgGemm::finish.
  void finish(cudaStream_t stream);
  // The adaptive split's statistics over this object's adaptive calls (RS and AR) on this rank,
  // zeros before the first; waits for the device.
  weave::tp::AdaptiveStats adaptive_stats() const;

 private:
  friend class NetGemmAr;
  void call(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* out, int M, int N, int K,
            bool all_reduce, cudaStream_t stream);
  __nv_bfloat16* scratch(size_t elems);
  NetPath& path_;
  NetTpOptions opt_;
  runtime::Communicator* node_ = nullptr;  // G > 1
  AgreedKeys agreed_;  // keys every rank checked together (net_common/call.hpp)
  DeviceCounters done_;             // G = 1: column tiles stored per virtual row tile
  __nv_bfloat16* scratch_ = nullptr;  // G = 1: device memory; G > 1: the node's heap
  size_t scratch_elems_ = 0;
  void* ledger_ = nullptr;  // the adaptive split's (tp_common/sm_ledger.cuh), zeroed once; device memory
  runtime::ShapeSignals sig_{"net.gemm_rs"};  // G > 1: ready, arrive and landed sets on the node
};

class NetGemmAr {
 public:
  // As NetAgGemm's.
  explicit NetGemmAr(NetPath& path, NetTpOptions opts = {});
  // As NetGemmRs's; at G > 1 out must lie in the node communicator's heap (the node peers write
  // the rows they reduced or received into it).
  NetGemmAr(NetPath& path, runtime::Communicator& node, NetTpOptions opts = {});
  // Collective, as NetAgGemm::run. out (M x N, every rank) = sum over ranks of A_r · B_r: the
  // reduce-scatter of NetGemmRs, then each owner's reduced rows to every peer from the same
  // kernel's receive blocks; every rank's out is bit-identical.
  void run(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* out, int M, int N, int K,
           cudaStream_t stream);
  void finish(cudaStream_t stream);
  weave::tp::AdaptiveStats adaptive_stats() const { return rs_.adaptive_stats(); }

 private:
  NetGemmRs rs_;
};

}  // namespace weave::net
