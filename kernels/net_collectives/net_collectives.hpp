// Inter-node collectives over the network path (NetPath), G = 1 rank per node: every transfer
// goes between rail peers through the host proxy and libfabric (README.md next to this file).
// In place on a device buffer of `count` elements, sharded as the single-node collectives shard
// it (hierarchy.hpp: near-equal in 16-byte units, rank order):
//   all_gather      rank q's shard is its input; afterwards every shard holds its owner's input.
//   reduce_scatter  the whole buffer is every rank's input; afterwards rank q's shard holds the
//                   sum over ranks (fp32 accumulation, rounded once); the other shards are left
//                   as they were.
//   all_reduce      every element holds the sum (the ring of hierarchy.hpp: N - 1 reduce-scatter
//                   hops, each adding in fp32 and rounding to the dtype, then N - 1 forwarding hops).
// Calls are collective (every rank, same order, same count and dtype) and stream-ordered on one
// path; finish() (NetPath::finish) after the last one reports a failure.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "weave/net/net_path.hpp"

namespace weave::net {

enum class NetDtype { bf16, fp32 };
size_t dtype_bytes(NetDtype d);

struct NetCollOptions {
  long long chunk_bytes = 256 << 10;  // network piece: a multiple of 16 (the tuned parameter)
  int send_blocks = 4;                // inter-node send blocks
  int recv_blocks = 8;                // inter-node receive blocks
};

class NetCollectives {
 public:
  // Throws weave::Error when the path is not in GPU mode, has more than one rank per node (the
  // hierarchical G > 1 kernels are not built yet) or the options are malformed.
  explicit NetCollectives(NetPath& path, NetCollOptions opts = {});

  // Each launches one kernel on `stream` (none for count == 0 or one rank) and returns. Throws
  // weave::Error, launching nothing, when the call does not fit the path (its message names the
  // option to raise) or the path has failed.
  void all_gather(void* buf, long long count, NetDtype dtype, cudaStream_t stream);
  void reduce_scatter(void* buf, long long count, NetDtype dtype, cudaStream_t stream);
  void all_reduce(void* buf, long long count, NetDtype dtype, cudaStream_t stream);

  // Rank q's shard of a `count`-element buffer, in elements.
  static void shard(int world, long long count, NetDtype dtype, int q, long long* first, long long* n);

 private:
  void launch(int coll, void* buf, long long count, NetDtype dtype, cudaStream_t stream);
  NetPath& path_;
  NetCollOptions opt_;
};

}  // namespace weave::net
