#include "net_collectives/net_collectives.hpp"

#include <cuda_bf16.h>

#include "net_collectives/kernel.cuh"
#include "net_collectives/layout.hpp"
#include "weave/common/error.hpp"

namespace weave::net {

using weave::detail::concat;

size_t dtype_bytes(NetDtype d) { return d == NetDtype::bf16 ? 2 : 4; }

NetCollectives::NetCollectives(NetPath& path, NetCollOptions opts) : path_(path), opt_(opts) {
  WEAVE_CHECK(path_.gpu(), "net collectives: the network path is in CPU mode (NetPathOptions::gpu = false)");
  const NetTopo t = path_.topo();
  WEAVE_CHECK(t.gpus == 1, "net collectives: ", t.nodes, " nodes of ", t.gpus,
              " ranks: only one rank per node is built yet (the hierarchical NVLink + network kernels are not)");
  WEAVE_CHECK(opt_.chunk_bytes >= 16 && opt_.chunk_bytes % 16 == 0, "net collectives: chunk_bytes (",
              opt_.chunk_bytes, ") must be a positive multiple of 16");
  WEAVE_CHECK(opt_.send_blocks >= 1 && opt_.send_blocks <= 64 && opt_.recv_blocks >= 1 && opt_.recv_blocks <= 64,
              "net collectives: send_blocks (", opt_.send_blocks, ") and recv_blocks (", opt_.recv_blocks,
              ") must be 1 to 64");
}

void NetCollectives::shard(int world, long long count, NetDtype dtype, int q, long long* first, long long* n) {
  const long long es = static_cast<long long>(dtype_bytes(dtype));
  const coll::Layout L = coll::make_layout(Coll::all_gather, world, count * es, 16);
  const Bytes b = net::shard(L.plan, q);
  *first = b.off / es;
  *n = b.size / es;
}

void NetCollectives::launch(int which, void* buf, long long count, NetDtype dtype, cudaStream_t stream) {
  const Coll c = static_cast<Coll>(which);
  const char* name = c == Coll::all_gather ? "all_gather" : c == Coll::reduce_scatter ? "reduce_scatter" : "all_reduce";
  WEAVE_CHECK(count >= 0, "net ", name, ": count ", count, " is negative");
  WEAVE_CHECK(count == 0 || (buf && reinterpret_cast<uintptr_t>(buf) % 16 == 0), "net ", name,
              ": the buffer must be non-null and 16-byte aligned");
  path_.check();
  const int world = path_.world(), rank = path_.rank();
  if (count == 0 || world == 1) return;  // the same on every rank: nothing to exchange
  const long long bytes = count * static_cast<long long>(dtype_bytes(dtype));
  const coll::Layout L = coll::make_layout(c, world, bytes, opt_.chunk_bytes);
  WEAVE_CHECK(coll::flags_needed(L) <= path_.slot_flags(), "net ", name, ": ", bytes, " bytes in pieces of ",
              opt_.chunk_bytes, " need ", coll::flags_needed(L), " arrival flags per call slot; the path has ",
              path_.slot_flags(), " (raise NetCollOptions::chunk_bytes or NetPathOptions::proxy.flags)");
  WEAVE_CHECK(static_cast<unsigned long long>(coll::send_needed(L)) <= path_.send_bytes(), "net ", name, ": ", bytes,
              " bytes need ", coll::send_needed(L), " bytes of send buffer; the path has ", path_.send_bytes(),
              " (NetPathOptions::send_bytes)");
  WEAVE_CHECK(static_cast<unsigned long long>(coll::recv_needed(L)) <= path_.slot_recv_bytes(), "net ", name, ": ",
              bytes, " bytes need ", coll::recv_needed(L), " bytes per receive slot; the path has ",
              path_.slot_recv_bytes(), " (NetPathOptions::recv_bytes holds two slots)");

  const NetPath::Call call = path_.begin_call(static_cast<uint64_t>(coll::commands(L, rank)));
  coll::KernelArgs a{};
  a.h = path_.handle();
  a.buf = static_cast<char*>(buf);
  a.L = L;
  a.call = call.index;
  a.commands_before = call.commands_before;
  a.recv_base = call.recv_offset;
  a.flag_base = call.flag_offset;
  a.send_blocks = opt_.send_blocks;
  const dim3 grid(opt_.send_blocks + opt_.recv_blocks), block(256);
  if (dtype == NetDtype::bf16)
    coll::net_collective_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(a);
  else
    coll::net_collective_kernel<float><<<grid, block, 0, stream>>>(a);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    // Numbered and counted but not launched: the peers would wait for this rank's commands.
    const std::string why = concat("net ", name, ": launch failed on rank ", rank, ": ", cudaGetErrorString(e));
    path_.abort(why);
    throw Error(concat("weave: ", why));
  }
}

void NetCollectives::all_gather(void* buf, long long count, NetDtype dtype, cudaStream_t stream) {
  launch(static_cast<int>(Coll::all_gather), buf, count, dtype, stream);
}

void NetCollectives::reduce_scatter(void* buf, long long count, NetDtype dtype, cudaStream_t stream) {
  launch(static_cast<int>(Coll::reduce_scatter), buf, count, dtype, stream);
}

void NetCollectives::all_reduce(void* buf, long long count, NetDtype dtype, cudaStream_t stream) {
  launch(static_cast<int>(Coll::all_reduce), buf, count, dtype, stream);
}

}  // namespace weave::net
