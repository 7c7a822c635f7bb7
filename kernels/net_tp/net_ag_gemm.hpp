// Inter-node AllGather + GEMM over the network path, one rank per node (README.md beside this
// file): C = A · Bᵀ (B as N x K, an nn.Linear weight) or A · B (B as K x N) on every rank, where A
// (M x K, bf16) is sharded by rows over the N nodes (rank q holds rows tp::shard(M, N, q)). The
// gathered A comes back in `a_gathered` (M x K, this rank's device memory), as the single-node
// ag_gemm returns it for the backward pass. One persistent kernel: the GEMM's compute blocks
// start on the own rows while send blocks post this rank's shard to every rail peer and receive
// blocks move the peers' units into the gathered A as they arrive; a peer row tile is computed as
// soon as its units are in.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gemm/layout.hpp"
#include "weave/net/net_path.hpp"

namespace weave::net {

struct NetTpOptions {
  long long chunk_bytes = 1 << 20;  // network unit: a 128-row tile in ceil(tile bytes / chunk) slices
  int send_blocks = 2;              // inter-node send blocks (SMs taken from the GEMM)
  int recv_blocks = 6;              // inter-node receive blocks
  gemm::BLayout b = gemm::BLayout::NK;
};

class NetAgGemm {
 public:
  // One rank per node (the path's G = 1; the hierarchical form is not built: refused with an
  // error), at most 8 nodes (tp::kMaxWorld), the path in GPU mode. Not collective.
  explicit NetAgGemm(NetPath& path, NetTpOptions opts = {});
  ~NetAgGemm();
  NetAgGemm(const NetAgGemm&) = delete;
  NetAgGemm& operator=(const NetAgGemm&) = delete;

  // Collective (every rank, same order, same M, N, K and options), stream-ordered on one path.
  // a_shard: this rank's rows (contiguous, device memory; may be its rows of a_gathered);
  // a_gathered: M x K; B: N x K or K x N (NetTpOptions::b); C: M x N. All 16-byte aligned device
  // memory as long as the shape says; K and N multiples of 8; M >= nodes.
  // Errors: a bad argument throws weave::Error before anything is queued; when only this rank's
  // arguments are bad, it also fails the path (NetPath::abort), so that no peer waits for this
  // rank's rows. A new shape is agreed with every rank over the bootstrap once (a mismatch throws
  // on every rank). Returns without waiting; finish() reports a failure of the transfer.
  void run(const __nv_bfloat16* a_shard, __nv_bfloat16* a_gathered, const __nv_bfloat16* B, __nv_bfloat16* C, int M,
           int N, int K, cudaStream_t stream);

  // Waits for `stream`, then throws the path's first failure (NetPath::finish).
  void finish(cudaStream_t stream);

 private:
  void check_call(const __nv_bfloat16* a_shard, const __nv_bfloat16* a_gathered, const __nv_bfloat16* B,
                  const __nv_bfloat16* C, int M, int N, int K);
  NetPath& path_;
  NetTpOptions opt_;
  std::vector<long long> agreed_;        // the last shape every rank agreed on
  unsigned long long* ready_ = nullptr;  // per virtual row tile, zeroed before each launch
  int ready_count_ = 0;
};

}  // namespace weave::net
