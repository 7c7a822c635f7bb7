#include "net_collectives/net_collectives.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <vector>

#include "collectives/collectives.hpp"
#include "net_collectives/kernel.cuh"
#include "net_collectives/layout.hpp"
#include "net_collectives/net_coll_fused_kernel.cuh"  // FusedArgs (instantiated in net_coll_fused_launch.cu)
#include "net_collectives/net_coll_fused_launch.hpp"
#include "net_collectives/node_phase.hpp"
#include "weave/runtime/device_copy.hpp"
#include "net_common/call.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/runtime/call.hpp"

namespace weave::net {

using weave::detail::concat;

size_t dtype_bytes(NetDtype d) { return d == NetDtype::bf16 ? 2 : 4; }

// The NVLink phases at G > 1: the node's single-node collectives over node_phase.hpp's rows, and
// the scratch they write into. Members in this order so that `coll` goes first: its destructor
// waits until no rank of the node has device work left, after which the scratch can go.
struct NetCollectives::Node {
  runtime::Communicator& comm;
  runtime::SymmetricTensor<char> tail;     // G x 16 bytes: every local rank's trailing partial unit
  runtime::SymmetricTensor<char> scratch;  // reduce_scatter's node partials (layout.hpp, staged)
  weave::coll::Collectives coll;
  // The fused kernel's: the node's arrive / done counters, its per-item counters, and its grid,
  // the smallest SM count of the job (every rank launches the same grid, each block resident).
  runtime::SignalSet fused_sig;
  DeviceCounters items;
  int grid;

  Node(runtime::Communicator& c, size_t scratch_bytes, int job_sms)
      : comm(c), tail(c, static_cast<size_t>(c.world()) * 16), scratch(c, scratch_bytes < 16 ? 16 : scratch_bytes),
        coll(c), fused_sig(c.signals("net collectives fused (arrive, done)", 2)), grid(job_sms) {}

  int local() const { return comm.rank(); }
  int gpus() const { return comm.world(); }
  static DType type(NetDtype d) { return d == NetDtype::bf16 ? DType::bf16 : DType::fp32; }
  // Rows of 16 bytes as a 2-D tensor sharded along dimension 0.
  static weave::coll::Shape shape(long long rows, NetDtype d) {
    weave::coll::Shape s;
    s.ndim = 2;
    s.d[0] = rows;
    s.d[1] = 16 / static_cast<long long>(dtype_bytes(d));
    return s;
  }

  // This rank's row shard of `b` (at `in`) to every rank of the node (the rows at `out`).
  void all_gather(const char* in, char* out, const coll::Rows& b, NetDtype d, cudaStream_t s) {
    if (b.rows == 0) return;
    coll.all_gather(in, out, shape(b.rows, d), 0, type(d), s);
  }
  // The node's sum of this rank's row shard of `b` (the rows at `in`) into `out`.
  void reduce_scatter(const char* in, char* out, const coll::Rows& b, NetDtype d, cudaStream_t s) {
    if (b.rows == 0) return;
    coll.reduce_scatter(in, out, shape(b.rows, d), 0, type(d), ReduceOp::sum, s);
  }
  // The node's sum of the tail into `out` (every rank; in place where out is the tail).
  void tail_sum(const char* buf, char* out, const Bytes& t, NetDtype d, cudaStream_t s) {
    if (t.size == 0) return;
    coll.all_reduce(buf + t.off, out, static_cast<size_t>(t.size) / dtype_bytes(d), type(d), ReduceOp::sum, s);
  }
  // The last local rank's tail to the others: gathered into `tail` (one row per rank, every rank
  // the same call), then copied out of the last row. The next call's gather writes a peer's
  // `tail` only after that peer reached it, i.e. after this copy (stream order).
  void tail_from_last(char* buf, const Bytes& t, NetDtype d, cudaStream_t s) {
    if (t.size == 0) return;
    weave::coll::Shape sh;
    sh.ndim = 2;
    sh.d[0] = gpus();
    sh.d[1] = t.size / static_cast<long long>(dtype_bytes(d));
    coll.all_gather(buf + t.off, tail.data(), sh, 0, type(d), s);
    if (local() != gpus() - 1)
      runtime::device_copy(buf + t.off, tail.data() + (gpus() - 1) * t.size, static_cast<size_t>(t.size), s);
  }
};

namespace {
void check_options(const NetPath& path, const NetCollOptions& o) {
  WEAVE_CHECK(path.gpu(), "net collectives: the network path is in CPU mode (NetPathOptions::gpu = false)");
  WEAVE_CHECK(o.chunk_bytes >= 16 && o.chunk_bytes % 16 == 0, "net collectives: chunk_bytes (", o.chunk_bytes,
              ") must be a positive multiple of 16");
  WEAVE_CHECK(o.send_blocks >= 1 && o.send_blocks <= 64 && o.recv_blocks >= 1 && o.recv_blocks <= 64,
              "net collectives: send_blocks (", o.send_blocks, ") and recv_blocks (", o.recv_blocks,
              ") must be 1 to 64");
}
}  // namespace

NetCollectives::NetCollectives(NetPath& path, NetCollOptions opts) : path_(path), opt_(opts) {
  check_options(path_, opt_);
  const NetTopo t = path_.topo();
  WEAVE_CHECK(t.gpus == 1, "net collectives: ", t.nodes, " nodes of ", t.gpus,
              " ranks: more than one rank per node needs the node's communicator (NetCollectives(path, node, "
              "opts), node a Communicator over runtime::node_launch_info)");
}

NetCollectives::NetCollectives(NetPath& path, runtime::Communicator& node, NetCollOptions opts)
    : path_(path), opt_(opts) {
  check_options(path_, opt_);
  const NetTopo t = path_.topo();
  const int local = path_.rank() % t.gpus;
  WEAVE_CHECK(node.world() == t.gpus && node.rank() == local, "net collectives: the node communicator has rank ",
              node.rank(), " of ", node.world(), " but this rank is local rank ", local, " of a node of ", t.gpus,
              " ranks (make it over runtime::node_launch_info)");
  WEAVE_CHECK(node.device() == path_.device(), "net collectives: the node communicator uses GPU ", node.device(),
              " but the network path GPU ", path_.device());
  if (t.gpus == 1) return;
  // The fused kernel's grid: the same on every rank (the ring blocks' item order and the node's
  // done count depend on it), at most one block per SM of the smallest GPU, so that every block
  // is resident at once (its blocks wait for each other) even where ranks share a GPU (their
  // kernels take turns on it).
  std::vector<int> sms(static_cast<size_t>(path_.world()));
  const int mine = node.sm_count();
  path_.bootstrap().all_gather(&mine, sms.data(), sizeof mine);
  node_ = std::make_unique<Node>(node, opt_.node_scratch_bytes, *std::min_element(sms.begin(), sms.end()));
}

NetCollectives::~NetCollectives() = default;

void NetCollectives::shard(int world, long long count, NetDtype dtype, int q, long long* first, long long* n) {
  const long long es = static_cast<long long>(dtype_bytes(dtype));
  const coll::Layout L = coll::make_layout(Coll::all_gather, Topo{world, 1}, count * es, 16);
  const Bytes b = net::shard(L.plan, q);
  *first = b.off / es;
  *n = b.size / es;
}

void NetCollectives::net_phase(const coll::Layout& L, char* buf, const char* src, NetDtype dtype,
                               cudaStream_t stream, const char* name) {
  const int rank = path_.rank();
  const NetPath::Call call = path_.begin_call(static_cast<uint64_t>(coll::commands(L, rank)));
  coll::KernelArgs a{};
  a.h = path_.handle();
  a.buf = buf;
  a.src = src;
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

void NetCollectives::launch(int which, void* buf, long long count, NetDtype dtype, cudaStream_t stream) {
  const Coll c = static_cast<Coll>(which);
  const char* name = c == Coll::all_gather ? "all_gather" : c == Coll::reduce_scatter ? "reduce_scatter" : "all_reduce";
  const std::string who = concat("net ", name);
  path_.check();
  const int world = path_.world();
  const NetTopo t = path_.topo();
  const long long bytes = count * static_cast<long long>(dtype_bytes(dtype));
  // This rank's checks, then every rank's verdict and arguments compared (a new call's, or every
  // call's with WEAVE_DEBUG): a bad argument on one rank, or ranks calling different collectives or
  // counts, throws on every rank instead of leaving the others' kernels waiting for it.
  const std::string problem = runtime::local_problem([&] {
    WEAVE_CHECK(count >= 0, who, ": count ", count, " is negative");
    if (count == 0) return;
    WEAVE_CHECK(buf && reinterpret_cast<uintptr_t>(buf) % 16 == 0, who, ": the buffer must be non-null and 16-byte aligned");
    check_extent(who.c_str(), "buf", buf, static_cast<size_t>(bytes));
    const coll::Layout L = coll::make_layout(c, Topo{t.nodes, t.gpus}, bytes, opt_.chunk_bytes);
    if (t.nodes > 1) {
      WEAVE_CHECK(coll::flags_needed(L) <= path_.slot_flags(), who, ": ", bytes, " bytes in pieces of ",
                  opt_.chunk_bytes, " need ", coll::flags_needed(L), " arrival flags per call slot; the path has ",
                  path_.slot_flags(), " (raise NetCollOptions::chunk_bytes or NetPathOptions::proxy.flags)");
      WEAVE_CHECK(static_cast<unsigned long long>(coll::send_needed(L)) <= path_.send_bytes(), who, ": ", bytes,
                  " bytes need ", coll::send_needed(L), " bytes of send buffer; the path has ", path_.send_bytes(),
                  " (NetPathOptions::send_bytes)");
      WEAVE_CHECK(static_cast<unsigned long long>(coll::recv_needed(L)) <= path_.slot_recv_bytes(), who, ": ", bytes,
                  " bytes need ", coll::recv_needed(L), " bytes per receive slot; the path has ",
                  path_.slot_recv_bytes(), " (NetPathOptions::recv_bytes holds two slots)");
    }
    if (t.gpus == 1) return;
    try {
      (void)node_->comm.peers(buf, static_cast<size_t>(bytes));
    } catch (const Error& e) {
      throw Error(concat("weave: ", who, ": with ", t.gpus, " ranks per node the buffer must lie in the node "
                         "communicator's heap or be registered with it: ", e.what()));
    }
    WEAVE_CHECK(static_cast<unsigned long long>(coll::scratch_needed(L)) <= node_->scratch.size(), who, ": ", bytes,
                " bytes need ", coll::scratch_needed(L), " bytes of node scratch; there are ", node_->scratch.size(),
                " (NetCollOptions::node_scratch_bytes)");
    WEAVE_CHECK(!opt_.fused || coll::roles_fit(c, coll::fused_roles(c, node_->grid, opt_.send_blocks, opt_.recv_blocks)),
                who, ": the fused kernel's grid of ", node_->grid, " blocks (the smallest SM count) leaves no NVLink "
                "block beside ", opt_.send_blocks, " send and ", opt_.recv_blocks,
                " receive blocks (lower NetCollOptions::send_blocks / recv_blocks)");
  });
  const long long op = c == Coll::all_gather ? kOpAllGather : c == Coll::reduce_scatter ? kOpReduceScatter : kOpAllReduce;
  const AgreedCall agreed_call = agree(path_, agreed_,
        {op, count, static_cast<long long>(dtype), opt_.chunk_bytes, opt_.send_blocks, opt_.recv_blocks, t.gpus,
         t.gpus > 1 && opt_.fused ? node_->grid : 0},
        problem, who.c_str(), "count, dtype, chunk, send blocks, receive blocks, ranks per node, fused grid");
  if (count == 0 || world == 1) return;  // the same on every rank (agreed): nothing to exchange
  const int rank = path_.rank();
  const coll::Layout L = coll::make_layout(c, Topo{t.nodes, t.gpus}, bytes, opt_.chunk_bytes);
  char* b = static_cast<char*>(buf);
  if (t.gpus == 1) return net_phase(L, b, b, dtype, stream, name);

  if (opt_.fused) return fused_call(L, b, dtype, stream, name);
  Node& n = *node_;
  // One stream, no host wait between stages: each stage's kernels start after the previous
  // stage's kernels of this rank ended; the single-node collectives frame their NVLink accesses
  // with arrival and completion signals, so a peer's buffer is touched only once that peer
  // reached the same stage (README.md: GPU-side ordering).
  const auto at = [&](const coll::Place& p) {
    return (p.where == coll::Where::buffer ? b : p.where == coll::Where::scratch ? n.scratch.data() : n.tail.data()) +
           p.off;
  };
  for (int i = 0; i < coll::num_stages(L); ++i) {
    const coll::Stage st = coll::stage(L, rank, i);
    switch (st.op) {
      case coll::StageOp::net:
        net_phase(L, b, c == Coll::reduce_scatter ? n.scratch.data() : b, dtype, stream, name);
        break;
      case coll::StageOp::ag_rows: n.all_gather(at(st.in), at(st.out), st.rows, dtype, stream); break;
      case coll::StageOp::rs_rows: n.reduce_scatter(at(st.in), at(st.out), st.rows, dtype, stream); break;
      case coll::StageOp::tail_sum: n.tail_sum(b, at(st.out), st.tail, dtype, stream); break;
      case coll::StageOp::tail_from_last: n.tail_from_last(b, st.tail, dtype, stream); break;
      case coll::StageOp::copy:
        runtime::device_copy(at(st.out), at(st.in), static_cast<size_t>(st.size), stream);
        break;
    }
  }
}

void NetCollectives::fused_call(const coll::Layout& L, char* buf, NetDtype dtype, cudaStream_t stream,
                                const char* name) {
  Node& n = *node_;
  coll::FusedArgs f{};
  coll::KernelArgs& a = f.net;
  a.buf = buf;
  a.src = L.plan.coll == Coll::reduce_scatter ? n.scratch.data() : buf;
  a.L = L;
  a.send_blocks = opt_.send_blocks;
  const runtime::PeerPtrs pp = n.comm.peers(buf, static_cast<size_t>(L.plan.bytes));
  for (int d = 0; d < n.gpus(); ++d) f.node[d] = static_cast<char*>(pp[d]);
  f.scratch = n.scratch.data();
  f.sig = n.fused_sig.view();
  f.round = n.fused_sig.next_round();
  f.roles = coll::fused_roles(L.plan.coll, n.grid, opt_.send_blocks, opt_.recv_blocks);
  f.G = n.gpus();
  f.local = n.local();
  // One node: the kernel queues nothing (the layout still counts all_reduce's ring pieces there).
  const long long cmds = L.plan.topo.nodes > 1 ? coll::commands(L, path_.rank()) : 0;
  launch_numbered(path_, a, cmds, concat("net ", name).c_str(), [&] {
    f.counters = n.items.zeroed(coll::fused_counters(L), stream);
    coll::launch_fused(f, dtype == NetDtype::bf16, stream);
    WEAVE_CUDA_CHECK(cudaGetLastError());
  });
}

void NetCollectives::finish(cudaStream_t stream) {
  if (node_) {
    // The node communicator first: it names a timed-out NVLink wait (a trap, which the path would
    // only see as a CUDA error). Its failure also fails the path, whose peers may wait on us.
    try {
      node_->comm.sync(stream);
    } catch (const Error& e) {
      path_.abort(e.what());
      throw;
    }
  }
  path_.finish(stream);
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
